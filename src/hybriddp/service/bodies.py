"""Request bodies of the service: the size limit, and JSON / NDJSON parsing with 4xx errors.

Every failure is a :class:`~hybriddp.service.errors.ServiceError` (or Starlette's 413
HTTPException inside the ASGI receive channel), which the app turns into its JSON error shape.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import orjson
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from hybriddp.core.errors import parameter_error
from hybriddp.service.errors import (
    BadBodyError,
    BodyTimeoutError,
    BodyTooLargeError,
    ServerBusyError,
    ServiceError,
    UnsupportedMediaTypeError,
    error_payload,
)

NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/jsonlines")


def media_type(content_type: str | None) -> str:
    """The media type of a Content-Type header; :class:`UnsupportedMediaTypeError` (415) when there is none.

    A body without a JSON content type is never read as JSON: ``text/plain``, a form or no type at all is what a page
    of another site can make a visitor's browser send without asking this server (``fetch`` in ``no-cors`` mode,
    ``navigator.sendBeacon``); the JSON types need a CORS preflight, which :mod:`hybriddp.service.guard` answers
    only for listed origins."""
    if content_type is None or not content_type.strip():
        raise UnsupportedMediaTypeError("the request has no Content-Type; send Content-Type: application/json (or "
                                        "application/x-ndjson where the endpoint takes one item a line)")
    return content_type.split(";")[0].strip().lower()


def is_json(media: str) -> bool:
    """Whether a media type (:func:`media_type`) is JSON: ``application/json`` or a ``+json`` type."""
    return media == "application/json" or media.endswith("+json")


def body_too_large(limit: int) -> BodyTooLargeError:
    """The 413 of a body over ``limit`` bytes."""
    return BodyTooLargeError(f"request body over the limit of {limit:,} bytes; send reports in smaller batches "
                             "(hybriddp serve --max-body-bytes sets the limit)")


def check_content_length(headers: Any, limit: int) -> None:
    """Refuse an announced body before reading it: a Content-Length that is not a number (400) or over
    ``limit`` (413). ``headers``: the ASGI scope's (name, value) byte pairs."""
    length = dict(headers or []).get(b"content-length")
    if length is not None:
        if not length.isdigit():
            raise ServiceError(f"Content-Length {length[:40].decode('latin-1')!r} is not a number")
        if int(length) > limit:
            raise body_too_large(limit)


class BodyLimit:
    """Pure ASGI middleware: 413 for a body over the limit, announced (Content-Length) or streamed; 408 for a body
    that comes too slowly (:class:`BodyPace`), whichever route reads it (FastAPI's own body parsing included)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            check_content_length(scope.get("headers"), self.limit)
        except ServiceError as exc:
            status, body, headers = error_payload(exc)
            await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
            return
        seen = 0
        pace: BodyPace | None = BodyPace()

        async def limited() -> Any:
            nonlocal seen, pace
            if pace is None:  # the body is complete: e.g. waiting for http.disconnect, not paced
                return await receive()
            try:
                msg = await _within(receive(), pace.wait(seen))
            except (TimeoutError, asyncio.TimeoutError):
                raise StarletteHTTPException(408, str(pace.late(seen))) from None
            except BodyTimeoutError as exc:
                raise StarletteHTTPException(408, str(exc)) from None
            if msg.get("type") != "http.request" or not msg.get("more_body", False):
                pace = None
            else:
                pace.got(len(msg.get("body", b"")))
            if msg.get("type") == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise StarletteHTTPException(413, str(body_too_large(self.limit)))
            return msg
        await self.app(scope, limited, send)


def body_text(body: bytes) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBodyError(f"the body is not UTF-8 text (byte {exc.start} is 0x{body[exc.start]:02x})") from None
    if not text.strip():
        raise BadBodyError("the body is empty; see /openapi.json for what this endpoint takes")
    return text


def ndjson_lines(body: bytes) -> list[tuple[int, Any]]:
    """(line number, parsed JSON) of every non-blank line."""
    return [(i, loads(line, f"NDJSON line {i}")) for i, line in enumerate(body_text(body).split("\n"), 1)
            if line.strip()]


def parse_messages(body: bytes, content_type: str | None) -> list[Any]:
    """A reports body → its messages: one JSON object, a JSON array, or NDJSON (one object a line)."""
    media = media_type(content_type)
    if media not in NDJSON_TYPES and not is_json(media):
        raise UnsupportedMediaTypeError(f"Content-Type {media[:60]!r} is not taken; send application/json (one message "
                                        "or an array) or application/x-ndjson (one message a line)")
    if media in NDJSON_TYPES:
        return [doc for _, doc in ndjson_lines(body)]
    try:  # the common case, fast: orjson reads the bytes (checking UTF-8 itself, refusing NaN/Infinity)
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:  # the standard parser says what is wrong (or takes what orjson does not)
        doc = loads(body_text(body), "the body")
    if isinstance(doc, list):
        if not doc:
            raise BadBodyError("the body is an empty array; send at least one message")
        return doc
    return [doc]


FIRST_MESSAGE_BYTES = 64 * 1024
"""How far into a reports body :func:`first_message` looks for the first message."""


def first_message(body: bytes, content_type: str | None) -> Any:
    """The first message of a reports body of several (a JSON array, or NDJSON), parsed alone from the first
    :data:`FIRST_MESSAGE_BYTES` of the body without parsing the rest; None when it cannot be read so (one message,
    another content type, a first message that is longer or not valid JSON): the parse of the whole body then says
    what is wrong. A batch whose first message is refused is refused without the rest being read
    (:mod:`hybriddp.service.checkpool`)."""
    try:
        media = media_type(content_type)
    except ServiceError:
        return None
    head = body[:FIRST_MESSAGE_BYTES]
    try:
        if media in NDJSON_TYPES:
            start = 0
            while (end := head.find(b"\n", start)) >= 0 or len(head) == len(body):
                line = head[start:] if end < 0 else head[start:end]
                if line.strip():
                    return orjson.loads(line)
                if end < 0:
                    return None
                start = end + 1
            return None
        if not is_json(media) or not head.lstrip().startswith(b"["):
            return None
        text = head.decode("utf-8", errors="strict") if len(head) == len(body) else _prefix_text(head)
        at = text.index("[") + 1
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        return None if text.startswith("]", at) else _FIRST.raw_decode(text, at)[0]
    except (ValueError, RecursionError, UnicodeDecodeError):  # orjson's and json's errors are ValueErrors
        return None


def _prefix_text(head: bytes) -> str:
    """The text of the first bytes of a body, whose last character may be cut (UnicodeDecodeError elsewhere)."""
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            raise
        return head[:exc.start].decode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_FIRST = json.JSONDecoder(parse_constant=_reject_constant)


def loads(text: str, where: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        hint = " (for one message a line, send Content-Type: application/x-ndjson)" if "Extra data" in str(exc) else ""
        raise BadBodyError(f"{where} is not valid JSON: {str(exc)[:200]}{hint}") from None


BODY_TIMEOUT_S = 20.0
"""Seconds a request may take between two parts of its body before it is refused (408): a client that opens a
body and then stops sending does not hold the server's memory and a connection for long."""

BODY_DEADLINE_S = 30.0
"""Seconds of slack of a request body (``hybriddp serve --body-deadline``): a body starts with this much time, each
byte received adds ``1 / MIN_BODY_RATE`` s, but never to more than this many seconds from now; a body whose time
runs out is refused (408, :class:`BodyPace`)."""

MIN_BODY_RATE = 64 * 1024
"""Bytes a second a request body must keep up on average after its first :data:`BODY_DEADLINE_S` seconds
(``hybriddp serve --min-body-rate``; 64 KiB/s, i.e. 512 kbit/s: a 16 MiB body may take 30 s + 256 s)."""

INFLIGHT_BODY_BYTES = 256 * 1024 * 1024
"""Bytes of unfinished request bodies the whole process holds at most (256 MiB); past it a body is refused with
503 and Retry-After, so many large unfinished bodies cannot exhaust memory (docs/DEPLOYMENT.md)."""


def set_body_pace(deadline: float, min_rate: int) -> None:
    """Set :data:`BODY_DEADLINE_S` and :data:`MIN_BODY_RATE` of this process (``hybriddp serve``, once per server
    process, like the in-flight budget :data:`INFLIGHT_BODY_BYTES`); a bad value is refused by name."""
    global BODY_DEADLINE_S, MIN_BODY_RATE
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not 1 <= deadline <= 86400:
        raise parameter_error("body deadline (--body-deadline)", deadline, "a number of seconds from 1 to 86400")
    if isinstance(min_rate, bool) or not isinstance(min_rate, int) or min_rate < 1:
        raise parameter_error("minimum body rate (--min-body-rate)", min_rate, "an integer number of bytes a "
                              "second >= 1 (1 turns the rate off: only the per-part timeout is left)")
    BODY_DEADLINE_S, MIN_BODY_RATE = float(deadline), min_rate


class BodyPace:
    """The time the request body being read has left: a token bucket of time, after Apache's ``mod_reqtimeout``
    (``body=…,MinRate=…``), but with the credit capped.

    The body starts with :data:`BODY_DEADLINE_S` seconds; every byte received adds ``1 / MIN_BODY_RATE`` s, but the
    credit never reaches past :data:`BODY_DEADLINE_S` seconds from now; a part that does not come within
    :data:`BODY_TIMEOUT_S` fails too. Guarantees: a body of N bytes is refused after at most
    ``BODY_DEADLINE_S + N / MIN_BODY_RATE`` seconds (the total deadline; with the limit of 16 MiB, 286 s by
    default); a client that keeps at least ``MIN_BODY_RATE`` is never refused for its pace; and a client that sent
    a large part fast and then trickles (the slow-body attack, "Slowloris" for bodies) is refused at most
    :data:`BODY_DEADLINE_S` seconds after its last burst, however much it sent: what it sent buys no time beyond
    that cap."""

    __slots__ = ("due", "rate", "slack", "start")

    def __init__(self) -> None:
        self.slack, self.rate = BODY_DEADLINE_S, MIN_BODY_RATE
        self.start = time.monotonic()
        self.due = self.start + self.slack

    def wait(self, size: int) -> float:
        """Seconds the next part may take (:class:`BodyTimeoutError` when none are left; ``size``: bytes so far)."""
        left = self.due - time.monotonic()
        if left <= 0:
            raise self.late(size)
        return min(BODY_TIMEOUT_S, left)

    def got(self, n: int) -> None:
        """``n`` more bytes arrived."""
        if n:
            self.due = min(self.due + n / self.rate, time.monotonic() + self.slack)

    def late(self, size: int) -> BodyTimeoutError:
        """The 408 of a body that ran out of time (after ``size`` bytes)."""
        now = time.monotonic()
        if self.due - now > 0.01:  # time was left: one part stalled
            return BodyTimeoutError(f"the request body stalled: no part of it arrived for {BODY_TIMEOUT_S:g} s "
                                    f"(after {size:,} bytes); send the whole body at once")
        return BodyTimeoutError(f"the request body arrived too slowly: {size:,} bytes in {now - self.start:.0f} s; "
                                f"after its first {self.slack:g} s a body must keep {self.rate:,} bytes/s on average "
                                "(hybriddp serve --body-deadline, --min-body-rate); send smaller batches, or over a "
                                "faster link")


class _Inflight:
    """The bytes of request bodies being read right now, in this process (one event loop: no lock needed)."""

    held = 0


async def read_body(receive: Any, limit: int) -> bytes:
    """The whole body, read from the ASGI ``receive`` channel (a route's ``request.receive``), refused
    with 413 as soon as it passes ``limit`` bytes, with 408 when it comes too slowly (:class:`BodyPace`: a part
    later than :data:`BODY_TIMEOUT_S`, or the body below :data:`MIN_BODY_RATE` past its slack), with 503 when the
    process already holds :data:`INFLIGHT_BODY_BYTES` of unfinished bodies; Starlette's ``ClientDisconnect`` when
    the client goes away first. A refused body's bytes leave the in-flight count at once. Reading the channel
    itself, not a ``Request``'s stream, keeps the per-request cost of the report endpoint low
    (:mod:`hybriddp.service.reports`)."""
    chunks: list[bytes] = []
    size = 0
    pace = BodyPace()
    try:
        while True:
            try:
                msg = await _within(receive(), pace.wait(size))
            except (TimeoutError, asyncio.TimeoutError):
                raise pace.late(size) from None
            if msg["type"] != "http.request":  # http.disconnect
                raise ClientDisconnect
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            if _Inflight.held + len(chunk) > INFLIGHT_BODY_BYTES:
                raise ServerBusyError("the server is reading too many request bodies at once; retry in a few seconds")
            _Inflight.held += len(chunk)
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            pace.got(len(chunk))
    finally:
        _Inflight.held -= sum(map(len, chunks))


async def _within(awaitable: Any, seconds: float) -> Any:
    """``await awaitable`` within ``seconds``: ``asyncio.timeout`` (a timer on this task) where there is one
    (Python ≥ 3.11), else ``asyncio.wait_for`` (an extra task per call)."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


def inflight_body_bytes() -> int:
    """Bytes of unfinished request bodies held by this process now (tests, metrics)."""
    return _Inflight.held

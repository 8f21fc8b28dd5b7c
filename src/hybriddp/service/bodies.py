"""Request bodies of the service: the size limit, and JSON / NDJSON parsing with 4xx errors.

Every failure is a :class:`~hybriddp.service.errors.ServiceError` (or Starlette's 413
HTTPException inside the ASGI receive channel), which the app turns into its JSON error shape.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

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
    """Pure ASGI middleware: 413 for a body over the limit, announced (Content-Length) or streamed."""

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

        async def limited() -> Any:
            nonlocal seen
            msg = await receive()
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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(text: str, where: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        hint = " (for one message a line, send Content-Type: application/x-ndjson)" if "Extra data" in str(exc) else ""
        raise BadBodyError(f"{where} is not valid JSON: {str(exc)[:200]}{hint}") from None


BODY_TIMEOUT_S = 20.0
"""Seconds a request may take between two parts of its body before it is refused (408): a client that opens a
body and sends it slowly, or never finishes it, does not hold the server's memory and a connection for long."""

INFLIGHT_BODY_BYTES = 256 * 1024 * 1024
"""Bytes of unfinished request bodies the whole process holds at most (256 MiB); past it a body is refused with
503 and Retry-After, so many large unfinished bodies cannot exhaust memory (docs/DEPLOYMENT.md)."""


class _Inflight:
    """The bytes of request bodies being read right now, in this process (one event loop: no lock needed)."""

    held = 0


async def read_body(receive: Any, limit: int, timeout: float | None = None) -> bytes:
    """The whole body, read from the ASGI ``receive`` channel (a route's ``request.receive``), refused
    with 413 as soon as it passes ``limit`` bytes, with 408 when a part takes more than ``timeout`` seconds
    (:data:`BODY_TIMEOUT_S`), with 503 when the process already holds :data:`INFLIGHT_BODY_BYTES` of unfinished
    bodies; Starlette's ``ClientDisconnect`` when the client goes away first. Reading the channel itself, not a
    ``Request``'s stream, keeps the per-request cost of the report endpoint low (:mod:`hybriddp.service.reports`)."""
    chunks: list[bytes] = []
    size = 0
    wait = BODY_TIMEOUT_S if timeout is None else timeout
    try:
        while True:
            try:
                msg = await _within(receive(), wait)
            except (TimeoutError, asyncio.TimeoutError):
                raise BodyTimeoutError(f"the request body did not arrive within {wait:g} s of its last part; "
                                       "send the whole body at once") from None
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

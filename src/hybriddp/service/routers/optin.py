"""Opt-in users: enrolment (one token per user and round) and uploads of their records or values (PRIVACY.md,
"The raw opt-in data's lifecycle").

An upload is one user's JSON (token in the Authorization header) or NDJSON, one user a line with its token.
Each user's upload is idempotent (its ``upload_id``, or else its content, makes its key) and counts against
the token's quota with its JSON bytes; all the users of a request are stored, or none.

Uploads are the opt-in side's hot path (a user's own upload, thousands a second): :class:`OptinUploadEndpoint`
serves them as a plain ASGI handler in front of FastAPI's middleware, routing and dependency injection, as
:mod:`hybriddp.service.reports` serves device reports (issue 39); the FastAPI route of the same path states the
endpoint in the OpenAPI document and shares every check and message through :func:`answer_upload`.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from hybriddp.core.errors import DataError, HybridDPError
from hybriddp.core.protocol import ID_PATTERN
from hybriddp.service import models as m
from hybriddp.service.bodies import (
    NDJSON_TYPES,
    body_text,
    check_content_length,
    is_json,
    loads,
    media_type,
    read_body,
)
from hybriddp.service.errors import (
    BadBodyError,
    ConflictError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
    describe_errors,
    error_payload,
)
from hybriddp.service.metrics import Metrics
from hybriddp.service.reports import internal_error, post_round_id, send_json
from hybriddp.service.routers.common import ADMIN, OptinCredentials, RoundId, Service, StoreDep, errors
from hybriddp.service.store import OptinUpload, RoundInfo, Store, TokenUpload, UploadAck, token_hash
from hybriddp.service.writer import OptinWriter

logger = logging.getLogger(__name__)
router = APIRouter(tags=["opt-in"])
ROUTE = "/api/v1/rounds/{round_id}/optin/records"
"""The upload route's template (the latency metric's label, as FastAPI names it)."""
_PATH = re.compile(rf"/api/v1/rounds/({ID_PATTERN})/optin/records")
_THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="hybriddp-optin")
"""The threads uploads read and write the database in: as many as requests can usefully wait for one group commit
(:meth:`hybriddp.service.store.optin.OptinStore.add_optin_batch`)."""


@router.post("/api/v1/rounds/{round_id}/optin/enrol", status_code=201, response_model=m.TokenOut | m.TokensOut,
             dependencies=ADMIN, responses=errors(400, 401, 404, 409, 413, 422, 503))
def enrol(round_id: RoundId, body: m.EnrolIn, store: StoreDep) -> dict[str, Any]:
    if (body.user is None) == (body.users is None):
        raise DataError('give one user {"user": "..."} or several {"users": ["...", ...]}, not both or neither')
    if body.user is not None:
        return {"token": store.enrol(round_id, body.user)}
    return {"tokens": store.enrol_many(round_id, body.users or [])}


@router.post(ROUTE, response_model=m.AcceptedOut, openapi_extra={"requestBody": m.OPTIN_BODY},
             responses=errors(400, 401, 404, 409, 413, 415, 422, 503))
async def upload(round_id: RoundId, request: Request, creds: OptinCredentials, service: Service) -> dict[str, int]:
    return await answer_upload(service.store, service.max_body_bytes, round_id, request.headers.get("content-type"),
                               None if creds is None else creds.credentials, request.receive,
                               "expect" not in request.headers, service.optin_writer,
                               _length(request.headers.get("content-length")))


async def answer_upload(store: Store, limit: int, round_id: str, content_type: str | None, token: str | None,
                        receive: Any, peek: bool = True, writer: OptinWriter | None = None,
                        length: int | None = None) -> dict[str, int]:
    """An upload request: the content type, the round and a one-user upload's token checked before the body is read
    (:func:`_admit`), then the body read (``limit`` bytes at most) and stored; its acknowledgement. A body that came
    with the headers is taken at once, and checked and stored in the same thread hop (``peek``; False for a request
    with ``Expect: 100-continue``, whose client waits to be asked for the body).

    A user's own small upload (JSON with a token, at most :data:`OWN_UPLOAD_BYTES` arrived or announced as
    ``length``) to a round whose tokens were checked before takes the short way: its body read (under the same pace
    and limits) and parsed on the event loop, then stored by the group commit of ``writer``, which checks its token
    (:func:`_own_upload`)."""
    loop = asyncio.get_running_loop()
    media = media_type(content_type)
    first = _arrived(receive) if peek else None
    whole = first is not None and not first.get("more_body") and len(first.get("body", b"")) <= limit
    own_size = len(first["body"]) if whole and first is not None else length if first is None else None
    info = store.checked_round(round_id) if writer is not None and token is not None and peek else None
    if info is not None and own_size is not None and own_size <= OWN_UPLOAD_BYTES and is_json(media):
        assert writer is not None and token is not None
        body = first["body"] if whole and first is not None else await read_body(receive, limit)
        own = await _own_upload(store, writer, info, token, body)
        if own is not None:
            return {"accepted": own.accepted, "duplicates": own.duplicates}
        first, whole = {"type": "http.request", "body": body}, True  # read: the long way takes it as arrived
    if whole and first is not None:
        ack = await loop.run_in_executor(_THREADS, _admit_and_upload, store, round_id, media, token, first["body"])
        return {"accepted": ack.accepted, "duplicates": ack.duplicates}
    user = await loop.run_in_executor(_THREADS, _admit, store, round_id, media, token)  # before the body is read
    body = await read_body(_prefixed(first, receive), limit)
    if user is None:
        ack = await loop.run_in_executor(_THREADS, _upload_ndjson, store, round_id, body)
    else:
        ack = await loop.run_in_executor(_THREADS, _upload_one, store, *user, body)
    return {"accepted": ack.accepted, "duplicates": ack.duplicates}


OWN_UPLOAD_BYTES = 16 << 10
"""A one-user JSON upload of at most this many bytes to a round whose tokens were checked before is read and parsed
on the event loop and stored by the opt-in writer's group commit, which checks its token (:func:`_own_upload`).
Such a body is read before its token is checked: up to 16 KiB, under the pace and in-flight limits of every body
(:func:`~hybriddp.service.bodies.read_body`); any other request's token is checked before its body is waited for."""


async def _own_upload(store: Store, writer: OptinWriter, info: RoundInfo, token: str, body: bytes
                      ) -> UploadAck | None:
    """A user's own small JSON upload to the round ``info`` (as remembered by its last token check) through the
    opt-in writer's group commit (issue 39's single uploads): parsed and checked here, on the event loop (at most
    :data:`OWN_UPLOAD_BYTES`: tens of microseconds, less than a thread hop), its token looked up with the other
    tokens of its group in the group's transaction, which also checks the round's state. None, with nothing
    stored, when the body is not a valid upload or the token is not one of the round's: the caller then takes the
    request the long way, which checks the token first and gives the exact answer."""
    try:
        doc = m.OptinUploadIn.model_validate(orjson.loads(body))
        items = _upload_items(info, doc, "")
    except (orjson.JSONDecodeError, ValidationError, HybridDPError):
        return None
    upload = TokenUpload(token_hash(token), items, store.upload_key(doc.upload_id, items), len(body))
    ack: UploadAck | None = await writer.submit(info, [upload])
    return ack


def _arrived(receive: Any) -> dict[str, Any] | None:
    """The body's first ASGI message if the server holds it already (a small body comes with the headers), else
    None, without waiting for the client: :func:`answer_upload` still checks the token before anything waits for
    the body. ``receive()`` is run up to where it would wait and, there, abandoned before it took anything (closing
    it removes its waiter)."""
    step = receive()
    if not inspect.iscoroutine(step):  # (ASGI servers' receive is a coroutine function)
        return None
    try:
        step.send(None)
    except StopIteration as done:
        msg: dict[str, Any] = done.value
    else:
        step.close()
        return None
    if msg["type"] != "http.request":  # http.disconnect
        raise ClientDisconnect
    return msg


def _prefixed(first: dict[str, Any] | None, receive: Any) -> Any:
    """``receive``, giving ``first`` (a message :func:`_arrived` took) before its own."""
    if first is None:
        return receive

    async def again() -> dict[str, Any]:
        nonlocal first
        if first is not None:
            msg, first = first, None
            return msg
        return await receive()  # type: ignore[no-any-return]
    return again


def _admit_and_upload(store: Store, round_id: str, media: str, token: str | None, body: bytes) -> UploadAck:
    """A request whose whole body came with its headers, in one thread hop: :func:`_admit` (the body is parsed
    only when that passes), then the upload."""
    user = _admit(store, round_id, media, token)
    if user is None:
        return _upload_ndjson(store, round_id, body)
    return _upload_one(store, *user, body)


class OptinUploadEndpoint:
    """Serves ``POST /api/v1/rounds/{22-character id}/optin/records`` as a plain ASGI handler (module docstring):
    the same checks, statuses and messages as the FastAPI route, at a fraction of its per-request cost."""

    def __init__(self, store: Store, metrics: Metrics, limit: int, writer: OptinWriter | None = None) -> None:
        self.store, self.metrics, self.limit, self.writer = store, metrics, limit, writer

    @staticmethod
    def round_of(scope: Any) -> str | None:
        """The round id when ``scope`` is an opt-in upload request, else None."""
        return post_round_id(_PATH, scope)

    async def __call__(self, round_id: str, scope: Any, receive: Any, send: Any) -> None:
        start = time.perf_counter()
        headers = dict(scope["headers"])
        try:
            check_content_length(scope["headers"], self.limit)
            ctype = headers.get(b"content-type")
            out: Any = await answer_upload(self.store, self.limit, round_id,
                                           None if ctype is None else ctype.decode("latin-1"),
                                           _bearer(headers.get(b"authorization")), receive, b"expect" not in headers,
                                           self.writer, _length(headers.get(b"content-length")))
            status, extra = 200, {}
        except ClientDisconnect:  # gone before its body arrived: nothing stored, nothing to answer
            return
        except HybridDPError as exc:
            status, out, extra = error_payload(exc)
        except Exception as exc:  # a bug: logged, and the API's 500 shape
            status, out, extra = internal_error(exc)
        await send_json(send, status, out, extra)
        self.metrics.observe("POST", ROUTE, time.perf_counter() - start)


def _length(value: bytes | str | None) -> int | None:
    """An announced Content-Length (checked by :func:`~hybriddp.service.bodies.check_content_length`), or None."""
    return int(value) if value is not None and value.isdigit() else None


def _bearer(value: bytes | None) -> str | None:
    """The credentials of an ``Authorization: Bearer <token>`` header, as FastAPI's ``HTTPBearer`` reads them
    (scheme case-insensitive; None when absent, empty or of another scheme)."""
    if not value:
        return None
    scheme, _, param = value.decode("latin-1").partition(" ")
    param = param.strip()
    return param if scheme and param and scheme.lower() == "bearer" else None


def _admit(store: Store, round_id: str, media: str, token: str | None) -> tuple[RoundInfo, Any] | None:
    """What can be refused before the body is read: the content type, the round, and a one-user upload's token.
    Returns the round and the token's user for a one-user (JSON) upload, None for NDJSON (a token a line, checked
    with the body)."""
    if media in NDJSON_TYPES:
        store.round(round_id)
        return None
    if not is_json(media):
        raise UnsupportedMediaTypeError(f"Content-Type {media[:60]!r} is not taken; send application/json (one user, "
                                        "token in the Authorization header) or application/x-ndjson (one user a line)")
    if token is None:
        store.round(round_id)
        raise UnauthorizedError("opt-in uploads need the user's token: Authorization: Bearer <token from "
                                "POST /api/v1/rounds/{id}/optin/enrol> (or an NDJSON body with a token on each line)")
    info, (user,) = store.optin_users(round_id, [token])
    if user is None:
        _not_collecting(info)
        raise UnauthorizedError(f"this token is not an opt-in token of round {round_id}; use the token issued when "
                                "the user enrolled in this round")
    return info, user


def _upload_one(store: Store, info: RoundInfo, user: Any, body: bytes) -> UploadAck:
    """One opt-in user's JSON upload (its token was checked by :func:`_admit`)."""
    doc = _validated(m.OptinUploadIn, loads(body_text(body), "the body"), "the body")
    items = _upload_items(info, doc, "")
    return store.add_optin_batch(info, [OptinUpload(user, items, store.upload_key(doc.upload_id, items), len(body))])


AUTH_CHUNK_LINES = 4096
"""Most NDJSON lines whose tokens are looked up in one query (:func:`_upload_ndjson`)."""


def _upload_ndjson(store: Store, round_id: str, body: bytes) -> UploadAck:
    """An NDJSON upload: one opt-in user a line, each with its token; all stored, or none.

    Every line is authenticated before any line is validated: the first line alone, then the lines in chunks
    that at most double what is authenticated so far (up to :data:`AUTH_CHUNK_LINES`), each token read from its
    parsed line without the model's validation; the first unknown token refuses the request (401, naming its
    line). So a request whose first token is bogus costs one line's parse and one lookup, and the work spent on
    unauthenticated lines is at most that spent on authenticated ones (plus 16 lines): a 16 MiB body of bogus
    tokens is refused after milliseconds, not seconds (issue 39)."""
    lines = _ndjson_lines(body)
    docs: list[tuple[int, Any]] = []
    users: list[Any] = []
    info: RoundInfo | None = None
    while chunk := [(i, _ndjson_doc(line, i)) for i, line in itertools.islice(
            lines, 1 if not docs else min(max(16, len(docs)), AUTH_CHUNK_LINES))]:
        info, found = store.optin_users(round_id, [_token_of(doc, i) for i, doc in chunk])
        for (i, _), user in zip(chunk, found, strict=True):
            if user is None:
                _not_collecting(info)
                raise UnauthorizedError(f"NDJSON line {i}: the token is not an opt-in token of round {round_id}; "
                                        "nothing was stored (use the token issued when the user enrolled in this "
                                        "round)")
        docs += chunk
        users += found
    if info is None:
        body_text(body)  # an empty or non-UTF-8 body says so
        raise BadBodyError("the NDJSON body has no line; send one line per opt-in user")
    uploads = []
    for (i, doc), user in zip(docs, users, strict=True):
        line = _validated(m.OptinBatchLine, doc, f"NDJSON line {i}")
        items = _upload_items(info, line, f"NDJSON line {i}: ")
        uploads.append(OptinUpload(user, items, store.upload_key(line.upload_id, items), len(json.dumps(doc))))
    return store.add_optin_batch(info, uploads)


def _ndjson_lines(body: bytes) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the body's non-blank lines, found as they are taken (the body is not split ahead)."""
    start, i = 0, 1
    while start < len(body):
        end = body.find(b"\n", start)
        end = len(body) if end < 0 else end
        line = body[start:end]
        if line.strip():
            yield i, line
        start, i = end + 1, i + 1


def _ndjson_doc(line: bytes, i: int) -> Any:
    """The JSON value of NDJSON line ``i`` (orjson; the standard parser says what is wrong, or takes what orjson
    does not, as :func:`hybriddp.service.bodies.parse_messages` does)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadBodyError(f"NDJSON line {i} is not UTF-8 text (byte {exc.start} of the line is "
                               f"0x{line[exc.start]:02x})") from None
        return loads(text, f"NDJSON line {i}")


def _token_of(doc: Any, i: int) -> str:
    """The token of a parsed NDJSON line; a line without a usable one gets the model's error (naming the field)."""
    token = doc.get("token") if isinstance(doc, dict) else None
    if isinstance(token, str) and 1 <= len(token) <= 1000:
        return token
    _validated(m.OptinBatchLine, doc, f"NDJSON line {i}")  # raises: says which field is wrong and how
    raise DataError(f"NDJSON line {i}: field 'token' must be the user's opt-in token (a string)")


def _not_collecting(info: RoundInfo) -> None:
    """A round past collecting-optin has no tokens left (deleted with the raw data): say why, not 'bad token'."""
    if info.state != "collecting-optin":
        raise ConflictError(f"cannot upload opt-in data: round {info.id} is {info.state!r}; uploads are taken while "
                            "it is 'collecting-optin' (its raw data and tokens were deleted when it left that state)")


def _upload_items(info: RoundInfo, body: m.OptinUploadIn, where: str) -> list[Any]:
    """The records (query, url) or values of an upload, checked against the round's kind and URL level."""
    if info.kind == "mean":
        if body.values is None or body.records is not None:
            raise DataError(f'{where}round {info.id} is a mean round: upload {{"values": [numbers]}}')
        return body.values
    if body.records is None or body.values is not None:
        raise DataError(f'{where}round {info.id} is a BLENDER round: upload {{"records": [{{"query": ..., '
                        '"url": ...}]}')
    url_level = info.params["url_level"]
    for i, r in enumerate(body.records):
        if url_level and r.url is None:
            raise DataError(f"{where}records[{i}]: url is null, but round {info.id} has a URL level (url_level "
                            "true): give each record as (query, clicked URL); a search without a click is not a record")
        if not url_level and r.url is not None:
            raise DataError(f"{where}records[{i}]: url {r.url[:60]!r} given, but round {info.id} has no URL level "
                            "(url_level false): send url null")
    return [(r.query, r.url) for r in body.records]


def _validated(model: type[Any], doc: Any, where: str) -> Any:
    """``doc`` checked by a pydantic model; a DataError naming the place and the fields otherwise."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise DataError(f"{where}: {describe_errors(exc.errors())}") from None

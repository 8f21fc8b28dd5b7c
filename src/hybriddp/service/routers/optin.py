"""Opt-in users: enrolment (one token per user and round) and uploads of their records or values (PRIVACY.md,
"The raw opt-in data's lifecycle").

An upload is one user's JSON (token in the Authorization header) or NDJSON, one user a line with its token.
Each user's upload is idempotent (its ``upload_id``, or else its content, makes its key) and counts against
the token's quota with its JSON bytes; all the users of a request are stored, or none.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from hybriddp.core.errors import DataError
from hybriddp.service import models as m
from hybriddp.service.bodies import NDJSON_TYPES, body_text, is_json, loads, media_type, read_body
from hybriddp.service.errors import (
    BadBodyError,
    ConflictError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
    describe_errors,
)
from hybriddp.service.routers.common import ADMIN, OptinCredentials, RoundId, Service, StoreDep, errors
from hybriddp.service.store import OptinUpload, RoundInfo, Store, UploadAck

router = APIRouter(tags=["opt-in"])


@router.post("/api/v1/rounds/{round_id}/optin/enrol", status_code=201, response_model=m.TokenOut | m.TokensOut,
             dependencies=ADMIN, responses=errors(400, 401, 404, 409, 413, 422, 503))
def enrol(round_id: RoundId, body: m.EnrolIn, store: StoreDep) -> dict[str, Any]:
    if (body.user is None) == (body.users is None):
        raise DataError('give one user {"user": "..."} or several {"users": ["...", ...]}, not both or neither')
    if body.user is not None:
        return {"token": store.enrol(round_id, body.user)}
    return {"tokens": store.enrol_many(round_id, body.users or [])}


@router.post("/api/v1/rounds/{round_id}/optin/records", response_model=m.AcceptedOut,
             openapi_extra={"requestBody": m.OPTIN_BODY}, responses=errors(400, 401, 404, 409, 413, 415, 422, 503))
async def upload(round_id: RoundId, request: Request, creds: OptinCredentials, service: Service) -> dict[str, int]:
    token = None if creds is None else creds.credentials
    media = media_type(request.headers.get("content-type"))
    user = await run_in_threadpool(_admit, service.store, round_id, media, token)  # all before the body is read
    body = await read_body(request.receive, service.max_body_bytes)
    if user is None:
        ack = await run_in_threadpool(_upload_ndjson, service.store, round_id, body)
    else:
        ack = await run_in_threadpool(_upload_one, service.store, *user, body)
    return {"accepted": ack.accepted, "duplicates": ack.duplicates}


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

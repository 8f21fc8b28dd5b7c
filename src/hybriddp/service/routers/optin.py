"""Opt-in users: enrolment (one token per user and round) and uploads of their records or values (PRIVACY.md,
"The raw opt-in data's lifecycle").

An upload is one user's JSON (token in the Authorization header) or NDJSON, one user a line with its token.
Each user's upload is idempotent (its ``upload_id``, or else its content, makes its key) and counts against
the token's quota with its JSON bytes; all the users of a request are stored, or none.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from hybriddp.core.errors import DataError
from hybriddp.service import models as m
from hybriddp.service.bodies import NDJSON_TYPES, body_text, is_json, loads, media_type, ndjson_lines, read_body
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


def _upload_ndjson(store: Store, round_id: str, body: bytes) -> UploadAck:
    """An NDJSON upload: one opt-in user a line, each with its token; all stored, or none."""
    lines = []
    for i, doc in ndjson_lines(body):
        line = _validated(m.OptinBatchLine, doc, f"NDJSON line {i}")
        lines.append((i, line.token, line, len(json.dumps(doc))))
    if not lines:
        raise BadBodyError("the NDJSON body has no line; send one line per opt-in user")
    info, users = store.optin_users(round_id, [t for _, t, _, _ in lines])
    uploads = []
    for (i, _, line, size), user in zip(lines, users, strict=True):
        if user is None:
            _not_collecting(info)
            raise UnauthorizedError(f"NDJSON line {i}: the token is not an opt-in token of round {round_id}; "
                                    "nothing was stored")
        items = _upload_items(info, line, f"NDJSON line {i}: ")
        uploads.append(OptinUpload(user, items, store.upload_key(line.upload_id, items), size))
    return store.add_optin_batch(info, uploads)


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

"""The collection service's HTTP API (FastAPI): rounds, opt-in uploads, head lists, reports, results.

:func:`create_app` opens the database (running its migrations), finishes what a stopped server
left mid-step, and returns the app. Every error a client can cause is a 4xx JSON body
``{"error": {"code": ..., "message": ...}}``; a 5xx means a bug or an unusable database.
Administrator endpoints need ``Authorization: Bearer <admin token>`` (constant-time comparison);
opt-in uploads need the opt-in user's own token. Nothing identifying the sender (address, user
agent, time) is stored with a report.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import io
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from hybriddp import __version__
from hybriddp.errors import DataError, HybridDPError, parameter_error
from hybriddp.service import models as m
from hybriddp.service import pages, rounds
from hybriddp.service.bodies import (
    NDJSON_TYPES,
    BodyLimit,
    body_text,
    loads,
    media_type,
    ndjson_lines,
    read_body,
)
from hybriddp.service.checkpool import DEFAULT_CHECK_WORKERS, CheckPool
from hybriddp.service.errors import (
    BadBodyError,
    ConflictError,
    NotFoundError,
    SeedRefusedError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
    error_payload,
)
from hybriddp.service.metrics import LatencyMiddleware, Metrics
from hybriddp.service.reports import ReportsEndpoint, accept_reports
from hybriddp.service.schema import ROUND_STATES
from hybriddp.service.store import (
    DEFAULT_OPTIN_MAX_BYTES,
    DEFAULT_OPTIN_MAX_RECORDS,
    OptinUpload,
    RoundInfo,
    Store,
    UploadAck,
)
from hybriddp.service.writer import ReportWriter

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body accepted (16 MiB); larger ones get 413."""
MIN_ADMIN_TOKEN = 16
PURGE_INTERVAL_S = 60.0
"""Seconds between two passes that purge raw opt-in data past their round's retention deadline."""
SEEDS_FLAG = "--insecure-testing-seeds"
"""The ``hybriddp serve`` flag without which seeded rounds are refused."""

admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                          description="The administrator token (`hybriddp serve` prints where it is).")
optin_bearer = HTTPBearer(auto_error=False, scheme_name="OptinToken",
                          description="The opt-in user's token from POST /api/v1/rounds/{id}/optin/enrol.")


RoundId = Annotated[str, Path(description="The round's id: 16 random bytes in URL-safe base64 (22 characters). "
                                          "Any other string is answered 404.",
                              json_schema_extra={"pattern": "^[A-Za-z0-9_-]{22}$"})]
"""A round id in a path (the pattern is documented, not enforced: a malformed id is simply not found)."""


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": m.ErrorOut, "description": _ERROR_TEXT[c]} for c in codes}


_ERROR_TEXT = {400: "Malformed request body.", 401: "Missing or wrong bearer token.", 404: "No such round.",
               403: "A seeded round, which this server refuses (it was not started with --insecure-testing-seeds).",
               409: "The round's state does not allow this, or the privacy budget refuses it.",
               413: "Request body over the size limit, or an opt-in token's upload quota exceeded.",
               415: "Unsupported content type.",
               422: "Invalid parameters or data (the message names the field, the value and the fix).",
               503: "The database is unavailable."}


# ----- errors -----------------------------------------------------------------------------------
def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape of the API."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


async def _hybriddp_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HybridDPError)
    status, body, headers = error_payload(exc)
    return JSONResponse(body, status_code=status, headers=headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errs = exc.errors()
    if errs and errs[0].get("type") == "json_invalid":
        where = errs[0].get("loc", ("body", "?"))[-1]
        why = (errs[0].get("ctx") or {}).get("error", "JSON decode error")
        return error_response(400, "malformed_body", f"the body is not valid JSON ({why} at position {where}); send "
                                                     "a JSON object as the endpoint's schema in /openapi.json says")
    return error_response(422, "invalid_request", _describe_errors(errs) + ". See /openapi.json for the schema")


def _describe_errors(errs: Any) -> str:
    """Pydantic's errors in one line: field, problem, the value given."""
    parts = []
    for e in list(errs)[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        got = "" if e.get("type") == "missing" else f" (got {json.dumps(e.get('input'), default=str)[:60]})"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}{got}")
    more = f"; and {len(errs) - 5} more" if len(errs) > 5 else ""
    return "; ".join(parts) + more


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type"}


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 304:
        return Response(status_code=304, headers=exc.headers)
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail, default=str)
    if exc.status_code == 404 and detail == "Not Found":
        detail = "no such endpoint; see /openapi.json or /docs for the API"
    return error_response(exc.status_code, _HTTP_CODES.get(exc.status_code, "http_error"), detail, exc.headers)


async def _disconnected(_request: Request, _exc: Exception) -> Response:
    """The client went away mid-request: nothing to answer, nothing was stored, nothing to log."""
    return Response(status_code=400)


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error", exc_info=exc)
    return error_response(500, "internal_error", "an unexpected server error; it was logged")


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, plus the models of the bodies that routes read themselves (opt-in uploads)."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (m.OptinUploadIn,):
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(js.pop("$defs", {}))
            components[model.__name__] = js
    return app.openapi_schema


# ----- the app ----------------------------------------------------------------------------------
class ServiceApp(FastAPI):
    """The FastAPI app, with device reports (the hot path) served ahead of FastAPI's machinery."""

    def __init__(self, reports: ReportsEndpoint, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reports = reports

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        round_id = self.reports.round_of(scope)
        if round_id is None:
            await super().__call__(scope, receive, send)
        else:
            await self.reports(round_id, scope, receive, send)


def create_app(db_url: str, admin_token: str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               lifetime_epsilon: float | None = None, lifetime_delta: float | None = None,
               check_workers: int = DEFAULT_CHECK_WORKERS, recover: bool = True, allow_seeds: bool = False,
               optin_max_records: int = DEFAULT_OPTIN_MAX_RECORDS,
               optin_max_bytes: int = DEFAULT_OPTIN_MAX_BYTES) -> FastAPI:
    """The service on the database at ``db_url`` (migrated to the newest schema on the way).

    ``admin_token``: the administrators' bearer token (at least 16 characters).
    ``lifetime_epsilon``/``lifetime_delta``: the opt-in users' lifetime budget of a new database
    (an existing one keeps its own). ``check_workers``: processes that parse and check large report
    bodies (0: a thread of the server process does). ``recover``: finish what a stopped server
    left mid-step (:func:`hybriddp.service.rounds.recover`) first. ``allow_seeds``: take seeded
    (experiment) rounds, which give no privacy (``hybriddp serve --insecure-testing-seeds``); refused
    otherwise. ``optin_max_records``/``optin_max_bytes``: each opt-in token's upload quota per round.
    Raw opt-in data past a round's retention deadline are purged every :data:`PURGE_INTERVAL_S`.
    ``app.state.store`` is the :class:`Store`; it is closed when the app shuts down.
    """
    if not isinstance(admin_token, str) or len(admin_token.strip()) < MIN_ADMIN_TOKEN:
        raise parameter_error("admin token", "<hidden>", f"at least {MIN_ADMIN_TOKEN} characters",
                              "Leave out --admin-token-file and `hybriddp serve` generates a random one.")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1024:
        raise parameter_error("max body bytes (--max-body-bytes)", max_body_bytes, "an integer >= 1024")
    store = Store(db_url, lifetime_epsilon=lifetime_epsilon, lifetime_delta=lifetime_delta,
                  optin_max_records=optin_max_records, optin_max_bytes=optin_max_bytes)
    try:
        if recover:  # `serve --workers N` recovers once, before its workers start
            rounds.recover(store)
    except BaseException:
        store.close()
        raise
    token = admin_token.strip().encode("utf-8")
    metrics = Metrics()
    writer = ReportWriter(store, metrics=metrics)
    pool = CheckPool(check_workers) if check_workers > 0 else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        purger = asyncio.create_task(_purge_periodically(store))
        yield
        purger.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await purger
        writer.close()
        if pool is not None:
            pool.close()
        store.close()

    app = ServiceApp(ReportsEndpoint(store, writer, pool, metrics, max_body_bytes),
                     title="hybriddp collection service", version=__version__, lifespan=lifespan,
                     docs_url=None, redoc_url=None,  # /docs is served from local files (pages.mount_api_docs)
                     description="BLENDER (hybrid-model differential privacy) and hybrid mean-estimation rounds: "
                                 "opt-in uploads, head lists, device reports, results. Errors are "
                                 '`{"error": {"code", "message"}}`.')
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.state.store = store
    app.state.metrics = metrics
    app.state.writer = writer
    app.add_exception_handler(HybridDPError, _hybriddp_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _disconnected)
    app.add_exception_handler(Exception, _unexpected)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(LatencyMiddleware, metrics=metrics)

    def require_admin(creds: Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)]) -> None:
        given = creds.credentials.encode("utf-8", "surrogateescape") if creds is not None else b""
        if not hmac.compare_digest(given, token):
            raise UnauthorizedError("this endpoint needs the administrator token: Authorization: Bearer <token> "
                                    "(hybriddp serve printed where the token file is)")

    admin = [Depends(require_admin)]

    def out(info: RoundInfo) -> dict[str, Any]:
        return info.to_json(admin=True)

    def is_admin(creds: HTTPAuthorizationCredentials | None) -> bool:
        given = creds.credentials.encode("utf-8", "surrogateescape") if creds is not None else b""
        return hmac.compare_digest(given, token)

    @app.get("/health", response_model=m.HealthOut, tags=["service"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse, tags=["service"],
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **_errors(503)})
    def get_metrics() -> PlainTextResponse:
        text = metrics.render(store.state_counts(), ROUND_STATES)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/api/v1/rounds", status_code=201, response_model=m.RoundOut, dependencies=admin, tags=["rounds"],
              responses=_errors(400, 401, 403, 413, 422, 503))
    def create_round(body: m.CreateRoundIn) -> dict[str, Any]:
        params = rounds.validate_params(body.kind, body.params.model_dump(exclude_unset=True))
        if params.get("seed") is not None and not allow_seeds:
            raise SeedRefusedError(f"params.seed = {params['seed']}: a seeded round gives no privacy (anyone who knows "
                                   "the seed can regenerate its noise), so this server refuses it; leave the seed out "
                                   f"(production), or start a test server with hybriddp serve {SEEDS_FLAG}")
        return out(store.create_round(body.kind, body.name, params, retention_hours=body.retention_hours))

    @app.get("/api/v1/rounds", response_model=m.RoundListOut, dependencies=admin, tags=["rounds"],
             responses=_errors(401, 503))
    def list_rounds() -> dict[str, Any]:
        return {"rounds": [out(r) for r in store.rounds()]}

    @app.get("/api/v1/rounds/{round_id}", response_model=m.RoundOut, tags=["rounds"], responses=_errors(404, 503))
    def get_round(round_id: RoundId,
                  creds: Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)]) -> dict[str, Any]:
        return store.round(round_id).to_json(admin=is_admin(creds))

    @app.post("/api/v1/rounds/{round_id}/abort", response_model=m.RoundOut, dependencies=admin, tags=["rounds"],
              responses=_errors(401, 404, 409, 503))
    def abort(round_id: RoundId) -> dict[str, Any]:
        """End a round that is collecting opt-in data: its raw opt-in data are deleted, nothing is charged."""
        return out(store.abort(round_id))

    @app.delete("/api/v1/rounds/{round_id}", response_model=m.RoundOut, dependencies=admin, tags=["rounds"],
                responses=_errors(401, 404, 409, 503))
    def delete_round(round_id: RoundId) -> dict[str, Any]:
        """Delete a round's raw opt-in data, tokens, reports, documents and results; its ledger charges stay."""
        return out(store.delete_round(round_id))

    @app.get("/api/v1/ledger", response_model=m.LedgerOut, dependencies=admin, tags=["rounds"],
             responses=_errors(401, 503))
    def get_ledger() -> dict[str, Any]:
        """The privacy ledger: per-round totals and per-pseudonym spend (HMAC pseudonyms, never identities)."""
        from hybriddp.service.ledger_view import service_ledger
        return store.read(service_ledger)

    @app.post("/api/v1/rounds/{round_id}/optin/enrol", status_code=201, response_model=m.TokenOut | m.TokensOut,
              dependencies=admin, tags=["opt-in"], responses=_errors(400, 401, 404, 409, 413, 422, 503))
    def enrol(round_id: RoundId, body: m.EnrolIn) -> dict[str, Any]:
        if (body.user is None) == (body.users is None):
            raise DataError('give one user {"user": "..."} or several {"users": ["...", ...]}, not both or neither')
        if body.user is not None:
            return {"token": store.enrol(round_id, body.user)}
        return {"tokens": store.enrol_many(round_id, body.users or [])}

    @app.post("/api/v1/rounds/{round_id}/optin/records", response_model=m.AcceptedOut, tags=["opt-in"],
              openapi_extra={"requestBody": m.OPTIN_BODY}, responses=_errors(400, 401, 404, 409, 413, 415, 422, 503))
    async def upload(round_id: RoundId, request: Request,
                     creds: Annotated[HTTPAuthorizationCredentials | None, Security(optin_bearer)]) -> dict[str, int]:
        body = await read_body(request.receive, max_body_bytes)
        token = None if creds is None else creds.credentials
        ack = await run_in_threadpool(_upload, store, round_id, body, request.headers.get("content-type"), token)
        return {"accepted": ack.accepted, "duplicates": ack.duplicates}

    @app.post("/api/v1/rounds/{round_id}/headlist", response_model=m.RoundOut, dependencies=admin,
              tags=["curator"], responses=_errors(400, 401, 404, 409, 413, 422, 503))
    def publish(round_id: RoundId, body: m.PublishIn | None = None) -> dict[str, Any]:
        vocabulary = None if body is None or body.vocabulary is None else body.vocabulary.model_dump()
        return out(rounds.publish_headlist(store, round_id, vocabulary))

    @app.get("/api/v1/rounds/{round_id}/headlist", response_model=m.HeadListOut, tags=["devices"],
             responses={304: {"description": "Not modified (If-None-Match matched the ETag)."},
                        **_errors(404, 409, 503)})
    def get_headlist(round_id: RoundId, request: Request) -> Response:
        docs = store.documents(round_id)
        if docs.headlist is None:
            raise ConflictError(f"round {round_id} has no head list yet: it is {docs.info.state!r}; the "
                                "administrator publishes it with POST /api/v1/rounds/{id}/headlist")
        etag = f'"{docs.info.headlist_hash}"'
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        match = request.headers.get("if-none-match")
        if match is not None and (match.strip() == "*" or etag in [t.strip().removeprefix("W/")
                                                                  for t in match.split(",")]):
            return Response(status_code=304, headers=headers)
        return Response(docs.headlist, media_type="application/json", headers=headers)

    @app.post("/api/v1/rounds/{round_id}/reports", response_model=m.ReportAckOut, tags=["devices"],
              openapi_extra={"requestBody": m.REPORTS_BODY},
              responses=_errors(400, 404, 409, 413, 415, 422, 503))
    async def post_reports(round_id: RoundId, request: Request) -> dict[str, int]:
        # Requests are served by ReportsEndpoint in front of the app; this route documents the endpoint.
        body = await read_body(request.receive, max_body_bytes)
        return await accept_reports(store, writer, pool, metrics, round_id, body,
                                    request.headers.get("content-type"))

    @app.post("/api/v1/rounds/{round_id}/close", response_model=m.RoundOut, dependencies=admin, tags=["rounds"],
              responses=_errors(401, 404, 409, 413, 422, 503))
    def close(round_id: RoundId) -> dict[str, Any]:
        return out(rounds.close_round(store, round_id))

    @app.get("/api/v1/rounds/{round_id}/results", tags=["results"],
             responses={200: {"description": "The results: JSON (everything), or the records table as CSV or "
                                             "Parquet.",
                              "content": {"application/json": {"schema": {"type": "object"}},
                                          "text/csv": {"schema": {"type": "string"}},
                                          "application/vnd.apache.parquet": {
                                              "schema": {"type": "string", "format": "binary"}}}},
                        **_errors(404, 409, 422, 503)})
    def get_results(round_id: RoundId, format: Literal["json", "csv", "parquet"] = Query("json")) -> Response:
        info, results, result = rounds.result_of(store, round_id)
        if format == "json":
            return JSONResponse(results)
        table = rounds.results_table(results, result)
        buf = io.BytesIO()
        if format == "csv":
            import pyarrow.csv as pacsv
            pacsv.write_csv(table, buf)
            media = "text/csv"
        else:
            import pyarrow.parquet as pq
            pq.write_table(table, buf)
            media = "application/vnd.apache.parquet"
        name = f"hybriddp-round-{info.id}.{format}"
        return Response(buf.getvalue(), media_type=media,
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @app.get("/api/v1/rounds/{round_id}/release", response_model=m.ReleaseOut, tags=["results"],
             responses=_errors(404, 409, 503))
    def get_release(round_id: RoundId) -> dict[str, Any]:
        return rounds.release_of(store, round_id)

    @app.get("/api/v1/rounds/{round_id}/local-search", response_model=m.LocalSearchOut, tags=["results"],
             responses=_errors(404, 409, 503))
    def get_local_search(round_id: RoundId) -> dict[str, Any]:
        info, _, result = rounds.result_of(store, round_id)
        if result is None:
            raise NotFoundError(f"round {round_id} is a mean round; only BLENDER rounds have a local-search document")
        return rounds.local_search(info, result)

    pages.mount(app, store)
    return app


async def _purge_periodically(store: Store) -> None:
    """Purge raw opt-in data past their retention deadline every :data:`PURGE_INTERVAL_S` seconds."""
    while True:
        await asyncio.sleep(PURGE_INTERVAL_S)
        try:
            await run_in_threadpool(store.purge_expired)
        except HybridDPError as exc:  # the database was unavailable: try again next time
            logger.error("purging raw opt-in data past their retention deadline failed: %s", exc)


def _upload(store: Store, round_id: str, body: bytes, content_type: str | None, token: str | None) -> UploadAck:
    """An opt-in upload: one user's JSON (token in the Authorization header) or NDJSON, one user a line.

    Each user's upload is idempotent (its ``upload_id``, or else its records, make its key) and counts
    against the token's quota with its JSON bytes."""
    media = media_type(content_type)
    if media in NDJSON_TYPES:
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
    if media != "application/json" and not media.endswith("+json"):
        raise UnsupportedMediaTypeError(f"Content-Type {media!r} is not taken; send application/json (one user, "
                                        "token in the Authorization header) or application/x-ndjson (one user a line)")
    upload = _validated(m.OptinUploadIn, loads(body_text(body), "the body"), "the body")
    if token is None:
        raise UnauthorizedError("opt-in uploads need the user's token: Authorization: Bearer <token from "
                                "POST /api/v1/rounds/{id}/optin/enrol> (or an NDJSON body with a token on each line)")
    info, (user,) = store.optin_users(round_id, [token])
    if user is None:
        _not_collecting(info)
        raise UnauthorizedError(f"this token is not an opt-in token of round {round_id}; use the token issued when "
                                "the user enrolled in this round")
    items = _upload_items(info, upload, "")
    return store.add_optin_batch(info, [OptinUpload(user, items, store.upload_key(upload.upload_id, items), len(body))])


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
        raise DataError(f"{where}: {_describe_errors(exc.errors())}") from None

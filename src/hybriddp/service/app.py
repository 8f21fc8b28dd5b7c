"""The collection service's HTTP API (FastAPI): rounds, opt-in uploads, head lists, reports, results.

:func:`create_app` opens the database (running its migrations), finishes what a stopped server
left mid-step, and returns the app; its routes are the routers of :mod:`hybriddp.service.routers`, one per
resource. Every error a client can cause is a 4xx JSON body ``{"error": {"code": ..., "message": ...}}``;
a 5xx means a bug or an unusable database. Administrator endpoints need ``Authorization: Bearer <admin
token>`` (constant-time comparison); opt-in uploads need the opt-in user's own token. Nothing identifying
the sender (address, user agent, time) is stored with a report.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from hybriddp.core.errors import HybridDPError, parameter_error
from hybriddp.core.version import __version__
from hybriddp.service import closing, pages
from hybriddp.service import models as m
from hybriddp.service.admission import Admission, CredentialAdmission
from hybriddp.service.bodies import BodyLimit
from hybriddp.service.checkpool import DEFAULT_CHECK_WORKERS, CheckPool
from hybriddp.service.errors import cut_message, describe_errors, error_payload
from hybriddp.service.guard import Guard
from hybriddp.service.metrics import LatencyMiddleware, Metrics
from hybriddp.service.reports import ReportsEndpoint
from hybriddp.service.routers import ROUTERS
from hybriddp.service.routers.common import ServiceContext
from hybriddp.service.routers.ohttp import GatewayEndpoint
from hybriddp.service.routers.optin import OptinUploadEndpoint
from hybriddp.service.series import DEFAULT_TICK_SECONDS, advance_all
from hybriddp.service.store import DEFAULT_OPTIN_MAX_BYTES, DEFAULT_OPTIN_MAX_RECORDS, Store
from hybriddp.service.writer import OptinWriter, ReportWriter

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body accepted (16 MiB); larger ones get 413."""
MIN_ADMIN_TOKEN = 16
PURGE_INTERVAL_S = 60.0
"""Seconds between two passes that purge raw opt-in data past their round's retention deadline."""
SHUTDOWN_TASK_WAIT_S = 1.0
"""Seconds the app's shutdown waits for a purge or scheduler pass running in a thread before it closes the report
writer (which stores what is queued) anyway: a pass stuck behind a lock must not hold the shutdown."""
PURGE_BACKOFF_S = 0.1
"""Pause before a purge pass that found a due round locked by another transaction is run again; it doubles at each
retry up to :data:`PURGE_BACKOFF_MAX_S`, and the retries go on until the round is purged (PRIVACY.md)."""
PURGE_BACKOFF_MAX_S = 1.0
"""Longest pause between two retries of a purge pass that found a due round locked."""


# ----- errors -----------------------------------------------------------------------------------
def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape of the API."""
    return JSONResponse({"error": {"code": code, "message": cut_message(message)}}, status_code=status,
                        headers=headers)


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
    return error_response(422, "invalid_request", describe_errors(errs) + ". See /openapi.json for the schema")


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 408: "body_timeout", 413: "body_too_large", 415: "unsupported_media_type"}


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
    """The FastAPI app, with the hot paths served ahead of FastAPI's machinery (behind the guard, as every request).

    ``POST /api/v1/rounds/{id}/reports`` goes to :class:`~hybriddp.service.reports.ReportsEndpoint` while
    :attr:`divert_reports` is True, and ``POST /ohttp`` (the OHTTP gateway, a relay's every request) to
    :class:`~hybriddp.service.routers.ohttp.GatewayEndpoint` while :attr:`divert_ohttp` is True, and
    ``POST /api/v1/rounds/{id}/optin/records`` to :class:`~hybriddp.service.routers.optin.OptinUploadEndpoint` while
    :attr:`divert_optin` is True (all always, in a running service); turned off, the request reaches the declared
    route of :mod:`hybriddp.service.routers.devices`, :mod:`hybriddp.service.routers.ohttp` or
    :mod:`hybriddp.service.routers.optin`, which answers through the same code.
    """

    def __init__(self, reports: ReportsEndpoint, gateway: GatewayEndpoint, guard: Guard,
                 optin: OptinUploadEndpoint | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reports = reports
        self.gateway = gateway
        self.optin = optin
        self.guard = guard
        self.divert_reports = True
        self.divert_ohttp = True
        self.divert_optin = optin is not None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.guard(self._serve, scope, receive, send)  # cross-site refusals, CORS, security headers

    async def _serve(self, scope: Any, receive: Any, send: Any) -> None:
        round_id = self.reports.round_of(scope) if self.divert_reports else None
        if round_id is not None:
            await self.reports(round_id, scope, receive, send)
        elif self.divert_ohttp and self.gateway.matches(scope):
            await self.gateway(self, scope, receive, send)  # its inner request comes back in through __call__
        elif self.divert_optin and self.optin is not None and (optin_round := self.optin.round_of(scope)):
            await self.optin(optin_round, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(db_url: str, admin_token: str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               lifetime_epsilon: float | None = None, lifetime_delta: float | None = None,
               check_workers: int = DEFAULT_CHECK_WORKERS, recover: bool = True, allow_seeds: bool = False,
               optin_max_records: int = DEFAULT_OPTIN_MAX_RECORDS,
               optin_max_bytes: int = DEFAULT_OPTIN_MAX_BYTES, cors_origins: Sequence[str] = (),
               public_metrics: bool = False, private_round_details: bool = False, open_admission: bool = False,
               admission: Admission | None = None, self_enrolment: bool = False,
               warm_check_workers: bool = False, series_tick: float = DEFAULT_TICK_SECONDS) -> FastAPI:
    """The service on the database at ``db_url`` (migrated to the newest schema on the way).

    ``admin_token``: the administrators' bearer token (at least 16 characters).
    ``lifetime_epsilon``/``lifetime_delta``: the opt-in users' lifetime budget of a new database
    (an existing one keeps its own). ``check_workers``: processes that parse and check large report
    bodies (0: a thread of the server process does). ``recover``: finish what a stopped server
    left mid-step (:func:`hybriddp.service.closing.recover`) first. ``allow_seeds``: take seeded
    (experiment) rounds, which give no privacy (``hybriddp serve --insecure-testing-seeds``); refused
    otherwise. ``optin_max_records``/``optin_max_bytes``: each opt-in token's upload quota per round.
    Raw opt-in data past a round's retention deadline are purged at start-up and every :data:`PURGE_INTERVAL_S`;
    a round locked by another transaction is retried every :data:`PURGE_BACKOFF_MAX_S` at most until it is.
    ``cors_origins``: other origins whose pages may call the API (:mod:`hybriddp.service.guard`; none by default).
    ``public_metrics``: serve ``/metrics`` without the admin token (off by default).
    ``private_round_details``: ``GET /api/v1/rounds/{id}`` only with the admin token (off by default: the round page
    shows it to anyone).
    ``open_admission``: take device reports without report tokens (UNSAFE: anyone who reaches the server may
    report, as often as it likes; demos only). Otherwise every report needs a token (docs/TOKENS.md), issued to
    callers ``admission`` admits (default: :class:`~hybriddp.service.admission.CredentialAdmission`, the
    administrator's device credentials). ``self_enrolment``: anyone may get a device credential (demos).
    ``warm_check_workers``: start the report-check processes at start-up instead of with the first large body
    (``hybriddp serve`` does: a restarted server under load then checks at once).
    ``series_tick``: seconds between two runs of the round series' scheduler
    (:func:`hybriddp.service.series.advance_all`; 0: none, an operator's cron calls ``POST
    /api/v1/series/{id}/advance`` instead).
    ``app.state.store`` is the :class:`Store`; it is closed when the app shuts down.
    """
    if not isinstance(admin_token, str) or len(admin_token.strip()) < MIN_ADMIN_TOKEN:
        raise parameter_error("admin token", "<hidden>", f"at least {MIN_ADMIN_TOKEN} characters",
                              "Leave out --admin-token-file and `hybriddp serve` generates a random one.")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1024:
        raise parameter_error("max body bytes (--max-body-bytes)", max_body_bytes, "an integer >= 1024")
    if not (isinstance(series_tick, (int, float)) and series_tick >= 0):
        raise parameter_error("series tick (--series-tick)", series_tick, "a number of seconds >= 0 (0: no scheduler)")
    if open_admission and admission is not None:
        raise parameter_error("admission", admission, "no admission with open_admission (reports need no token)")
    guard = Guard(cors_origins)  # a bad origin is refused by name
    store = Store(db_url, lifetime_epsilon=lifetime_epsilon, lifetime_delta=lifetime_delta,
                  optin_max_records=optin_max_records, optin_max_bytes=optin_max_bytes)
    try:
        if recover:  # `serve --workers N` recovers once, before its workers start
            closing.recover(store)
        store.gateway_key()  # the OHTTP gateway's key pair: made at first start, kept in the database (spec-v2 §4)
    except BaseException:
        store.close()
        raise
    metrics = Metrics()
    service = ServiceContext(store, ReportWriter(store, metrics=metrics),
                             CheckPool(check_workers) if check_workers > 0 else None, metrics,
                             admin_token.strip().encode("utf-8"), max_body_bytes, allow_seeds, public_metrics,
                             private_round_details, None if open_admission else admission or CredentialAdmission(),
                             self_enrolment, OptinWriter(store))
    app = ServiceApp(ReportsEndpoint(store, service.writer, service.pool, metrics, max_body_bytes,
                                     service.admission is not None), GatewayEndpoint(store, metrics, max_body_bytes),
                     guard, optin=OptinUploadEndpoint(store, metrics, max_body_bytes, service.optin_writer),
                     title="hybriddp collection service", version=__version__,
                     lifespan=_lifespan(service, warm_check_workers, series_tick),
                     docs_url=None, redoc_url=None,  # /docs is served from local files (pages.mount_api_docs)
                     description="BLENDER (hybrid-model differential privacy) and hybrid mean-estimation rounds: "
                                 "opt-in uploads, head lists, device reports, results. Errors are "
                                 '`{"error": {"code", "message"}}`.')
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.state.service = service
    app.state.store = store
    app.state.metrics = metrics
    app.state.writer = service.writer
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(LatencyMiddleware, metrics=metrics)
    for router in ROUTERS:
        app.include_router(router)
    pages.mount(app, store)
    return app


def _lifespan(service: ServiceContext, warm_check_workers: bool, series_tick: float) -> Any:
    """The app's start-up and shut-down: the periodic purge of raw opt-in data and run of the series' scheduler, the
    check workers started ahead (``warm_check_workers``), and at the end the writer, the workers and the store
    closed."""
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        purger = asyncio.create_task(_periodically(PURGE_INTERVAL_S, service.store.purge_expired, "purging raw "
                                                   "opt-in data past their retention deadline", wait_first=False,
                                                   pending=lambda: service.store.purge_pending))
        scheduler = (asyncio.create_task(_periodically(series_tick, lambda: _advance_and_log(service.store),
                                                       "advancing the round series", wait_first=False))
                     if series_tick > 0 else None)
        if warm_check_workers and service.pool is not None:  # now, not under the first large body
            asyncio.get_running_loop().run_in_executor(None, service.pool.warm).add_done_callback(_warmed)
        yield
        tasks = [t for t in (purger, scheduler) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=SHUTDOWN_TASK_WAIT_S)  # a pass running in a thread cannot be interrupted
        service.writer.close()
        if service.optin_writer is not None:
            service.optin_writer.close()
        if service.pool is not None:
            service.pool.close()
        service.store.close()
    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as the API's one JSON shape (module docstring)."""
    app.add_exception_handler(HybridDPError, _hybriddp_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _disconnected)
    app.add_exception_handler(Exception, _unexpected)


def _warmed(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:  # e.g. the server stopped while they started
        logger.info("the report-check workers did not start ahead (%s); they start with the first large body",
                    done.exception())


def _advance_and_log(store: Store) -> None:
    """:func:`advance_all`, each action logged (the round series' scheduler, docs/SERIES.md)."""
    for line in advance_all(store):
        logger.info("series: %s", line)


async def _periodically(seconds: float, job: Callable[[], object], what: str, *, wait_first: bool,
                        pending: Callable[[], Sequence[str]] | None = None) -> None:
    """Run ``job`` in a worker thread every ``seconds`` (the first time at once unless ``wait_first``); a failure is
    logged and the job tried again next time: a bug in one pass must not stop the purge or the scheduler for good.
    While ``pending()`` names what a run left undone because another transaction held it (the purge's locked rounds,
    :attr:`~hybriddp.service.store.rounds.RoundStore.purge_pending`), the next run comes after a backoff of
    :data:`PURGE_BACKOFF_S` doubling up to :data:`PURGE_BACKOFF_MAX_S` instead, until nothing is left."""
    if wait_first:
        await asyncio.sleep(seconds)
    retries = 0
    while True:
        try:
            await run_in_threadpool(job)
        except HybridDPError as exc:  # the database was unavailable: try again next time
            logger.error("%s failed: %s", what, exc)
        except Exception:  # anything else is a bug: its traceback in the log, and the loop goes on
            logger.exception("%s failed", what)
        left = pending() if pending is not None else ()
        if left:
            if retries == 0:
                logger.warning("%s: round(s) %s held by another transaction; retrying every %g s at most until "
                               "done", what, ", ".join(left), PURGE_BACKOFF_MAX_S)
            await asyncio.sleep(min(PURGE_BACKOFF_S * 2.0 ** min(retries, 30), PURGE_BACKOFF_MAX_S))
            retries += 1
            continue
        if retries:
            logger.warning("%s: done after %d retries", what, retries)
            retries = 0
        await asyncio.sleep(seconds)

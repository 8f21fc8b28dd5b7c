"""The Oblivious HTTP gateway (RFC 9458; spec-v2 §4): the service's end of a relay that hides a device's address.

* ``GET /ohttp-keys``: the gateway's key configurations (RFC 9458 §3.2, ``application/ohttp-keys``), cacheable.
* ``POST /ohttp``: an encapsulated request (RFC 9458 §4.3, ``message/ohttp-req``) → an encapsulated response
  (§4.4, ``message/ohttp-res``). The inner request is binary HTTP (RFC 9292 §3, known-length form).

Guarantees. The inner request is served by this same app, in process, with no client address: its ASGI scope's
``client`` is None whatever connection brought the outer request (the relay's), so nothing the service does can
read a device's address from it. Only the device routes of spec §4 are forwarded (:data:`FORWARDED`: a round's
details, head list and token key; token issuance; reports); any other inner request, this endpoint included (no
nesting), is answered with an encapsulated 404. An inner body obeys the service's body limit (413, encapsulated).
Once the outer request is decapsulated the answer is always 200 with the inner response (status, headers, body)
encapsulated in it; an outer request that is not ``message/ohttp-req`` gets 415, one that is malformed, names
another key or does not decrypt gets 400 (RFC 9458 §5.2), in the API's JSON error shape, unencrypted.

``POST /ohttp`` is a hot path (every report of a device behind a relay): :class:`GatewayEndpoint` serves it as a
plain ASGI handler, which :class:`hybriddp.service.app.ServiceApp` hands such requests to ahead of FastAPI's
middleware, routing and dependencies (as it does direct reports, :mod:`hybriddp.service.reports`), after the guard
(:mod:`hybriddp.service.guard`: cross-site refusals and security headers apply to the outer request as to any
other). The FastAPI route declared here states the endpoint in the OpenAPI document and answers only when the app's
``divert_ohttp`` is off, through the same :func:`answer`, so both give the same answers. An inner
``POST .../reports`` (nearly every inner request) is answered by
:meth:`hybriddp.service.reports.ReportsEndpoint.answer` with the guard's refusal and headers, without an ASGI
request built for it: what the reports code gets is the round id, the body and its Content-Type. Every other inner
request is dispatched to the app's own entry, guard included.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any
from urllib.parse import unquote

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from hybriddp.core import bhttp, ohttp
from hybriddp.core.errors import DataError, HybridDPError
from hybriddp.core.ohttp import KEYS_MEDIA_TYPE, REQUEST_MEDIA_TYPE, RESPONSE_MEDIA_TYPE
from hybriddp.core.protocol import ID_PATTERN
from hybriddp.service.bodies import body_too_large, check_content_length, media_type, read_body
from hybriddp.service.errors import ServiceError, UnsupportedMediaTypeError, cut_message, error_payload
from hybriddp.service.guard import with_security_headers
from hybriddp.service.metrics import Metrics
from hybriddp.service.routers.common import Service, StoreDep, errors
from hybriddp.service.store import Store

logger = logging.getLogger(__name__)

router = APIRouter(tags=["ohttp"])

KEYS_MAX_AGE_S = 3600
"""Seconds clients and relays may cache ``GET /ohttp-keys`` (the key is server-wide and kept)."""

FORWARDED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("GET", re.compile(rf"/api/v1/rounds/{ID_PATTERN}")),
    ("GET", re.compile(rf"/api/v1/rounds/{ID_PATTERN}/headlist")),
    ("GET", re.compile(rf"/api/v1/rounds/{ID_PATTERN}/token-key")),
    ("POST", re.compile(rf"/api/v1/rounds/{ID_PATTERN}/tokens")),
    ("POST", re.compile(rf"/api/v1/rounds/{ID_PATTERN}/reports")),
)
"""(method, path) of the inner requests the gateway serves (spec-v2 §4); every other one gets a 404."""

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                        "upgrade", "proxy-authenticate", "proxy-authorization", "host", "content-length"})
"""Header fields not carried between the inner message and the in-process request or response (RFC 9110 §7.6.1;
Host and Content-Length are rebuilt from the message's authority and content, RFC 9292 §3)."""

MIN_REQUEST_BYTES = 7 + 65 + 16
"""The shortest encapsulated request: header (7), ``enc`` (65, an uncompressed P-256 point), AEAD tag (16)."""

Answer = tuple[int, list[tuple[str, str]], bytes]
"""An inner response: (status, header fields, body)."""


class OhttpRequestError(ServiceError):
    """An encapsulated request that cannot be decapsulated (malformed, another key or suite, or tampered)."""

    status = 400
    code = "ohttp_undecryptable"


class OhttpKeyError(OhttpRequestError):
    """An encapsulated request for a key configuration this gateway does not have (RFC 9458 §5.3): the client
    fetches ``/ohttp-keys`` again."""

    code = "ohttp_key"


_BINARY = {"schema": {"type": "string", "format": "binary"}}
_KEYS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The gateway's key configurations, each as a 2-byte length and an RFC 9458 §3.1 KeyConfig.",
          "content": {KEYS_MEDIA_TYPE: _BINARY}},
    **errors(503)}
_OHTTP_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The encapsulated inner response (RFC 9458 §4.4), whatever its status.",
          "content": {RESPONSE_MEDIA_TYPE: _BINARY}},
    **errors(400, 413, 415, 503)}
_OHTTP_BODY = {"requestBody": {"required": True, "description": "An encapsulated request (RFC 9458 §4.3) of a binary "
                               "HTTP request (RFC 9292 §3) for one of the device routes.",
                               "content": {REQUEST_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary",
                                                                           "minLength": MIN_REQUEST_BYTES}}}}}


@router.get("/ohttp-keys", response_class=Response, responses=_KEYS_RESPONSES)
def get_ohttp_keys(store: StoreDep) -> Response:
    """The gateway's key configurations (RFC 9458 §3.2): what a device encapsulates to, and what the head lists
    published since the gateway exists commit to (``ohttp_key``)."""
    body = ohttp.encode_key_configs([store.gateway_key().config])
    return Response(body, media_type=KEYS_MEDIA_TYPE, headers={"Cache-Control": f"public, max-age={KEYS_MAX_AGE_S}"})


@router.post("/ohttp", response_class=Response, responses=_OHTTP_RESPONSES, openapi_extra=_OHTTP_BODY)
async def post_ohttp(request: Request, service: Service) -> Response:
    """Decapsulate, serve the inner request in process (no client address; spec-v2 §4's routes only) and
    encapsulate its response (RFC 9458 §4.3-§4.4, module docstring).

    Documents :class:`GatewayEndpoint`'s endpoint; reached only when ``ServiceApp.divert_ohttp`` is off."""
    check_media(request.headers.get("content-type"))
    body = await read_body(request.receive, service.max_body_bytes)
    sealed = await answer(request.app, request.scope, service.store, body, service.max_body_bytes)
    return Response(sealed, media_type=RESPONSE_MEDIA_TYPE, headers={"Cache-Control": "no-store"})


def check_media(content_type: str | None) -> None:
    """:class:`UnsupportedMediaTypeError` (415) unless ``content_type`` is ``message/ohttp-req`` (parameters aside)."""
    media = media_type(content_type)
    if media != REQUEST_MEDIA_TYPE:
        raise UnsupportedMediaTypeError(f"Content-Type {media[:60]!r} is not taken; send an encapsulated request as "
                                        f"{REQUEST_MEDIA_TYPE} (RFC 9458 §4.3)")


async def answer(app: Any, outer: dict[str, Any], store: Store, body: bytes, limit: int) -> bytes:
    """The encapsulated response (RFC 9458 §4.4) to the encapsulated request ``body``, its inner request served by
    ``app`` (:func:`dispatch`; ``outer``: the outer request's ASGI scope, ``limit``: the inner body limit).

    :class:`OhttpKeyError` / :class:`OhttpRequestError` (400, unencrypted) when ``body`` is not for the gateway's
    key or does not decrypt; once it does, every outcome (an inner message that is not binary HTTP included) is an
    encapsulated inner response."""
    try:
        inner, context = ohttp.decapsulate_request(store.gateway_key(), body)
    except ohttp.UnknownKeyError as exc:
        raise OhttpKeyError(f"{exc}: fetch /ohttp-keys again") from None
    except DataError as exc:
        raise OhttpRequestError(f"the encapsulated request does not decrypt with this gateway's key ({exc}); it was "
                                "tampered with or made for another key: fetch /ohttp-keys again") from None
    try:
        req = bhttp.decode_request(inner)
    except DataError as exc:  # RFC 9458 §5.2: an inner message that does not decode is answered, encapsulated, 400
        status, headers, content = _error(400, "bad_request", f"the inner request is not binary HTTP (RFC 9292 "
                                                              f"§3, known-length): {exc}")
    else:
        status, headers, content = await dispatch(app, outer, req, limit)
    return context.seal_response(bhttp.encode_response(status, headers, content))


ROUTE = "/ohttp"
"""The gateway's path (and its latency metric's route label, as FastAPI names it)."""
_SEALED_HEADERS = ((b"content-type", RESPONSE_MEDIA_TYPE.encode()), (b"cache-control", b"no-store"))


class GatewayEndpoint:
    """Serves ``POST /ohttp`` ahead of FastAPI (module docstring): the answers of :func:`post_ohttp`, status for
    status and body for body (413 for an announced or streamed body over the limit, 400 for a Content-Length
    that is not a number, 415, 400 for what does not decapsulate, 408/503 of :func:`read_body`, 503 with an
    unusable database, 500 for a bug), at a fraction of its per-request cost."""

    def __init__(self, store: Store, metrics: Metrics, limit: int) -> None:
        self.store, self.metrics, self.limit = store, metrics, limit

    @staticmethod
    def matches(scope: Any) -> bool:
        """Whether ``scope`` is a ``POST /ohttp`` request."""
        return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == ROUTE

    async def __call__(self, app: Any, scope: Any, receive: Any, send: Any) -> None:
        """Serve the outer request ``scope``; its inner request goes to ``app`` (the service's own entry)."""
        start = time.perf_counter()
        try:
            raw = scope["headers"]
            check_content_length(raw, self.limit)  # first, as the BodyLimit middleware does on FastAPI's path
            check_media(next((v.decode("latin-1") for k, v in raw if k == b"content-type"), None))
            body = await read_body(receive, self.limit)
            status, payload = 200, await answer(app, scope, self.store, body, self.limit)
            headers = list(_SEALED_HEADERS)
        except ClientDisconnect:  # gone before its body arrived: FastAPI's path answers an empty 400 to no one
            status, payload, headers = 400, b"", []
        except HybridDPError as exc:
            status, out, extra = error_payload(exc)
            payload = orjson.dumps(out)
            headers = [(b"content-type", b"application/json")] + [(k.lower().encode(), v.encode())
                                                                  for k, v in extra.items()]
        except Exception as exc:  # a bug: logged, and the API's 500 shape
            logger.exception("unexpected error", exc_info=exc)
            status, payload = 500, orjson.dumps({"error": {"code": "internal_error", "message": "an unexpected "
                                                                                               "server error; it was "
                                                                                               "logged"}})
            headers = [(b"content-type", b"application/json")]
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        self.metrics.observe("POST", ROUTE, time.perf_counter() - start)


def _error(status: int, code: str, message: str) -> Answer:
    """An inner response in the API's one error shape."""
    body = orjson.dumps({"error": {"code": code, "message": cut_message(message)}})
    return status, [("content-type", "application/json")], body


def forwarded(method: str, path: str) -> bool:
    """Whether the gateway serves an inner ``method`` ``path`` (decoded, without the query; :data:`FORWARDED`)."""
    return any(method == m and p.fullmatch(path) for m, p in FORWARDED)


async def dispatch(app: Any, outer: dict[str, Any], req: bhttp.Request, limit: int) -> Answer:
    """Serve the decoded inner request ``req`` with ``app`` in process:
    (status, headers, body) of its response.

    Guarantee: the inner ASGI scope carries no client address (``client`` None) and none of the outer request's
    headers; only :func:`forwarded` routes are served (else 404), a body over ``limit`` bytes gets 413."""
    method = str(req.method).upper()
    target = str(req.path) or "/"
    raw_path, _, query = target.partition("?")
    path = unquote(raw_path)
    if not forwarded(method, path):
        return _error(404, "not_found", f"the OHTTP gateway does not forward {method} {path[:80]}; it serves a round's "
                                        "details, head list and token key (GET), token issuance and reports (POST)")
    content = bytes(req.content or b"")
    if len(content) > limit:
        return _error(413, "body_too_large", str(body_too_large(limit)))
    host = str(req.authority or "") or next((v.decode("latin-1") for k, v in outer.get("headers", []) if k == b"host"),
                                           "")
    try:
        headers = [(k.strip().lower().encode("latin-1"), v.strip().encode("latin-1")) for k, v in req.headers
                   if k.strip().lower() not in HOP_BY_HOP]
        headers.append((b"host", host.encode("latin-1")))
    except UnicodeEncodeError:
        return _error(400, "bad_request", "an inner header or the authority is not ISO-8859-1 text (RFC 9110 §5.5)")
    reports = getattr(app, "reports", None) if getattr(app, "divert_reports", False) else None
    round_id = reports.round_of({"type": "http", "method": method, "path": path}) if reports is not None else None
    if round_id is not None:  # a report, the gateway's every request: served without an ASGI round trip
        return await _report(app, reports, round_id, headers, content)
    if content or method == "POST":
        headers.append((b"content-length", str(len(content)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "scheme": str(req.scheme or outer.get("scheme", "http")), "path": path,
             "raw_path": raw_path.encode("latin-1"), "root_path": outer.get("root_path", ""),
             "query_string": query.encode("latin-1"), "headers": headers,
             "client": None,  # never the outer connection's address (spec-v2 §4)
             "server": outer.get("server"), "state": dict(outer.get("state") or {}), "extensions": {}}
    return await _serve(app, scope, content)


async def _report(app: Any, reports: Any, round_id: str, raw: list[tuple[bytes, bytes]], content: bytes) -> Answer:
    """The inner ``POST .../reports`` answered as the app's own entry answers it (the guard's refusal and headers,
    :meth:`hybriddp.service.reports.ReportsEndpoint.answer`), without building an ASGI request for it."""
    headers: dict[str, str] = {}
    for k, v in raw:
        headers.setdefault(k.decode("latin-1"), v.decode("latin-1"))
    refused = app.guard.refusal("POST", headers)
    if refused is not None:
        status, out, extra = refused[0], {"error": {"code": refused[1], "message": refused[2]}}, {}
        cors: list[tuple[bytes, bytes]] = []
    else:
        status, out, extra = await reports.answer(round_id, content, headers.get("content-type"))
        cors = app.guard.cors_headers(headers.get("origin"))
    raw_out = [(b"content-type", b"application/json"), *((k.lower().encode(), v.encode()) for k, v in extra.items())]
    return status, [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1"))
                    for k, v in with_security_headers(raw_out, cors)], orjson.dumps(out)


async def _serve(app: Any, scope: dict[str, Any], content: bytes) -> Answer:
    """Run ``app`` on ``scope`` with the body ``content``; its collected response."""
    done = asyncio.Event()
    sent_body = False
    start: dict[str, Any] | None = None
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": content, "more_body": False}
        await done.wait()  # the response is complete: the "client" goes away
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                done.set()

    try:
        await app(scope, receive, send)
    except Exception as exc:  # the app's own error handling answered, or it is a bug; never the outer request's
        if start is None:
            logger.exception("unexpected error serving an OHTTP inner request", exc_info=exc)
    finally:
        done.set()
    if start is None:
        return _error(500, "internal_error", "an unexpected server error; it was logged")
    headers = [(bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1")) for k, v in start.get("headers", [])]
    return int(start["status"]), [(k, v) for k, v in headers if k not in HOP_BY_HOP], b"".join(chunks)

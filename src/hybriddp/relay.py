"""The Oblivious HTTP relay (RFC 9458 §2, §7; spec-v2 §4): ``hybriddp relay``, run by a party other than the operator.

A device sends its encapsulated request (``message/ohttp-req``) to the relay; the relay forwards the bytes to the
service's gateway (``{target}/ohttp``) and returns the gateway's encapsulated answer. The relay sees the device's
address but not what it asks (HPKE, RFC 9180); the service sees what is asked but only the relay's address.

Guarantees (:func:`create_relay_app`):

* ``POST /ohttp`` forwards the body alone, with ``Content-Type`` (and the ``Host``/``Content-Length`` the
  transfer needs) as its only header fields: no client address, no ``Forwarded``/``X-Forwarded-For``, no
  ``User-Agent``, none of the device's headers. The answer is the gateway's status, ``Content-Type`` and body.
* ``batch_ms`` > 0: requests are held up to that many milliseconds and each held batch is forwarded, concurrently,
  in a uniformly random order (OS randomness), so the gateway cannot match arrival order at the relay to arrival
  order at the service within a batch (RFC 9458 §7.1 suggests such delays).
* A consistency mirror (spec-v2 §3.2): ``GET /api/v1/rounds/{id}/headlist`` and ``/token-key`` answer the
  target's document (status, body, ``ETag``, ``Content-Type``), fetched by the relay itself and kept
  ``mirror_ttl`` seconds, so every device behind the relay sees the same copy; concurrent misses share one fetch.
  ``GET /ohttp-keys`` is the target's key configurations, kept the same way.
* Nothing is stored or logged per request (run it with uvicorn's access log off, as ``hybriddp relay`` does).
* The target is reached over at most :data:`~hybriddp.forwarder.DEFAULT_CONNECTIONS` kept-alive HTTP/1.1
  connections (:class:`~hybriddp.forwarder.Forwarder`; TLS to an ``https`` target); ``timeout`` seconds bound each
  forward (else 502). The mirror's rare GETs use one :class:`httpx.AsyncClient`.

``POST /ohttp`` is served as a plain ASGI handler ahead of the Starlette routes (:class:`RelayApp`): the relay's
per-request cost is that of reading the body and forwarding it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hybriddp.core.errors import parameter_error
from hybriddp.core.ohttp import REQUEST_MEDIA_TYPE
from hybriddp.core.protocol import ID_PATTERN
from hybriddp.forwarder import Answer, Forwarder, TargetError

DEFAULT_PORT = 8081
DEFAULT_MIRROR_TTL_S = 60.0
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_BODY_SECONDS = 30.0
"""Seconds a device has to send a whole request body (408 beyond): a client that trickles a body cannot hold a
connection and its buffered bytes for longer."""
MIRROR_ENTRIES = 4096
"""Documents the mirror keeps at most (the oldest fetched is dropped first)."""

_MIRRORED = re.compile(rf"/api/v1/rounds/{ID_PATTERN}/(headlist|token-key)")
_KEPT_HEADERS = ("content-type", "etag")


def check_target(target: Any) -> str:
    """The gateway's service URL, ``http(s)://host[:port][/prefix]`` without a trailing slash; a
    :class:`~hybriddp.core.errors.ParameterError` naming ``--target`` otherwise."""
    ok = isinstance(target, str)
    if ok:
        parts = urlsplit(target.strip())
        ok = (parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment
              and not parts.username and not parts.password)
        if ok:
            try:
                parts.port  # noqa: B018  (raises on a port that is not a number in 0-65535)
            except ValueError:
                ok = False
    if not ok:
        raise parameter_error("relay target (--target)", target, "the http:// or https:// URL of the hybriddp "
                              "service whose OHTTP gateway the relay forwards to, such as https://dp.example.org")
    return str(target).strip().rstrip("/")


@dataclass
class _Held:
    """One request held for a batch: its body, and where its answer goes."""

    body: bytes
    answer: asyncio.Future[Answer] = field(repr=False)


@dataclass
class _Kept:
    """A mirrored document: the target's answer and when it was fetched (monotonic seconds)."""

    status: int
    headers: dict[str, str]
    body: bytes
    fetched: float


class Relay:
    """The relay's state: the forwarder and the client to the target, the batch being held, the mirror (module
    docstring).

    ``transport``: an :class:`httpx.AsyncBaseTransport` to reach the target with, for the forwarded requests too
    (tests); default: the network, the forwarded requests through :class:`~hybriddp.forwarder.Forwarder`.
    """

    def __init__(self, target: str, *, batch_ms: float = 0.0, mirror_ttl: float = DEFAULT_MIRROR_TTL_S,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, timeout: float = DEFAULT_TIMEOUT_S,
                 body_seconds: float = DEFAULT_BODY_SECONDS, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.target = check_target(target)
        for name, value, low in (("batch_ms (--batch-ms)", batch_ms, 0.0), ("mirror_ttl (--mirror-ttl)", mirror_ttl,
                                                                           0.0), ("timeout", timeout, 0.001),
                                 ("body_seconds (--body-timeout)", body_seconds, 0.001)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < float("inf"):
                raise parameter_error(name, value, f"a finite number >= {low:g}")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1024:
            raise parameter_error("max body bytes (--max-body-bytes)", max_body_bytes, "an integer >= 1024")
        self.batch_s = batch_ms / 1000.0
        self.mirror_ttl = float(mirror_ttl)
        self.max_body_bytes = max_body_bytes
        self.timeout = float(timeout)
        self.body_seconds = float(body_seconds)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._forwarder = None if transport is not None else Forwarder(f"{self.target}/ohttp", timeout=self.timeout)
        self._held: list[_Held] = []
        self._flush: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._mirror: dict[str, _Kept] = {}
        self._fetching: dict[str, asyncio.Future[_Kept]] = {}
        self._rng = secrets.SystemRandom()
        self.fetches = 0
        """Requests the mirror sent to the target (tests: a second GET within the TTL sends none)."""

    # ----- the client to the target -----
    @property
    def client(self) -> httpx.AsyncClient:
        """The pooled client to the target for the mirror (and, with a test ``transport``, the forwards), made on
        first use in the running event loop. Its only default header is ``Connection`` (hop-by-hop): no
        ``User-Agent``, ``Accept`` or ``Accept-Encoding``."""
        if self._client is None:
            client = httpx.AsyncClient(transport=self._transport, timeout=httpx.Timeout(self.timeout),
                                       follow_redirects=False, trust_env=False)
            for name in ("user-agent", "accept", "accept-encoding"):
                del client.headers[name]
            self._client = client
        return self._client

    async def aclose(self) -> None:
        """Close the forwarder's and the client's connections (the app's shutdown)."""
        if self._flush is not None:
            self._flush.cancel()
        if self._forwarder is not None:
            await self._forwarder.aclose()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ----- POST /ohttp -----
    async def forward(self, body: bytes) -> Answer:
        """The gateway's answer to ``body``, sent alone (batched and shuffled when ``batch_ms`` > 0);
        :class:`~hybriddp.forwarder.TargetError` or :class:`httpx.HTTPError` when there is none."""
        if self.batch_s <= 0:
            return await self._post(body)
        held = _Held(body, asyncio.get_running_loop().create_future())
        self._held.append(held)
        if self._flush is None:
            self._flush = asyncio.create_task(self._flush_later())
        return await held.answer

    async def _flush_later(self) -> None:
        """After the batch window: forward every held request, concurrently, in a uniformly random order."""
        await asyncio.sleep(self.batch_s)
        batch, self._held, self._flush = self._held, [], None
        self._rng.shuffle(batch)  # Fisher-Yates on OS randomness
        for held in batch:  # started in the shuffled order, each on its own task
            task = asyncio.create_task(self._answer(held))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, held: _Held) -> None:
        try:
            resp = await self._post(held.body)
        except Exception as exc:  # delivered to the waiting request, which answers 502
            if not held.answer.done():
                held.answer.set_exception(exc)
        else:
            if not held.answer.done():
                held.answer.set_result(resp)

    async def _post(self, body: bytes) -> Answer:
        if self._forwarder is not None:
            return await self._forwarder.post(body, REQUEST_MEDIA_TYPE)
        resp = await self.client.post(f"{self.target}/ohttp", content=body,
                                      headers={"content-type": REQUEST_MEDIA_TYPE})
        return Answer(resp.status_code, resp.headers.get("content-type"), resp.content)

    # ----- the mirror -----
    async def mirrored(self, path: str) -> _Kept:
        """The target's answer to ``GET {path}``, fetched at most once per ``mirror_ttl`` seconds (200 answers are
        kept; others are passed on as they are, unkept); concurrent misses share one fetch."""
        kept = self._mirror.get(path)
        if kept is not None and time.monotonic() - kept.fetched < self.mirror_ttl:
            return kept
        pending = self._fetching.get(path)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(path))
            self._fetching[path] = pending
            pending.add_done_callback(lambda _f: self._fetching.pop(path, None))
        return await asyncio.shield(pending)

    async def _fetch(self, path: str) -> _Kept:
        self.fetches += 1
        resp = await self.client.get(self.target + path)
        kept = _Kept(resp.status_code, {k: resp.headers[k] for k in _KEPT_HEADERS if k in resp.headers},
                     resp.content, time.monotonic())
        if resp.status_code == 200 and self.mirror_ttl > 0:
            if len(self._mirror) >= MIRROR_ENTRIES:
                self._mirror.pop(min(self._mirror, key=lambda p: self._mirror[p].fetched))
            self._mirror[path] = kept
        return kept


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers={"Cache-Control": "no-store"})


_NO_STORE = (b"cache-control", b"no-store")


class OhttpForwarding:
    """``POST /ohttp`` as a plain ASGI handler (module docstring): 415 unless the body is ``message/ohttp-req``, 413
    over the relay's limit (announced or streamed), an empty 400 when the device goes away first, 502 when the
    target cannot be reached; else the target's status, ``Content-Type`` and body, with ``Cache-Control:
    no-store``."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ctype = length = None
        for k, v in scope["headers"]:
            if k == b"content-type":
                ctype = v.decode("latin-1")
            elif k == b"content-length":
                length = v
        limit = self.relay.max_body_bytes
        if (ctype or "").split(";")[0].strip().lower() != REQUEST_MEDIA_TYPE:
            await _send_error(send, 415, "unsupported_media_type", f"send an encapsulated request as "
                                                                  f"{REQUEST_MEDIA_TYPE} (RFC 9458 §4.3)")
            return
        try:
            async with asyncio.timeout(self.relay.body_seconds):
                body = None if length is not None and (not length.isdigit() or int(length) > limit) else \
                    await _read_body(receive, limit)
        except ClientDisconnect:
            await _send(send, 400, [], b"")
            return
        except TimeoutError:
            await _send_error(send, 408, "body_timeout", f"the request body did not arrive within "
                                                         f"{self.relay.body_seconds:g} s; send it at once")
            return
        if body is None:
            await _send_error(send, 413, "body_too_large", f"request body over the relay's limit of {limit:,} bytes")
            return
        try:
            answer = await self.relay.forward(body)
        except (TargetError, httpx.HTTPError) as exc:
            reason = exc.reason if isinstance(exc, TargetError) else type(exc).__name__
            await _send_error(send, 502, "gateway_unreachable", f"the relay could not reach the gateway ({reason}); "
                                                                "retry later")
            return
        headers = [_NO_STORE]
        if answer.content_type is not None:
            headers.append((b"content-type", answer.content_type.encode("latin-1")))
        await _send(send, answer.status, headers, answer.body)


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The body from the ASGI channel; None once it passes ``limit`` bytes, :class:`ClientDisconnect` if the device
    went away first."""
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise ClientDisconnect
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Any, status: int, code: str, message: str) -> None:
    await _send(send, status, [(b"content-type", b"application/json"), _NO_STORE],
                orjson.dumps({"error": {"code": code, "message": message}}))


class RelayApp:
    """The relay's ASGI app: ``POST /ohttp`` goes to :class:`OhttpForwarding` directly, everything else (the
    mirror, ``/healthz``, the lifespan, 404s and 405s) to the Starlette app ``routes``; ``state`` is its state."""

    def __init__(self, forwarding: OhttpForwarding, routes: Starlette) -> None:
        self.forwarding, self.routes = forwarding, routes

    @property
    def state(self) -> Any:
        return self.routes.state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/ohttp":
            await self.forwarding(scope, receive, send)
        else:
            await self.routes(scope, receive, send)


def create_relay_app(target: str, *, batch_ms: float = 0.0, mirror_ttl: float = DEFAULT_MIRROR_TTL_S,
                     max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, timeout: float = DEFAULT_TIMEOUT_S,
                     body_seconds: float = DEFAULT_BODY_SECONDS,
                     transport: httpx.AsyncBaseTransport | None = None) -> RelayApp:
    """The relay as an ASGI app (module docstring for what it guarantees); ``app.state.relay`` is its
    :class:`Relay`. ``target``: the service's URL (its gateway is ``{target}/ohttp``); ``batch_ms``: milliseconds
    requests are held to be shuffled (0: forwarded at once); ``mirror_ttl``: seconds a mirrored document is kept;
    ``max_body_bytes``: the largest encapsulated request taken (413 beyond); ``timeout``: seconds for the target;
    ``body_seconds``: seconds a device has to send a whole request body (408 beyond). A bad value is a
    :class:`~hybriddp.core.errors.ParameterError` naming it."""
    relay = Relay(target, batch_ms=batch_ms, mirror_ttl=mirror_ttl, max_body_bytes=max_body_bytes, timeout=timeout,
                  body_seconds=body_seconds, transport=transport)
    forwarding = OhttpForwarding(relay)

    async def get_mirrored(request: Request) -> Response:
        path = request.url.path
        if path != "/ohttp-keys" and not _MIRRORED.fullmatch(path):
            return _error(404, "not_found", "the relay mirrors only /ohttp-keys and a round's head list and token key")
        try:
            kept = await relay.mirrored(path)
        except httpx.HTTPError as exc:
            return _error(502, "gateway_unreachable", f"the relay could not reach the service ({type(exc).__name__}); "
                                                      "retry later")
        headers = {"Cache-Control": "no-cache"}
        if "etag" in kept.headers:
            headers["ETag"] = kept.headers["etag"]
            match = request.headers.get("if-none-match")
            if kept.status == 200 and match is not None and kept.headers["etag"] in [
                    t.strip().removeprefix("W/") for t in match.split(",")]:
                return Response(status_code=304, headers=headers)
        return Response(kept.body, status_code=kept.status, headers=headers,
                        media_type=kept.headers.get("content-type"))

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"}, headers={"Cache-Control": "no-store"})

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await relay.aclose()

    app = Starlette(routes=[Route("/ohttp", forwarding, methods=["POST"]),  # reached for its 405 only
                            Route("/ohttp-keys", get_mirrored, methods=["GET"]),
                            Route("/api/v1/rounds/{round_id}/{doc}", get_mirrored, methods=["GET"]),
                            Route("/healthz", healthz, methods=["GET"])],
                    lifespan=lifespan)
    app.state.relay = relay
    return RelayApp(forwarding, app)

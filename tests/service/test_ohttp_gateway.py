"""The OHTTP gateway (spec-v2 §4, RFC 9458) on a real server, behind a real relay (``hybriddp.relay``), reached with the
SDK's :class:`~hybriddp.sdk.relay.OhttpTransport`: the same answers as direct, no device address inside the service,
only the device routes, refusals of tampered and wrong-key requests, the relay's mirror."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient
from test_api import ADMIN, API, blender_round, device_messages

from asyncrun import run_async
from hybriddp.core import bhttp, ohttp
from hybriddp.relay import create_relay_app
from hybriddp.sdk.relay import OhttpTransport, fetch_key_configs
from hybriddp.service import create_app
from hybriddp.service.routers.ohttp import dispatch
from hybriddp.service.store import Store
from tokenhelpers import relay_credential, tokened
from uvicornhelpers import served

AUTH = {"Authorization": f"Bearer {ADMIN}"}
OUTER_HEADERS = {"host", "content-type", "content-length", "connection"}
"""All the header fields the relay may send the gateway (spec-v2 §4: only Content-Type, and what HTTP needs)."""


@dataclass
class Recorder:
    """Wraps an app's entry (the service's :class:`~hybriddp.service.guard.Guard`, or a whole ASGI app) and records
    (method, path, client, header names) of every HTTP request it gets: what the app can know of its sender."""

    seen: list[tuple[str, str, Any, set[str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, scope: Any) -> None:
        if scope["type"] == "http":
            names = {bytes(k).decode("latin-1").lower() for k, _ in scope.get("headers", [])}
            with self.lock:
                self.seen.append((scope["method"], scope["path"], scope.get("client"), names))

    def of(self, path: str) -> list[tuple[str, str, Any, set[str]]]:
        with self.lock:
            return [s for s in self.seen if s[1] == path]


class GuardRecorder(Recorder):
    """Records in front of the service's guard: every request the app serves, the gateway's inner ones included."""

    def __init__(self, guard: Any) -> None:
        super().__init__()
        self.guard = guard

    async def __call__(self, app: Any, scope: Any, receive: Any, send: Any) -> None:
        self.record(scope)
        await self.guard(app, scope, receive, send)

    def __getattr__(self, name: str) -> Any:  # refusal, cors_headers: the gateway's inner reports ask the guard
        return getattr(self.guard, name)


class AnswerRecorder:
    """Wraps ``ReportsEndpoint.answer``, through which the gateway serves an inner report without an ASGI request:
    records every argument it gets (all that the reports code can know of the sender)."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.seen = answer, []

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.seen.append((args, kwargs))
        return await self.answer(*args, **kwargs)


class AppRecorder(Recorder):
    """Records in front of a whole ASGI app (the relay: the addresses of the devices that reach it)."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.record(scope)
        await self.app(scope, receive, send)


@dataclass
class Stack:
    server: str
    relay: str
    service: GuardRecorder
    reports: AnswerRecorder
    devices: AppRecorder
    relay_app: Any
    rid: str
    headlist: dict[str, Any]

    def direct(self) -> httpx.Client:
        return httpx.Client(base_url=self.server, timeout=30)

    def via_relay(self, **kw: Any) -> httpx.Client:
        """A client whose every request goes through the relay, encapsulated (what a device is given)."""
        return httpx.Client(transport=OhttpTransport(self.relay, **kw), base_url=self.server, timeout=30)


@pytest.fixture
def stack(store_url: str) -> Iterator[Stack]:
    """A real service (report tokens on, the default) with a published BLENDER round, and a real relay to it."""
    app = create_app(store_url, ADMIN, check_workers=0)
    recorder = GuardRecorder(app.guard)
    app.guard = recorder  # type: ignore[attr-defined]
    reports = AnswerRecorder(app.reports.answer)
    app.reports.answer = reports  # type: ignore[method-assign]
    with served(app) as server:
        with httpx.Client(base_url=server, timeout=30) as admin:
            rid, headlist = blender_round(admin)  # type: ignore[arg-type]
        relay_app = create_relay_app(server, mirror_ttl=60)
        devices = AppRecorder(relay_app)
        with served(devices) as relay:
            yield Stack(server, relay, recorder, reports, devices, relay_app, rid, headlist)


def _same(a: httpx.Response, b: httpx.Response) -> None:
    assert (a.status_code, a.content, a.headers.get("content-type"), a.headers.get("etag")) == (
        b.status_code, b.content, b.headers.get("content-type"), b.headers.get("etag"))


def test_the_relay_path_gives_the_direct_answers(stack: Stack) -> None:
    rid = stack.rid
    transport = OhttpTransport(stack.relay)  # fetches the key configs from the relay on first use
    with stack.direct() as direct, httpx.Client(transport=transport, base_url=stack.server, timeout=30) as relayed:
        keys = fetch_key_configs(stack.relay)
        assert [k.to_bytes() for k in keys] == [k.to_bytes() for k in ohttp.parse_key_configs(
            direct.get("/ohttp-keys").content)]
        assert transport.key_config == keys[0].to_bytes()
        if "ohttp_key" in stack.headlist:  # committed by the head list (spec-v2 §1): the device's check
            assert base64.urlsafe_b64decode(stack.headlist["ohttp_key"] + "==") == transport.key_config
        for path in (f"{API}/rounds/{rid}/headlist", f"{API}/rounds/{rid}", f"{API}/rounds/{rid}/token-key",
                     f"{API}/rounds/AAAAAAAAAAAAAAAAAAAAAA/headlist"):
            _same(relayed.get(path), direct.get(path))
        etag = direct.get(f"{API}/rounds/{rid}/headlist").headers["etag"]
        assert relayed.get(f"{API}/rounds/{rid}/headlist", headers={"If-None-Match": etag}).status_code == 304

        # issuance through the relay carries the device credential (Authorization), and needs it
        credential = relay_credential(direct, API, AUTH, 4)
        r = relayed.post(f"{API}/rounds/{rid}/tokens", json={"blinded_msgs": ["AAAA"]})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        msgs = device_messages(stack.headlist, 2, seed=5)
        via, plain = tokened(relayed, API, rid, credential, msgs[:1]), tokened(direct, API, rid, credential, msgs[1:])
        first = relayed.post(f"{API}/rounds/{rid}/reports", json=via)
        second = direct.post(f"{API}/rounds/{rid}/reports", json=plain)
        assert first.status_code == second.status_code == 200, (first.text, second.text)
        assert first.json() == second.json() == {"acknowledged": 1, "counted": 1, "duplicates": 0}
        again_via = relayed.post(f"{API}/rounds/{rid}/reports", json=plain)  # retries: counted once either way
        again_direct = direct.post(f"{API}/rounds/{rid}/reports", json=via)
        _same(again_via, again_direct)
        assert again_via.json() == {"acknowledged": 1, "counted": 0, "duplicates": 1}
        assert direct.get(f"{API}/rounds/{rid}").json()["counts"]["messages"] == 2


def test_the_service_never_sees_a_device_address(stack: Stack) -> None:
    rid = stack.rid
    with stack.via_relay() as relayed:
        for _ in range(3):
            assert relayed.get(f"{API}/rounds/{rid}/token-key").status_code == 200
        assert relayed.post(f"{API}/rounds/{rid}/reports", json=[]).status_code == 400
    device_ports = {c[1] for _, path, c, _ in stack.devices.seen if path == "/ohttp"}
    assert len(device_ports) >= 1
    inner = stack.service.of(f"{API}/rounds/{rid}/token-key")
    assert len(inner) == 3 and all(client is None for _, _, client, _ in inner)
    assert all("x-forwarded-for" not in names and "forwarded" not in names for *_, names in inner)
    # the inner report skips the ASGI round trip: the reports code gets the round, the body and its type, no more
    assert stack.service.of(f"{API}/rounds/{rid}/reports") == []
    assert stack.reports.seen == [((rid, b"[]", "application/json"), {})]
    outer = stack.service.of("/ohttp")
    assert len(outer) == 4
    for _, _, client, names in outer:  # the relay's own connection, with nothing of the device's request
        assert client is not None and client[1] not in device_ports
        assert names <= OUTER_HEADERS, names


def test_only_the_device_routes_are_forwarded(stack: Stack) -> None:
    rid = stack.rid
    with stack.via_relay() as relayed, stack.direct() as direct:
        for method, path, headers in [
                ("GET", "/health", {}), ("POST", "/ohttp", {}), ("GET", f"{API}/rounds", AUTH),
                ("DELETE", f"{API}/rounds/{rid}", AUTH), ("GET", f"{API}/rounds/{rid}/results", {}),
                ("POST", f"{API}/rounds/{rid}/close", AUTH), ("GET", "/ohttp-keys", {}),
                ("PUT", f"{API}/rounds/{rid}/reports", {}), ("GET", "/", {}), ("HEAD", f"{API}/rounds/{rid}", {}),
                ("GET", f"{API}/rounds/{rid}/headlist/../../rounds", AUTH)]:
            r = relayed.request(method, path, headers=headers)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (method, path, r.text)
            assert "does not forward" in r.json()["error"]["message"]
        assert direct.get(f"{API}/rounds/{rid}").json()["state"] == "headlist-published"
    served_inner = [s for s in stack.service.seen if s[2] is None]
    assert served_inner == []  # none of them reached the app


def test_tampered_and_wrong_key_requests_are_refused(stack: Stack) -> None:
    with httpx.Client(base_url=stack.relay, timeout=30) as raw:
        config = fetch_key_configs(stack.relay)[0]
        inner = bhttp.encode_request("GET", "http", "x", f"{API}/rounds/{stack.rid}/headlist", [], b"")
        enc, _ = ohttp.encapsulate_request(config, inner)
        post = lambda body, ct="message/ohttp-req": raw.post("/ohttp", content=body,  # noqa: E731
                                                              headers={"content-type": ct})
        good = post(enc)
        assert good.status_code == 200 and good.headers["content-type"] == "message/ohttp-res"
        tampered = enc[:-1] + bytes([enc[-1] ^ 1])
        other = ohttp.GatewayKey.generate(key_id=config.key_id).config  # the same key id, another key
        wrong_key, _ = ohttp.encapsulate_request(other, inner)
        unknown_id, _ = ohttp.encapsulate_request(ohttp.GatewayKey.generate(key_id=(config.key_id + 1) % 256).config,
                                                  inner)
        for body, code in [(tampered, "ohttp_undecryptable"), (wrong_key, "ohttp_undecryptable"),
                           (enc[:50], "ohttp_undecryptable"), (unknown_id, "ohttp_key")]:
            r = post(body)
            assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
        assert post(enc, "application/octet-stream").status_code == 415
        assert post(enc, "text/plain").status_code == 415
    # a refusal reaches the SDK as the gateway's JSON error, not as an answer of the service
    stale = OhttpTransport(stack.relay, ohttp.GatewayKey.generate(key_id=config.key_id).config)
    with httpx.Client(transport=stale, base_url=stack.server) as client:
        r = client.get(f"{API}/rounds/{stack.rid}/headlist")
        assert r.status_code == 400 and r.json()["error"]["code"] == "ohttp_undecryptable"


def test_the_relay_mirrors_and_caches_the_documents(stack: Stack) -> None:
    rid = stack.rid
    with httpx.Client(base_url=stack.relay, timeout=30) as mirror, stack.direct() as direct:
        for doc in ("headlist", "token-key"):
            path = f"{API}/rounds/{rid}/{doc}"
            before = len(stack.service.of(path))
            first, second = mirror.get(path), mirror.get(path)
            _same(first, direct.get(path))
            _same(second, first)
            assert len(stack.service.of(path)) - before == 2  # ours direct, and the relay's one fetch
        etag = direct.get(f"{API}/rounds/{rid}/headlist").headers["etag"]
        assert mirror.get(f"{API}/rounds/{rid}/headlist", headers={"If-None-Match": etag}).status_code == 304
        keys = mirror.get("/ohttp-keys")
        assert keys.content == direct.get("/ohttp-keys").content
        assert keys.headers["content-type"] == "application/ohttp-keys"
        assert mirror.get(f"{API}/rounds/AAAAAAAAAAAAAAAAAAAAAA/headlist").status_code == 404
        assert mirror.get(f"{API}/rounds/{rid}/results").status_code == 404  # not mirrored
        assert mirror.get("/healthz").json() == {"status": "ok"}
    assert stack.relay_app.state.relay.fetches == 4  # head list, token key, keys (kept), the unknown round's 404


# ----- the gateway in process ---------------------------------------------------------------------------
def _through(client: TestClient, config: ohttp.KeyConfig, method: str, path: str, content: bytes = b"",
             headers: tuple[tuple[str, str], ...] = ()) -> tuple[httpx.Response, bhttp.Response | None]:
    enc, ctx = ohttp.encapsulate_request(config, bhttp.encode_request(method, "http", "testserver", path,
                                                                      list(headers), content))
    outer = client.post("/ohttp", content=enc, headers={"content-type": "message/ohttp-req"})
    return outer, bhttp.decode_response(ctx.open_response(outer.content)) if outer.status_code == 200 else None


def test_the_gateway_keeps_the_body_limit_and_its_key(store_url: str) -> None:
    app = create_app(store_url, ADMIN, max_body_bytes=4096, open_admission=True, check_workers=0)
    client = TestClient(app)
    try:
        config = ohttp.parse_key_configs(client.get("/ohttp-keys").content)[0]
        assert client.get("/ohttp-keys").headers["cache-control"].startswith("public")
        rid = "A" * 22
        outer, inner = _through(client, config, "POST", f"{API}/rounds/{rid}/reports", b"x" * 3000,
                                (("content-type", "application/json"),))
        assert outer.status_code == 200 and inner is not None and inner.status == 404  # under the limit: served
        outer, inner = _through(client, config, "POST", f"{API}/rounds/{rid}/reports", b"x" * 5000,
                                (("content-type", "application/json"),))
        assert outer.status_code == 413 and inner is None
        outer, inner = _through(client, config, "GET", f"{API}/rounds/{rid}/headlist?x=1")
        assert inner is not None and inner.status == 404 and inner.header("content-type") == "application/json"
    finally:
        app.state.writer.close()
        app.state.store.close()
    again = Store(store_url)
    try:  # the key is kept in the database: a restarted service serves the same one
        assert again.gateway_config() == config.to_bytes()
    finally:
        again.close()


def test_an_inner_body_over_the_limit_is_an_encapsulated_413() -> None:
    req = bhttp.decode_request(bhttp.encode_request("POST", "http", "h", f"{API}/rounds/{'A' * 22}/reports",
                                                    [], b"x" * 11))
    status, headers, body = run_async(dispatch(None, {}, req, 10))
    assert status == 413 and b"body_too_large" in body and ("content-type", "application/json") in headers


def test_racing_stores_make_one_gateway_key(store_url: str) -> None:
    first = Store(store_url)
    stores = [first] + [Store(store_url) for _ in range(3)]
    try:
        got: list[bytes] = []
        threads = [threading.Thread(target=lambda s=s: got.append(s.gateway_key().to_bytes())) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and len(set(got)) == 1
    finally:
        for s in stores:
            s.close()


def test_the_fast_path_and_the_declared_route_answer_alike(store_url: str) -> None:
    """``ServiceApp`` serves ``POST /ohttp`` ahead of FastAPI (``GatewayEndpoint``); with that diversion off the
    declared route answers. Both give the same statuses, error bodies, headers (the guard's included) and inner
    answers, and the guard refuses a cross-site outer request on both."""
    app = create_app(store_url, ADMIN, max_body_bytes=65536, open_admission=True, check_workers=0)
    with TestClient(app) as client:
        rid, hl = blender_round(client)
        config = ohttp.parse_key_configs(client.get("/ohttp-keys").content)[0]
        json_ct = (("content-type", "application/json"),)

        def outcomes(seed: int) -> list[Any]:
            msgs = device_messages(hl, 2, seed=seed)  # new message ids at every call
            out: list[Any] = []
            for method, path, content, headers in [
                    ("POST", f"{API}/rounds/{rid}/reports", orjson.dumps(msgs), json_ct),
                    ("POST", f"{API}/rounds/{rid}/reports", orjson.dumps(msgs[:1]), json_ct),
                    ("POST", f"{API}/rounds/{rid}/reports", b"{", json_ct),
                    ("GET", f"{API}/rounds/{rid}/headlist", b"", ()), ("GET", "/health", b"", ()),
                    ("POST", f"{API}/rounds/{rid}/reports", b"x" * 70_000, json_ct)]:
                outer, inner = _through(client, config, method, path, content, headers)
                out.append((outer.status_code, _kept(outer.headers), None if inner is None else
                            (inner.status, inner.header("content-type"), inner.content)))
            enc, _ = ohttp.encapsulate_request(config, bhttp.encode_request("GET", "http", "t", "/health", [], b""))
            for body, headers in [(enc[:-1] + bytes([enc[-1] ^ 1]), {"content-type": "message/ohttp-req"}),
                                  (enc, {"content-type": "text/plain"}), (enc, {}),
                                  (b"x" * 70_000, {"content-type": "message/ohttp-req"}),
                                  (enc, {"content-type": "message/ohttp-req", "content-length": "x"}),
                                  (enc, {"content-type": "message/ohttp-req", "origin": "https://evil.example"}),
                                  (enc, {"content-type": "message/ohttp-req", "sec-fetch-site": "cross-site"})]:
                r = client.post("/ohttp", content=body, headers=headers)
                out.append((r.status_code, _kept(r.headers), r.content))
            return out

        fast = outcomes(1)
        assert app.divert_ohttp  # type: ignore[attr-defined]
        app.divert_ohttp = False  # type: ignore[attr-defined]
        declared = outcomes(2)
        assert declared == fast
        assert [o[0] for o in fast] == [200] * 5 + [413, 400, 415, 415, 413, 400, 403, 403]
        assert [o[2][0] for o in fast[:5]] == [200, 200, 400, 200, 404]
        assert fast[0][2][2] == b'{"acknowledged":2,"counted":2,"duplicates":0}'
        assert client.get(f"{API}/rounds/{rid}").json()["counts"]["messages"] == 4


def _kept(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The response header fields that must not depend on the path that answered (not ``date``, ``server``)."""
    return sorted((k, v) for k, v in headers.items() if k not in ("date", "server"))


def test_an_inner_report_is_answered_as_the_app_entry_answers_it(store_url: str) -> None:
    """The gateway answers an inner ``POST .../reports`` without an ASGI request (``ReportsEndpoint.answer`` with
    the guard's checks); through the app's own entry (``divert_reports`` off: guard, then the declared route) the
    inner answers are the same, status, header fields and body, refusals of the guard included: an inner request
    that says it comes from another site is refused, one from a listed origin gets its CORS header."""
    listed = "https://pages.example.org"
    app = create_app(store_url, ADMIN, max_body_bytes=65536, check_workers=0, cors_origins=[listed])
    with TestClient(app) as client:
        rid, hl = blender_round(client)
        config = ohttp.parse_key_configs(client.get("/ohttp-keys").content)[0]
        credential = relay_credential(client, API, AUTH, 8)

        def outcomes(seed: int) -> list[Any]:
            ct = ("content-type", "application/json")
            good = orjson.dumps(tokened(client, API, rid, credential, device_messages(hl, 1, seed=seed)))
            out = []
            for path, content, headers in [
                    (f"{API}/rounds/{rid}/reports", good, (ct,)),  # stored
                    (f"{API}/rounds/{rid}/reports", good, (ct,)),  # a retry: a duplicate
                    (f"{API}/rounds/{rid}/reports", good, (ct, ("origin", "https://evil.example"))),
                    (f"{API}/rounds/{rid}/reports", good, (ct, ("sec-fetch-site", "cross-site"))),
                    (f"{API}/rounds/{rid}/reports", good, (ct, ("origin", listed))),
                    (f"{API}/rounds/{rid}/reports", orjson.dumps(device_messages(hl, 1, seed=seed + 50)), (ct,)),
                    (f"{API}/rounds/{rid}/reports", b"[", (ct,)),
                    (f"{API}/rounds/{rid}/reports", good, (("content-type", "text/plain"),)),
                    (f"{API}/rounds/{'A' * 22}/reports", good, (ct,))]:
                outer, inner = _through(client, config, "POST", path, content, headers)
                assert outer.status_code == 200 and inner is not None
                out.append((inner.status, sorted(inner.headers), inner.content))
            return out

        fast = outcomes(1)
        app.divert_reports = False  # type: ignore[attr-defined]
        entry = outcomes(2)  # new tokens, so new message ids: stored again
        app.divert_reports = True  # type: ignore[attr-defined]
    assert [o[0] for o in fast] == [200, 200, 403, 403, 200, 403, 400, 415, 404]
    assert fast[0][2] == b'{"acknowledged":1,"counted":1,"duplicates":0}'
    assert fast[1][2] == fast[4][2] == b'{"acknowledged":1,"counted":0,"duplicates":1}'
    assert ("access-control-allow-origin", listed) in fast[4][1] and ("access-control-allow-origin", listed) not in \
        fast[0][1]
    assert fast == entry

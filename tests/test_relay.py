"""The OHTTP relay (``hybriddp relay``, :mod:`hybriddp.relay`; spec-v2 §4) against a scripted target, and the SDK's
:class:`~hybriddp.sdk.relay.OhttpTransport` against a scripted gateway. The relay with a real service is
tests/service/test_ohttp_gateway.py."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import pytest

from asyncrun import run_async
from clihelpers import assert_clean_error, invoke
from hybriddp.core import bhttp, ohttp
from hybriddp.core.errors import ParameterError
from hybriddp.relay import create_relay_app
from hybriddp.sdk.relay import OhttpTransport, fetch_key_configs
from uvicornhelpers import served

RID = "R" * 22
FORWARDED_HEADERS = {"host", "content-type", "content-length", "connection"}


class Target(httpx.AsyncBaseTransport):
    """A scripted service: answers ``POST /ohttp`` with the request's own bytes (so each answer names its request)
    and ``GET`` with ``answer(path)``; records what it got, in order."""

    def __init__(self, answer: Callable[[str], httpx.Response] | None = None, delay: float = 0.0) -> None:
        self.posts: list[bytes] = []
        self.headers: list[set[str]] = []
        self.gets: list[str] = []
        self.answer = answer or (lambda path: httpx.Response(200, headers={"content-type": "application/json",
                                                                           "etag": '"v1"', "x-other": "1"},
                                                             content=b'{"doc": "%s"}' % path.encode()))
        self.delay = delay

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        if self.delay:
            await asyncio.sleep(self.delay)
        if request.method == "POST":
            self.posts.append(body)
            self.headers.append({k.lower() for k in request.headers})
            return httpx.Response(200, headers={"content-type": "message/ohttp-res"}, content=body)
        self.gets.append(request.url.path)
        return self.answer(request.url.path)


def _post(client: httpx.Client, body: bytes, **headers: str) -> httpx.Response:
    return client.post("/ohttp", content=body, headers={"content-type": "message/ohttp-req", **headers})


def test_the_relay_forwards_the_body_alone_and_returns_the_answer() -> None:
    target = Target()
    with served(create_relay_app("http://service.invalid", transport=target)) as url, httpx.Client(base_url=url) as c:
        r = _post(c, b"opaque bytes", **{"X-Forwarded-For": "10.1.2.3", "User-Agent": "device/1.0",
                                         "Cookie": "a=b", "Authorization": "Bearer x", "Forwarded": "for=1.2.3.4"})
        assert (r.status_code, r.content, r.headers["content-type"]) == (200, b"opaque bytes", "message/ohttp-res")
        assert target.posts == [b"opaque bytes"]
        assert target.headers[0] <= FORWARDED_HEADERS and "content-type" in target.headers[0], target.headers
        assert c.post("/ohttp", content=b"x", headers={"content-type": "application/json"}).status_code == 415
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/api/v1/rounds").status_code == 404
    with served(create_relay_app("http://service.invalid", transport=target, max_body_bytes=1024)) as url:
        with httpx.Client(base_url=url) as c:
            r = _post(c, b"x" * 1025)
            assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert len(target.posts) == 1  # neither refusal reached the target


def test_a_trickled_body_is_cut_off_at_the_deadline() -> None:
    """A client that announces a body and sends it a byte at a time (always within any per-read timeout) gets 408
    once the whole-body deadline passes, and nothing reaches the target; a prompt client meanwhile is served."""
    target = Target()
    with served(create_relay_app("http://service.invalid", transport=target, body_seconds=1.0)) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /ohttp HTTP/1.1\r\nHost: r\r\nContent-Type: message/ohttp-req\r\n"
                         b"Content-Length: 1000\r\n\r\n")
            start = time.monotonic()
            answer = b""
            sock.settimeout(0.3)
            while time.monotonic() - start < 8 and b"\r\n\r\n" not in answer:
                try:
                    sock.sendall(b"x")
                    answer += sock.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    break
            with httpx.Client(base_url=url) as c:
                assert _post(c, b"prompt").status_code == 200
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body_timeout" in answer or b"\r\n\r\n" in answer
        assert 0.9 <= time.monotonic() - start < 8
    assert target.posts == [b"prompt"]


def test_an_unreachable_gateway_is_a_502() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    try:
        with served(create_relay_app(f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=5)) as url:
            with httpx.Client(base_url=url) as c:
                r = _post(c, b"x" * 100)
                assert r.status_code == 502 and r.json()["error"]["code"] == "gateway_unreachable"
                assert c.get(f"/api/v1/rounds/{RID}/headlist").status_code == 502
    finally:
        sock.close()


def test_batches_are_forwarded_in_a_random_order() -> None:
    """50 tagged requests sent one after another within one batch window reach the target shuffled. Under a
    uniformly random order the number of requests still in their sent place is about Poisson(1):
    P(>= 10 in place) = 1.1e-7, the false-failure probability of this test. Without shuffling nearly all 50 are."""
    target = Target()
    n, window_ms = 50, 1500
    with served(create_relay_app("http://service.invalid", transport=target, batch_ms=window_ms)) as url:
        async def send_all() -> tuple[list[bytes], list[float]]:
            async with httpx.AsyncClient(base_url=url, timeout=30,
                                         limits=httpx.Limits(max_connections=n + 5)) as client:
                async def one(i: int) -> tuple[bytes, float]:
                    start = time.monotonic()
                    r = await client.post("/ohttp", content=b"tag-%02d" % i,
                                          headers={"content-type": "message/ohttp-req"})
                    assert r.status_code == 200
                    return r.content, time.monotonic() - start

                tasks = []
                for i in range(n):
                    tasks.append(asyncio.create_task(one(i)))
                    await asyncio.sleep(0.004)  # sent in order, well within the window
                got = await asyncio.gather(*tasks)
                return [g[0] for g in got], [g[1] for g in got]

        answers, waits = run_async(send_all())
    assert answers == [b"tag-%02d" % i for i in range(n)]  # each request got its own answer
    assert sorted(target.posts) == [b"tag-%02d" % i for i in range(n)]
    in_place = sum(body == b"tag-%02d" % i for i, body in enumerate(target.posts))
    assert in_place < 10, target.posts
    assert waits[0] >= window_ms / 1000 * 0.9  # the first request was held for the window


def test_the_mirror_keeps_a_document_for_its_ttl_and_fetches_it_once() -> None:
    target = Target(delay=0.1)
    path = f"/api/v1/rounds/{RID}/headlist"
    app = create_relay_app("http://service.invalid", transport=target, mirror_ttl=0.5)
    with served(app) as url, httpx.Client(base_url=url) as c:
        first, second = c.get(path), c.get(path)
        assert first.status_code == second.status_code == 200 and first.content == second.content
        assert first.content == b'{"doc": "%s"}' % path.encode()
        assert first.headers["etag"] == '"v1"' and first.headers["content-type"] == "application/json"
        assert "x-other" not in first.headers
        assert target.gets == [path]  # the second GET within the TTL did not reach the target
        assert c.get(path, headers={"If-None-Match": '"v1"'}).status_code == 304
        time.sleep(0.55)
        assert c.get(path).status_code == 200 and target.gets == [path, path]  # expired: fetched again

        async def many() -> list[int]:  # concurrent misses share one fetch
            async with httpx.AsyncClient(base_url=url) as client:
                rs = await asyncio.gather(*[client.get(f"/api/v1/rounds/{RID}/token-key") for _ in range(10)])
                return [r.status_code for r in rs]
        assert run_async(many()) == [200] * 10
        assert target.gets.count(f"/api/v1/rounds/{RID}/token-key") == 1
    assert app.state.relay.fetches == 3


def test_the_mirror_does_not_keep_refusals() -> None:
    target = Target(answer=lambda path: httpx.Response(409, json={"error": {"code": "conflict", "message": "no"}}))
    with served(create_relay_app("http://service.invalid", transport=target)) as url, httpx.Client(base_url=url) as c:
        for _ in range(2):
            r = c.get(f"/api/v1/rounds/{RID}/headlist")
            assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
        assert len(target.gets) == 2


# ----- the CLI ------------------------------------------------------------------------------------------
def test_relay_help_and_bad_options() -> None:
    text = invoke("relay", "--help").output
    for needle in ("--target URL", "--batch-ms", "Milliseconds", "--mirror-ttl", "Seconds", "--max-body-bytes",
                   "16MiB", "default: 8081", "no access log"):
        assert needle in " ".join(text.split()), needle
    assert_clean_error(invoke("relay", ok=False), "--target")
    for bad in ("ftp://x", "127.0.0.1:8000", "http://", "http://h:99999", "http://h/?q=1"):
        assert_clean_error(invoke("relay", "--target", bad, ok=False), "--target", "http:// or https://")
    assert_clean_error(invoke("relay", "--target", "http://h", "--max-body-bytes", "12XB", ok=False),
                       "--max-body-bytes")
    assert_clean_error(invoke("relay", "--target", "http://h", "--max-body-bytes", "1000", ok=False),
                       "--max-body-bytes", "1024")
    assert_clean_error(invoke("relay", "--target", "http://h", "--batch-ms", "-1", ok=False), "--batch-ms")
    with pytest.raises(ParameterError, match="batch_ms"):
        create_relay_app("http://h", batch_ms=float("nan"))


def test_hybriddp_relay_runs_as_a_process() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "hybriddp", "relay", "--target", "http://127.0.0.1:9",
                             "--port", str(port), "--max-body-bytes", "64KiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.05)
        assert r.json() == {"status": "ok"}
        big = httpx.post(f"http://127.0.0.1:{port}/ohttp", content=b"x" * (64 * 1024 + 1),
                         headers={"content-type": "message/ohttp-req"})
        assert big.status_code == 413
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert "relaying" in out and "127.0.0.1:" not in err.replace(f"127.0.0.1:{port}", "")  # no access log lines


# ----- the SDK's transport ------------------------------------------------------------------------------
class Gateway:
    """A scripted relay + gateway: decapsulates with its key, records the inner request, answers ``answer``."""

    def __init__(self, key: ohttp.GatewayKey, status: int = 201) -> None:
        self.key, self.status = key, status
        self.inner: list[bhttp.Request] = []
        self.outer_headers: list[set[str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/ohttp-keys":
            return httpx.Response(200, headers={"content-type": "application/ohttp-keys"},
                                  content=ohttp.encode_key_configs([self.key.config]))
        self.outer_headers.append({k.lower() for k in request.headers})
        req, ctx = ohttp.decapsulate_request(self.key, request.read())
        self.inner.append(bhttp.decode_request(req))
        sealed = ctx.seal_response(bhttp.encode_response(self.status, [("content-type", "application/json"),
                                                                       ("etag", '"e"')], b'{"ok": true}'))
        return httpx.Response(200, headers={"content-type": "message/ohttp-res"}, content=sealed)


def test_the_transport_sends_the_request_encapsulated_and_returns_the_inner_answer() -> None:
    gateway = Gateway(ohttp.GatewayKey.generate(key_id=3))
    transport = OhttpTransport("http://relay.invalid/", relay_transport=httpx.MockTransport(gateway))
    assert transport.key_config == gateway.key.config.to_bytes()  # fetched from the relay
    with httpx.Client(transport=transport, base_url="https://dp.example:8443",
                      headers={"User-Agent": "hybriddp"}) as client:
        r = client.post(f"/api/v1/rounds/{RID}/tokens?x=1&y=%2F", json={"blinded_msgs": ["AA"]},
                        headers={"Authorization": "Bearer hdc_secret"})
    assert (r.status_code, r.json(), r.headers["etag"]) == (201, {"ok": True}, '"e"')
    (inner,) = gateway.inner
    assert (inner.method, inner.scheme, inner.authority, inner.path) == (
        "POST", "https", "dp.example:8443", f"/api/v1/rounds/{RID}/tokens?x=1&y=%2F")
    names = {k for k, _ in inner.headers}
    assert inner.header("authorization") == "Bearer hdc_secret" and inner.header("content-type") == "application/json"
    assert not names & {"host", "content-length", "connection", "transfer-encoding"}
    assert inner.content == b'{"blinded_msgs":["AA"]}'
    assert gateway.outer_headers[0] <= FORWARDED_HEADERS  # no User-Agent, Accept, … to the relay


def test_the_transport_refuses_a_tampered_answer_and_passes_refusals_on() -> None:
    key = ohttp.GatewayKey.generate()

    def tampering(request: httpx.Request) -> httpx.Response:
        resp = Gateway(key)(request)
        return httpx.Response(200, headers={"content-type": "message/ohttp-res"},
                              content=resp.content[:-1] + bytes([resp.content[-1] ^ 1]))

    transport = OhttpTransport("http://relay.invalid", key.config,
                               client=httpx.Client(transport=httpx.MockTransport(tampering)))
    with httpx.Client(transport=transport) as client, pytest.raises(httpx.RemoteProtocolError, match="OHTTP"):
        client.get("http://dp.example/api/v1/rounds/x/headlist")
    refusing = httpx.MockTransport(lambda r: httpx.Response(502, json={"error": {"code": "gateway_unreachable",
                                                                                  "message": "later"}}))
    with httpx.Client(transport=OhttpTransport("http://relay.invalid", key.config.to_bytes(),
                                               client=httpx.Client(transport=refusing))) as client:
        r = client.get("http://dp.example/api/v1/rounds/x/headlist")
        assert r.status_code == 502 and r.json()["error"]["code"] == "gateway_unreachable"
    for bad in ("relay.example", "ftp://r", ""):
        with pytest.raises(ParameterError, match="--relay"):
            OhttpTransport(bad, key.config)


def test_fetch_key_configs_errors() -> None:
    from hybriddp.sdk.http import ServiceRequestError, ServiceUnavailableError

    def answer(status: int, ctype: str, body: bytes) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(
            status, headers={"content-type": ctype}, content=body)))
    with pytest.raises(ServiceRequestError, match="not application/ohttp-keys"):
        fetch_key_configs("http://r", client=answer(200, "text/html", b"<html>"))
    with pytest.raises(ServiceRequestError, match="ohttp-keys"):
        fetch_key_configs("http://r", client=answer(200, "application/ohttp-keys", b"\x00\x05abc"))
    with pytest.raises(ServiceUnavailableError):
        fetch_key_configs("http://r", client=answer(503, "application/json", b"{}"))

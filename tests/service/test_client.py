"""The SDK (hybriddp.client), the round CLI and `demo --service` against real servers on 127.0.0.1.

Retries and error mapping are checked against tiny scripted ASGI apps served by Uvicorn (so the
failures are real HTTP answers, timeouts and refused connections); everything else against the
service's own app (``create_app``) on the database of the ``store_url`` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from hybriddp.client import (
    AdminClient,
    ConflictError,
    DeviceClient,
    NotFoundError,
    OptinUploader,
    RetryPolicy,
    ServiceRequestError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from hybriddp.device import DeviceError, content_hash, new_message_id
from hybriddp.errors import HybridDPError
from hybriddp.service.demo import local_server

ROUND = "AAAAAAAAAAAAAAAAAAAAAA"


# ----- a scripted server ---------------------------------------------------------------------------------
@dataclass
class Scripted:
    """An ASGI app answering each request with the next scripted answer (the last one repeats).

    An answer is ``(status, json_body, headers)``, or ``("sleep", seconds)`` to answer 200 late.
    ``seen`` records (method, path, headers, body) of every request.
    """

    answers: list[Any]
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.seen.append((scope["method"], scope["path"], headers, body))
        answer = self.answers[min(len(self.seen), len(self.answers)) - 1]
        if answer[0] == "sleep":
            await asyncio.sleep(answer[1])
            answer = (200, {"acknowledged": 1, "counted": 1, "duplicates": 0}, {})
        status, obj, extra = answer
        payload = json.dumps(obj).encode()
        hdrs = [(b"content-type", b"application/json")] + [(k.encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": hdrs})
        await send({"type": "http.response.body", "body": payload if status != 304 else b""})


ACK = (200, {"acknowledged": 1, "counted": 1, "duplicates": 0}, {})


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    return status, {"error": {"code": code, "message": message}}, {}


def _message() -> dict[str, Any]:
    return {"id": new_message_id(), "headlist": "sha256:" + "0" * 64, "reports": [{"query": None, "url": None}]}


class Sleeps:
    """Records the backoff delays instead of waiting them out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def scripted() -> Iterator[Any]:
    """``start(answers) -> (app, base_url)``: scripted servers, stopped after the test."""
    with contextlib.ExitStack() as stack:
        def start(answers: list[Any]) -> tuple[Scripted, str]:
            app = Scripted(answers)
            return app, stack.enter_context(local_server(app))
        yield start


# ----- retries -----------------------------------------------------------------------------------------
def test_submission_retried_on_5xx_and_429_then_acknowledged(scripted: Any) -> None:
    app, url = scripted([_error(503, "database_unavailable", "busy"), (429, {}, {"Retry-After": "3"}),
                         _error(500, "internal", "oops"), ACK])
    sleeps = Sleeps()
    msg = _message()
    dev = DeviceClient(url, ROUND, retry=RetryPolicy(attempts=6, base_delay=0.5, max_delay=8.0), sleep=sleeps)
    ack = dev.submit(msg)
    assert (ack.acknowledged, ack.counted, ack.duplicates) == (1, 1, 0)
    assert len(app.seen) == 4
    assert {body for *_, body in app.seen} == {app.seen[0][3]}  # the same message (same id) every time
    assert json.loads(app.seen[0][3]) == msg
    # full jitter: retry n waits in [0, min(8, 0.5 * 2^(n-1))]; the 429's Retry-After (3 s) is honoured
    assert 0 <= sleeps.delays[0] <= 0.5 and sleeps.delays[1] >= 3.0 and 0 <= sleeps.delays[2] <= 2.0
    assert len(sleeps.delays) == 3


def test_backoff_delays_grow_exponentially_with_full_jitter() -> None:
    import random

    policy = RetryPolicy(attempts=10, base_delay=0.1, max_delay=2.0)
    rng = random.Random(7)
    for n in range(1, 9):
        cap = min(2.0, 0.1 * 2 ** (n - 1))
        draws = [policy.delay(n, rng=rng) for _ in range(400)]
        assert all(0 <= d <= cap for d in draws)
        # uniform on [0, cap]: the largest of 400 draws is within 2% of the cap with probability 1 - 0.98^400
        assert max(draws) > 0.98 * cap and min(draws) < 0.02 * cap


def test_4xx_is_not_retried_and_carries_the_servers_message(scripted: Any) -> None:
    app, url = scripted([_error(400, "invalid_report", "message 1: query 'x' is not in the head list")])
    sleeps = Sleeps()
    with pytest.raises(ServiceRequestError) as info:
        DeviceClient(url, ROUND, sleep=sleeps).submit(_message())
    assert len(app.seen) == 1 and sleeps.delays == []
    assert "query 'x' is not in the head list" in str(info.value) and "HTTP 400 invalid_report" in str(info.value)
    assert info.value.status == 400 and info.value.code == "invalid_report"
    assert isinstance(info.value, HybridDPError)


@pytest.mark.parametrize(("status", "cls"), [(401, UnauthorizedError), (404, NotFoundError), (409, ConflictError)])
def test_status_codes_become_error_classes(scripted: Any, status: int, cls: type) -> None:
    _, url = scripted([_error(status, "x", "the server says why")])
    with pytest.raises(cls, match="the server says why"):
        AdminClient(url, "token").round(ROUND)


def test_gives_up_after_the_last_attempt_with_the_message_pending(scripted: Any) -> None:
    app, url = scripted([_error(503, "database_unavailable", "the database is locked")])
    sleeps = Sleeps()
    msg = _message()
    with pytest.raises(ServiceUnavailableError, match="gave up after 3 attempts") as info:
        DeviceClient(url, ROUND, retry=RetryPolicy(attempts=3), sleep=sleeps).submit(msg)
    assert len(app.seen) == 3 and len(sleeps.delays) == 2
    assert info.value.pending == msg  # resend it later as it is: the id makes it count once


def test_a_timeout_is_retried_for_submissions_but_not_for_uploads(scripted: Any) -> None:
    app, url = scripted([("sleep", 1.5), ACK])
    ack = DeviceClient(url, ROUND, timeout=0.3, sleep=Sleeps()).submit(_message())
    assert ack.counted == 1 and len(app.seen) == 2
    app2, url2 = scripted([("sleep", 1.5)])
    with pytest.raises(ServiceUnavailableError, match="may or may not have been applied"):
        OptinUploader(url2, ROUND, "tok", timeout=0.3, sleep=Sleeps()).upload([("q", "u")])
    assert len(app2.seen) == 1  # an upload is not idempotent: never sent twice


def test_a_server_that_is_briefly_down(scripted: Any) -> None:
    """Connections are refused until the client has backed off twice; then the server starts and answers."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = Scripted([ACK])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    delays: list[float] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) == 2:  # the server comes up during the second backoff
            thread.start()
            while not server.started:
                threading.Event().wait(0.01)

    try:
        ack = DeviceClient(url, ROUND, sleep=sleep).submit(_message())
    finally:
        server.should_exit = True
        if thread.is_alive():
            thread.join(10)
        sock.close()
    assert ack.counted == 1 and len(delays) == 2 and len(app.seen) == 1


def test_non_idempotent_requests_are_retried_only_when_nothing_was_sent() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sleeps = Sleeps()
    try:
        with pytest.raises(ServiceUnavailableError, match="cannot connect") as info:
            AdminClient(url, "tok", retry=RetryPolicy(attempts=3), sleep=sleeps).close(ROUND)
    finally:
        sock.close()
    assert len(sleeps.delays) == 2 and "is `hybriddp serve` running there?" in str(info.value)


def test_bad_server_url_and_round_id_are_clean_errors() -> None:
    for bad in ("127.0.0.1:8000", "ftp://x", "", None, "http://"):
        with pytest.raises(HybridDPError, match="--server"):
            DeviceClient(bad, ROUND)  # type: ignore[arg-type]
    with pytest.raises(HybridDPError, match="round id"):
        DeviceClient("http://127.0.0.1:1", "").fetch_headlist()
    with pytest.raises(HybridDPError, match="attempts"):
        RetryPolicy(attempts=0)


# ----- head list: verification and the ETag cache (scripted) ------------------------------------------------
def _doc() -> dict[str, Any]:
    doc = {"format": "hybriddp-headlist", "version": 1, "epsilon": 4.0, "delta": 1e-5, "f_c": 0.85, "m_c": 1,
           "url_level": True, "queries": [{"query": "weather", "urls": ["http://w.example"]}]}
    doc["content_hash"] = content_hash(doc)
    return doc


def test_headlist_verified_and_cached_by_etag(scripted: Any) -> None:
    doc = _doc()
    etag = f'"{doc["content_hash"]}"'
    app, url = scripted([(200, doc, {"ETag": etag}), (304, {}, {"ETag": etag})])
    dev = DeviceClient(url, ROUND)
    first = dev.fetch_headlist()
    second = dev.fetch_headlist()
    assert first == doc and second is first
    assert "if-none-match" not in app.seen[0][2] and app.seen[1][2]["if-none-match"] == etag


def test_tampered_headlist_refused(scripted: Any) -> None:
    doc = _doc()
    bad = {**doc, "epsilon": 40.0}  # content changed, hash kept
    _, url = scripted([(200, bad, {"ETag": f'"{doc["content_hash"]}"'})])
    with pytest.raises(DeviceError, match="content_hash"):
        DeviceClient(url, ROUND).fetch_headlist()
    other = _doc()
    _, url2 = scripted([(200, other, {"ETag": '"sha256:' + "1" * 64 + '"'})])
    with pytest.raises(ServiceRequestError, match="ETag"):
        DeviceClient(url2, ROUND).fetch_headlist()

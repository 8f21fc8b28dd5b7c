"""The SDK (hybriddp.sdk.client), the round CLI and `demo --service` against real servers on 127.0.0.1.

Retries and error mapping are checked against tiny scripted ASGI apps served by Uvicorn (so the
failures are real HTTP answers, timeouts and refused connections); everything else against the
service's own app (``create_app``) on the database of the ``store_url`` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from hybriddp.core.errors import HybridDPError
from hybriddp.core.protocol import DeviceError, content_hash, lists_hash, new_message_id
from hybriddp.sdk.client import (
    AdminClient,
    ConflictError,
    DeviceClient,
    NotFoundError,
    OptinRelay,
    OptinUploader,
    RetryPolicy,
    ServiceRequestError,
    ServiceUnavailableError,
    UnauthorizedError,
)
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
    assert app.seen[0][2]["user-agent"] == "hybriddp"  # the same for every device: says nothing about it
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


def test_a_timeout_is_retried_for_submissions_and_for_uploads(scripted: Any) -> None:
    app, url = scripted([("sleep", 1.5), ACK])
    ack = DeviceClient(url, ROUND, timeout=0.3, sleep=Sleeps()).submit(_message())
    assert ack.counted == 1 and len(app.seen) == 2
    app2, url2 = scripted([("sleep", 1.5), (200, {"accepted": 1, "duplicates": 0}, {})])
    assert OptinUploader(url2, ROUND, "tok", timeout=0.3, sleep=Sleeps()).upload([("q", "u")]) == 1
    assert len(app2.seen) == 2  # an upload is idempotent (the server keys it by its content): sent again


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


# ----- the SDK against the service (create_app on the store_url database) ------------------------------------
ADMIN = "admin-token-of-the-client-tests-0123"
PARAMS = {"epsilon": 8.0, "delta": 1e-5, "head_list_size": 10, "m_c": 2}
# one record per opt-in user; each listed record is seen >= 10 times in S, far above tau = 4 at epsilon 8
OPTIN = ([("weather", "https://w.example/a")] * 16 + [("weather", "https://w.example/b")] * 12
         + [("news", "https://n.example/a")] * 12 + [("maps", "https://m.example/a")] * 10)
POOL = [("weather", "https://w.example/a"), ("weather", "https://w.example/b"), ("news", "https://n.example/a"),
        ("maps", "https://m.example/a"), ("cats", "https://c.example/1")]


@dataclass
class Service:
    url: str
    store_url: str


@pytest.fixture
def service(store_url: str) -> Iterator[Service]:
    """The real service on the test's database, served by Uvicorn on 127.0.0.1 (a free port)."""
    from hybriddp.service import create_app

    with local_server(create_app(store_url, ADMIN, open_admission=True)) as url:
        yield Service(url, store_url)


def published_round(url: str, params: dict[str, Any] | None = None, users: str = "user") -> tuple[str, AdminClient]:
    """A round with the OPTIN users' records uploaded through the SDK and its head list published; its opt-in
    users are ``<users>-0``, ``<users>-1``, … (another name: other users, whose lifetime budget is untouched)."""
    admin = AdminClient(url, ADMIN)
    rid = admin.create_round("blender", params or PARAMS, name="sdk test")["id"]
    tokens = admin.enrol_many(rid, [f"{users}-{i}" for i in range(len(OPTIN))])
    assert OptinUploader(url, rid, tokens[0]).upload([OPTIN[0]]) == 1  # one user with their token
    relay = OptinRelay(url, rid)  # the others through a relay, each line with its user's token
    assert relay.upload_many([(t, [rec]) for t, rec in zip(tokens[1:], OPTIN[1:], strict=True)]) == len(OPTIN) - 1
    rnd = admin.publish_headlist(rid)
    assert rnd["state"] == "headlist-published" and rnd["counts"]["optin_records"] == len(OPTIN)
    return rid, admin


def test_a_round_through_the_sdk(service: Service, tmp_path: Any) -> None:
    import numpy as np

    from hybriddp.device.ledger import DeviceLedger
    rid, admin = published_round(service.url)
    rng = np.random.default_rng(4)
    devices = [[POOL[i] for i in rng.integers(0, len(POOL), rng.integers(1, 4))] for _ in range(40)]
    total = 0
    with httpx.Client() as http:
        for i, records in enumerate(devices):  # every device on its own, with its own ledger
            ledger = DeviceLedger(tmp_path / f"device-{i}.json", lifetime_epsilon=20.0, lifetime_delta=1e-3)
            # report_now=True: a test of the SDK's round trip, not of when devices report (test_unlinkable.py is)
            ack = DeviceClient(service.url, rid, ledger, client=http, report_now=True).participate(records)
            assert (ack.acknowledged, ack.counted, ack.duplicates) == (1, 1, 0)
            assert ledger.spent() == (8.0, 1e-5)
            total += min(2, len(records))  # m_C = 2 reports per device
        with pytest.raises(DeviceError, match="already reported"):  # the ledger allows one report per round
            DeviceClient(service.url, rid, DeviceLedger(tmp_path / "device-0.json"), client=http,
                         report_now=True).participate(devices[0])
    rnd = admin.round(rid)
    assert rnd["state"] == "collecting-reports" and rnd["counts"]["messages"] == 40
    assert rnd["counts"]["reports"] == total
    closed = admin.close(rid, "publish")
    assert closed["state"] == "results-published"
    res = admin.results(rid)
    assert res["sizes"]["reports"] == total and res["sizes"]["messages"] == 40
    assert {q["query"] for q in res["queries"]} == {"weather", "news", "maps", "*"}
    ls = admin.local_search(rid)
    assert {q["query"] for q in ls["queries"]} == {"weather", "news", "maps"} and ls["round"] == rid
    # in the suggestions' order: the guarded ranking score p_rank of the results, largest first (ALGORITHM.md §7.2,
    # "The suggestions' ranking"), then the estimate
    rank = {q["query"]: (-q["p_rank"], -q["p_blended"]) for q in res["queries"]}
    order = [q["query"] for q in ls["queries"]]
    assert order == sorted(order, key=rank.__getitem__)
    import io

    import pyarrow.parquet as pq
    table = pq.read_table(io.BytesIO(admin.results(rid, "parquet")))
    assert table.num_rows == len(res["records"]) and "p_blended" in table.column_names
    assert admin.results(rid, "csv").decode().splitlines()[0].startswith('"query","url"')
    assert rid in {r["id"] for r in admin.rounds()}
    with pytest.raises(ConflictError, match=r"closed|results-published"):  # reports after close: 409, not retried
        DeviceClient(service.url, rid, client=None, sleep=Sleeps(), report_now=True).participate(devices[1])


def test_a_relay_uploads_many_users_in_bodies_of_bounded_size(service: Service) -> None:
    admin = AdminClient(service.url, ADMIN)
    rid = admin.create_round("blender", PARAMS)["id"]
    tokens = admin.enrol_many(rid, [f"u{i}" for i in range(30)])
    bodies: list[int] = []
    with httpx.Client(event_hooks={"request": [lambda r: bodies.append(len(r.content))]}) as http:
        relay = OptinRelay(service.url, rid, client=http)
        uploads = [(t, [POOL[i % 4], POOL[(i + 1) % 4]]) for i, t in enumerate(tokens)]
        assert relay.upload_many(uploads, max_body_bytes=1000) == 60
        # one line is ~180 bytes: at most 1000 bytes a body, so 6..8 bodies, none empty
        assert 5 <= len(bodies) <= 10 and all(0 < b <= 1000 for b in bodies)
        stored = admin.round(rid)["counts"]["optin_records"]
        with pytest.raises(UnauthorizedError, match="line 2"):  # a bad token refuses the whole body
            relay.upload_many([(tokens[0], [POOL[0]]), ("not-a-token-of-this-round", [POOL[0]])])
    assert stored == 60 and admin.round(rid)["counts"]["optin_records"] == 60


def test_resubmission_is_acknowledged_and_counted_once(service: Service) -> None:
    from hybriddp.device.localalg import randomize_records
    rid, admin = published_round(service.url)
    dev = DeviceClient(service.url, rid)
    doc = dev.fetch_headlist()
    msgs = [randomize_records(doc, [POOL[i % len(POOL)]]) for i in range(30)]
    first = dev.submit_batch(msgs, chunk=7)  # 5 requests, NDJSON
    assert (first.acknowledged, first.counted, first.duplicates) == (30, 30, 0)
    again = dev.submit_batch(msgs[:10] + msgs[:3], chunk=50, ndjson=False)  # a retried batch, one id three times
    assert (again.acknowledged, again.counted, again.duplicates) == (13, 0, 13)
    one = dev.submit(msgs[5])
    assert (one.counted, one.duplicates) == (0, 1)
    assert admin.round(rid)["counts"]["messages"] == 30
    assert admin.close(rid, "publish")["counts"]["reports"] == 30


def test_headlist_cached_by_etag_on_the_real_server(service: Service) -> None:
    rid, _ = published_round(service.url)
    statuses: list[int] = []
    with httpx.Client(event_hooks={"response": [lambda r: statuses.append(r.status_code)]}) as http:
        dev = DeviceClient(service.url, rid, client=http)
        doc = dev.fetch_headlist()
        assert dev.fetch_headlist() is doc and dev.fetch_headlist() is doc
    assert statuses == [200, 304, 304]
    assert doc["content_hash"] == content_hash(doc)


def test_a_message_for_another_head_list_is_refused_once(service: Service) -> None:
    from hybriddp.device.localalg import randomize_records
    rid1, _ = published_round(service.url)
    rid2, _ = published_round(service.url, {**PARAMS, "epsilon": 6.0})
    doc1 = DeviceClient(service.url, rid1).fetch_headlist()
    sleeps = Sleeps()
    with pytest.raises(ServiceRequestError, match="head list") as info:
        DeviceClient(service.url, rid2, sleep=sleeps).submit(randomize_records(doc1, [POOL[0]]))
    assert 400 <= info.value.status < 500 and sleeps.delays == []  # a refusal is not retried
    with pytest.raises(NotFoundError):
        DeviceClient(service.url, "nosuchroundnosuchround").fetch_headlist()
    with pytest.raises(UnauthorizedError):
        AdminClient(service.url, "wrong-token-wrong-token").rounds()


def test_an_unacknowledged_message_is_resent_from_the_outbox(service: Service, tmp_path: Any) -> None:
    """The server fails while the device submits: the message stays in the outbox; the next run resends the
    same message (same id, counted once) instead of randomizing again, which the ledger would refuse."""
    from hybriddp.device.ledger import DeviceLedger
    rid, admin = published_round(service.url)
    doc = DeviceClient(service.url, rid).fetch_headlist()
    etag = f'"{doc["content_hash"]}"'
    outbox = tmp_path / "outbox.json"
    ledger_path = tmp_path / "ledger.json"
    with contextlib.ExitStack() as stack:
        down = Scripted([(200, doc, {"ETag": etag}), _error(503, "database_unavailable", "the database is locked")])
        down_url = stack.enter_context(local_server(down))
        ledger = DeviceLedger(ledger_path, lifetime_epsilon=20.0, lifetime_delta=1e-3)
        with pytest.raises(ServiceUnavailableError) as info:
            DeviceClient(down_url, rid, ledger, outbox=outbox, retry=RetryPolicy(attempts=3),
                         sleep=Sleeps(), report_now=True).participate(POOL[:2])  # report_now: a test
    pending = info.value.pending
    assert pending is not None and json.loads(outbox.read_text())["message"] == pending
    assert ledger.spent()[0] == 8.0  # charged before the message left
    again = DeviceClient(service.url, rid, DeviceLedger(ledger_path), outbox=outbox,
                         report_now=True).participate(POOL[:2])
    assert again.counted == 1 and not outbox.exists()
    assert admin.round(rid)["counts"]["messages"] == 1
    assert all(json.loads(body)["id"] == pending["id"] for m, _, _, body in down.seen if m == "POST")


def test_a_mean_round_through_the_sdk(service: Service) -> None:
    admin = AdminClient(service.url, ADMIN)
    rid = admin.create_round("mean", {"epsilon": 2.0, "lower": 0.0, "upper": 10.0, "sigma2": 4.0})["id"]
    tokens = admin.enrol_many(rid, [f"u{i}" for i in range(40)])
    for i, token in enumerate(tokens):
        assert OptinUploader(service.url, rid, token).upload_values([float(i % 10)]) == 1
    admin.publish_headlist(rid)
    with httpx.Client() as http:
        for i in range(60):  # 60 simulated devices from one process: no device ledger (one would refuse the 2nd)
            dev = DeviceClient(service.url, rid, DeviceClient.NO_LEDGER, client=http, report_now=True)  # a test
            assert dev.participate_value(float(i % 10)).counted == 1
        with pytest.raises(HybridDPError, match="not a mean round"):
            brid, _ = published_round(service.url)
            DeviceClient(service.url, brid, client=http).participate_value(1.0)
    admin.close(rid, "publish")
    res = admin.results(rid)
    assert res["sizes"]["messages"] == 60 and res["sizes"]["optin_users"] == 40


# ----- the CLI ----------------------------------------------------------------------------------------------
def _cli(*args: Any, env: dict[str, str] | None = None, ok: bool = True) -> Any:
    from click.testing import CliRunner

    from hybriddp.cli import cli
    result = CliRunner().invoke(cli, [str(a) for a in args], env={"HYBRIDDP_ADMIN_TOKEN": "", **(env or {})})
    if ok:
        assert result.exit_code == 0, result.output + result.stderr
    return result


def _clean_error(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def _csv(path: Any, records: list[tuple[str, str]]) -> Any:
    path.write_text("query,url\n" + "".join(f"{q},{u}\n" for q, u in records), encoding="utf-8")
    return path


def test_round_commands_end_to_end(service: Service, tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    url = service.url
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN + "\n")
    admin = ("--server", url, "--admin-token-file", token_file)
    out = _cli("round", "create", *admin, "--epsilon", 8, "--head-list-size", 10, "--m-c", 2, "--name", "cli",
               "--json")
    rnd = json.loads(out.stdout)
    rid = rnd["id"]
    assert rnd["params"]["m_c"] == 2 and rnd["params"]["head_list_size"] == 10 and rnd["state"] == "collecting-optin"
    users = tmp_path / "users.txt"
    users.write_text("".join(f"user-{i}\n" for i in range(len(OPTIN))))
    tokens = json.loads(_cli("round", "enrol", rid, *admin, "--users-file", users, "--json").stdout)["tokens"]
    assert list(tokens) == [f"user-{i}" for i in range(len(OPTIN))]
    for i, rec in enumerate(OPTIN):
        if i < 3:  # a few opt-in users upload with the CLI, the rest with the SDK
            tf = tmp_path / f"token-{i}"
            tf.write_text(tokens[f"user-{i}"])
            out = _cli("round", "upload", rid, "--server", url, "--token-file", tf, "--input",
                       _csv(tmp_path / f"optin-{i}.csv", [rec]))
            assert "uploaded 1 new records" in out.stdout
        else:
            OptinUploader(url, rid, tokens[f"user-{i}"]).upload([rec])
    assert "headlist-published" in _cli("round", "publish", rid, *admin).stdout
    ledger = tmp_path / "device-ledger.json"
    for i in range(6):  # device 0 with its own ledger file, the others with the default one of their own data home
        dev = _csv(tmp_path / f"device-{i}.csv", [POOL[i % len(POOL)], POOL[(i + 1) % len(POOL)]])
        flags = ("--device-ledger", ledger, "--lifetime-epsilon", 20, "--lifetime-delta", 1e-3) if i == 0 else ()
        got = json.loads(_cli("participate", "--server", url, "--round", rid, "--input", dev, *flags, "--json",
                              "--report-now",  # a test: at once
                              env={"HYBRIDDP_DATA_HOME": str(tmp_path / f"home-{i}")}).stdout)
        assert {k: v for k, v in got.items() if k != "send_at"} == {
            "round": rid, "acknowledged": 1, "counted": 1, "duplicates": 0, "skipped": False, "pending": False}
    _clean_error(_cli("participate", "--server", url, "--round", rid, "--input", tmp_path / "device-0.csv",
                      "--device-ledger", ledger, ok=False), "already reported")
    status = json.loads(_cli("round", "status", rid, "--server", url, "--json").stdout)
    assert status["state"] == "collecting-reports" and status["counts"]["messages"] == 6
    assert rid in _cli("round", "list", *admin).stdout
    _clean_error(_cli("round", "results", rid, "--server", url, ok=False), "HTTP 409")
    closed = _cli("round", "close", rid, "--server", url, "--json", "--flagged", "publish",
                  env={"HYBRIDDP_ADMIN_TOKEN": ADMIN})
    assert json.loads(closed.stdout)["state"] == "results-published"
    res = json.loads(_cli("round", "results", rid, "--server", url, "--json").stdout)
    assert res["sizes"]["reports"] == 12 and res["sizes"]["messages"] == 6
    table = _cli("round", "results", rid, "--server", url, "--output", tmp_path / "r.parquet").stdout
    assert "Top queries" in table and "weather" in table and "wrote" in table
    assert pq.read_table(tmp_path / "r.parquet").num_rows == len(res["records"])
    _cli("round", "results", rid, "--server", url, "--output", tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text().splitlines()[0].startswith('"query","url"')
    _cli("round", "results", rid, "--server", url, "--output", tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text()) == res
    _clean_error(_cli("participate", "--server", url, "--round", rid, "--input", tmp_path / "device-1.csv",
                      "--report-now", ok=False), "HTTP 409")  # reports after close


def test_round_commands_refuse_cleanly(service: Service, tmp_path: Any) -> None:
    url = service.url
    _clean_error(_cli("round", "create", "--server", url, ok=False), "no admin token", "HYBRIDDP_ADMIN_TOKEN")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-admin-token-at-all\n")
    _clean_error(_cli("round", "list", "--server", url, "--admin-token-file", wrong, ok=False), "HTTP 401")
    _clean_error(_cli("round", "list", "--server", url, "--admin-token-file", tmp_path / "missing", ok=False),
                 "no such file")
    _clean_error(_cli("round", "status", "nosuchroundnosuchround", "--server", url, ok=False), "HTTP 404")
    _clean_error(_cli("round", "status", "x", "--server", "localhost:1", ok=False), "--server")
    _clean_error(_cli("round", "results", "x", "--server", url, "--output", tmp_path / "r.txt", ok=False),
                 "unknown extension")
    _clean_error(_cli("round", "create", "--server", url, "--kind", "mean", "--lower", 5, "--upper", 1,
                      env={"HYBRIDDP_ADMIN_TOKEN": ADMIN}, ok=False), "lower")
    _clean_error(_cli("round", "create", "--server", url, "--epsilon", 0.1, env={"HYBRIDDP_ADMIN_TOKEN": ADMIN},
                      ok=False), "epsilon")
    dev = _csv(tmp_path / "d.csv", [POOL[0]])
    _clean_error(_cli("participate", "--server", "http://127.0.0.1:9", "--round", ROUND, "--input", dev,
                      "--retries", 1, ok=False), "cannot connect")


def test_enrol_writes_one_private_token_file_per_user_that_upload_reads(service: Service, tmp_path: Any) -> None:
    """`round enrol --out DIR`: one file per user, mode 0600, named by the percent-encoded identifier (a slash or
    a leading dot in an identifier cannot escape DIR or hide the file); `round upload --token-file` accepts it. A
    second enrolment into the same DIR is refused before the server is asked (the earlier files stay as they were),
    and so is a user named twice."""
    env = {"HYBRIDDP_ADMIN_TOKEN": ADMIN}
    rid = json.loads(_cli("round", "create", "--server", service.url, "--json", env=env).stdout)["id"]
    names = ["alice", "../bob", ".carol", "dörte smith"]
    out_dir = tmp_path / "tokens"
    args = [a for u in names for a in ("--user", u)]
    got = json.loads(_cli("round", "enrol", rid, "--server", service.url, *args, "--out", out_dir, "--json",
                          env=env).stdout)
    expected = {"alice": "alice.token", "../bob": "%2E.%2Fbob.token", ".carol": "%2Ecarol.token",
                "dörte smith": "d%C3%B6rte%20smith.token"}  # percent-encoded by hand, a leading dot too
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(expected.values())  # all inside DIR, none hidden
    assert {u: os.path.basename(f) for u, f in got["token_files"].items()} == expected
    for f in out_dir.iterdir():
        assert f.stat().st_mode & 0o777 == 0o600, f
    before = {f.name: f.read_text() for f in out_dir.iterdir()}
    assert len({t.strip() for t in before.values()}) == len(names)  # one token each
    up = _cli("round", "upload", rid, "--server", service.url, "--token-file", out_dir / expected["../bob"],
              "--input", _csv(tmp_path / "bob.csv", [POOL[0]]))
    assert "uploaded 1 new records" in up.stdout
    _clean_error(_cli("round", "enrol", rid, "--server", service.url, "--user", "alice", "--out", out_dir, env=env,
                      ok=False), "alice.token exists", "never replaced")
    _clean_error(_cli("round", "enrol", rid, "--server", service.url, "--user", "x", "--user", "x", "--out",
                      tmp_path / "other", env=env, ok=False), "each user once")
    assert {f.name: f.read_text() for f in out_dir.iterdir()} == before


# ----- demo --service -------------------------------------------------------------------------------------
@pytest.mark.parametrize("estimator", ["paper", "pooled", "reuse", "consistent"])
def test_demo_through_the_service_reproduces_the_seeded_demo(estimator: str) -> None:
    """Same seed: the round through HTTP and SQLite (opt-in uploads, the server's curator, device messages from
    the device randomizer, batched) gives exactly the simulation's JSON, every estimate and metric; the round's
    ``estimator`` parameter reaches the server's close."""
    plain = json.loads(_cli("demo", "--scale", 0.02, "--seed", 11, "--estimator", estimator, "--json").stdout)
    served = json.loads(_cli("demo", "--service", "--scale", 0.02, "--seed", 11, "--estimator", estimator,
                             "--json").stdout)
    assert plain["params"]["estimator"] == served["params"]["estimator"] == estimator
    service = served.pop("service")
    plain.pop("stage_seconds")
    served.pop("stage_seconds")
    assert served == plain
    assert service["state"] == "results-published" and service["messages_counted"] == plain["sizes"]["clients"]
    assert service["duplicates"] == 0


def test_demo_through_the_service_without_a_seed(tmp_path: Any, capsys: Any) -> None:
    """OS randomness everywhere (no vocabulary order sent, devices randomize on their own, the truth is a fresh
    sample); a small log whose top records are far above tau, so the curator's noise cannot empty the head list."""
    from hybriddp.cli.servicedemo import demo_through_service
    from hybriddp.core.params import BlenderParams
    from logdata import zipf_log
    log = zipf_log(n_users=3000, n_queries=6, urls_per_query=2, seed=3)
    params = BlenderParams(epsilon=8.0, optin_fraction=0.1)
    demo_through_service(log, params, seed=None, as_json=False, output=str(tmp_path / "demo.json"), top=5,
                         algorithm="blender", noise="discrete", source="the test log")
    out = capsys.readouterr().out
    assert "Top queries (paper Fig. 9)" in out and "service: round" in out and "users: 3,000" in out
    res = json.loads((tmp_path / "demo.json").read_text())
    assert res["seed"] is None and "warning" not in res and 0 < res["metrics"]["ndcg"] <= 1
    assert res["sizes"]["optin_users"] == 300 and res["sizes"]["reports"] == 2700
    _clean_error(_cli("demo", "--service", "--scale", 0.01, "--algorithm", "optin-only", ok=False), "--service")


def test_serve_demo_serves_a_finished_round_and_one_collecting_reports(tmp_path: Any, monkeypatch: Any) -> None:
    """`hybriddp serve --demo` runs a demo round into its database before serving and leaves a second round of
    the same population collecting reports (here at a small scale and seeded, so the head lists are known not to
    be empty; Uvicorn's serving loop is replaced by a check)."""
    import functools

    import uvicorn

    import hybriddp.cli.servicedemo as servicedemo_cli
    import hybriddp.service.demo as demo
    monkeypatch.setattr(servicedemo_cli, "DEMO_SCALE", 0.02)
    monkeypatch.setattr(demo, "populate_demo", functools.partial(demo.populate_demo, seed=5))
    served: dict[str, Any] = {}

    def fake_run(app: Any, **kw: Any) -> None:
        finished, collecting = app.state.store.rounds()  # both demo rounds are in the database the server opened
        with local_server(app) as url:
            dev = DeviceClient(url, finished.id)
            served.update(round=finished.id, finished=dev.round(), local_search=dev.local_search(),
                          optin_users=(finished.optin_users, collecting.optin_users))
            other = DeviceClient(url, collecting.id)
            served.update(collecting=other.round(), collecting_headlist=other.fetch_headlist(),
                          page_rounds=httpx.get(f"{url}/api/v1/local-search/rounds").json())

    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: fake_run(app() if kw.get("factory") else app))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:  # the factory chains serve's exit deadline to this process's signal handlers: put them back after
        out = _cli("serve", "--demo", "--data-dir", tmp_path / "data", "--port", 8123, "--log-level", "warning")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert f"demo round: http://127.0.0.1:8123/api/v1/rounds/{served['round']}/local-search" in out.stdout
    assert "local-search page: http://127.0.0.1:8123/\n" in out.stdout
    assert f"round page: http://127.0.0.1:8123/rounds/{served['round']}\n" in out.stdout
    assert served["finished"]["state"] == "results-published"
    assert [q["query"] for q in served["local_search"]["queries"]] == ["google"]  # seed 5: the one listed query

    rnd, headlist = served["collecting"], served["collecting_headlist"]
    assert f"collecting round page: http://127.0.0.1:8123/rounds/{rnd['id']}\n" in out.stdout
    assert rnd["state"] == "headlist-published" and "collecting reports" in rnd["name"]
    assert rnd["params"] == served["finished"]["params"]  # the same parameters, as many opt-in users
    assert rnd["counts"]["optin_users"] is None  # live opt-in counts are for administrators only
    assert served["optin_users"][0] == served["optin_users"][1] > 0
    assert rnd["counts"]["messages"] == 0
    assert headlist["queries"] and headlist["content_hash"] == rnd["headlist_hash"]
    # the local-search page searches the finished round and contributes to the collecting one
    assert served["page_rounds"]["search"]["id"] == served["round"]
    assert served["page_rounds"]["contribute"]["id"] == rnd["id"]


def test_a_mean_round_with_the_cli(service: Service, tmp_path: Any) -> None:
    env = {"HYBRIDDP_ADMIN_TOKEN": ADMIN, "HYBRIDDP_SERVER": service.url}
    rnd = json.loads(_cli("round", "create", "--kind", "mean", "--epsilon", 2, "--lower", 0, "--upper", 10,
                          "--sigma2", 4, "--json", env=env).stdout)
    rid = rnd["id"]
    assert rnd["kind"] == "mean" and rnd["params"]["sigma2"] == 4.0
    tokens = json.loads(_cli("round", "enrol", rid, "--user", "a", "--user", "b", "--json", env=env).stdout)["tokens"]
    for token in tokens.values():
        assert "uploaded 2 new values" in _cli("round", "upload", rid, "--value", 3, "--value", 4,
                                           env={**env, "HYBRIDDP_OPTIN_TOKEN": token}).stdout
    _cli("round", "publish", rid, env=env)
    ledger = tmp_path / "ledger.json"
    first = json.loads(_cli("participate", "--round", rid, "--value", 7, "--device-ledger", ledger,
                            "--lifetime-epsilon", 5, "--lifetime-delta", 1e-6, "--json", "--report-now",
                            env=env).stdout)  # --report-now: a test
    assert first["counted"] == 1 and json.loads(ledger.read_text())["rounds"]  # charged under the round's hash
    _clean_error(_cli("participate", "--round", rid, "--value", 7, "--device-ledger", ledger, env=env, ok=False),
                 "already reported")
    for v in (1, 2, 9):  # three more devices, each with the default ledger of its own data home
        _cli("participate", "--round", rid, "--value", v, "--report-now",
             env={**env, "HYBRIDDP_DATA_HOME": str(tmp_path / str(v))})
    _cli("round", "close", rid, "--flagged", "publish", env=env)
    table = _cli("round", "results", rid, env=env).stdout
    assert "mean estimates" in table and all(name in table for name in ("optin", "client", "hybrid"))
    res = json.loads(_cli("round", "results", rid, "--json", env=env).stdout)
    assert res["sizes"]["messages"] == 4 and res["sizes"]["optin_users"] == 2
    _clean_error(_cli("round", "create", "--kind", "blender", "--lower", 0, env=env, ok=False), "--kind blender")


# ----- the device ledger by default -------------------------------------------------------------------------
def _one_line_refusal(result: Any, rid: str, *needles: str) -> str:
    """A refused `participate`: exit status 2, no traceback, one line naming the round."""
    _clean_error(result, f"round {rid}", "No report was sent", *needles)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_participate_three_times_in_one_round_counts_once(service: Service, tmp_path: Any) -> None:
    """With default settings the second and third runs are refused by the per-user device ledger (in
    HYBRIDDP_DATA_HOME, 0700/0600) before anything is sent: the server counts one message, the device spent ε once."""
    import os
    import stat
    from pathlib import Path
    rid, admin = published_round(service.url)
    dev = _csv(tmp_path / "device.csv", POOL[:2])
    run = ("participate", "--server", service.url, "--round", rid, "--input", dev)
    assert json.loads(_cli(*run, "--json", "--report-now").stdout)["counted"] == 1  # --report-now: a test
    for _ in range(2):
        line = _one_line_refusal(_cli(*run, ok=False), rid, "already reported", "would spend ε = 8 again",
                                 "lifetime ε = 16, δ = 0.0001", "--no-device-ledger")
        assert "spent so far ε = 8," in line
    assert admin.round(rid)["counts"]["messages"] == 1
    home = Path(os.environ["HYBRIDDP_DATA_HOME"])
    ledger = home / "device-ledger.json"
    hl = httpx.get(f"{service.url}/api/v1/rounds/{rid}/headlist").json()  # its shape, for PLD accounting
    shape = {"kq": [len(q["urls"]) + 1 for q in hl["queries"]] + [1], "f_c": hl["f_c"], "m_c": hl["m_c"]}
    # keyed by the lists the device randomized over (the head list without its round's commitments)
    assert json.loads(ledger.read_text())["rounds"] == {lists_hash(hl): {"epsilon": 8.0, "delta": 1e-5,
                                                                         "shape": shape}}
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o600 and stat.S_IMODE(home.stat().st_mode) == 0o700
    assert sorted(p.name for p in home.iterdir()) == ["device-ledger.json"]  # the outbox went with the ack


def test_device_client_participates_once_per_round_by_default(service: Service) -> None:
    from hybriddp.device.ledger import DeviceLedgerRefusal
    rid, admin = published_round(service.url)
    with httpx.Client() as http:
        # report_now=True: a test of the ledger, not of when devices report
        first = DeviceClient(service.url, rid, client=http, report_now=True)
        second = DeviceClient(service.url, rid, client=http, report_now=True)
        assert first.participate(POOL[:2]).counted == 1
        for dev in (first, second, DeviceClient(service.url, rid, client=http)):  # the same device, three objects
            with pytest.raises(DeviceLedgerRefusal) as info:
                dev.participate(POOL[2:4])
            message = str(info.value)
            assert message.startswith(f"this device already reported in round {rid} (head list sha256:")
            assert "lifetime ε = 16" in message and "DeviceClient.NO_LEDGER" in message and "\n" not in message
    assert admin.round(rid)["counts"]["messages"] == 1


def test_the_lifetime_budget_is_refused_across_rounds(service: Service, tmp_path: Any) -> None:
    """Rounds of ε = 8, 7 and 6 against the default lifetime ε = 16: the third is refused, nothing reaches its
    round. (Each round has its own ε, so its own head-list hash: the ledger keys a round by that hash.)"""
    rounds = [published_round(service.url, {**PARAMS, "epsilon": eps}, users=f"round-{eps}") for eps in (8, 7, 6)]
    dev = _csv(tmp_path / "device.csv", POOL[:2])
    for rid, _ in rounds[:2]:
        _cli("participate", "--server", service.url, "--round", rid, "--input", dev, "--report-now")  # a test
    rid3, admin = rounds[2]
    _one_line_refusal(_cli("participate", "--server", service.url, "--round", rid3, "--input", dev, ok=False), rid3,
                      "would spend ε = 6, δ = 1e-05 more and pass this device's lifetime ε = 16, δ = 0.0001",
                      "spent so far ε = 15 by basic composition, ε = ", " by PLD accounting, δ = 2e-05",
                      "--no-device-ledger")
    assert [admin.round(rid)["counts"]["messages"] for rid, _ in rounds] == [1, 1, 0]


def test_a_mean_round_is_charged_once_by_default(service: Service) -> None:
    from hybriddp.device.ledger import DeviceLedgerRefusal
    admin = AdminClient(service.url, ADMIN)
    rid = admin.create_round("mean", {"epsilon": 2.0, "lower": 0.0, "upper": 10.0, "sigma2": 4.0})["id"]
    OptinUploader(service.url, rid, admin.enrol(rid, "u")).upload_values([1.0, 2.0])
    admin.publish_headlist(rid)
    assert DeviceClient(service.url, rid, report_now=True).participate_value(3.0).counted == 1  # a test: at once
    with pytest.raises(DeviceLedgerRefusal, match=f"already reported in round {rid} .* spend ε = 2 again"):
        DeviceClient(service.url, rid, report_now=True).participate_value(3.0)
    assert admin.round(rid)["counts"]["messages"] == 1


def test_the_explicit_opt_out_allows_repeated_reports(service: Service, tmp_path: Any) -> None:
    import os
    from pathlib import Path
    rid, admin = published_round(service.url)
    dev = _csv(tmp_path / "device.csv", POOL[:2])
    run = ("participate", "--server", service.url, "--round", rid, "--input", dev)
    for _ in range(2):
        out = _cli(*run, "--no-device-ledger", "--report-now")  # --report-now: a test
        assert "warning: --no-device-ledger" in out.stderr and "counted" in out.stdout
    for _ in range(2):
        assert DeviceClient(service.url, rid, DeviceClient.NO_LEDGER, report_now=True).participate(
            POOL[:1]).counted == 1
    assert admin.round(rid)["counts"]["messages"] == 4
    assert not Path(os.environ["HYBRIDDP_DATA_HOME"]).exists()  # no ledger, no outbox: nothing written
    _clean_error(_cli(*run, "--no-device-ledger", "--device-ledger", tmp_path / "l.json", ok=False),
                 "--device-ledger and --no-device-ledger contradict each other")
    _clean_error(_cli(*run, "--no-device-ledger", "--lifetime-epsilon", 3, ok=False), "--lifetime-epsilon and")
    with pytest.raises(HybridDPError, match="device_ledger"):
        DeviceClient(service.url, rid, True)  # type: ignore[arg-type]
    assert admin.round(rid)["counts"]["messages"] == 4


def test_an_unacknowledged_message_is_resent_from_the_default_outbox(service: Service, tmp_path: Any) -> None:
    """The default ledger's outbox: the server fails while the device submits; the next run resends the same
    message (same id, counted once, not charged again); the run after that is refused."""
    import os
    from pathlib import Path
    rid, admin = published_round(service.url)
    doc = DeviceClient(service.url, rid, DeviceClient.NO_LEDGER).fetch_headlist()
    dev = _csv(tmp_path / "device.csv", POOL[:2])
    with local_server(Scripted([(200, doc, {"ETag": f'"{doc["content_hash"]}"'}),
                                _error(503, "database_unavailable", "the database is locked")])) as down_url:
        _clean_error(_cli("participate", "--server", down_url, "--round", rid, "--input", dev, "--retries", 1,
                          "--report-now", ok=False), "gave up")  # --report-now: a test
    home = Path(os.environ["HYBRIDDP_DATA_HOME"])
    pending = json.loads((home / f"device-ledger.json.outbox-{rid}.json").read_text())
    again = json.loads(_cli("participate", "--server", service.url, "--round", rid, "--input", dev,
                            "--json").stdout)
    assert again["counted"] == 1 and not (home / f"device-ledger.json.outbox-{rid}.json").exists()
    assert json.loads((home / "device-ledger.json").read_text())["rounds"][lists_hash(doc)]["epsilon"] == 8.0
    _one_line_refusal(_cli("participate", "--server", service.url, "--round", rid, "--input", dev, ok=False), rid,
                      "already reported")
    assert admin.round(rid)["counts"]["messages"] == 1
    # the SDK's default outbox is the same file: a message left there by the CLI is resent by DeviceClient
    (home / f"device-ledger.json.outbox-{rid}.json").write_text(json.dumps(pending))
    ack = DeviceClient(service.url, rid).participate(POOL[:2])
    assert (ack.counted, ack.duplicates) == (0, 1) and admin.round(rid)["counts"]["messages"] == 1


def test_round_lifecycle_commands_abort_delete_upload_twice_and_the_ledger(service: Service, tmp_path: Any) -> None:
    """`round upload` run twice stores the records once; `round abort` and `round delete --yes` end rounds and
    delete their raw data; bad input exits 2 with one line; `privacy report` reads the service's ledger."""
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN + "\n")
    admin = ("--server", service.url, "--admin-token-file", token_file)
    rid = json.loads(_cli("round", "create", *admin, "--retention-hours", 2, "--json").stdout)["id"]
    token = json.loads(_cli("round", "enrol", rid, *admin, "--user", "u-1", "--json").stdout)["tokens"]["u-1"]
    (tmp_path / "tok").write_text(token)
    records = _csv(tmp_path / "r.csv", OPTIN[:2])
    outs = [_cli("round", "upload", rid, "--server", service.url, "--token-file", tmp_path / "tok", "--input",
                 records).stdout for _ in range(2)]
    assert "uploaded 2 new records" in outs[0] and "uploaded 0 new records" in outs[1] and "repeat" in outs[1]
    status = AdminClient(service.url, ADMIN).round(rid)
    assert status["counts"]["optin_records"] == 2 and status["retention_deadline"] is not None
    _clean_error(_cli("round", "delete", rid, *admin, ok=False), "--yes")
    _clean_error(_cli("round", "create", *admin, "--retention-hours", -1, ok=False), "retention")
    _clean_error(_cli("round", "create", *admin, "--seed", 3, ok=False), "--insecure-testing-seeds")
    aborted = json.loads(_cli("round", "abort", rid, *admin, "--json").stdout)
    assert aborted["state"] == "aborted" and aborted["raw_data_purged"] is not None
    _clean_error(_cli("round", "abort", rid, *admin, ok=False), "aborted")
    assert json.loads(_cli("round", "delete", rid, *admin, "--yes", "--json").stdout)["state"] == "deleted"
    other, _ = published_round(service.url)
    report = json.loads(_cli("privacy", "report", service.store_url, "--json").stdout)
    assert other in json.dumps(report) and "u-1" not in json.dumps(report)


def test_flagged_results_are_held_at_close_and_published_from_the_command_line(service: Service) -> None:
    """`round close` holds results the anchor check flags and says so; `round publish-results --flagged remove`
    publishes them without the flagged entries (ALGORITHM.md §7.2)."""
    from hybriddp.core.protocol import new_message_id

    rid, admin = published_round(service.url)
    hl = httpx.get(f"{service.url}/api/v1/rounds/{rid}/headlist").json()
    target = ("maps", "https://m.example/a")
    fakes = [{"id": new_message_id(), "headlist": hl["content_hash"],
              "reports": [{"query": target[0], "url": target[1]}]} for _ in range(400)]
    assert httpx.post(f"{service.url}/api/v1/rounds/{rid}/reports", json=fakes).json()["counted"] == 400
    env = {"HYBRIDDP_ADMIN_TOKEN": ADMIN}
    closed = _cli("round", "close", rid, "--server", service.url, env=env)
    assert "results-held" in closed.stdout and "held" in closed.stderr and "publish-results" in closed.stderr
    assert httpx.get(f"{service.url}/api/v1/rounds/{rid}/results").status_code == 409
    out = _cli("round", "publish-results", rid, "--server", service.url, "--flagged", "remove", "--json", env=env)
    assert json.loads(out.stdout)["state"] == "results-published"
    listed = {(q["query"], u["url"]) for q in admin.local_search(rid)["queries"] for u in q["urls"]}
    assert target not in listed

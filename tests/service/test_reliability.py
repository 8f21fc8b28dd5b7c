"""Reliability through the real server process (issue 10, "Reliability and security").

Every test starts ``python -m hybriddp serve`` as a subprocess on a fresh database (``store_url``:
SQLite and PostgreSQL) and talks HTTP to it, so uvicorn's own request handling is part of what is
tested:

* the server is SIGKILLed while threads stream reports into it and restarted on the same database;
  every unacknowledged message (and some acknowledged ones) is sent again; after the close, every
  acknowledged message is stored exactly once and the per-entry counts equal an independent count
  of the distinct messages (hybriddp.server.party.count_messages, in memory);
* a close while threads upload: every request is acknowledged (200, then counted) or refused (409),
  and the close counts exactly the acknowledged messages;
* reports after close (409, also for an id stored before the close);
* oversized and malformed bodies: a JSON 4xx error each, never a 5xx, and no traceback in the
  server's log.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import sqlalchemy as sa

from hybriddp.core.protocol import new_message_id
from hybriddp.curator.release import release_from_documents
from hybriddp.device.localalg import randomize_records
from hybriddp.server.party import count_messages
from hybriddp.service.process import ServeProcess

API = "/api/v1"


# ----- the server as a process ------------------------------------------------------------------
ServerProcess = ServeProcess  # `hybriddp serve` as a child process (tests/browser imports it from here too)


@pytest.fixture
def server(store_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(store_url, tmp_path, ("--open-admission",))  # the report path; admission: test_tokens.py
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
    assert "Traceback" not in srv.log_text(), srv.log_text()[-4000:]


# ----- a round with a published head list -------------------------------------------------------
QUERIES = [f"query {i}" for i in range(6)]


def optin_records(user: int) -> list[dict[str, Any]]:
    """A few records per user, concentrated on six (query, URL) pairs so the head list is not empty."""
    rng = random.Random(user)
    out = []
    for _ in range(rng.randint(1, 3)):
        q = min(int(rng.expovariate(0.6)), 5)
        out.append({"query": QUERIES[q], "url": f"https://site{q}.example/{rng.randint(0, 1)}"})
    return out


def open_round(srv: ServerProcess, n_users: int = 200,
               records: Callable[[int], list[dict[str, Any]]] | None = None) -> tuple[str, dict[str, Any]]:
    """A BLENDER round with ``n_users`` opt-in users and its head list published; user ``i`` uploads
    ``records(i)`` (default :func:`optin_records`)."""
    records = records or optin_records
    with httpx.Client(base_url=srv.base_url + API, timeout=60) as http:
        r = http.post("/rounds", headers=srv.admin, json={"kind": "blender", "name": "reliability", "params": {
            "epsilon": 4.0, "delta": 1e-5, "head_list_size": 10, "m_o": 1, "m_c": 1}})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        r = http.post(f"/rounds/{rid}/optin/enrol", headers=srv.admin,
                      json={"users": [f"user-{user}" for user in range(n_users)]})
        assert r.status_code == 201, r.text
        for user, token in enumerate(r.json()["tokens"]):
            r = http.post(f"/rounds/{rid}/optin/records", json={"records": records(user)},
                          headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
        r = http.post(f"/rounds/{rid}/headlist", headers=srv.admin)
        assert r.status_code == 200, r.text
        doc = http.get(f"/rounds/{rid}/headlist").json()
    assert doc["queries"], "the test's opt-in data must give a non-empty head list"
    return rid, doc


def device_messages(doc: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """``n`` device messages made by the device randomizer, each from one record of the head list."""
    rng = random.Random(5)
    records = [(q["query"], u) for q in doc["queries"] for u in q["urls"]] + [("unlisted query", "https://unlisted.example/")]
    return [randomize_records(doc, [rng.choice(records)]) for _ in range(n)]


def post_reports(http: httpx.Client, rid: str, msgs: list[dict[str, Any]]) -> httpx.Response:
    """One message as an object, several as a JSON array."""
    return http.post(f"{API}/rounds/{rid}/reports", json=msgs[0] if len(msgs) == 1 else msgs)


def close_round(srv: ServerProcess, rid: str) -> dict[str, Any]:
    r = httpx.post(f"{srv.base_url}{API}/rounds/{rid}/close", headers=srv.admin, timeout=120,
                   json={"flagged": "publish"})  # the devices here are not the opt-in population
    assert r.status_code == 200, r.text
    return r.json()


def stored_messages(db_url: str, rid: str) -> tuple[int, int, int, int]:
    """Read from the database itself: (message rows, distinct message ids, stored report entries, sum of the
    per-entry counts kept at insert time) of round ``rid``."""
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            num = conn.execute(sa.text("SELECT num FROM rounds WHERE id = :r"), {"r": rid}).scalar_one()
            rows, distinct, firsts = conn.execute(sa.text(  # stored messages: settled ones and recent ones (SQLite)
                "SELECT count(*), count(DISTINCT message_id), count(entry) FROM (SELECT message_id, entry FROM "
                "messages WHERE round_num = :n UNION ALL SELECT message_id, entry FROM messages_recent "
                "WHERE round_num = :n) AS t"), {"n": num}).one()
            extra = conn.execute(sa.text("SELECT count(*) FROM extra_entries WHERE round_num = :n"),
                                 {"n": num}).scalar_one()
            counted = conn.execute(sa.text("SELECT coalesce(sum(n), 0) FROM entry_counts WHERE round_num = :n"),
                                   {"n": num}).scalar_one()
        return int(rows), int(distinct), int(firsts) + int(extra), int(counted)
    finally:
        engine.dispose()


def expected_counts(doc: dict[str, Any], estimates: dict[str, Any], msgs: list[dict[str, Any]]) -> list[int]:
    """Reports per head-list entry of the distinct messages, counted in memory by the library."""
    release = release_from_documents(doc, estimates)
    return count_messages(release, msgs).counts.tolist()


# ----- SIGKILL mid-stream ------------------------------------------------------------------------
def test_sigkill_mid_stream_every_acknowledged_report_is_stored_exactly_once(server: ServerProcess,
                                                                             store_url: str) -> None:
    rid, doc = open_round(server)
    msgs = device_messages(doc, 4000)
    by_id = {m["id"]: m for m in msgs}
    acked: set[str] = set()
    unacked: list[dict[str, Any]] = []
    refused: list[str] = []
    lock = threading.Lock()

    def stream(part: list[dict[str, Any]], batch: int) -> None:
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            for i in range(0, len(part), batch):
                chunk = part[i:i + batch]
                try:
                    r = post_reports(http, rid, chunk)
                except httpx.TransportError:  # the server died with this request in flight (or was down)
                    with lock:
                        unacked.extend(chunk)
                    continue
                with lock:
                    if r.status_code == 200 and r.json()["acknowledged"] == len(chunk):
                        acked.update(m["id"] for m in chunk)
                    else:
                        refused.append(f"{r.status_code} {r.text[:300]}")

    # five streams: single messages, and JSON arrays of 7, 25, 60 and 400 (over 64 KiB: checked by the
    # server's worker processes, hybriddp.service.checkpool)
    batches = (1, 7, 25, 60, 400)
    threads = [threading.Thread(target=stream, args=(msgs[k::5], batch)) for k, batch in enumerate(batches)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(acked) < 600 and time.monotonic() < deadline:
        time.sleep(0.002)
    workers = psutil.Process(server.proc.pid).children(recursive=True)
    server.kill9()
    for t in threads:
        t.join(120)
    # the check workers end with the server (they watch their parent), even after SIGKILL
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, [p.cmdline()[:3] for p in alive]
    assert not refused, refused[:5]
    assert len(acked) >= 600 and unacked, (len(acked), len(unacked))
    assert len(acked) + len(unacked) == len(msgs)

    server.start()
    resend = unacked + [by_id[m] for m in random.Random(1).sample(sorted(acked), 200)]
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        for i in range(0, len(resend), 50):
            r = post_reports(http, rid, resend[i:i + 50])
            assert r.status_code == 200, r.text
            ack = r.json()
            assert ack["acknowledged"] == len(resend[i:i + 50])
            assert ack["counted"] + ack["duplicates"] == ack["acknowledged"]
        # acknowledged before the kill: acknowledged again, counted no more
        again = [by_id[m] for m in sorted(acked)[:100]]
        ack = post_reports(http, rid, again).json()
        assert (ack["acknowledged"], ack["counted"], ack["duplicates"]) == (100, 0, 100)

    closed = close_round(server, rid)
    distinct = acked | {m["id"] for m in unacked}
    n_reports = sum(len(by_id[m]["reports"]) for m in distinct)
    assert closed["state"] == "results-published"
    assert closed["counts"]["messages"] == len(distinct) == len(msgs)
    assert closed["counts"]["reports"] == n_reports
    server.stop()
    assert stored_messages(store_url, rid) == (len(msgs), len(msgs), n_reports, n_reports)
    # the estimates were computed from exactly these counts: compare per entry with an in-memory count
    server.start()
    release = httpx.get(f"{server.base_url}{API}/rounds/{rid}/release", timeout=30).json()
    assert release["counts"] == expected_counts(doc, release["estimates"], msgs + resend)


# ----- close while uploads run -----------------------------------------------------------------
def test_close_during_uploads_counts_exactly_the_acknowledged_reports(server: ServerProcess, store_url: str) -> None:
    rid, doc = open_round(server)
    msgs = device_messages(doc, 2400)
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        assert post_reports(http, rid, msgs[:50]).status_code == 200  # a round without reports cannot close
    acked: set[str] = {m["id"] for m in msgs[:50]}
    statuses: list[tuple[int, str]] = []
    lock = threading.Lock()

    def stream(part: list[dict[str, Any]], batch: int) -> None:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            for i in range(0, len(part), batch):
                chunk = part[i:i + batch]
                r = post_reports(http, rid, chunk)
                with lock:
                    statuses.append((r.status_code, r.text))
                    if r.status_code == 200:
                        acked.update(m["id"] for m in chunk)

    rest = msgs[50:]
    threads = [threading.Thread(target=stream, args=(rest[k::3], batch)) for k, batch in enumerate((1, 10, 40))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(acked) < 500 and time.monotonic() < deadline:
        time.sleep(0.002)
    closed = close_round(server, rid)
    for t in threads:
        t.join(120)
    codes = {code for code, _ in statuses}
    assert codes <= {200, 409}, [s for s in statuses if s[0] not in (200, 409)][:3]
    assert 409 in codes, "the close must have happened while the uploads ran"
    for code, text in statuses:
        if code == 409:
            assert json.loads(text)["error"]["code"] == "conflict"
    by_id = {m["id"]: m for m in msgs}
    assert closed["counts"]["messages"] == len(acked)
    assert closed["counts"]["reports"] == sum(len(by_id[m]["reports"]) for m in acked)
    rows, distinct, entries, counted = stored_messages(store_url, rid)
    assert rows == distinct == len(acked)
    assert entries == counted == closed["counts"]["reports"]


# ----- several server processes ------------------------------------------------------------------
def test_several_worker_processes_share_the_rounds_and_die_with_the_server(store_url: str, tmp_path: Path) -> None:
    """`serve --workers 3`: any process answers any request (rounds and reports live in the database);
    concurrent retries through different processes still count a message once; after SIGKILL of
    `serve` no worker keeps serving the port."""
    srv = ServerProcess(store_url, tmp_path, ("--workers", "3", "--open-admission"))
    srv.start()
    try:
        rid, doc = open_round(srv, n_users=150)
        msgs = device_messages(doc, 600)
        acks: list[dict[str, int]] = []

        def send(part: list[dict[str, Any]]) -> None:
            with httpx.Client(base_url=srv.base_url, timeout=60) as http:  # a connection each: any process
                for i in range(0, len(part), 20):
                    r = post_reports(http, rid, part[i:i + 20])
                    assert r.status_code == 200, r.text
                    acks.append(r.json())
        # every message twice, from different threads (so through different processes, concurrently)
        threads = [threading.Thread(target=send, args=(msgs[k::3] + msgs[(k + 1) % 3::3],)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sum(a["acknowledged"] for a in acks) == 2 * len(msgs)
        assert sum(a["counted"] for a in acks) == len(msgs)
        workers = psutil.Process(srv.proc.pid).children(recursive=True)
        assert len([p for p in workers if "spawn_main" in " ".join(p.cmdline())]) >= 3
        srv.kill9()
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, [p.cmdline()[:3] for p in alive]
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{srv.base_url}/health", timeout=2)
        srv.start()  # the port is free again; the restarted server has every message once
        closed = close_round(srv, rid)
        assert closed["counts"]["messages"] == len(msgs)
    finally:
        srv.stop()
    assert "Traceback" not in srv.log_text(), srv.log_text()[-4000:]


# ----- after close --------------------------------------------------------------------------------
def test_reports_after_close_are_refused_with_409(server: ServerProcess) -> None:
    rid, doc = open_round(server, n_users=150)
    msgs = device_messages(doc, 20)
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        assert post_reports(http, rid, msgs[:10]).status_code == 200
        before = close_round(server, rid)["counts"]
        for body in (msgs[10:], msgs[10:11], msgs[:1]):  # new ids, one new id, an id stored before the close
            r = post_reports(http, rid, body)
            assert r.status_code == 409, r.text
            assert r.headers["content-type"].startswith("application/json")
            err = r.json()["error"]
            assert err["code"] == "conflict" and rid in err["message"]
        r = http.post(f"{API}/rounds/{rid}/reports", content="\n".join(json.dumps(m) for m in msgs[10:]) + "\n",
                      headers={"Content-Type": "application/x-ndjson"})
        assert r.status_code == 409
        after = http.get(f"{API}/rounds/{rid}", headers=server.admin).json()["counts"]
    assert after == before and after["messages"] == 10


# ----- oversized and malformed bodies ---------------------------------------------------------
def assert_json_4xx(r: httpx.Response, *statuses: int) -> dict[str, Any]:
    """A 4xx (one of ``statuses`` when given) with the JSON error shape of the contract."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    if statuses:
        assert r.status_code in statuses, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert re.fullmatch(r"[a-z][a-z0-9_]*", err["code"]), err
    assert isinstance(err["message"], str) and len(err["message"]) > 10, err
    return err


def test_oversized_bodies_get_413(server: ServerProcess) -> None:
    rid, doc = open_round(server, n_users=150)
    msg = device_messages(doc, 1)[0]
    big = 17 * 2**20  # over the 16 MiB default
    padding = json.dumps(msg)[:-1] + ', "pad": "' + "x" * big + '"}'
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        assert_json_4xx(http.post(f"{API}/rounds/{rid}/reports", content=padding,
                                  headers={"Content-Type": "application/json"}), 413)

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must hold while reading
            yield b"["
            for _ in range(big // 2**16 + 1):
                yield b" " * 2**16
            yield b"]"
        assert_json_4xx(http.post(f"{API}/rounds/{rid}/reports", content=chunks(),
                                  headers={"Content-Type": "application/json"}), 413)
        lines = (json.dumps(dict(msg, id=new_message_id())) for _ in range(big // 150))
        body = "\n".join(lines)
        assert_json_4xx(http.post(f"{API}/rounds/{rid}/reports", content=body,
                                  headers={"Content-Type": "application/x-ndjson"}), 413)
        assert_json_4xx(http.post(f"{API}/rounds", content=padding, headers=server.admin), 413)
        # nothing of it was stored, and the server still works
        assert http.get(f"{API}/rounds/{rid}").json()["counts"]["messages"] == 0
        assert post_reports(http, rid, [msg]).status_code == 200


def test_large_bodies_are_checked_like_small_ones(server: ServerProcess) -> None:
    """Bodies over 64 KiB are parsed and checked in worker processes, small ones on the event loop:
    the same refusal (status, code, message naming the message) and the same counting either way."""
    rid, doc = open_round(server, n_users=150)
    msgs = device_messages(doc, 700)
    assert len(json.dumps(msgs)) > 64 * 1024 > len(json.dumps(msgs[:3]))
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for part in (msgs[:3], msgs):
            n = len(part)
            bad = [*part[:-1], dict(part[-1], headlist="sha256:" + "0" * 64)]
            r = post_reports(http, rid, bad)
            err = assert_json_4xx(r, 422)
            assert err["code"] == "headlist_error" and err["message"].startswith(f"message {n}: report made for"), err
            assert http.get(f"{API}/rounds/{rid}").json()["counts"]["messages"] == 0  # nothing of it stored
        for part, counted in ((msgs[:3], 3), (msgs, 697), (msgs, 0)):
            ack = post_reports(http, rid, part).json()
            assert ack == {"acknowledged": len(part), "counted": counted, "duplicates": len(part) - counted}
        assert http.get(f"{API}/rounds/{rid}").json()["counts"]["messages"] == 700


def test_malformed_bodies_get_json_4xx_never_5xx(server: ServerProcess) -> None:
    rid, doc = open_round(server, n_users=150)
    good = device_messages(doc, 1)[0]
    reports = f"{API}/rounds/{rid}/reports"
    listed = doc["queries"][0]
    bad_bodies: list[tuple[str, bytes | str]] = [
        ("empty", b""), ("truncated", json.dumps(good)[:-5]), ("not json", b"hello"), ("null", b"null"),
        ("number", b"42"), ("string", b'"message"'), ("nan", b'{"id": NaN}'), ("huge number", b"1e400"),
        ("invalid utf-8", b'{"id": "\xff\xfe", "headlist": "x", "reports": []}'),
        ("utf-16", json.dumps(good).encode("utf-16")), ("binary", bytes(range(256)) * 4),
        ("deep nesting", b"[" * 100_000 + b"]" * 100_000), ("deep object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        ("missing id", json.dumps({k: v for k, v in good.items() if k != "id"})),
        ("bad id", json.dumps(dict(good, id="short"))), ("id number", json.dumps(dict(good, id=12345))),
        ("other head list", json.dumps(dict(good, headlist="sha256:" + "0" * 64))),
        ("reports not a list", json.dumps(dict(good, reports={"query": None}))),
        ("too many reports", json.dumps(dict(good, reports=[{"query": None, "url": None}] * 2))),
        ("unlisted query", json.dumps(dict(good, reports=[{"query": "not listed", "url": None}]))),
        ("unlisted url", json.dumps(dict(good, reports=[{"query": listed["query"], "url": "https://no.example/"}]))),
        ("report fields numbers", json.dumps(dict(good, reports=[{"query": 1, "url": 2}]))),
        ("array with a bad message", json.dumps([good, dict(good, id="x")])),
        ("array of numbers", b"[1, 2, 3]"),
        ("large array with a bad last message",  # over 64 KiB: parsed and checked in a worker process
         json.dumps([dict(good, id=new_message_id()) for _ in range(600)] + [dict(good, id="x")])),
        ("lone surrogate", b'{"id": "\\ud800", "headlist": "x", "reports": []}'),
    ]
    ndjson = [("bad line", json.dumps(good) + "\n{not json\n"), ("array line", "[1]\n"),
              ("blank lines only", "\n\n\n"), ("binary", bytes(range(256)))]
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for kind, bodies in (("application/json", bad_bodies), ("application/x-ndjson", ndjson)):
            for name, body in bodies:
                r = http.post(reports, content=body, headers={"Content-Type": kind})
                try:
                    assert_json_4xx(r)
                except AssertionError as exc:
                    raise AssertionError(f"{kind} {name}: {exc}") from None
        r = http.post(reports, content=json.dumps(good), headers={"Content-Type": "text/plain"})
        assert r.status_code < 500 and r.headers["content-type"].startswith("application/json")
        for path in (f"{API}/rounds/{'A' * 22}/reports", f"{API}/rounds/%00%ff/reports",
                     f"{API}/rounds/{'x' * 5000}/reports"):
            assert_json_4xx(http.post(path, json=good), 404, 400, 414, 422)
        admin_bodies: list[Any] = [b"{", b"[]", {"kind": "nope"}, {"kind": "blender", "params": {"epsilon": "x"}},
                                   {"kind": "blender", "params": {"epsilon": -1}},
                                   {"kind": "blender", "params": {"epsilon": 1e308}},
                                   {"kind": "blender", "params": {"head_list_size": 10**30}},
                                   {"kind": "mean", "params": {"epsilon": 1, "lower": 5, "upper": 1}}]
        for body in admin_bodies:
            kw = {"content": body} if isinstance(body, bytes) else {"json": body}
            assert_json_4xx(http.post(f"{API}/rounds", headers=server.admin, **kw))
        # text with a NUL character: SQLite would store it, PostgreSQL refuses it — a 4xx either way
        assert_json_4xx(http.post(f"{API}/rounds", headers=server.admin, json={"kind": "blender", "name": "a\x00b"}))
        r = http.post(f"{API}/rounds", headers=server.admin, json={"kind": "blender", "params": {"epsilon": 4.0}})
        assert r.status_code == 201, r.text
        other = r.json()["id"]
        assert_json_4xx(http.post(f"{API}/rounds/{other}/optin/enrol", headers=server.admin, json={"user": "u\x00"}))
        token = http.post(f"{API}/rounds/{other}/optin/enrol", headers=server.admin, json={"user": "u"}).json()["token"]
        assert_json_4xx(http.post(f"{API}/rounds/{other}/optin/records", headers={"Authorization": f"Bearer {token}"},
                                  json={"records": [{"query": "q\x00", "url": "https://a.example/\x00"}]}))
        assert_json_4xx(http.post(f"{API}/rounds", json={"kind": "blender"}), 401)
        assert_json_4xx(http.post(f"{API}/rounds", json={"kind": "blender"},
                                  headers={"Authorization": "Bearer wrong"}), 401)
        # the round's head list is published: its tokens are deleted with the raw data, so any token gets 409
        assert_json_4xx(http.post(f"{API}/rounds/{rid}/optin/records", json={"records": []},
                                  headers={"Authorization": "Bearer not-a-token"}), 409)
        # nothing was stored, and the server still takes a good message
        assert http.get(f"{API}/rounds/{rid}").json()["counts"]["messages"] == 0
        assert post_reports(http, rid, [good]).json()["counted"] == 1
        assert http.get("/health").json() == {"status": "ok"}

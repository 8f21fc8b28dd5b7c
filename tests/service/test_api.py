"""The collection service's HTTP API end to end (FastAPI's TestClient) on a real database (``store_url``).

Every test builds its own rounds. Opt-in users hold one record each, every listed record far above
the head-list threshold (τ = 4 at ε = 8, δ = 1e-5 with discrete noise of scale 1/4: a record seen
at least 9 times in S is kept with probability above 1 − 1e-7), so the curator's OS randomness
cannot make a test fail. The database is read directly where a test must prove what is stored.
"""

from __future__ import annotations

import io
import json
import math
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from hybriddp.core.protocol import content_hash, new_message_id
from hybriddp.curator.release import release_from_documents
from hybriddp.device.localalg import randomize_records
from hybriddp.device.mean import randomize_value
from hybriddp.privacy.ledger import BudgetExceededError, LedgerError
from hybriddp.server.party import count_messages, serve_estimates
from hybriddp.server.result import json_default
from hybriddp.service import create_app
from hybriddp.service.errors import ConflictError, StoreError
from hybriddp.service.store import Store
from storehelpers import published_round

ADMIN = "admin-token-of-the-tests-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
JSON = {"Content-Type": "application/json"}
API = "/api/v1"
PARAMS = {"epsilon": 8.0, "delta": 1e-5, "head_list_size": 10, "m_c": 2}
OPTIN_RECORDS = ([("weather", "https://w.example/a")] * 16 + [("weather", "https://w.example/b")] * 12
                 + [("news", "https://n.example/a")] * 12 + [("maps", "https://m.example/a")] * 10)
DEVICE_POOL = [("weather", "https://w.example/a"), ("weather", "https://w.example/b"), ("news", "https://n.example/a"),
               ("maps", "https://m.example/a"), ("cats", "https://c.example/1"), ("weather", "https://w.example/z")]


# ----- helpers ----------------------------------------------------------------------------------
@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as c:
        yield c


def error_of(resp: Any, status: int, code: str | None = None, *needles: str) -> str:
    """Assert a JSON error with this status (and code); returns its message."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    if code is not None:
        assert body["error"]["code"] == code, body
    for needle in needles:
        assert needle in body["error"]["message"], body
    return body["error"]["message"]


def create(client: TestClient, kind: str = "blender", params: dict[str, Any] | None = None, **extra: Any) -> str:
    resp = client.post(f"{API}/rounds", json={"kind": kind, "params": PARAMS if params is None else params, **extra},
                       headers=AUTH)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def enrol_all(client: TestClient, rid: str, users: list[str]) -> list[str]:
    resp = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": users}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    return resp.json()["tokens"]


def upload(client: TestClient, rid: str, token: str, body: dict[str, Any]) -> Any:
    return client.post(f"{API}/rounds/{rid}/optin/records", json=body, headers={"Authorization": f"Bearer {token}"})


def upload_ndjson(client: TestClient, rid: str, lines: list[dict[str, Any]]) -> Any:
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.post(f"{API}/rounds/{rid}/optin/records", content=body,
                       headers={"Content-Type": "application/x-ndjson"})


def optin_all(client: TestClient, rid: str, first_user: int = 0) -> None:
    """Enrol len(OPTIN_RECORDS) users and upload one record each (one batch request each)."""
    tokens = enrol_all(client, rid, [f"user-{first_user + i}" for i in range(len(OPTIN_RECORDS))])
    lines = [{"token": t, "records": [{"query": q, "url": u}]} for t, (q, u) in zip(tokens, OPTIN_RECORDS, strict=True)]
    resp = upload_ndjson(client, rid, lines)
    assert resp.status_code == 200 and resp.json() == {"accepted": len(OPTIN_RECORDS), "duplicates": 0}, resp.text


def blender_round(client: TestClient, params: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """A published BLENDER round: (id, device head list)."""
    rid = create(client, params=params)
    optin_all(client, rid)
    resp = client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH)
    assert resp.status_code == 200, resp.text
    return rid, client.get(f"{API}/rounds/{rid}/headlist").json()


def device_messages(headlist: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    """n devices with 1..3 records of DEVICE_POOL (chosen with a seeded generator), each randomized."""
    rng = np.random.default_rng(seed)
    return [randomize_records(headlist, [DEVICE_POOL[i] for i in rng.integers(0, len(DEVICE_POOL), rng.integers(1, 4))])
            for _ in range(n)]


def rows_of(store_url: str, table: str, rid: str) -> int:
    """Rows of ``table`` belonging to round ``rid``, read from the database itself."""
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT COUNT(*) FROM {table} t JOIN rounds r ON r.num = t.round_num "
                                        "WHERE r.id = :rid"), {"rid": rid}).scalar_one()
    finally:
        engine.dispose()


def post_reports(client: TestClient, rid: str, body: Any) -> Any:
    return client.post(f"{API}/rounds/{rid}/reports", json=body)


# ----- a BLENDER round, start to finish ---------------------------------------------------------
def test_blender_round_lifecycle_over_http(client: TestClient, store_url: str) -> None:
    resp = client.post(f"{API}/rounds", json={"kind": "blender", "name": "week 1", "params": PARAMS}, headers=AUTH)
    assert resp.status_code == 201
    rnd = resp.json()
    rid = rnd["id"]
    assert rnd["state"] == "collecting-optin" and rnd["name"] == "week 1" and rnd["headlist_hash"] is None
    assert rnd["params"]["epsilon"] == 8.0 and rnd["params"]["noise"] == "discrete" and rnd["params"]["m_c"] == 2
    assert len(rid) == 22

    # opt-in: one user, then the rest in one batch; a user enrols once per round
    resp = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"user": "user-0"}, headers=AUTH)
    assert resp.status_code == 201
    tokens = [resp.json()["token"]]
    error_of(client.post(f"{API}/rounds/{rid}/optin/enrol", json={"user": "user-0"}, headers=AUTH), 409, "conflict",
             "already enrolled")
    tokens += enrol_all(client, rid, [f"user-{i}" for i in range(1, len(OPTIN_RECORDS))])
    assert len(set(tokens)) == len(OPTIN_RECORDS)

    error_of(upload(client, rid, "not-a-token", {"records": [{"query": "q", "url": "u"}]}), 401, "unauthorized")
    error_of(client.post(f"{API}/rounds/{rid}/optin/records", json={"records": []}), 401, "unauthorized")
    error_of(upload(client, rid, tokens[0], {"records": [{"query": "weather", "url": None}]}), 422, "invalid_data",
             "url is null")
    error_of(client.get(f"{API}/rounds/{rid}/headlist"), 409, "conflict", "no head list yet")
    error_of(post_reports(client, rid, {"id": new_message_id(), "headlist": "x", "reports": []}), 409, "conflict")
    for token, (q, u) in zip(tokens, OPTIN_RECORDS, strict=True):
        ack = upload(client, rid, token, {"records": [{"query": q, "url": u}]}).json()
        assert ack == {"accepted": 1, "duplicates": 0}
    assert rows_of(store_url, "optin_records", rid) == len(OPTIN_RECORDS)

    # the curator: head list built, ledger charged, published; the raw records are gone from the database
    resp = client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH)
    assert resp.status_code == 200, resp.text
    rnd = resp.json()
    assert rnd["state"] == "headlist-published" and rnd["headlist_hash"].startswith("sha256:")
    assert rnd["counts"] == {"optin_users": 50, "optin_records": 50, "messages": 0, "reports": 0}
    assert rows_of(store_url, "optin_records", rid) == 0
    error_of(upload(client, rid, tokens[1], {"records": [{"query": "q", "url": "u"}]}), 409, "conflict")
    error_of(client.post(f"{API}/rounds/{rid}/optin/enrol", json={"user": "late"}, headers=AUTH), 409, "conflict")
    error_of(client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH), 409, "conflict")

    # devices fetch the head list (ETag = its content hash; If-None-Match answers 304)
    resp = client.get(f"{API}/rounds/{rid}/headlist")
    hl = resp.json()
    assert hl["content_hash"] == content_hash(hl) == rnd["headlist_hash"]
    assert resp.headers["etag"] == f'"{hl["content_hash"]}"'
    assert {q["query"] for q in hl["queries"]} == {"weather", "news", "maps"}
    assert hl["m_c"] == 2 and hl["epsilon"] == 8.0
    for tag in (resp.headers["etag"], "W/" + resp.headers["etag"], f'"other", {resp.headers["etag"]}', "*"):
        again = client.get(f"{API}/rounds/{rid}/headlist", headers={"If-None-Match": tag})
        assert again.status_code == 304 and again.content == b""
    assert client.get(f"{API}/rounds/{rid}/headlist", headers={"If-None-Match": '"sha256:0"'}).status_code == 200

    # reports: one message, an array, NDJSON; retries acknowledged but counted once
    msgs = device_messages(hl, 300, seed=1)
    sent: list[dict[str, Any]] = []

    def send(body: Any, want: dict[str, int], **kw: Any) -> None:
        resp = client.post(f"{API}/rounds/{rid}/reports", **kw) if kw else post_reports(client, rid, body)
        assert resp.status_code == 200, resp.text
        assert resp.json() == want
        sent.extend(body if isinstance(body, list) else [body])

    send(msgs[0], {"acknowledged": 1, "counted": 1, "duplicates": 0})
    assert client.get(f"{API}/rounds/{rid}").json()["state"] == "collecting-reports"
    send(msgs[1:150], {"acknowledged": 149, "counted": 149, "duplicates": 0})
    ndjson = "\n".join(json.dumps(m) for m in msgs[150:]) + "\n"
    send(msgs[150:], {"acknowledged": 150, "counted": 150, "duplicates": 0}, content=ndjson.encode(),
         headers={"Content-Type": "application/x-ndjson"})
    send(msgs[100:120], {"acknowledged": 20, "counted": 0, "duplicates": 20})  # a retried batch
    extra = device_messages(hl, 1, seed=2)[0]
    send([extra, extra], {"acknowledged": 2, "counted": 1, "duplicates": 1})  # the same id twice in one request
    n_reports = sum(len(m["reports"]) for m in [*msgs, extra])
    rnd = client.get(f"{API}/rounds/{rid}").json()
    assert rnd["counts"]["messages"] == 301 and rnd["counts"]["reports"] == n_reports
    assert rows_of(store_url, "messages", rid) + rows_of(store_url, "messages_recent", rid) == 301
    store = client.app.state.store  # the per-entry counts kept with the messages agree with a recount
    n_entries = sum(len(q["urls"]) + 1 for q in hl["queries"]) + 1
    num = store.round(rid).num
    assert store.entry_counts(num, n_entries).tolist() == store.recount(num, n_entries).tolist()

    # close: estimates published; reports and a second close refused
    # (the devices' pool is not the opt-in group's, so the anchor check may flag: publish anyway)
    resp = client.post(f"{API}/rounds/{rid}/close", headers=AUTH, json={"flagged": "publish"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["state"] == "results-published"
    assert (rows_of(store_url, "messages", rid), rows_of(store_url, "messages_recent", rid)) == (301, 0)  # settled
    error_of(post_reports(client, rid, device_messages(hl, 1, seed=3)[0]), 409, "conflict", "results-published")
    error_of(client.post(f"{API}/rounds/{rid}/close", headers=AUTH), 409, "conflict")

    # results: JSON, CSV and Parquet hold the same records table
    results = client.get(f"{API}/rounds/{rid}/results").json()
    assert results["algorithm"] == "blender" and results["sizes"]["messages"] == 301
    assert results["sizes"]["duplicate_messages"] == 21 and results["sizes"]["reports"] == n_reports
    csv = client.get(f"{API}/rounds/{rid}/results", params={"format": "csv"})
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    parquet = client.get(f"{API}/rounds/{rid}/results", params={"format": "parquet"})
    assert parquet.status_code == 200 and parquet.content[:4] == b"PAR1"
    from_csv = pacsv.read_csv(io.BytesIO(csv.content)).to_pylist()
    from_parquet = pq.read_table(io.BytesIO(parquet.content)).to_pylist()
    assert [r["p_blended"] for r in from_parquet] == [r["p_blended"] for r in results["records"]]
    assert [(r["query"], r["url"]) for r in from_csv] == [(r["query"], r["url"]) for r in results["records"]]
    assert np.allclose([r["p_blended"] for r in from_csv], [r["p_blended"] for r in results["records"]], rtol=1e-12)
    error_of(client.get(f"{API}/rounds/{rid}/results", params={"format": "xml"}), 422, "invalid_request")

    # the local-search document: listed queries and URLs, blended probabilities, largest first
    doc = client.get(f"{API}/rounds/{rid}/local-search").json()
    assert doc["round"] == rid and doc["headlist"] == hl["content_hash"]
    p_query = {r["query"]: r["p_blended"] for r in results["queries"]}
    p_record = {(r["query"], r["url"]): r["p_blended"] for r in results["records"] if not r["wildcard"]}
    assert [q["query"] for q in doc["queries"]] == sorted(p_query.keys() - {"*"}, key=lambda q: -p_query[q])
    for q in doc["queries"]:
        assert q["p"] == p_query[q["query"]]
        assert [u["p"] for u in q["urls"]] == sorted((u["p"] for u in q["urls"]), reverse=True)
        assert {u["url"]: u["p"] for u in q["urls"]} == {u: p for (qq, u), p in p_record.items() if qq == q["query"]}

    # the service's estimates are exactly serve_estimates on the same messages, computed here
    with sa.create_engine(store_url).connect() as conn:
        estimates = json.loads(conn.execute(sa.text("SELECT estimates FROM rounds WHERE id = :r"), {"r": rid})
                               .scalar_one())
    release = release_from_documents(hl, estimates)
    counts = count_messages(release, sent)
    assert (counts.messages, counts.duplicates) == (301, 21)
    expected = json.loads(json.dumps(serve_estimates(release, counts).to_json(), default=json_default))
    assert results == {**expected, "headlist": hl["content_hash"]}  # the hash it committed to, keys included
    published = client.get(f"{API}/rounds/{rid}/release").json()
    assert published["headlist"] == hl and published["estimates"] == estimates
    assert published["counts"] == counts.counts.tolist() and published["messages"] == 301

    assert client.get("/metrics").status_code == 401  # behind the admin token unless --public-metrics
    metrics = client.get("/metrics", headers=AUTH).text
    assert 'hybriddp_reports_total{result="accepted"} 301' in metrics
    assert 'hybriddp_reports_total{result="duplicate"} 21' in metrics
    assert 'hybriddp_rounds{state="results-published"} 1' in metrics
    assert 'route="/api/v1/rounds/{round_id}/reports"' in metrics and rid not in metrics
    # the report requests that reached the writer, one after another: five accepted and the one after the
    # close (refused inside the writer's transaction), so six group commits of one request each
    assert "\nhybriddp_report_group_requests_count 6\n" in metrics
    assert "\nhybriddp_report_group_requests_sum 6.000000\n" in metrics
    assert '\nhybriddp_report_group_requests_bucket{le="1"} 6\n' in metrics
    assert "\nhybriddp_report_commit_seconds_count 6\n" in metrics
    assert client.get("/health").json() == {"status": "ok"}


# ----- refusals ---------------------------------------------------------------------------------
def test_bad_reports_are_refused_with_a_json_4xx_and_nothing_is_stored(client: TestClient, store_url: str) -> None:
    rid, hl = blender_round(client)
    good = device_messages(hl, 1, seed=4)[0]
    url = f"{API}/rounds/{rid}/reports"

    three = dict(good, id=new_message_id(), reports=[{"query": "news", "url": "https://n.example/a"}] * 3)
    error_of(post_reports(client, rid, three), 422, "invalid_data", "m_C = 2")
    other = dict(hl, epsilon=4.0)  # another head list (another round's, or a stale one)
    other["content_hash"] = content_hash(other)
    foreign = randomize_records(other, [("news", "https://n.example/a")])
    error_of(post_reports(client, rid, foreign), 422, "headlist_error", "head list")
    unlisted = dict(good, id=new_message_id(), reports=[{"query": "not listed", "url": None}])
    error_of(post_reports(client, rid, unlisted), 422, "invalid_data", "not in the head list")
    error_of(post_reports(client, rid, dict(good, id="short")), 422, "invalid_data", "message id")
    error_of(post_reports(client, rid, {"id": new_message_id(), "reports": []}), 422, "invalid_data", "'headlist'")
    error_of(post_reports(client, rid, [good, 42]), 422, "invalid_data", "message 2")
    error_of(post_reports(client, rid, {"id": new_message_id(), "round": rid, "value": 1.0}), 422, "invalid_data")
    error_of(post_reports(client, rid, "a string"), 422, "invalid_data")

    error_of(client.post(url, content=json.dumps(good).encode()), 415, "unsupported_media_type", "no Content-Type")
    error_of(client.post(url, content=b'{"id": ', headers=JSON), 400, "malformed_body", "not valid JSON")
    error_of(client.post(url, content=b'{"id": NaN}', headers=JSON), 400, "malformed_body")
    error_of(client.post(url, content=b"\xff\xfe{}", headers=JSON), 400, "malformed_body", "not UTF-8")
    error_of(client.post(url, content=b"", headers=JSON), 400, "malformed_body", "empty")
    error_of(client.post(url, content=b"[]", headers=JSON), 400, "malformed_body", "empty array")
    error_of(client.post(url, content=b"[" * 100_000 + b"]" * 100_000, headers=JSON), 400, "malformed_body")
    error_of(client.post(url, content=json.dumps(good).encode(), headers={"Content-Type": "text/plain"}), 415,
             "unsupported_media_type")
    error_of(client.post(url, content=(json.dumps(good) + "\n{oops\n").encode(),
                         headers={"Content-Type": "application/x-ndjson"}), 400, "malformed_body", "NDJSON line 2")
    error_of(client.post(url, content=(json.dumps(good) + json.dumps(good)).encode(), headers=JSON), 400,
             "malformed_body", "application/x-ndjson")
    error_of(post_reports(client, "AAAAAAAAAAAAAAAAAAAAAA", good), 404, "not_found")

    rnd = client.get(f"{API}/rounds/{rid}").json()
    assert rnd["state"] == "headlist-published" and rnd["counts"]["messages"] == 0
    assert rows_of(store_url, "messages", rid) + rows_of(store_url, "messages_recent", rid) == 0
    assert 'hybriddp_reports_total{result="refused"} ' in client.get("/metrics", headers=AUTH).text


def test_bodies_over_the_size_limit_get_413(store_url: str) -> None:
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as client:
        rid, _ = blender_round(client)
    with TestClient(create_app(store_url, ADMIN, open_admission=True, max_body_bytes=4096)) as client:
        big = b"[" + b" " * 5000 + b"]"
        url = f"{API}/rounds/{rid}/reports"
        error_of(client.post(url, content=big, headers=JSON), 413, "body_too_large", "4,096 bytes")
        # the round is checked before the body is read: an unknown round is 404 whatever the body
        error_of(client.post(f"{API}/rounds/AAAAAAAAAAAAAAAAAAAAAA/reports", content=big, headers=JSON), 404,
                 "not_found")

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts the streamed bytes
            for _ in range(10):
                yield b" " * 1000

        error_of(client.post(url, content=chunks(), headers=JSON), 413, "body_too_large")
        error_of(client.post(f"{API}/rounds", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}),
                 413, "body_too_large")
        assert client.get("/health").status_code == 200


def test_the_declared_reports_route_answers_as_the_fast_path_does(store_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """POST .../reports is served by the fast path ahead of FastAPI; its declared route (the OpenAPI document's)
    runs only with the diversion off, and then gives the same answers."""
    from hybriddp.service.routers import devices

    calls: list[str] = []
    route_accept = devices.accept_reports

    async def counted(*args: Any) -> Any:
        calls.append(args[4])
        return await route_accept(*args)
    monkeypatch.setattr(devices, "accept_reports", counted)
    app = create_app(store_url, ADMIN, open_admission=True)
    with TestClient(app) as client:
        rid, hl = blender_round(client)
        url = f"{API}/rounds/{rid}/reports"

        def answers(seed: int) -> list[tuple[int, Any]]:
            batch = device_messages(hl, 5, seed=seed)  # new message ids at every call
            out = [client.post(url, json=batch), client.post(url, json=batch[:2]),
                   client.post(url, json=dict(batch[0], id="short")),
                   client.post(url, content=b'{"id": ', headers=JSON),
                   client.post(url, content=b"{}", headers={"Content-Type": "text/plain"}),
                   client.post(f"{API}/rounds/AAAAAAAAAAAAAAAAAAAAAA/reports", json=batch)]
            return [(r.status_code, r.json()) for r in out]

        fast = answers(1)
        assert calls == [] and app.divert_reports
        app.divert_reports = False
        declared = answers(2)
        assert calls == [rid] * 5 + ["AAAAAAAAAAAAAAAAAAAAAA"]
        assert declared == fast
        assert fast[0] == (200, {"acknowledged": 5, "counted": 5, "duplicates": 0})
        assert fast[1] == (200, {"acknowledged": 2, "counted": 0, "duplicates": 2})
        assert [status for status, _ in fast[2:]] == [422, 400, 415, 404]
        assert client.get(f"{API}/rounds/{rid}").json()["counts"]["messages"] == 10


def test_bad_round_parameters_and_unknown_rounds(client: TestClient) -> None:
    error_of(client.post(f"{API}/rounds", json={"kind": "blender", "params": {"epsilon": 0.5}}, headers=AUTH), 422,
             "invalid_request", "params.epsilon")
    error_of(client.post(f"{API}/rounds", json={"kind": "blender", "params": {"bogus": 1}}, headers=AUTH), 422,
             "invalid_request", "bogus")
    error_of(client.post(f"{API}/rounds", json={"kind": "mean", "params": {"epsilon": 1, "lower": 5, "upper": 1}},
                         headers=AUTH), 422, "invalid_parameter", "upper")
    error_of(client.post(f"{API}/rounds", json={"kind": "mean", "params": {"epsilon": 1e-300, "lower": 0, "upper": 1}},
                         headers=AUTH), 422, "invalid_parameter", "epsilon")  # noise beyond double precision
    error_of(client.post(f"{API}/rounds", json={"kind": "nope"}, headers=AUTH), 422, "invalid_request")
    error_of(client.post(f"{API}/rounds", content=b"{", headers={**AUTH, "Content-Type": "application/json"}), 400,
             "malformed_body")
    # LocalAlg's budget f_C·ε/m_C below what double precision resolves: the library refuses it
    error_of(client.post(f"{API}/rounds", json={"kind": "blender", "params": {"f_c": 1e-14}}, headers=AUTH), 422,
             "invalid_parameter", "f_c")
    error_of(client.post(f"{API}/rounds", json={"kind": "blender", "name": "a\u0000b"}, headers=AUTH), 422,
             "invalid_request", "name")  # NUL is refused on every database (PostgreSQL cannot store it)
    rid = create(client)
    error_of(client.post(f"{API}/rounds/{rid}/optin/enrol", json={"user": "a\u0000b"}, headers=AUTH), 422,
             "invalid_request", "user")
    for round_id in ("no-such-round", "%00%ff", "A" * 22, rid + "x"):
        for path in ("", "/headlist", "/results", "/local-search", "/release"):
            error_of(client.get(f"{API}/rounds/{round_id}{path}"), 404, "not_found", "does not exist")
        error_of(post_reports(client, round_id, {}), 404, "not_found")
    error_of(client.get("/no/such/path"), 404, "not_found")


def test_opt_in_uploads_in_one_ndjson_request_all_or_nothing(client: TestClient, store_url: str) -> None:
    rid = create(client)
    tokens = enrol_all(client, rid, [f"user-{i}" for i in range(len(OPTIN_RECORDS))])
    lines = [{"token": t, "records": [{"query": q, "url": u}]} for t, (q, u) in zip(tokens, OPTIN_RECORDS, strict=True)]
    error_of(upload_ndjson(client, rid, [*lines[:3], {"token": "not-a-token", "records": []}]), 401, "unauthorized",
             "NDJSON line 4")
    error_of(upload_ndjson(client, rid, [lines[0], {"token": tokens[1], "records": [{"query": "q", "url": None}]}]),
             422, "invalid_data", "NDJSON line 2", "url is null")
    error_of(upload_ndjson(client, rid, [{"token": tokens[0], "records": [{"query": "a\u0000b", "url": "u"}]}]), 422,
             "invalid_data", "NDJSON line 1", "records.0.query")
    error_of(upload_ndjson(client, rid, [{"token": tokens[0], "values": [1.0]}]), 422, "invalid_data", "BLENDER round")
    error_of(client.post(f"{API}/rounds/{rid}/optin/records", content=b"{\n",
                         headers={"Content-Type": "application/x-ndjson"}), 400, "malformed_body", "NDJSON line 1")
    error_of(client.post(f"{API}/rounds/{rid}/optin/records", content=b"q,u", headers={"Content-Type": "text/csv"}),
             415, "unsupported_media_type")
    assert rows_of(store_url, "optin_records", rid) == 0  # every refused request stored nothing
    assert upload_ndjson(client, rid, lines).json() == {"accepted": 50, "duplicates": 0}
    assert rows_of(store_url, "optin_records", rid) == 50
    assert client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).json()["state"] == "headlist-published"
    assert rows_of(store_url, "optin_records", rid) == 0


# ----- concurrency, authentication, the ledger ----------------------------------------------------
def test_two_concurrent_closes_one_wins(client: TestClient) -> None:
    rid, hl = blender_round(client)
    assert post_reports(client, rid, device_messages(hl, 40, seed=5)).status_code == 200
    barrier = threading.Barrier(2)
    answers: list[Any] = []

    def close() -> None:
        barrier.wait()
        answers.append(client.post(f"{API}/rounds/{rid}/close", headers=AUTH, json={"flagged": "publish"}))

    threads = [threading.Thread(target=close) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.status_code for a in answers) == [200, 409]
    error_of(next(a for a in answers if a.status_code == 409), 409, "conflict", "cannot close")
    assert client.get(f"{API}/rounds/{rid}").json()["state"] == "results-published"


def test_administrator_endpoints_need_the_token(client: TestClient) -> None:
    body = {"kind": "blender", "params": PARAMS}
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": f"Basic {ADMIN}"},
                    {"Authorization": f"Bearer {ADMIN}x"}):
        resp = client.post(f"{API}/rounds", json=body, headers=headers)
        error_of(resp, 401, "unauthorized", "administrator token")
        assert resp.headers["www-authenticate"] == "Bearer"
        error_of(client.get(f"{API}/rounds", headers=headers), 401, "unauthorized")
    rid = create(client)
    for method, path, json_body in (("post", "/optin/enrol", {"user": "u"}), ("post", "/headlist", None),
                                    ("post", "/close", None)):
        error_of(client.request(method, f"{API}/rounds/{rid}{path}", json=json_body), 401, "unauthorized")
    rnd = client.get(f"{API}/rounds/{rid}").json()  # reading a round is public; its live opt-in counts are not
    assert rnd["state"] == "collecting-optin" and rnd["counts"]["optin_users"] is None
    assert client.get(f"{API}/rounds/{rid}", headers=AUTH).json()["counts"]["optin_users"] == 0
    assert [r["id"] for r in client.get(f"{API}/rounds", headers=AUTH).json()["rounds"]] == [rid]


def test_the_ledger_refuses_a_round_over_the_lifetime_budget(store_url: str) -> None:
    with TestClient(create_app(store_url, ADMIN, open_admission=True, lifetime_epsilon=10.0,
                                       lifetime_delta=1e-3)) as client:
        first = create(client)
        second = create(client)
        optin_all(client, first)
        optin_all(client, second)  # the same 50 users, enrolled in both before either was built (and charged)
        assert client.post(f"{API}/rounds/{first}/headlist", headers=AUTH).status_code == 200
        store = client.app.state.store  # the build charged every opt-in user (8, 1e-5) before the curator ran
        spent = [store.spent(f"user-{i}") for i in range(50)]
        assert spent == [(8.0, 1e-5)] * 50
        third = create(client)  # a user who cannot afford a round is refused at enrolment now: 8 + 8 > 10
        error_of(client.post(f"{API}/rounds/{third}/optin/enrol", json={"users": ["user-0", "someone-new"]},
                             headers=AUTH), 409, "budget_exceeded", "cannot enrol user 'user-0'",
                 "nobody in this request was enrolled")
        assert rows_of(store_url, "optin_tokens", third) == 0
        message = error_of(client.post(f"{API}/rounds/{second}/headlist", headers=AUTH), 409, "budget_exceeded",
                           "50 opt-in user(s) would exceed the lifetime budget", "epsilon 10")
        assert "Nothing was run or charged" in message and "round abort" in message
        rnd = client.get(f"{API}/rounds/{second}").json()
        assert rnd["state"] == "collecting-optin" and rnd["headlist_hash"] is None
        assert rows_of(store_url, "optin_records", second) == 50  # nothing deleted
        assert rows_of(store_url, "ledger_charges", second) == 0 and rows_of(store_url, "ledger_charges", first) == 50
        assert [store.spent(f"user-{i}") for i in range(50)] == spent
        error_of(client.get(f"{API}/rounds/{second}/headlist"), 409, "conflict")
        with sa.create_engine(store_url).connect() as conn:  # users are pseudonyms in the database
            names = conn.execute(sa.text("SELECT user_pseudonym FROM ledger_charges UNION ALL "
                                         "SELECT user_pseudonym FROM optin_tokens")).scalars().all()
        assert names and not any(n.startswith("user-") for n in names)


# ----- a mean round -------------------------------------------------------------------------------
def test_mean_round_lifecycle(client: TestClient, store_url: str) -> None:
    lower, upper, eps, sigma2 = 0.0, 10.0, 1.0, 4.0
    rid = create(client, "mean", {"epsilon": eps, "lower": lower, "upper": upper, "sigma2": sigma2})
    rng = np.random.default_rng(7)
    optin_values = [[float(v)] for v in rng.uniform(2, 8, 28)] + [[1.0, 3.0], [25.0]]  # two values; one clamped
    tokens = enrol_all(client, rid, [f"m-{i}" for i in range(len(optin_values))])
    error_of(upload(client, rid, tokens[0], {"records": [{"query": "q", "url": "u"}]}), 422, "invalid_data", "values")
    for token, values in zip(tokens, optin_values, strict=True):
        assert upload(client, rid, token, {"values": values}).json() == {"accepted": len(values), "duplicates": 0}
    assert rows_of(store_url, "optin_values", rid) == 31
    assert client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 200
    assert rows_of(store_url, "optin_values", rid) == 0
    doc = client.get(f"{API}/rounds/{rid}/headlist").json()
    assert doc["format"] == "hybriddp-mean-round" and doc["round"] == rid and doc["content_hash"] == content_hash(doc)
    assert (doc["lower"], doc["upper"], doc["epsilon"]) == (lower, upper, eps)
    assert client.app.state.store.spent("m-0") == (eps, 0.0)

    true_values = rng.uniform(0, 10, 400)
    reports = [{"id": new_message_id(), "round": rid, "value": randomize_value(v, lower=lower, upper=upper,
                                                                                epsilon=eps)} for v in true_values]
    ack = post_reports(client, rid, reports).json()
    assert ack == {"acknowledged": 400, "counted": 400, "duplicates": 0}
    assert post_reports(client, rid, reports[:5]).json()["duplicates"] == 5
    error_of(post_reports(client, rid, dict(reports[0], round="another-round")), 422, "invalid_data", "round")
    error_of(post_reports(client, rid, dict(reports[0], id=new_message_id(), value="7")), 422, "invalid_data")
    error_of(post_reports(client, rid, dict(reports[0], id=new_message_id(), value=True)), 422, "invalid_data")
    # farther than ln(1e9) ≈ 20.72 noise scales (Δ/ε = 10) from [0, 10]: an honest device sends it with
    # probability e^-20.72 = 1e-9 (derived here: P[|Laplace(b)| > t·b] = e^-t)
    reach = math.log(1e9) * 10.0
    error_of(post_reports(client, rid, dict(reports[0], id=new_message_id(), value=10.0 + reach + 0.01)), 422,
             "invalid_data", f"between {-reach:.6g} and {10 + reach:.6g}")
    error_of(post_reports(client, rid, dict(reports[0], id=new_message_id(), value=1000.999)), 422, "invalid_data")
    assert client.post(f"{API}/rounds/{rid}/close", headers=AUTH, json={"flagged": "publish"}).status_code == 200

    res = client.get(f"{API}/rounds/{rid}/results").json()
    n_t, n_l = 30, 400
    n, c, width = n_t + n_l, n_t / (n_t + n_l), upper - lower
    # Dubey & Korolova Lemma 3.3, derived here: A = 2Δ²/(ε² n_T²), B = 2Δ²/(ε² n_L), S = σ²/(c(1−c)n)
    a, b, s = 2 * width**2 / (eps**2 * n_t**2), 2 * width**2 / (eps**2 * n_l), sigma2 / (c * (1 - c) * n)
    w = (b + c * s) / (a + b + s)
    opt, cli, hyb = res["optin"], res["client"], res["hybrid"]
    assert (opt["n"], cli["n"], hyb["n"]) == (n_t, n_l, n)
    assert math.isclose(cli["estimate"], math.fsum(r["value"] for r in reports) / n_l, rel_tol=1e-12)
    assert math.isclose(hyb["weight_optin"], w, rel_tol=1e-12)
    assert math.isclose(hyb["estimate"], w * opt["estimate"] + (1 - w) * cli["estimate"], rel_tol=1e-12)
    assert math.isclose(hyb["variance"], w * w * a + (1 - w) ** 2 * b + (w - c) ** 2 * s, rel_tol=1e-12)
    assert math.isclose(opt["variance"], a + (1 - c) ** 2 * s, rel_tol=1e-12)
    assert math.isclose(cli["variance"], b + c * c * s, rel_tol=1e-12)
    assert hyb["variance"] < min(opt["variance"], cli["variance"])
    # the opt-in mean: per-user means of clamped values, plus Laplace(Δ/(ε n_T)); |noise| > b·ln(1e6) has p = 1e-6
    per_user = [float(np.mean(np.clip(v, lower, upper))) for v in optin_values]
    assert abs(opt["estimate"] - float(np.mean(per_user))) < width / (eps * n_t) * math.log(1e6)
    table = pacsv.read_csv(io.BytesIO(client.get(f"{API}/rounds/{rid}/results", params={"format": "csv"}).content))
    assert table.column("estimator").to_pylist() == ["optin", "client", "hybrid"]
    error_of(client.get(f"{API}/rounds/{rid}/local-search"), 404, "not_found", "mean round")


# ----- the store underneath -------------------------------------------------------------------------
def test_migrations_create_exactly_the_schema(store_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from hybriddp.service.schema import metadata

    store = Store(store_url)
    try:
        with store.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "0011"
    finally:
        store.close()


def test_the_store_refuses_a_foreign_database_and_keeps_its_lifetime_budget(store_url: str) -> None:
    store = Store(store_url, lifetime_epsilon=5.0)
    store.close()
    with pytest.raises(LedgerError, match=r"lifetime epsilon 5\.0, not 6"):
        Store(store_url, lifetime_epsilon=6.0)
    store = Store(store_url)
    assert (store.lifetime_epsilon, store.lifetime_delta) == (5.0, 1e-4)
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE alembic_version"))
    store.close()
    with pytest.raises(StoreError, match="not a hybriddp service database"):
        Store(store_url)


def test_group_commit_counts_each_message_id_once_and_refuses_closed_rounds(store_url: str) -> None:
    store = Store(store_url)
    try:
        infos = []
        for i in range(2):
            infos.append(published_round(store, user=f"user {i}"))
        a, b = infos
        ids = [new_message_id() for _ in range(4)]
        results = store.add_reports_many([
            (a, [(ids[0], [1]), (ids[1], [2, 3])]),
            (a, [(ids[1], [4]), (ids[2], [])]),  # ids[1] again, in another request of the same group
            (b, [(ids[0], [5])]),  # the same id in another round is another message
        ])
        assert [(r.acknowledged, r.counted, r.reports) for r in results] == [(2, 2, 3), (2, 1, 0), (1, 1, 1)]
        assert store.entry_counts(a.num, 6).tolist() == [0, 1, 1, 1, 0, 0] == store.recount(a.num, 6).tolist()
        assert store.add_reports(a, [(ids[0], [5]), (ids[3], [0])]).counted == 1
        assert store.round(a.id).messages == 4 and store.round(a.id).duplicates == 2
        store.start_close(b.id)
        mixed = store.add_reports_many([(b, [(ids[3], [0])]), (a, [(new_message_id(), [1])])])
        assert isinstance(mixed[0], ConflictError) and mixed[1].counted == 1
        assert store.round(b.id).messages == 1
        with pytest.raises(BudgetExceededError):
            from hybriddp.privacy.ledger import Charge
            store.charge(a, [Charge("optin-S", ["someone"], 17.0, 0.0)])
    finally:
        store.close()


def test_an_enrolment_that_loses_a_race_is_a_conflict(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the insert of a token fails (another request enrolled the same user meanwhile: a unique key), the
    request is refused as a conflict if the user now holds a token, and as the database error otherwise."""
    store = Store(store_url)
    try:
        info = store.create_round("blender", None, {})
        store.enrol(info.id, "alice")

        def fails(fn: Any) -> Any:
            raise StoreError("database: UniqueViolation")
        monkeypatch.setattr(store, "_write", fails)
        with pytest.raises(ConflictError, match=f"already enrolled in round {info.id}"):
            store.enrol_many(info.id, ["bob", "alice"])
        with pytest.raises(StoreError, match="UniqueViolation"):
            store.enrol(info.id, "bob")
    finally:
        store.close()


def test_openapi_states_the_request_and_response_shapes(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    reports = spec["paths"]["/api/v1/rounds/{round_id}/reports"]["post"]
    assert set(reports["requestBody"]["content"]) == {"application/json", "application/x-ndjson"}
    assert {"200", "400", "404", "409", "413", "415", "422"} <= set(reports["responses"])
    assert reports["responses"]["409"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
    create_op = spec["paths"]["/api/v1/rounds"]["post"]
    assert create_op["security"] == [{"AdminToken": []}] and "201" in create_op["responses"]
    assert {"BlenderParamsIn", "MeanParamsIn", "RoundOut", "LocalSearchOut"} <= set(spec["components"]["schemas"])


# ----- hybriddp serve -------------------------------------------------------------------------------
def test_serve_refuses_bad_options_with_one_error_line(tmp_path: Path) -> None:
    from clihelpers import assert_clean_error, invoke

    data = tmp_path / "data"
    assert_clean_error(invoke("serve", "--db", "mysql://x/y", "--data-dir", data, ok=False), "--db", "sqlite:///")
    assert_clean_error(invoke("serve", "--db", "sqlite://", "--data-dir", data, ok=False), "in-memory")
    assert_clean_error(invoke("serve", "--db", f"sqlite:///{tmp_path}/no/such/dir/x.db", "--data-dir", data, ok=False),
                       "does not exist")
    short = tmp_path / "short-token"
    short.write_text("short\n")
    assert_clean_error(invoke("serve", "--admin-token-file", short, "--data-dir", data, ok=False), "at least 16")
    assert_clean_error(invoke("serve", "--admin-token-file", tmp_path / "missing", "--data-dir", data, ok=False),
                       "no such file")
    assert_clean_error(invoke("serve", "--lifetime-delta", "2", "--data-dir", data, ok=False), "--lifetime-delta")
    assert_clean_error(invoke("serve", "--lifetime-epsilon", "inf", "--data-dir", data, ok=False), "lifetime_epsilon")
    assert not data.exists()  # refused before anything was written


def test_serve_generates_a_private_admin_token_and_serves(tmp_path: Path, store_url: str) -> None:
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "hybriddp", "serve", "--db", store_url, "--data-dir", str(data),
                             "--port", str(port), "--log-level", "warning"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).json() == {"status": "ok"}:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        token_file = data / "admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        body = {"kind": "mean", "params": {"epsilon": 1, "lower": 0, "upper": 1}}
        assert httpx.post(f"{base}{API}/rounds", json=body, timeout=10).status_code == 401
        resp = httpx.post(f"{base}{API}/rounds", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert resp.status_code == 201 and resp.json()["kind"] == "mean"
        assert "server" not in resp.headers  # no server banner
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"admin token generated: {token_file}" in out and f"serving on http://127.0.0.1:{port}" in out


def test_round_ids_never_look_like_command_line_options() -> None:
    """A round id is a CLI argument (`hybriddp round close ID`): one starting with "-" would be taken for
    an option. Without the redraw, 1 id in 64 would (5,000 draws: all but certain to show one)."""
    from hybriddp.service.store import ROUND_ID, new_round_id

    ids = [new_round_id() for _ in range(5000)]
    assert all(ROUND_ID.fullmatch(i) and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
    assert sum(i.startswith("A") for i in ids) > 20  # still spread over the other 63 first characters



def test_parameters_stored_before_a_field_existed_take_its_default() -> None:
    """A round stored before ``estimator`` existed reads as the paper's weights, and a bad value in such an
    old dict is still refused by name."""
    from hybriddp.core.errors import ParameterError
    from hybriddp.service.roundparams import blender_params

    old = {"epsilon": 4.0, "delta": 1e-5, "head_list_size": 50, "m_o": 1, "m_c": 1, "f_o": 0.95, "f_c": 0.85,
           "project": True, "optin_fraction": 0.05}
    assert blender_params(old).estimator == "paper"
    with pytest.raises(ParameterError, match=r"m_c \(--m-c\) = 'x' is not allowed"):
        blender_params({**old, "m_c": "x"})


def test_the_ranking_guard_is_stored_with_the_round_and_auto_is_null() -> None:
    """``anchor_kappa_query`` null (the default) chooses the guard per round from ``anchor_rank_cost`` (ALGORITHM.md
    §7.2), a number fixes it; a round stored before ``anchor_rank_cost`` existed takes its default, and one stored
    before ``anchor_kappa_query`` existed the fixed guard those versions had."""
    from hybriddp.server.anchor import DEFAULT_RANK_COST, FIXED_KAPPA_QUERY
    from hybriddp.service.models import BlenderParamsIn
    from hybriddp.service.roundparams import defense, validate_params

    stored = validate_params("blender", {})
    assert "anchor_kappa_query" in stored and stored["anchor_kappa_query"] is None
    assert defense(stored).kappa_query is None
    assert stored["anchor_rank_cost"] == DEFAULT_RANK_COST
    auto = validate_params("blender", BlenderParamsIn(anchor_rank_cost=0.004).model_dump())
    policy = defense(auto)
    assert policy is not None and policy.kappa_query is None and policy.rank_cost == 0.004
    fixed = validate_params("blender", BlenderParamsIn(anchor_kappa_query=0.25).model_dump())
    assert defense(fixed).kappa_query == 0.25
    legacy = {k: v for k, v in stored.items() if k != "anchor_kappa_query"}
    assert defense(legacy).kappa_query == FIXED_KAPPA_QUERY
    older = {k: v for k, v in stored.items() if k != "anchor_rank_cost"}
    assert defense(older).rank_cost == DEFAULT_RANK_COST
    with pytest.raises(ValueError, match="anchor_rank_cost"):
        BlenderParamsIn(anchor_rank_cost=0.0)

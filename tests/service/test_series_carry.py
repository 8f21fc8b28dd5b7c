"""Carried head lists in a series (ALGORITHM.md §13.1) on a real database (``store_url``: SQLite and PostgreSQL).

A query the head list selected in one period stays on the next ``carry`` periods' lists although nobody uploads it
there: published with no S count (its estimate is T's), so its fall shows in the trends, and gone after ``carry``
periods. Without carry the list is each period's own. Refusals: a mean series, an estimator without S's counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hybriddp.device.localalg import SeededSource, randomize_records
from hybriddp.service import create_app
from serieshelpers import PARAMS

ADMIN = "admin-token-of-the-carry-tests-0123456"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
FALLING = ("solstice", "https://s.example/a")
STEADY = ("weather", "https://w.example/a")


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(store_url, ADMIN, open_admission=True, series_tick=0)) as c:
        yield c


def _step(client: TestClient, sid: str) -> dict[str, Any]:
    resp = client.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _period(client: TestClient, sid: str, k: int, records: list[tuple[str, str | None]]) -> dict[str, Any]:
    """Run period ``k``: open it, 30 new opt-in users per record, build, 60 device reports, close; its release."""
    rid = _step(client, sid)["periods_table"][k]["round"]["id"]
    body = ""
    for j, rec in enumerate(records):
        users = [f"p{k}-r{j}-u{i}" for i in range(30)]
        tokens = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": users}, headers=AUTH).json()["tokens"]
        record = {"query": rec[0]} if rec[1] is None else {"query": rec[0], "url": rec[1]}
        body += "".join(json.dumps({"token": t, "records": [record]}) + "\n" for t in tokens)
    assert client.post(f"{API}/rounds/{rid}/optin/records", content=body.encode(),
                       headers={"Content-Type": "application/x-ndjson"}).status_code == 200
    assert _step(client, sid)["periods_table"][k]["round"]["state"] == "headlist-published"
    headlist = client.get(f"{API}/rounds/{rid}/headlist").json()
    device = (STEADY[0], STEADY[1] if headlist.get("url_level", True) else None)
    reports = [randomize_records(headlist, [device], source=SeededSource(i)) for i in range(60)]
    assert client.post(f"{API}/rounds/{rid}/reports", json=reports).status_code == 200
    assert "closed" in _step(client, sid)["actions"][0]
    return client.get(f"{API}/rounds/{rid}/release").json()


def _listed(release: dict[str, Any]) -> dict[str, bool]:
    """Listed query → whether its record came with an S count (selected this period) rather than carried."""
    hl, est = release["headlist"], release["estimates"]
    out, entry = {}, 0
    for q in hl["queries"]:
        for _ in q["urls"]:
            out[q["query"]] = bool(est["reused"][entry])
            entry += 1
        if not hl.get("url_level", True):  # without URLs the record is the query's ⟨q,*⟩
            out[q["query"]] = bool(est["reused"][entry])
        entry += 1  # ⟨q,*⟩
    return out


def _series(client: TestClient, **extra: Any) -> str:
    body = {"kind": "blender", "params": PARAMS, "period_seconds": 7 * 86400, "periods": 5, "flagged": "publish",
            **extra}
    resp = client.post(f"{API}/series", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_a_selected_query_stays_listed_for_carry_periods_estimated_from_t_and_then_drops_out(
        client: TestClient) -> None:
    sid = _series(client, carry=2)
    assert client.get(f"{API}/series/{sid}").json()["carry"] == 2
    lists = [_listed(_period(client, sid, 0, [FALLING, STEADY]))]
    for k in range(1, 4):  # nobody uploads the falling query any more
        lists.append(_listed(_period(client, sid, k, [STEADY])))
    assert lists[0] == {FALLING[0]: True, STEADY[0]: True}
    assert lists[1] == lists[2] == {FALLING[0]: False, STEADY[0]: True}  # carried: no S count
    assert lists[3] == {STEADY[0]: True}  # selected in period 1, 3 periods ago > carry = 2
    trends = client.get(f"{API}/series/{sid}/trends", params={"window": 1}).json()
    tested = {c["to"] for c in trends["changes"] if c["query"] == FALLING[0]}
    assert tested == {"period 2", "period 3"}  # its fall can be tested while it is carried


def test_without_carry_each_period_lists_only_what_its_own_opt_in_data_select(client: TestClient) -> None:
    sid = _series(client, carry=0)
    _period(client, sid, 0, [FALLING, STEADY])
    assert _listed(_period(client, sid, 1, [STEADY])) == {STEADY[0]: True}


def test_carry_is_refused_where_it_cannot_work(client: TestClient) -> None:
    for body, needle in (({"params": {**PARAMS, "estimator": "paper"}, "carry": 2}, "releases no S counts"),
                         ({"kind": "mean", "params": {"epsilon": 1.0, "lower": 0.0, "upper": 1.0}, "carry": 1},
                          "0 for a mean series")):
        full = {"kind": "blender", "params": PARAMS, "period_seconds": 3600, "periods": 3, **body}
        resp = client.post(f"{API}/series", json=full, headers=AUTH)
        assert resp.status_code == 422, resp.text
        assert needle in resp.json()["error"]["message"] and "carry" in resp.json()["error"]["message"]
    sid = _series(client, params={**PARAMS, "estimator": "paper"})  # the default then: no carry
    assert client.get(f"{API}/series/{sid}").json()["carry"] == 0


def test_a_series_without_urls_carries_its_queries(client: TestClient) -> None:
    sid = _series(client, params={**PARAMS, "url_level": False}, carry=1)
    _period(client, sid, 0, [(FALLING[0], None), (STEADY[0], None)])
    assert _listed(_period(client, sid, 1, [(STEADY[0], None)])) == {FALLING[0]: False, STEADY[0]: True}
    assert _listed(_period(client, sid, 2, [(STEADY[0], None)])) == {STEADY[0]: True}

"""A 12-period round series driven through the HTTP API of a running service (docs/SERIES.md): the service tests
(both databases) and the browser test (whose trends view must show the planted rising query) run it.

Each period's opt-in users (rotated so that each takes part in two periods, the lifetime budget's worth at ε = 8)
upload one record each, devices report (every batch sent twice: a retry is acknowledged and not counted again),
and ``advance --step`` opens, publishes and closes the rounds. One query rises from 15% to 45% at period 7.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from hybriddp.device.localalg import SeededSource, randomize_records

API = "/api/v1"
PARAMS = {"epsilon": 8.0, "delta": 1e-5, "head_list_size": 10}
PERIODS = 12
GROUPS = 6  # group g opts in to periods g and g + 6: two rounds of ε = 8, the default lifetime budget (16)
GROUP_SIZE = 100
STEADY = [("weather", "https://w.example/a"), ("news", "https://n.example/a"), ("maps", "https://m.example/a")]
RISING = ("eclipse", "https://e.example/a")


def population(period: int) -> tuple[list[tuple[str, str]], np.ndarray]:
    """The records and their probabilities in ``period`` (from 0): the rising query holds 15% before period
    index 6, then 45%."""
    share = 0.15 if period < PERIODS // 2 else 0.45
    rest = (1.0 - share) / len(STEADY)
    return [*STEADY, RISING], np.array([rest] * len(STEADY) + [share])


def _ok(resp: Any, *codes: int) -> Any:
    assert resp.status_code in (codes or (200,)), (resp.status_code, resp.text)
    return resp.json()


def drive_series(http: Any, admin: dict[str, str], *, devices: int = 1000, seed: int = 30,
                 tokens: Callable[[str, list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
                 name: str = "weekly") -> tuple[str, dict[str, int]]:
    """Create and run the series to its end; returns (series id, acknowledged reports per round id).
    ``tokens(round id, messages)``: the messages with their report tokens (a server with admission on)."""
    rng = np.random.default_rng(seed)
    doc = _ok(http.post(f"{API}/series", json={"kind": "blender", "params": PARAMS, "period_seconds": 7 * 86400,
                                                "periods": PERIODS, "name": name}, headers=admin), 201)
    sid = doc["id"]
    assert doc["budget"]["periods_per_user"] == 2 and doc["state"] == "active"
    acked: dict[str, int] = {}
    for k in range(PERIODS):
        doc = _ok(http.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=admin))
        rid = doc["periods_table"][k]["round"]["id"]
        assert doc["actions"] == [f"period {k + 1}: opened round {rid} (collecting opt-in data)"]
        users = [f"user-{k % GROUPS}-{i}" for i in range(GROUP_SIZE)]
        optin = _ok(http.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": users}, headers=admin), 201)
        records, p = population(k)
        held = [records[i] for i in rng.choice(len(records), GROUP_SIZE, p=p)]
        body = "".join(json.dumps({"token": t, "records": [{"query": q, "url": u}]}) + "\n"
                       for t, (q, u) in zip(optin["tokens"], held, strict=True))
        _ok(http.post(f"{API}/rounds/{rid}/optin/records", content=body.encode(),
                      headers={"Content-Type": "application/x-ndjson"}))
        doc = _ok(http.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=admin))
        assert doc["periods_table"][k]["round"]["state"] == "headlist-published", doc["actions"]
        headlist = _ok(http.get(f"{API}/rounds/{rid}/headlist"))
        messages = [randomize_records(headlist, [records[i]], source=SeededSource(seed * 100_000 + k * devices + d))
                    for d, i in enumerate(rng.choice(len(records), devices, p=p))]
        if tokens is not None:
            messages = tokens(rid, messages)
        for start in range(0, devices, 500):
            batch = messages[start:start + 500]
            for attempt in range(2):  # every batch twice: a retry is acknowledged and not counted again
                got = _ok(http.post(f"{API}/rounds/{rid}/reports", json=batch))
                assert got == {"acknowledged": len(batch), "counted": 0 if attempt else len(batch),
                               "duplicates": len(batch) if attempt else 0}, got
        acked[rid] = devices
        doc = _ok(http.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=admin))
        state = doc["periods_table"][k]["round"]["state"]
        assert state in ("results-published", "results-held"), doc["actions"]
        if state == "results-held":  # the anchor check flagged something: the administrator publishes
            _ok(http.post(f"{API}/rounds/{rid}/results/publish", json={"flagged": "keep"}, headers=admin))
    doc = _ok(http.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=admin))
    assert doc["state"] == "ended" and doc["actions"] == [f"series {sid} ended"]
    return sid, acked

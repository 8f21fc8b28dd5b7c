"""The anchor check in the collection service (ALGORITHM.md §7.2), on a real database (``store_url``): fake device
messages that push one record are flagged at close, the results are held for an administrator, and published
without the flagged entries they never reach the local-search document; an honest round publishes directly; a
mean round's fake values are flagged the same way.

The rounds are seeded (curator noise) and the devices randomize with a seeded source, so every number is
reproducible: the tests cannot flake.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.csv as pacsv
import pytest
from fastapi.testclient import TestClient

from hybriddp.core.protocol import new_message_id
from hybriddp.device.localalg import SeededSource, randomize_records
from hybriddp.device.mean import randomize_value
from hybriddp.service import create_app

ADMIN = "admin-token-of-the-anchor-tests-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
POPULATION = [("weather", "https://w.example/a", 0.30), ("weather", "https://w.example/b", 0.15),
              ("news", "https://n.example/a", 0.25), ("maps", "https://m.example/a", 0.15),
              ("cats", "https://c.example/1", 0.10), ("dogs", "https://d.example/1", 0.05)]
TARGET = ("dogs", "https://d.example/1")
N_OPTIN, N_DEVICES = 600, 6_000


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(store_url, ADMIN, open_admission=True, allow_seeds=True)) as c:
        yield c


def population(n: int) -> list[tuple[str, str]]:
    """n records in the population's exact proportions (opt-in users and devices are the same population)."""
    return [(q, u) for q, u, p in POPULATION for _ in range(round(p * n))]


def optin_round(client: TestClient, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    resp = client.post(f"{API}/rounds", json={"kind": "blender", "params": params}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    rid = resp.json()["id"]
    records = population(N_OPTIN)
    tokens = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": [f"u{i}" for i in range(len(records))]},
                         headers=AUTH).json()["tokens"]
    for token, (q, u) in zip(tokens, records, strict=True):
        resp = client.post(f"{API}/rounds/{rid}/optin/records", json={"records": [{"query": q, "url": u}]},
                           headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 200, resp.text
    assert client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 200
    return rid, client.get(f"{API}/rounds/{rid}/headlist").json()


def report_honestly(client: TestClient, rid: str, headlist: dict[str, Any]) -> None:
    src = SeededSource(29)
    msgs = [randomize_records(headlist, [r], source=src) for r in population(N_DEVICES)]
    for i in range(0, len(msgs), 1_000):
        assert client.post(f"{API}/rounds/{rid}/reports", json=msgs[i:i + 1_000]).status_code == 200


def fake(client: TestClient, rid: str, headlist: dict[str, Any], n: int) -> None:
    """n fake devices, each reporting the target outright (well-formed messages with fresh ids)."""
    msgs = [{"id": new_message_id(), "headlist": headlist["content_hash"],
             "reports": [{"query": TARGET[0], "url": TARGET[1]}]} for _ in range(n)]
    assert client.post(f"{API}/rounds/{rid}/reports", json=msgs).json()["counted"] == n


PARAMS = {"epsilon": 8.0, "delta": 1e-5, "head_list_size": 10, "seed": 5}


def test_fake_reports_are_held_and_published_without_the_flagged_entries(client: TestClient) -> None:
    rid, hl = optin_round(client, PARAMS)
    report_honestly(client, rid, hl)
    fake(client, rid, hl, N_DEVICES // 20)  # 5%
    assert client.post(f"{API}/rounds/{rid}/close", headers=AUTH).json()["state"] == "results-held"
    # held: nothing public; the administrator sees the check
    for path in ("results", "local-search"):
        resp = client.get(f"{API}/rounds/{rid}/{path}")
        assert resp.status_code == 409 and "held" in resp.json()["error"]["message"]
    doc = client.get(f"{API}/rounds/{rid}/results", headers=AUTH).json()
    check = doc["anchor_check"]
    assert check["flagged_records"] >= 1 and check["defense"] == "anchor"
    flagged = [(r["query"], r["url"]) for r in doc["records"] if r["flagged"]]
    assert TARGET in flagged
    # at least 200 of the 300 fakes counted as excess (the rest is the honest count's and the anchor's noise)
    assert check["excess_reports"] > 200 and check["fake_fraction_lower"] > 200 / (N_DEVICES + 300)
    target_row = next(r for r in doc["records"] if (r["query"], r["url"]) == TARGET)
    # within its bound of the opt-in estimate (unprojected), far below what the fakes would have published
    assert abs(target_row["p_blended_raw"] - target_row["p_optin"]) <= target_row["anchor_bound"] * (1 + 1e-9)
    assert target_row["p_undefended"] > 2 * target_row["p_optin"]
    assert target_row["p_blended_raw"] < target_row["p_optin"] + 0.5 * (target_row["p_undefended"]
                                                                      - target_row["p_optin"])
    for r in doc["records"] + doc["queries"]:
        assert 0.0 <= r["p_blended"] <= 1.0 and 0.0 <= r["ci95_low"] <= r["ci95_high"] <= 1.0

    resp = client.post(f"{API}/rounds/{rid}/results/publish", json={"flagged": "remove"}, headers=AUTH)
    assert resp.status_code == 200 and resp.json()["state"] == "results-published"
    public = client.get(f"{API}/rounds/{rid}/results").json()
    assert public["anchor_check"]["withheld"] is True
    assert all((r["query"], r["url"]) not in flagged for r in public["records"])
    search = client.get(f"{API}/rounds/{rid}/local-search").json()
    listed = {(q["query"], u["url"]) for q in search["queries"] for u in q["urls"]}
    assert TARGET not in listed and listed
    table = pacsv.read_csv(io.BytesIO(client.get(f"{API}/rounds/{rid}/results", params={"format": "csv"}).content))
    assert all((q, u) not in flagged for q, u in zip(table.column("query").to_pylist(),
                                                     table.column("url").to_pylist(), strict=True))
    assert client.post(f"{API}/rounds/{rid}/results/publish", headers=AUTH).status_code == 409  # once


def test_the_same_attack_on_an_undefended_round_tops_the_suggestions(client: TestClient) -> None:
    """What the check prevents: without it 10% of fakes nearly triple the rarest query (0.05 in the population) and
    rank it above one twice as frequent (cats, 0.10)."""
    rid, hl = optin_round(client, {**PARAMS, "defense": "none"})
    report_honestly(client, rid, hl)
    fake(client, rid, hl, N_DEVICES // 10)
    assert client.post(f"{API}/rounds/{rid}/close", headers=AUTH).json()["state"] == "results-published"
    search = {q["query"]: q["p"] for q in client.get(f"{API}/rounds/{rid}/local-search").json()["queries"]}
    assert search[TARGET[0]] > 0.12 and search[TARGET[0]] > search["cats"]
    assert client.get(f"{API}/rounds/{rid}/results").json()["anchor_check"] is None


def test_an_honest_round_is_published_at_close_and_unchanged_by_publish_choices(client: TestClient) -> None:
    rid, hl = optin_round(client, PARAMS)
    report_honestly(client, rid, hl)
    info = client.post(f"{API}/rounds/{rid}/close", json={"flagged": "remove"}, headers=AUTH).json()
    assert info["state"] == "results-published"
    doc = client.get(f"{API}/rounds/{rid}/results").json()
    assert doc["anchor_check"]["flagged_records"] == doc["anchor_check"]["flagged_queries"] == 0
    assert "withheld" not in doc["anchor_check"]
    search = client.get(f"{API}/rounds/{rid}/local-search").json()
    assert [q["query"] for q in search["queries"]][:2] == ["weather", "news"]  # the population's order


def test_fake_values_in_a_mean_round_are_flagged_and_the_opt_in_mean_published(client: TestClient) -> None:
    lower, upper, eps = 0.0, 1.0, 1.0
    resp = client.post(f"{API}/rounds", json={"kind": "mean", "params": {
        "epsilon": eps, "lower": lower, "upper": upper, "sigma2": 0.05, "seed": 3}}, headers=AUTH)
    rid = resp.json()["id"]
    rng = np.random.default_rng(4)
    values = rng.uniform(0.1, 0.5, 2_000)
    tokens = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": [f"m{i}" for i in range(200)]},
                         headers=AUTH).json()["tokens"]
    for token, v in zip(tokens, values[:200], strict=True):
        client.post(f"{API}/rounds/{rid}/optin/records", json={"values": [float(v)]},
                    headers={"Authorization": f"Bearer {token}"})
    assert client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 200
    src = SeededSource(8)
    honest = [{"id": new_message_id(), "round": rid,
               "value": randomize_value(float(v), lower=lower, upper=upper, epsilon=eps, source=src)}
              for v in values[200:]]
    # 2% fakes at the largest value the service accepts (ln(1e9) noise scales above the range)
    top = upper + np.log(1e9) * (upper - lower) / eps - 1e-6
    fakes = [{"id": new_message_id(), "round": rid, "value": top} for _ in range(36)]
    assert client.post(f"{API}/rounds/{rid}/reports", json=honest + fakes).status_code == 200
    assert client.post(f"{API}/rounds/{rid}/close", headers=AUTH).json()["state"] == "results-held"
    doc = client.get(f"{API}/rounds/{rid}/results", headers=AUTH).json()
    assert doc["anchor_check"]["flagged"] is True
    assert doc["anchor_check"]["undefended"] > doc["optin"]["estimate"] + 0.05  # the fakes' pull, undone
    assert doc["hybrid"]["estimate"] == pytest.approx(doc["optin"]["estimate"])
    assert client.post(f"{API}/rounds/{rid}/results/publish", headers=AUTH).json()["state"] == "results-published"
    assert client.get(f"{API}/rounds/{rid}/results").json()["hybrid"]["estimate"] == doc["hybrid"]["estimate"]

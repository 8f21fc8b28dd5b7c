"""Sizing a service round before it starts (issue 42): the forecast endpoint and ``--dry-run``.

The numbers themselves are checked against the shipped curator in tests/test_sizing.py; here: the endpoint uses
the round's own parameters and opt-in uploads, refuses what it cannot size, and the CLI forecasts without a server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from hybriddp.cli import cli
from hybriddp.core.params import BlenderParams
from hybriddp.service import create_app
from hybriddp.tune.sizing import forecast_round

ADMIN = "admin-token-of-the-sizing-tests-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as c:
        yield c


def _create(client: TestClient, params: dict[str, Any], kind: str = "blender") -> str:
    resp = client.post(f"{API}/rounds", json={"kind": kind, "params": params}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _upload(client: TestClient, rid: str, n: int) -> None:
    users = [f"user-{i}" for i in range(n)]
    resp = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": users}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    lines = "\n".join(json.dumps({"token": t, "records": [{"query": f"q{i % 3}", "url": "u"}]})
                      for i, t in enumerate(resp.json()["tokens"]))
    resp = client.post(f"{API}/rounds/{rid}/optin/records", content=lines.encode(),
                       headers={"Content-Type": "application/x-ndjson"})
    assert resp.status_code == 200, resp.text


def test_forecast_uses_the_rounds_parameters_and_uploads(client: TestClient) -> None:
    params = {"epsilon": 3.0, "delta": 1e-6, "head_list_size": 20, "f_o": 0.9}
    rid = _create(client, params)
    doc = client.get(f"{API}/rounds/{rid}/forecast", headers=AUTH).json()
    expected = forecast_round(BlenderParams(epsilon=3.0, delta=1e-6, head_list_size=20, f_o=0.9), optin_users=0)
    assert doc["optin_users"] == 0 and doc["p_empty"] == 1.0 and doc["tau"] == expected.tau
    assert doc["optin_for_one"] == expected.optin_for_one and doc["head_list_size"] == 20
    assert "likely list nothing" in doc["warnings"][0] and doc["lines"][0].startswith("τ = ")
    _upload(client, rid, 5)
    assert client.get(f"{API}/rounds/{rid}/forecast", headers=AUTH).json()["optin_users"] == 5
    big = client.get(f"{API}/rounds/{rid}/forecast", params={"optin_users": 50_000}, headers=AUTH).json()
    assert big["optin_users"] == 50_000 and big["p_empty"] < 1e-6 and big["head_list_range"][1] == 20


def test_forecast_refuses_what_it_cannot_size(client: TestClient) -> None:
    rid = _create(client, {"epsilon": 4.0, "delta": 1e-5, "head_list_size": 10})
    assert client.get(f"{API}/rounds/{rid}/forecast").status_code == 401
    assert client.get(f"{API}/rounds/{rid}/forecast", params={"optin_users": 0}, headers=AUTH).status_code == 422
    mean = _create(client, {"epsilon": 1.0, "lower": 0.0, "upper": 1.0}, kind="mean")
    resp = client.get(f"{API}/rounds/{mean}/forecast", headers=AUTH)
    assert resp.status_code == 409 and "only BLENDER rounds" in resp.text


def test_round_create_dry_run_forecasts_without_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDDP_SERVER", "http://127.0.0.1:9")  # nothing listens there: nothing may be sent
    res = CliRunner().invoke(cli, ["round", "create", "--expect-optin", "300", "-M", "50", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "P(empty list)" in res.output and "likely list nothing" in res.output and "round id" not in res.output
    res = CliRunner().invoke(cli, ["series", "create", "--period", "7d", "--periods", "2", "--expect-optin", "30000",
                                   "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["forecast"]["optin_users"] == 30_000 and doc["forecast"]["warnings"] == []
    res = CliRunner().invoke(cli, ["round", "create", "--expect-devices", "1000", "--dry-run"])
    assert res.exit_code == 2 and "--expect-optin" in res.output

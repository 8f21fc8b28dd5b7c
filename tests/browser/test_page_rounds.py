"""``GET /api/v1/local-search/rounds``: which round the local-search page searches and which it contributes to.

The page searches the newest BLENDER round with published results and contributes to the newest BLENDER round
still taking device reports; mean rounds and rounds in other states are neither. Through the app in-process
(no browser), on SQLite, with tests/service/test_api.py's helpers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browserhelpers import API
from fastapi.testclient import TestClient
from test_api import ADMIN, AUTH, blender_round, create, device_messages, enrol_all, upload

from hybriddp.service import create_app


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(f"sqlite:///{tmp_path / 'hybriddp.db'}", ADMIN, open_admission=True)) as c:
        yield c


def page_rounds(client: TestClient) -> tuple[str | None, str | None]:
    resp = client.get(f"{API}/local-search/rounds")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    for r in body.values():
        assert r is None or set(r) == {"id", "name", "state", "headlist_hash"}
    return tuple(None if body[k] is None else body[k]["id"] for k in ("search", "contribute"))  # type: ignore[return-value]


def report_and_close(client: TestClient, rid: str, headlist: dict[str, Any]) -> None:
    resp = client.post(f"{API}/rounds/{rid}/reports", json=device_messages(headlist, 50, seed=3))
    assert resp.status_code == 200, resp.text
    resp = client.post(f"{API}/rounds/{rid}/close", headers=AUTH, json={"flagged": "publish"})
    assert resp.status_code == 200, resp.text


def test_newest_published_round_is_searched_and_newest_collecting_round_takes_reports(client: TestClient) -> None:
    assert page_rounds(client) == (None, None)
    create(client)  # collecting opt-in records: neither
    assert page_rounds(client) == (None, None)

    first, first_headlist = blender_round(client)
    assert page_rounds(client) == (None, first)
    second, second_headlist = blender_round(client)  # (the same opt-in users: two rounds fit their lifetime budget)
    assert page_rounds(client) == (None, second)

    report_and_close(client, first, first_headlist)
    assert page_rounds(client) == (first, second)
    report_and_close(client, second, second_headlist)
    assert page_rounds(client) == (second, None)
    info = client.get(f"{API}/rounds/{second}").json()
    search = client.get(f"{API}/local-search/rounds").json()["search"]
    assert search == {"id": second, "name": info["name"], "state": "results-published",
                      "headlist_hash": info["headlist_hash"]}

    # a mean round collecting reports is not a round the page can contribute to
    mean = create(client, "mean", {"epsilon": 1.0, "lower": 0.0, "upper": 10.0, "sigma2": 4.0})
    tokens = enrol_all(client, mean, [f"m-{i}" for i in range(20)])
    for token, value in zip(tokens, np.linspace(1, 9, 20).tolist(), strict=True):
        assert upload(client, mean, token, {"values": [value]}).status_code == 200
    assert client.post(f"{API}/rounds/{mean}/headlist", headers=AUTH).status_code == 200
    assert page_rounds(client) == (second, None)

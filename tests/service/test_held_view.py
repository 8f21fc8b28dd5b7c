"""Held results an operator can judge (issue 39; ALGORITHM.md §7.2, "Judging held results"): a round whose fake
reports the anchor check flags lists, in its ``anchor_check``, each flagged entry with its opt-in and device
estimates, the test's z, p-value and Holm level, the estimated number of fake reports that would explain the gap,
and what publishing the results as they are (keep) or without the flagged entries (remove) would publish; the
same for a mean round. ``hybriddp round close`` prints it (table and ``--json``), the round page reads it.

Rounds run on a real server (uvicorn on a socket) with seeded curator noise and seeded device randomness: every
number is reproducible. Two rounds per kind differ only in the number of fakes, so each extra fake must add
one to the estimate (the honest part cancels), and each round's estimate must lie within the noise of the number
injected; one round is then published with ``--flagged keep``, the other with ``--flagged remove``, and what they
publish must be what the view said.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from test_anchor_service import N_DEVICES, N_OPTIN, POPULATION, TARGET  # the anchor tests' population

from clihelpers import invoke
from hybriddp.core.protocol import new_message_id
from hybriddp.device.localalg import SeededSource, randomize_records
from hybriddp.device.mean import randomize_value
from hybriddp.service import create_app
from uvicornhelpers import served

ADMIN = "admin-token-of-the-held-view-tests-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
PARAMS = {"epsilon": 8.0, "delta": 1e-5, "head_list_size": 10, "seed": 5}
SPREAD = 3.0  # the estimate must lie within this many of the test's standard deviations of the number injected


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    """The service on a real socket (SQLite), an HTTP client of it, and the CLI pointed at it."""
    app = create_app(f"sqlite:///{tmp_path / 'held.db'}", ADMIN, open_admission=True, allow_seeds=True)
    with served(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        monkeypatch.setenv("HYBRIDDP_SERVER", url)
        monkeypatch.setenv("HYBRIDDP_ADMIN_TOKEN", ADMIN)
        yield http


def population(n: int) -> list[tuple[str, str]]:
    return [(q, u) for q, u, p in POPULATION for _ in range(round(p * n))]


def optin(http: httpx.Client, rid: str, lines: list[dict[str, Any]]) -> None:
    """Enrol one user per line and upload every line in one NDJSON request."""
    resp = http.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": [f"{rid}-u{i}" for i in range(len(lines))]},
                     headers=AUTH)
    assert resp.status_code == 201, resp.text
    body = "".join(json.dumps({"token": t, **line}) + "\n" for t, line in zip(resp.json()["tokens"], lines,
                                                                             strict=True))
    resp = http.post(f"{API}/rounds/{rid}/optin/records", content=body.encode(),
                     headers={"Content-Type": "application/x-ndjson"})
    assert resp.status_code == 200, resp.text
    assert http.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 200


def attacked_blender_round(http: httpx.Client, fakes: int) -> str:
    """The population's opt-in records and honest devices (seeded), plus ``fakes`` devices reporting TARGET."""
    rid = http.post(f"{API}/rounds", json={"kind": "blender", "params": PARAMS}, headers=AUTH).json()["id"]
    optin(http, rid, [{"records": [{"query": q, "url": u}]} for q, u in population(N_OPTIN)])
    hl = http.get(f"{API}/rounds/{rid}/headlist").json()
    src = SeededSource(29)
    msgs = [randomize_records(hl, [r], source=src) for r in population(N_DEVICES)]
    msgs += [{"id": new_message_id(), "headlist": hl["content_hash"],
              "reports": [{"query": TARGET[0], "url": TARGET[1]}]} for _ in range(fakes)]
    for i in range(0, len(msgs), 2_000):
        assert http.post(f"{API}/rounds/{rid}/reports", json=msgs[i:i + 2_000]).status_code == 200
    return rid


def within_noise(estimate: float, injected: int, z: float) -> None:
    """The estimate of fakes is proportional to the gap the test measured in standard deviations (z), so one
    standard deviation of the estimate under honest noise is estimate/z reports: the number injected must lie
    within SPREAD of them (and the estimate cannot be off by more than half of what was injected)."""
    sd = abs(estimate / z)
    assert abs(estimate - injected) <= SPREAD * sd and abs(estimate - injected) < injected / 2, (estimate, z)


def test_a_held_blender_round_names_the_attacked_entry_and_what_each_choice_publishes(
        server: httpx.Client) -> None:
    small, large = 300, 450
    ra, rb = attacked_blender_round(server, small), attacked_blender_round(server, large)

    closed = json.loads(invoke("round", "close", ra, "--json").output)  # --json: the round with the view
    assert closed["state"] == "results-held"
    view_a = closed["anchor_check"]
    text = invoke("round", "close", rb).output  # the table
    assert "flagged entries" in text and "dogs" in text and "d.example/1" in text and "fake reports" in text
    view_b = server.get(f"{API}/rounds/{rb}/results", headers=AUTH).json()["anchor_check"]
    assert server.get(f"{API}/rounds/{ra}/results", headers=AUTH).json()["anchor_check"] == view_a  # same numbers

    entries = []
    for view, injected in ((view_a, small), (view_b, large)):
        hits = [e for e in view["flagged_entries"] if (e["query"], e["url"]) == TARGET]
        assert len(hits) == 1, view["flagged_entries"]
        e = hits[0]
        assert e["level"] == "record" and e["p_client"] > e["p_optin"]
        assert abs(e["z"]) > view["critical_z"] and e["p_value"] <= e["p_threshold"]  # the test that flagged it
        within_noise(e["estimated_fake_reports"], injected, e["z"])
        entries.append(e)
    assert f"{entries[1]['estimated_fake_reports']:,.0f}" in text
    # the honest part of the two rounds is the same: each extra fake adds one fake to the estimate
    assert entries[1]["estimated_fake_reports"] - entries[0]["estimated_fake_reports"] == pytest.approx(
        large - small, abs=0.5)

    # the round page (browser-free): its HTML has the administrator's token form and the held-results panel, its
    # script renders the view's fields, and the JSON it reads holds them for the administrator only
    html = server.get(f"/rounds/{ra}").text
    for needle in ('id="held-panel"', 'id="admin-form"', 'type="password"', 'id="held"'):
        assert needle in html
    script = server.get("/static/round.js").text
    for field in ("flagged_entries", "estimated_fake_reports", "published_if_kept", "published_if_removed",
                  "estimated_fake_values", "p_threshold", "Authorization"):
        assert field in script
    assert server.get(f"{API}/rounds/{ra}/results").status_code == 409  # held: not public

    # keep publishes what the view said; remove leaves the entry out, as the view said
    invoke("round", "publish-results", ra, "--flagged", "keep")
    public = server.get(f"{API}/rounds/{ra}/results").json()
    row = next(r for r in public["records"] if (r["query"], r["url"]) == TARGET)
    assert row["p_blended"] == entries[0]["published_if_kept"]
    assert {"records": len(public["records"]), "queries": len(public["queries"])} == view_a["published_if_kept"]
    invoke("round", "publish-results", rb, "--flagged", "remove")
    public = server.get(f"{API}/rounds/{rb}/results").json()
    assert entries[1]["published_if_removed"] is None
    assert all((r["query"], r["url"]) != TARGET for r in public["records"])
    assert {"records": len(public["records"]), "queries": len(public["queries"])} == view_b["published_if_removed"]
    assert "flagged_entries" not in public["anchor_check"]  # the removed entries are not named in public


def test_a_held_mean_round_estimates_the_extreme_values_and_what_each_choice_publishes(
        server: httpx.Client) -> None:
    lower, upper, eps = 0.0, 1.0, 1.0
    top = upper + np.log(1e9) * (upper - lower) / eps - 1e-6  # the largest value the service accepts

    def mean_round(fakes: int) -> str:
        rid = server.post(f"{API}/rounds", json={"kind": "mean", "params": {
            "epsilon": eps, "lower": lower, "upper": upper, "sigma2": 0.05, "seed": 3}}, headers=AUTH).json()["id"]
        values = np.random.default_rng(4).uniform(0.1, 0.5, 2_000)
        optin(server, rid, [{"values": [float(v)]} for v in values[:200]])
        src = SeededSource(8)
        msgs = [{"id": new_message_id(), "round": rid,
                 "value": randomize_value(float(v), lower=lower, upper=upper, epsilon=eps, source=src)}
                for v in values[200:]]
        msgs += [{"id": new_message_id(), "round": rid, "value": top} for _ in range(fakes)]
        assert server.post(f"{API}/rounds/{rid}/reports", json=msgs).status_code == 200
        return rid

    small, large = 36, 54
    ra, rb = mean_round(small), mean_round(large)
    view_a = json.loads(invoke("round", "close", ra, "--json").output)["anchor_check"]
    text = invoke("round", "close", rb).output
    view_b = server.get(f"{API}/rounds/{rb}/results", headers=AUTH).json()["anchor_check"]
    assert "extreme values" in text and f"{view_b['estimated_fake_values']:,.1f}" in text
    for view, injected in ((view_a, small), (view_b, large)):
        assert view["flagged"] is True and view["client_mean"] > view["optin_mean"]
        assert view["extreme_value"] == pytest.approx(top, abs=1e-5)
        within_noise(view["estimated_fake_values"], injected, view["z"])
    assert view_b["estimated_fake_values"] - view_a["estimated_fake_values"] == pytest.approx(large - small, abs=1e-3)

    invoke("round", "publish-results", ra, "--flagged", "keep")
    assert server.get(f"{API}/rounds/{ra}/results").json()["hybrid"]["estimate"] == view_a["published_if_kept"]
    invoke("round", "publish-results", rb, "--flagged", "remove")
    public = server.get(f"{API}/rounds/{rb}/results").json()
    assert public["hybrid"]["estimate"] is None and view_b["published_if_removed"] is None
    assert public["anchor_check"]["client_mean"] is None  # withheld with the client estimate


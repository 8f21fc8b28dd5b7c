"""Round series (docs/SERIES.md) on a real database (``store_url``: SQLite and PostgreSQL).

A 12-period series is driven through the HTTP API of a running ``hybriddp serve`` (tests/serieshelpers.py): every
user's spend stays within the lifetime budget, every acknowledged report is counted once, and the trends over the
published periods find the query planted to rise. Then the schedule itself (what is due when, by the clock), the
scheduler's races, a user refused at enrolment when the budget is spent, and every refusal of bad input.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from hybriddp.device.localalg import SeededSource, randomize_records
from hybriddp.service import create_app
from hybriddp.service import series as ser
from hybriddp.service.process import ServeProcess
from hybriddp.service.store import Store
from serieshelpers import GROUP_SIZE, GROUPS, PARAMS, PERIODS, drive_series

ADMIN = "admin-token-of-the-tests-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"


def optin_round(http: Any, rid: str, users: list[str], record: tuple[str, str]) -> list[str]:
    """Enrol ``users`` in round ``rid`` and upload ``record`` for each (one NDJSON request); their tokens."""
    tokens = http.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": users}, headers=AUTH).json()["tokens"]
    body = "".join(json.dumps({"token": t, "records": [{"query": record[0], "url": record[1]}]}) + "\n"
                   for t in tokens)
    resp = http.post(f"{API}/rounds/{rid}/optin/records", content=body.encode(),
                     headers={"Content-Type": "application/x-ndjson"})
    assert resp.status_code == 200, resp.text
    return tokens


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(store_url, ADMIN, open_admission=True, series_tick=0)) as c:
        yield c


def create_series(client: TestClient, **extra: Any) -> dict[str, Any]:
    body = {"kind": "blender", "params": PARAMS, "period_seconds": 7 * 86400, "periods": PERIODS, **extra}
    resp = client.post(f"{API}/series", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.text
    return resp.json()


def step(client: TestClient, sid: str) -> dict[str, Any]:
    resp = client.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return resp.json()


def current_round(doc: dict[str, Any], period: int) -> dict[str, Any]:
    row = doc["periods_table"][period]
    assert row["round"] is not None, row
    return row["round"]


def test_a_twelve_period_series_on_a_running_server_keeps_every_budget_counts_every_report_once_and_finds_the_rise(
        store_url: str, tmp_path: Path) -> None:
    srv = ServeProcess(store_url, tmp_path, ("--open-admission", "--series-tick", "0", "--log-level", "warning"))
    srv.start()
    try:
        with httpx.Client(base_url=srv.base_url, timeout=120) as http:
            sid, acked = drive_series(http, srv.admin)
            for rid, n in acked.items():  # every acknowledged report counted once
                counts = http.get(f"{API}/rounds/{rid}", headers=srv.admin).json()["counts"]
                assert counts["messages"] == n and counts["reports"] == n
            trends = http.get(f"{API}/series/{sid}/trends", params={"window": 3}).json()
            public = http.get(f"{API}/series/{sid}").json()  # the public view: no opt-in counts
    finally:
        srv.stop()
    assert "Traceback" not in srv.log_text(), srv.log_text()[-4000:]
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:  # every user's spend, read from the database itself
        spent = conn.execute(sa.text("SELECT SUM(epsilon), SUM(delta), COUNT(*) FROM ledger_charges "
                                     "GROUP BY user_pseudonym")).all()
        lifetime = dict(conn.execute(sa.text("SELECT key, value FROM ledger_meta")).all())
    engine.dispose()
    assert len(spent) == GROUPS * GROUP_SIZE
    assert all(e <= float(lifetime["lifetime_epsilon"]) + 1e-9 and d <= float(lifetime["lifetime_delta"]) and n == 2
               for e, d, n in spent)
    assert trends["periods"] == [f"period {k + 1}" for k in range(PERIODS)]
    found = {(c["query"], c["trend"]) for c in trends["changes"] if c["trend"] != "steady"}
    assert ("eclipse", "rising") in found, found
    assert len(trends["series"]["eclipse"]) == PERIODS
    assert all(r["round"]["optin_users"] is None for r in public["periods_table"])


def test_the_clock_opens_publishes_and_closes_each_period_on_time_and_ends_the_series(client: TestClient) -> None:
    store: Store = client.app.state.store
    t0 = datetime(2030, 1, 5, tzinfo=timezone.utc)
    plan = ser.plan_series(store, "blender", PARAMS, start=t0, period_seconds=3600.0, optin_seconds=600.0,
                           periods=2, at=t0)
    sid = ser.create_series(store, plan).id
    hour, minute = timedelta(hours=1), timedelta(minutes=1)
    assert ser.advance(store, sid, at=t0 - minute) == []  # before the start: nothing
    opened = ser.advance(store, sid, at=t0)
    rid = store.series_rounds(store.series(sid))[0].id
    assert opened == [f"period 1: opened round {rid} (collecting opt-in data)"]
    tokens = store.enrol_many(rid, [f"u{i}" for i in range(22)])
    body = "".join(json.dumps({"token": t, "records": [{"query": "weather", "url": "https://w.example/a"}]}) + "\n"
                   for t in tokens)
    assert client.post(f"{API}/rounds/{rid}/optin/records", content=body.encode(),
                       headers={"Content-Type": "application/x-ndjson"}).status_code == 200
    assert ser.advance(store, sid, at=t0 + 9 * minute) == []  # the opt-in window is still open
    assert ser.advance(store, sid, at=t0 + 10 * minute) == [
        f"period 1: round {rid} built its head list (headlist-published)"]
    headlist = client.get(f"{API}/rounds/{rid}/headlist").json()
    reports = [randomize_records(headlist, [("weather", "https://w.example/a")], source=SeededSource(i))
               for i in range(40)]
    assert client.post(f"{API}/rounds/{rid}/reports", json=reports).status_code == 200
    assert ser.advance(store, sid, at=t0 + 59 * minute) == []  # reports until the period ends
    done = ser.advance(store, sid, at=t0 + hour)
    rid2 = store.series_rounds(store.series(sid))[1].id
    assert done[0].startswith(f"period 1: round {rid} closed (results-") and done[1] == (
        f"period 2: opened round {rid2} (collecting opt-in data)")
    assert ser.advance(store, sid, at=t0 + hour) == []  # a second scheduler at the same moment: nothing twice
    # nobody uploaded in period 2: at its window's end the round cannot build and is aborted (raw data deleted)
    done = ser.advance(store, sid, at=t0 + hour + 10 * minute)
    assert len(done) == 1 and "aborted" in done[0] and "no opt-in records" in done[0], done
    assert store.series(sid).state == "active"
    assert ser.advance(store, sid, at=t0 + 2 * hour) == [f"series {sid} ended"]
    assert ser.advance(store, sid, at=t0 + 3 * hour) == []
    status = ser.status(store, sid, admin=True, at=t0 + 3 * hour)
    assert [r["round"]["state"] for r in status["periods_table"]] == [store.round(rid).state, "aborted"]
    assert store.round(rid).state in ("results-published", "results-held") and status["state"] == "ended"


def test_concurrent_schedulers_open_a_period_once(client: TestClient) -> None:
    store: Store = client.app.state.store
    t0 = datetime(2031, 3, 1, tzinfo=timezone.utc)
    sid = ser.create_series(store, ser.plan_series(store, "blender", PARAMS, start=t0, period_seconds=3600.0,
                                                   periods=3, at=t0)).id
    out: list[list[str]] = []
    threads = [threading.Thread(target=lambda: out.append(ser.advance(store, sid, at=t0))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(o) for o in out) == 1
    assert list(store.series_rounds(store.series(sid))) == [0]


def test_a_user_whose_budget_is_spent_is_refused_at_enrolment_not_the_whole_round(client: TestClient) -> None:
    sid = create_series(client)["id"]
    for k in range(3):
        rid = current_round(step(client, sid), k)["id"]
        fillers = [f"filler-{k}-{i}" for i in range(20)]  # enough records for a head list
        resp = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": ["carol", "dave"]}, headers=AUTH)
        if k == 2:  # both spent 16 = the lifetime budget: the third period refuses them at enrolment
            assert resp.status_code == 409 and resp.json()["error"]["code"] == "budget_exceeded", resp.text
            message = resp.json()["error"]["message"]
            assert "'carol'" in message and "(and 1 more)" in message and "nobody in this request" in message
            ok = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": fillers}, headers=AUTH)
            assert ok.status_code == 201  # everyone else takes part
            break
        assert resp.status_code == 201, resp.text
        tokens = resp.json()["tokens"] + client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": fillers},
                                                     headers=AUTH).json()["tokens"]
        body = "".join(json.dumps({"token": t, "records": [{"query": "weather", "url": "https://w.example/a"}]})
                       + "\n" for t in tokens)
        assert client.post(f"{API}/rounds/{rid}/optin/records", content=body.encode(),
                           headers={"Content-Type": "application/x-ndjson"}).status_code == 200
        assert current_round(step(client, sid), k)["state"] == "headlist-published"  # charges everyone ε = 8
        headlist = client.get(f"{API}/rounds/{rid}/headlist").json()
        reports = [randomize_records(headlist, [("weather", "https://w.example/a")], source=SeededSource(i))
                   for i in range(50)]
        assert client.post(f"{API}/rounds/{rid}/reports", json=reports).status_code == 200
        assert "closed" in step(client, sid)["actions"][0]
    store: Store = client.app.state.store
    assert store.spent("carol") == pytest.approx((16.0, 2e-5))


def test_bad_series_are_refused_with_one_line_and_nothing_stored(client: TestClient) -> None:
    def refused(body: dict[str, Any], status: int, *needles: str) -> None:
        full = {"kind": "blender", "params": PARAMS, "period_seconds": 3600, "periods": 4, **body}
        resp = client.post(f"{API}/series", json=full, headers=AUTH)
        assert resp.status_code == status, resp.text
        message = resp.json()["error"]["message"]
        assert "\n" not in message
        for n in needles:
            assert n in message, message

    before = client.get(f"{API}/series", headers=AUTH).json()["series"]
    refused({"params": {**PARAMS, "epsilon": 20.0}}, 422, "admits no round")  # ε 20 > lifetime 16
    refused({"optin_seconds": 3600}, 422, "opt-in window")
    refused({"period_seconds": 0.5}, 422, "period")
    refused({"start": (datetime.now(timezone.utc) - timedelta(days=3)).isoformat()}, 422, "start")
    refused({"retention_hours": 0.1, "optin_seconds": 1800}, 422, "retention_hours")
    assert client.get(f"{API}/series", headers=AUTH).json()["series"] == before
    first = create_series(client)
    refused({"start": (datetime.now(timezone.utc) + timedelta(days=30)).isoformat(), "period_seconds": 86400}, 409,
            "overlap", first["id"])
    # a series can start with a round that still collects opt-in data, never with a closed one
    rid = client.post(f"{API}/rounds", json={"kind": "blender", "params": PARAMS}, headers=AUTH).json()["id"]
    client.post(f"{API}/rounds/{rid}/abort", headers=AUTH)
    later = (datetime.now(timezone.utc) + timedelta(days=400)).isoformat()
    refused({"first_round": rid, "start": later}, 409, "'aborted'", "collecting-optin")
    assert len(client.get(f"{API}/series", headers=AUTH).json()["series"]) == len(before) + 1
    resp = client.post(f"{API}/series/{first['id']}/cancel", headers=AUTH)
    assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
    again = client.post(f"{API}/series/{first['id']}/cancel", headers=AUTH)
    assert again.status_code == 409
    assert client.get(f"{API}/series/not-a-series-id").status_code == 404
    assert client.post(f"{API}/series", json={"kind": "blender", "params": PARAMS, "period_seconds": 60,
                                               "periods": 2}).status_code == 401


def test_a_series_can_adopt_a_round_collecting_opt_in_data_as_its_first_period(client: TestClient) -> None:
    rid = client.post(f"{API}/rounds", json={"kind": "blender", "params": PARAMS}, headers=AUTH).json()["id"]
    doc = create_series(client, first_round=rid)
    assert doc["periods_table"][0]["round"]["id"] == rid
    doc = step(client, doc["id"])  # the first period's round exists: the step builds it (nobody uploaded: aborted)
    assert "aborted" in doc["actions"][0]


def test_a_device_reporting_one_period_in_six_reports_in_exactly_two_of_twelve(store_url: str,
                                                                                tmp_path: Path) -> None:
    """The device-side policy (ALGORITHM.md §15, docs/SERIES.md): each block of 6 periods, one slot drawn on the
    device; asked every period, it reports in exactly one per block, and a period sat out sends and charges
    nothing. With memoization the two reports cost one round."""
    from hybriddp.device.ledger import DeviceLedger
    from hybriddp.sdk import DeviceClient
    from hybriddp.service.demo import local_server

    ledger_path = tmp_path / "device-ledger.json"
    sent: list[int] = []
    with local_server(create_app(store_url, ADMIN, open_admission=True, series_tick=0)) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        sid = http.post(f"{API}/series", json={"kind": "blender", "params": PARAMS, "period_seconds": 86400,
                                               "periods": PERIODS}, headers=AUTH).json()["id"]
        for k in range(PERIODS):
            doc = http.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=AUTH).json()
            rid = doc["periods_table"][k]["round"]["id"]
            optin_round(http, rid, [f"p{k}-{i}" for i in range(22)], ("weather", "https://w.example/a"))
            assert http.post(f"{API}/series/{sid}/advance", json={"step": True},
                             headers=AUTH).json()["periods_table"][k]["round"]["state"] == "headlist-published"
            ledger = DeviceLedger(ledger_path, lifetime_epsilon=100.0, lifetime_delta=1e-3)
            with DeviceClient(url, rid, ledger, participation=6, outbox=None, report_now=True) as dev:  # a test
                ack = dev.participate([("weather", "https://w.example/a")])
            if not ack.skipped:
                assert ack.counted == 1
                sent.append(k)
            else:
                assert ack.acknowledged == 0
            assert http.get(f"{API}/rounds/{rid}").json()["counts"]["messages"] == (0 if ack.skipped else 1)
            headlist = http.get(f"{API}/rounds/{rid}/headlist").json()
            others = [randomize_records(headlist, [("weather", "https://w.example/a")], source=SeededSource(i))
                      for i in range(20)]
            http.post(f"{API}/rounds/{rid}/reports", json=others)
            http.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=AUTH)
    assert len(sent) == 2 and sent[0] < 6 <= sent[1], sent
    # every period's head list is the same document (same records, same list), and so are the device's records:
    # the second report re-sends the memoized one (ALGORITHM.md §15), so the two periods cost one round's ε
    ledger = DeviceLedger(ledger_path)
    assert len(ledger.state["rounds"]) == 1 and ledger.spent() == pytest.approx((8.0, 1e-5))
    (memo,) = ledger.state["memo"].values()
    assert len(memo["sent_in"]) == 2


def test_the_device_draws_its_slot_uniformly_and_keeps_it(tmp_path: Path) -> None:
    """The slot of a block is uniform on [0, r) (OS randomness; chi-square, p < 1e-6 fails) and, once drawn, fixed:
    asking again never changes the answer."""
    from scipy.stats import chisquare

    from hybriddp.device.ledger import DeviceLedger

    r, n = 6, 1200
    counts = np.zeros(r, dtype=int)
    for i in range(n):
        led = DeviceLedger(tmp_path / f"l{i}.json", lifetime_epsilon=16.0, lifetime_delta=1e-4)
        answers = [led.takes_part("s", p, r) for p in range(r)]
        assert sum(answers) == 1 and answers == [led.takes_part("s", p, r) for p in range(r)]
        counts[answers.index(True)] += 1
    assert chisquare(counts).pvalue > 1e-6, counts
    late = DeviceLedger(tmp_path / "late.json", lifetime_epsilon=16.0, lifetime_delta=1e-4)
    picks = [late.takes_part("s", p, r, draw=lambda _n: 2) for p in range(3, 12)]  # first asked at period 3
    assert picks == [False, False, False, False, False, True, False, False, False]  # slot 2: none in block 0's rest


def test_a_person_moving_between_groups_is_accounted_on_their_device(store_url: str, tmp_path: Path) -> None:
    """docs/SERIES.md, "Moving between groups": an opt-in upload with the person's device ledger records the round's
    (ε, δ) there once (retries too), so that ledger counts both groups and refuses a device report past the
    lifetime budget; the service's ledger charges the opt-in round as always."""
    from hybriddp.device.ledger import DeviceLedger, DeviceLedgerRefusal
    from hybriddp.sdk import DeviceClient, OptinUploader
    from hybriddp.service.demo import local_server

    ledger = DeviceLedger(tmp_path / "ledger.json", lifetime_epsilon=12.0, lifetime_delta=1e-3)
    with local_server(create_app(store_url, ADMIN, open_admission=True, series_tick=0)) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        sid = http.post(f"{API}/series", json={"kind": "blender", "params": PARAMS, "period_seconds": 86400,
                                               "periods": 3}, headers=AUTH).json()["id"]
        rid = http.post(f"{API}/series/{sid}/advance", json={"step": True},
                        headers=AUTH).json()["periods_table"][0]["round"]["id"]
        tokens = http.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": [f"x{i}" for i in range(22)]},
                           headers=AUTH).json()["tokens"]
        with OptinUploader(url, rid, tokens[0], device_ledger=ledger) as me:  # this person opts in, period 1
            assert me.upload([("weather", "https://w.example/a")]) == 1
            assert me.upload([("weather", "https://w.example/a")]) == 0  # a repeat: neither stored nor charged
        assert ledger.spent() == pytest.approx((8.0, 1e-5))
        body = "".join(json.dumps({"token": t, "records": [{"query": "weather", "url": "https://w.example/a"}]})
                       + "\n" for t in tokens[1:])  # the others, through a relay
        assert http.post(f"{API}/rounds/{rid}/optin/records", content=body.encode(),
                         headers={"Content-Type": "application/x-ndjson"}).status_code == 200
        for _ in range(3):  # build period 1, close it (the other devices' reports), open period 2
            doc = http.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=AUTH).json()
            if doc["periods_table"][0]["round"]["state"] == "headlist-published":
                headlist = http.get(f"{API}/rounds/{rid}/headlist").json()
                http.post(f"{API}/rounds/{rid}/reports", json=[randomize_records(
                    headlist, [("weather", "https://w.example/a")], source=SeededSource(i)) for i in range(20)])
        rid2 = doc["periods_table"][1]["round"]["id"]
        optin_round(http, rid2, [f"y{i}" for i in range(22)], ("news", "https://n.example/a"))
        http.post(f"{API}/series/{sid}/advance", json={"step": True}, headers=AUTH)  # build period 2
        with DeviceClient(url, rid2, ledger, outbox=None, report_now=True) as dev, pytest.raises(  # a test
                DeviceLedgerRefusal, match="lifetime ε = 12"):
            dev.participate([("news", "https://n.example/a")])  # 8 (opt-in) + 8 (device) > 12: refused
    assert ledger.spent() == pytest.approx((8.0, 1e-5))
    assert list(ledger.state["rounds"]) == [f"optin:{rid}"]


def test_series_commands_end_to_end_and_refusals(store_url: str, tmp_path: Path) -> None:
    """`hybriddp series create|list|status|advance|trends|cancel` against a real server; bad input is one line on
    stderr and exit 2, nothing created."""
    from click.testing import CliRunner

    from hybriddp.cli import cli
    from hybriddp.service.demo import local_server

    def run(*args: Any, ok: bool = True, admin: bool = True) -> Any:
        env = {"HYBRIDDP_ADMIN_TOKEN": ADMIN if admin else ""}
        result = CliRunner().invoke(cli, [str(a) for a in args], env=env)
        if ok:
            assert result.exit_code == 0, result.output + result.stderr
        else:
            assert result.exit_code == 2 and "Traceback" not in result.output + result.stderr, result.output
        return result

    with local_server(create_app(store_url, ADMIN, open_admission=True, series_tick=0)) as url:
        made = json.loads(run("series", "create", "--server", url, "--period", "7d", "--periods", 3, "--epsilon", 8,
                              "--head-list-size", 10, "--name", "cli weekly", "--json").stdout)
        sid = made["id"]
        assert made["period_seconds"] == 604800 and made["optin_seconds"] == 302400 and made["periods"] == 3
        assert made["params"]["epsilon"] == 8 and made["params"]["head_list_size"] == 10
        assert sid in run("series", "list", "--server", url).stdout
        shown = run("series", "status", sid, "--server", url, admin=False).stdout
        assert "cli weekly" in shown and "lets a user join 2 period(s)" in shown
        assert "period 1: opened round" in run("series", "advance", sid, "--server", url, "--step").stdout
        assert "nothing was due" in run("series", "advance", sid, "--server", url).stdout
        assert "trends need two periods" in run("series", "trends", sid, "--server", url, admin=False).stdout
        for args, needle in ((("--period", "0.5", "--periods", 2), "period"),
                             (("--period", "soon", "--periods", 2), "duration"),
                             (("--period", "7d", "--periods", 2, "--start", "tomorrow"), "ISO 8601"),
                             (("--period", "7d", "--periods", 2, "--epsilon", 20), "admits no round"),
                             (("--period", "1d", "--periods", 2), "overlap")):
            err = run("series", "create", "--server", url, *args, ok=False).stderr
            assert needle in err and err.count("\n") <= 2, err
        assert len(json.loads(run("series", "list", "--server", url, "--json").stdout)["series"]) == 1
        assert "HTTP 404" in run("series", "status", "x" * 22, "--server", url, ok=False, admin=False).stderr
        assert "cancelled" in run("series", "cancel", sid, "--server", url).stdout


def test_showing_a_series_never_runs_the_privacy_accountant(client: TestClient,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The periods per user are computed once, when the series is created (the PLD accountant can take seconds on
    a new (ε, δ)), and stored with it: a GET of the series shows them without computing anything."""
    import hybriddp.audit.pld as pld

    sid = create_series(client, params={**PARAMS, "epsilon": 0.7, "delta": 1e-9})["id"]
    got = client.get(f"{API}/series/{sid}")
    assert got.status_code == 200, got.text
    want = got.json()["budget"]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the accountant ran inside a request")

    monkeypatch.setattr(pld, "admitted_rounds", refuse)
    doc = client.get(f"{API}/series/{sid}").json()
    assert doc["budget"] == want and want["periods_per_user"] >= 12  # ε 0.7 a period, lifetime ε 16
    assert client.get(f"{API}/series/{sid}", headers=AUTH).status_code == 200

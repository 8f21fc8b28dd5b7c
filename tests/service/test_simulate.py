"""`hybriddp simulate` (issue 42) against the real service on SQLite and PostgreSQL: a whole round driven by the
command, its pace, its summary, and its refusals.

The server is the service's own app (``create_app``, report tokens required) under Uvicorn on 127.0.0.1; the
population is a small synthetic AOL-like log (about 2,600 users), so each test takes a few seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from hybriddp.cli import cli
from hybriddp.sdk import AdminClient, DeviceClient
from hybriddp.service.demo import local_server
from hybriddp.service.simulate import RateLimiter, Tally, classify, phase_of, pick_users, plan_count, sample_seed

ADMIN = "admin-token-of-the-simulate-tests-01"
POP = ("--scale", "0.005")  # about 2,600 AOL-like users
OPTIN = 600  # at epsilon 8 enough for a head list of several queries


def run(*args: Any, ok: bool | int = True) -> Result:
    """``hybriddp ARGS`` with the admin token in the environment; ``ok``: exit status 0, or the status expected."""
    result = CliRunner().invoke(cli, [str(a) for a in args], env={"HYBRIDDP_ADMIN_TOKEN": ADMIN})
    want = 0 if ok is True else ok
    if want is not False:
        assert result.exit_code == want, result.output + result.stderr
    assert "Traceback" not in result.output + result.stderr
    return result


@pytest.fixture
def server(store_url: str) -> Iterator[str]:
    from hybriddp.service import create_app

    with local_server(create_app(store_url, ADMIN, series_tick=0)) as url:
        yield url


def new_round(url: str, *extra: Any) -> str:
    return json.loads(run("round", "create", "--server", url, "--epsilon", 8, "--head-list-size", 10, *extra,
                          "--json").stdout)["id"]


def published_round(url: str, *extra: Any) -> str:
    """A round whose opt-in users were simulated and whose head list is published."""
    rid = new_round(url, *extra)
    run("simulate", rid, "--server", url, *POP, "--optin-users", OPTIN, "--json")
    assert json.loads(run("round", "publish", rid, "--server", url, "--json").stdout)["state"] == "headlist-published"
    return rid


def test_a_whole_round_driven_by_the_command(server: str) -> None:
    """create → simulate opt-in → publish → simulate devices (paced) → close → results: every device acknowledged
    is counted once by the server, and the head list is not empty."""
    url = server
    rid = new_round(url)
    got = json.loads(run("simulate", rid, "--server", url, *POP, "--optin-users", OPTIN, "--devices", 99,
                         "--concurrency", 4, "--json").stdout)
    assert got["phase"] == "optin" and got["state"] == "collecting-optin" and got["round"] == rid
    assert (got["planned"], got["acknowledged"], got["failed"], got["not_started"]) == (OPTIN, OPTIN, 0, 0)
    assert got["round_counts"]["optin_users"] == OPTIN and got["round_counts"]["optin_records"] == got["records"] > 0
    assert got["next"].startswith(f"hybriddp round publish {rid}") and got["failure"] is None
    for key in ("duplicates", "refused", "errors", "elapsed_seconds", "rate_per_second", "latency_ms", "population",
                "concurrency", "setup_seconds"):
        assert key in got, key
    assert set(got["latency_ms"]) == {"p50", "p95", "p99"} and got["latency_ms"]["p50"] > 0

    published = json.loads(run("round", "publish", rid, "--server", url, "--json").stdout)
    assert published["state"] == "headlist-published"
    with DeviceClient(url, rid, DeviceClient.NO_LEDGER) as dev:
        assert len(dev.fetch_headlist()["queries"]) > 0

    devices, rate = 12, 10.0
    t0 = time.monotonic()
    got = json.loads(run("simulate", rid, "--server", url, *POP, "--optin-users", 5, "--devices", devices, "--rate",
                         rate, "--concurrency", 4, "--json").stdout)
    took = time.monotonic() - t0
    assert got["phase"] == "devices" and got["planned"] == devices and got["target_rate"] == rate
    assert (got["acknowledged"], got["counted"], got["duplicates"], got["failed"]) == (devices, devices, 0, 0)
    assert got["round_counts"]["messages"] == devices
    assert took >= got["elapsed_seconds"] >= (devices - 1) / rate  # the token bucket holds one token
    assert got["next"].startswith(f"hybriddp round close {rid}")

    closed = json.loads(run("round", "close", rid, "--server", url, "--flagged", "publish", "--json").stdout)
    assert closed["state"] == "results-published" and closed["counts"]["messages"] == devices
    res = json.loads(run("round", "results", rid, "--server", url, "--json").stdout)
    assert res["sizes"]["messages"] == got["acknowledged"] and len(res["queries"]) > 1

    text = run("simulate", rid, "--server", url, ok=2).stderr  # the round is over: what to run instead
    assert "'results-published'" in text and f"hybriddp round results {rid}" in text


def test_the_next_round_sized_like_a_past_one(tmp_path: Any) -> None:
    """``round create --like ROUND`` (docs/TUNE.md "Sizing a round"): the forecast's model is fitted to a past
    round's release (DP outputs only); at that round's own opt-in group it expects about the list its curator made.
    The past round is seeded (an experiment: the server allows it here) so that its list, hence the test, is fixed."""
    from hybriddp.service import create_app

    with local_server(create_app(f"sqlite:///{tmp_path / 'db.sqlite'}", ADMIN, allow_seeds=True)) as url:
        optin = 1500
        rid = new_round(url, "--seed", 5)
        run("simulate", rid, "--server", url, *POP, "--optin-users", optin, "--seed", 5, "--json")
        run("round", "publish", rid, "--server", url, "--json")
        run("simulate", rid, "--server", url, *POP, "--devices", 20, "--seed", 5, "--json")
        run("round", "close", rid, "--server", url, "--flagged", "publish", "--json")
        made = json.loads(run("round", "results", rid, "--server", url, "--json").stdout)["sizes"]
        fc = json.loads(run("round", "create", "--server", url, "--epsilon", 8, "--head-list-size", 10, "--like", rid,
                            "--expect-optin", optin, "--dry-run", "--json").stdout)["forecast"]
        assert fc["model"].startswith("fitted to the privatized head list")
        assert f"round {rid}'s head list" in fc["model"]
        # |HL_S| is a sum of independent Bernoullis (docs/TUNE.md): its variance is at most its mean
        assert abs(made["head_list_s_records"] - fc["head_list_mean"]) <= 2 * fc["head_list_mean"] ** 0.5
        prior = json.loads(run("round", "create", "--epsilon", 8, "--head-list-size", 10, "--expect-optin", optin,
                               "--dry-run", "--json").stdout)["forecast"]
        assert prior["model"].startswith("the built-in prior") and prior["head_list_mean"] != fc["head_list_mean"]
        small = new_round(url)  # a round without published results cannot be fitted: one clear line
        assert "--like" in run("round", "create", "--server", url, "--like", small, "--dry-run", ok=2).stderr


def test_refused_reports_are_counted_by_reason_and_fail_the_run(server: str) -> None:
    """A round that takes reports only after a million tokens refuses every device (409 too_few_tokens): the
    table says so, and the command exits 1 with one line."""
    rid = published_round(server, "--min-tokens", 1_000_000)
    result = run("simulate", rid, "--server", server, *POP, "--devices", 3, ok=1)
    assert "3 HTTP 409 too_few_tokens" in result.stdout and f"hybriddp round close {rid}" in result.stdout
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("error: 3 of 3 devices failed (3× HTTP 409 too_few_tokens)")


def test_spread_devices_send_at_their_times_in_the_report_window(server: str) -> None:
    """--spread: every device gets its token at once and sends at a uniformly random time in the report window (here
    the 2 seconds after publication); all are counted, none before it opens nor long after it closes."""
    rid = published_round(server, "--issuance-window", 0, "--report-window", 2)
    got = json.loads(run("simulate", rid, "--server", server, *POP, "--devices", 5, "--spread", "--json").stdout)
    assert (got["acknowledged"], got["counted"], got["failed"], got["round_counts"]["messages"]) == (5, 5, 0, 5)
    assert got["elapsed_seconds"] < 10


def test_a_series_round_and_the_refusals_that_need_a_server(server: str) -> None:
    url = server
    admin = AdminClient(url, ADMIN)
    sid = admin.create_series("blender", {"epsilon": 8, "head_list_size": 10}, period_seconds=3600, periods=2)["id"]
    text = run("simulate", "--series", sid, "--server", url, *POP, ok=2).stderr  # not opened yet
    assert f"series (--series) = '{sid}'" in text and f"hybriddp series advance {sid}" in text
    admin.advance_series(sid)
    got = json.loads(run("simulate", "--series", sid, "--server", url, *POP, "--optin-users", 20, "--json").stdout)
    rnd = admin.series(sid)["periods_table"][0]["round"]
    assert (got["series"], got["round"], got["acknowledged"]) == (sid, rnd["id"], 20)
    assert f"hybriddp series advance {sid} --step" in got["next"]

    text = run("simulate", "nosuchroundnosuchround", "--server", url, *POP, ok=2).stderr
    assert "round = 'nosuchroundnosuchround' is not allowed" in text and "hybriddp round list" in text
    text = run("simulate", "--series", "nosuchseriesnosuchser", "--server", url, ok=2).stderr
    assert "series (--series) = 'nosuchseriesnosuchser'" in text and "hybriddp series list" in text
    rid = new_round(url)
    text = run("simulate", rid, "--server", url, *POP, "--optin-users", 5000, ok=2).stderr  # more than the log has
    assert "opt-in users (--optin-users) = 5000 is not allowed" in text and "--scale" in text


@pytest.mark.parametrize(("args", "needle"), [
    (("R", "--optin-users", 0), "optin_users (--optin-users) = 0"),
    (("R", "--devices", -3), "devices (--devices) = -3"),
    (("R", "--rate", 0), "rate (--rate) = 0.0"),
    (("R", "--rate", "nan"), "rate (--rate) = nan"),
    (("R", "--duration", -1), "duration (--duration) = -1.0"),
    (("R", "--concurrency", 0), "concurrency (--concurrency) = 0"),
    (("R", "--scale", 0), "scale (--scale) = 0.0"),
    ((), "ROUND/--series = None"),
    (("R", "--series", "S"), "ROUND/--series = 'R'"),
    (("R", "--input", "x.csv", "--scale", 0.1), "--scale = 0.1"),
])
def test_bad_input_is_one_line_naming_the_field(args: tuple[Any, ...], needle: str) -> None:
    text = run("simulate", *args, "--server", "http://127.0.0.1:9", ok=2).stderr
    assert text.startswith("error: ") and needle in text and text.count("\n") == 1, text


def test_the_rate_limiter_spaces_tokens_whatever_the_threads() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)

    lim = RateLimiter(4.0, clock=lambda: now[0], sleep=sleep)
    assert [lim.acquire() for _ in range(5)] == [True] * 5
    assert slept == pytest.approx([0.25, 0.5, 0.75, 1.0])  # the k-th waits k/rate from the first
    assert lim.acquire(deadline=101.0) is False  # its token would come at 101.25
    now[0] = 200.0  # idle for long: still one token at a time, no burst
    assert lim.acquire() and lim.acquire() and slept[-1] == pytest.approx(0.25)


def test_users_are_disjoint_and_counts_follow_the_rules() -> None:
    seed = sample_seed("round-a", None)
    assert seed == sample_seed("round-a", None) != sample_seed("round-b", None) and sample_seed("x", 7) == 7
    optin, _ = pick_users(1000, seed, optin=300)
    _, devices = pick_users(1000, seed, devices=700, optin_taken=300)  # a later run of the same round
    assert len(set(optin.tolist()) | set(devices.tolist())) == 1000
    with pytest.raises(Exception, match=r"devices \(--devices\) = 701 is not allowed: it must be <= 700"):
        pick_users(1000, seed, devices=701, optin_taken=300)
    assert plan_count(40, 10.0, 2.0, 500) == 40 and plan_count(None, 10.0, 2.5, 500) == 25
    assert plan_count(None, None, 2.0, 500) == 500


def test_phases_and_failure_classes() -> None:
    from hybriddp.sdk import ConflictError, ServiceUnavailableError
    assert phase_of({"id": "r", "kind": "blender", "state": "collecting-optin"}) == "optin"
    assert phase_of({"id": "r", "kind": "blender", "state": "collecting-reports"}) == "devices"
    for state, hint in (("building-headlist", "in a moment"), ("headlist-empty", "round create"),
                        ("closed", "round results r")):
        with pytest.raises(Exception, match=hint):
            phase_of({"id": "r", "kind": "blender", "state": state})
    with pytest.raises(Exception, match="a BLENDER round"):
        phase_of({"id": "r", "kind": "mean", "state": "collecting-optin"})
    assert classify(ConflictError("x", status=409, code="too_few_tokens")) == ("refused", "HTTP 409 too_few_tokens")
    assert classify(ServiceUnavailableError("down")) == ("error", "unavailable")
    tally = Tally()
    tally.add(ValueError("boom"), 0.1)
    assert tally.errors == {"ValueError": 1} and tally.examples["ValueError"] == "boom" and tally.done == 1

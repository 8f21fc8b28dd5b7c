"""``experiment trends`` on a real log with times (``hybriddp.experiments.trends_real``; ALGORITHM.md §13).

A hand-made AOL-format file over four weeks whose per-week query counts are chosen here, so the truth is known
without the code under test: "beta" doubles in week 3, "gamma" halves in week 2, "alpha" stays. Checked: the truth
read from the log, the participation rotation (each user in the periods of one slot), the log without drift (each
user's records in one period), and the command end to end with its refusals.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybriddp.experiments.trends_real import RealLog

WEEK = 7 * 86_400
START = dt.datetime(2006, 3, 1, tzinfo=dt.timezone.utc)
# per week: how many users ask each query once (with a click), and the rest ask their own unique query
COUNTS = {"alpha": [40, 40, 40, 40], "beta": [20, 20, 40, 40], "gamma": [40, 20, 20, 20]}
OTHERS = 100  # per week


def _write_log(path: Path, weeks: tuple[int, ...] = (0, 1, 2, 3)) -> Path:
    rows = ["AnonID\tQuery\tQueryTime\tItemRank\tClickURL"]
    user = 0
    for week in weeks:
        at = (START + dt.timedelta(seconds=week * WEEK + 3600)).strftime("%Y-%m-%d %H:%M:%S")
        for query, counts in COUNTS.items():
            for _ in range(counts[week]):
                rows.append(f"{user % 150}\t{query}\t{at}\t1\thttp://{query}.example/")
                user += 1
        for i in range(OTHERS):
            rows.append(f"{user % 150}\tother {week} {i}\t{at}\t1\thttp://o.example/{i}")
            user += 1
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    return _write_log(tmp_path / "weeks.tsv")


def test_the_truth_is_the_logs_own_weekly_shares(log_file: Path) -> None:
    real = RealLog.load(str(log_file), periods=12, seconds=WEEK)
    assert real.n_periods == 4
    truth = real.truth(head_queries=3, truth_change=0.5, min_change=0.1, window=2)
    # beta: 20/200 → 40/220 (×1.82) in week 3; gamma: 40/220 → 20/180 (×0.61) in week 2
    assert truth.changes == {("beta", 2, "rising"), ("gamma", 1, "falling")}
    assert truth.confirms(("beta", 2, "rising")) and truth.confirms(("beta", 3, "rising"))  # within window − 1
    assert not truth.confirms(("beta", 2, "falling"))
    # alpha: 40/200 → 40/180 (+11%, over the test's 10%) → 40/200 → 40/200; shares, not counts, are the popularity
    assert truth.confirms(("alpha", 1, "rising")) and not truth.confirms(("alpha", 3, "rising"))
    assert not truth.confirms(("no such query", 1, "rising"))


def test_a_week_without_records_counts_no_change_around_it(tmp_path: Path) -> None:
    real = RealLog.load(str(_write_log(tmp_path / "gap.tsv", weeks=(0, 1, 3))), periods=12, seconds=WEEK)
    assert [p.n_records for p in real.logs][2] == 0
    truth = real.truth(head_queries=3, truth_change=0.5, min_change=0.1, window=2)
    assert truth.changes == {("gamma", 1, "falling")}  # not every query "falling" into week 3 and "rising" out
    assert not truth.confirms(("beta", 3, "rising")) and not truth.confirms(("alpha", 2, "falling"))


def test_an_unchanged_share_is_no_change_even_for_a_test_of_any_change(log_file: Path) -> None:
    real = RealLog.load(str(log_file), periods=12, seconds=WEEK)
    truth = real.truth(head_queries=3, truth_change=0.5, min_change=0.0, window=1)
    # alpha: 40/200 in weeks 3 and 4
    assert not truth.confirms(("alpha", 3, "rising")) and not truth.confirms(("alpha", 3, "falling"))
    assert truth.confirms(("alpha", 2, "falling"))  # 40/180 → 40/200


def _where(logs: list[Any], label: Any) -> dict[str, set[int]]:
    """User key → the labels (``label(t)``) of the periods in which the user has records."""
    out: dict[str, set[int]] = {}
    for t, part in enumerate(logs):
        for key in part.user_keys(np.arange(part.n_users)):
            out.setdefault(key, set()).add(label(t))
    return out


def test_participation_puts_each_user_in_the_periods_of_one_slot(log_file: Path) -> None:
    real = RealLog.load(str(log_file), periods=12, seconds=WEEK)
    logs = real.periods(2, drifting=True, seed=7)
    assert all(len(slots) == 1 for slots in _where(logs, lambda t: t % 2).values())
    assert 0 < sum(p.n_records for p in logs) < sum(p.n_records for p in real.logs)
    assert real.periods(1, drifting=True, seed=7) == real.logs


def test_without_drift_every_user_sits_in_one_random_period(log_file: Path) -> None:
    real = RealLog.load(str(log_file), periods=12, seconds=WEEK)
    logs = real.periods(1, drifting=False, seed=3)
    assert all(len(h) == 1 for h in _where(logs, lambda t: t).values())
    assert sum(p.n_records for p in logs) == real.log.n_records


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hybriddp", *args], capture_output=True, text=True, timeout=300)


def test_the_command_runs_on_a_log_file_and_refuses_bad_input(log_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _cli("experiment", "trends", "--dataset", str(log_file), "--participation", "1,2", "--trials", "1",
                "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "Log weeks.tsv, its first 4 periods of 7 day(s)" in report and "| 1/2 |" in report
    assert (out / "trends.csv").read_text().count("\n") == 5  # header + (1, 2) × (drift, no drift)

    bad = tmp_path / "bad.tsv"
    bad.write_text("AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n1\tq\tyesterday\t1\thttp://a.example/\n")
    for args, needle in (((str(bad),), "QueryTime"), ((str(tmp_path / "missing.tsv"),), "--dataset"),
                         (("aol", "--period", "7d"), "--period")):
        refused = _cli("experiment", "trends", "--dataset", *args, "--out", str(tmp_path / "x"))
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert needle in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not (tmp_path / "x").exists()

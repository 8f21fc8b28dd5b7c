"""Synthetic logs whose popularity drifts over periods (hybriddp.datasets.drift): the plan's truth, and the sampler
against it (a chi-square test of every period's first records, which are independent draws of the query law)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from hybriddp.core.errors import ParameterError
from hybriddp.datasets.drift import drift_logs, plan_drift
from hybriddp.datasets.generator import generate
from hybriddp.datasets.presets import get_preset


def test_the_plan_changes_exactly_the_chosen_queries() -> None:
    d = plan_drift("aol", 12, n_rising=6, n_falling=5, change=2.0, seed=7)
    assert d.periods == 12 and len(d.rising) == 6 and len(d.falling) == 5
    chosen = [q for q, _ in d.rising + d.falling]
    assert len(set(chosen)) == 11 and all(5 <= q < 60 for q in chosen)
    changes = d.changes(at_least=1.5)
    assert changes["rising"] == set(d.rising) and changes["falling"] == set(d.falling)
    p = d.head_probabilities()
    head = get_preset("aol").head_probabilities
    assert np.allclose(p.sum(axis=1), head.sum())  # the head keeps its mass
    for q, t in d.rising:  # a step: ×2 at t (up to the head's rescaling), flat elsewhere
        assert p[t, q] / p[t - 1, q] == pytest.approx(2.0, rel=0.05)
    unchanged = np.setdiff1d(np.arange(head.size), chosen)
    assert np.abs(p[1:, unchanged] / p[:-1, unchanged] - 1).max() < 0.05


def test_every_period_draws_from_its_own_law() -> None:
    """First records of users are independent draws of the query law: chi-square over the 60 first head queries
    and the rest, per period, against the plan's probabilities (p > 1e-6 each)."""
    d = plan_drift("aol", 4, n_rising=4, n_falling=4, change=2.5, seed=3)
    logs = drift_logs(d, scale=0.05, seed=4)
    p = d.head_probabilities()
    for t, log in enumerate(logs):
        first = log.query[log.user_offsets[:-1]]
        counts = np.bincount(np.minimum(first, 60), minlength=61)
        expected = np.append(p[t, :60], 1.0 - p[t, :60].sum()) * first.size
        assert stats.chisquare(counts, expected).pvalue > 1e-6, t


def test_no_weights_is_the_preset_and_bad_weights_are_refused() -> None:
    a, b = generate("aol", seed=5, scale=0.002), generate("aol", seed=5, scale=0.002,
                                                          head_weights=np.ones(get_preset("aol").head_probabilities.size))
    assert np.array_equal(a.query, b.query) and np.array_equal(a.url, b.url)
    with pytest.raises(ParameterError, match="head_weights"):
        generate("aol", seed=5, scale=0.002, head_weights=np.ones(3))
    for kw, needle in (({"periods": 1}, "periods"), ({"ranks": (5, 99999)}, "ranks"),
                       ({"n_rising": 40, "n_falling": 40}, "n_rising"), ({"change": 1.0}, "change")):
        with pytest.raises(ParameterError, match=needle):
            plan_drift("aol", **{"periods": 4, **kw})


# ----- a log with times: synth --periods, load_aol(times=True), split_periods ---------------------------------------
def test_synth_periods_writes_one_log_per_period_with_its_times_and_the_truth(tmp_path) -> None:
    import json

    from click.testing import CliRunner

    from hybriddp.cli import cli
    from hybriddp.core.periods import DAY, split_periods
    from hybriddp.io.aol import load_aol
    out = tmp_path / "drift"
    r = CliRunner().invoke(cli, ["synth", "--scale", "0.004", "--seed", "5", "--periods", "3", "--period-days", "2",
                                 "--rising", "2", "--falling", "1", "--output", str(out)])
    assert r.exit_code == 0, r.output + r.stderr
    truth = json.loads((out / "drift.json").read_text())
    assert [f["file"] for f in truth["files"]] == ["period-01.tsv", "period-02.tsv", "period-03.tsv"]
    assert len(truth["rising"]) == 2 and len(truth["falling"]) == 1
    assert all(2 <= c["period"] <= 3 for c in truth["rising"] + truth["falling"])
    logs = [load_aol(out / f["file"], times=True) for f in truth["files"]]
    start = truth["files"][0]["start"]
    for t, log in enumerate(logs):  # every QueryTime inside its period
        assert log.n_records == truth["files"][t]["records"]
        assert start + t * 2 * DAY <= log.times.min() and log.times.max() < start + (t + 1) * 2 * DAY
    # one log of all three periods' rows, split back by time
    both = out / "all.tsv"
    lines = [p.read_text().rstrip("\n").split("\n") for p in sorted(out.glob("period-*.tsv"))]
    users_seen = 0
    rows = [lines[0][0]]
    for part in lines:  # AnonIDs renumbered so that the periods' users stay apart
        ids = [int(line.split("\t", 1)[0]) for line in part[1:]]
        rows += [f"{i + users_seen}\t{line.split(chr(9), 1)[1]}" for i, line in zip(ids, part[1:], strict=True)]
        users_seen += max(ids) + 1
    both.write_text("\n".join(rows) + "\n")
    split = split_periods(load_aol(both, times=True), 2 * DAY, start=start)
    assert [label for label, _ in split] == ["2006-03-01", "2006-03-03", "2006-03-05"]
    for (_, part), log in zip(split, logs, strict=True):
        assert part.n_records == log.n_records and part.n_users == log.n_users
        assert sorted(part.queries.decode(part.query)) == sorted(log.queries.decode(log.query))
    r = CliRunner().invoke(cli, ["synth", "--scale", "0.004", "--periods", "3", "--output", str(out)])
    assert r.exit_code != 0 and "new directory" in r.output + r.stderr  # nothing overwritten
    assert (out / "drift.json").read_text() == json.dumps(truth, indent=2)


def test_a_time_that_does_not_parse_is_a_bad_row(tmp_path) -> None:
    from hybriddp.core.errors import DataError
    from hybriddp.io.aol import AOL_HEADER, load_aol
    p = tmp_path / "t.tsv"
    p.write_text(AOL_HEADER + "\n1\tq\t2006-03-01 10:00:00\t1\thttp://a\n2\tr\tyesterday\t1\thttp://b\n")
    assert load_aol(p).n_records == 2  # times not asked for: not read
    with pytest.raises(DataError, match="QueryTime 'yesterday'"):
        load_aol(p, times=True)
    log = load_aol(p, times=True, skip_bad_rows=True)
    assert log.n_records == 1 and log.times.tolist() == [1141207200]

"""Trends across rounds (hybriddp.server.trends, ALGORITHM.md §13): the test's false discoveries and power by Monte
Carlo, Benjamini–Hochberg against scipy's, results documents of real runs, and the command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from hybriddp.cli import cli
from hybriddp.core.errors import DataError, ParameterError
from hybriddp.server.trends import PeriodEstimates, benjamini_hochberg, trend_document, trends

TAIL = 1e-6  # p-value threshold of the Monte Carlo checks: a correct implementation fails once in a million runs


def test_benjamini_hochberg_matches_scipy() -> None:
    rng = np.random.default_rng(1)
    for m in (1, 2, 7, 50, 400):
        for level in (0.01, 0.05, 0.2):
            p = np.concatenate([rng.uniform(size=m // 2), rng.uniform(0, 1e-3, size=m - m // 2)])
            assert np.array_equal(benjamini_hochberg(p, level), stats.false_discovery_control(p, method="bh") <= level)
    assert benjamini_hochberg(np.array([]), 0.05).size == 0


def _periods(p: np.ndarray, var: np.ndarray, rng: np.random.Generator) -> list[PeriodEstimates]:
    """Periods with estimates N(p[t, q], var[t, q]) of queries q0, q1, ... (the published variances are exact)."""
    names = [f"q{i}" for i in range(p.shape[1])]
    return [PeriodEstimates(f"w{t}", names, p[t] + rng.normal(size=p.shape[1]) * np.sqrt(var[t]), var[t].copy())
            for t in range(p.shape[0])]


def _binomial_upper(n: int, rate: float) -> int:
    """The largest count of a Binomial(n, rate) that is not improbable beyond TAIL."""
    return int(stats.binom.isf(TAIL, n, rate))


def test_no_drift_gives_no_trend_beyond_the_controlled_rate() -> None:
    """12 periods, 30 queries, no change: every reported trend is false, so P(any) ≤ FDR (BH under the global null
    controls the family-wise rate at the level)."""
    rng = np.random.default_rng(2)
    runs, fdr, any_found = 600, 0.05, 0
    p = np.tile(np.linspace(0.002, 0.05, 30), (12, 1))
    var = (0.1 * p) ** 2
    for _ in range(runs):
        found = trends(_periods(p, var, rng), fdr=fdr)
        any_found += bool(found.rising.any() or found.falling.any())
    assert any_found <= _binomial_upper(runs, fdr), any_found


def test_changes_are_found_and_false_discoveries_controlled() -> None:
    """Half the queries double (or halve) between two periods: recall is high and the false discovery proportion,
    averaged over runs, is at most the level."""
    rng = np.random.default_rng(3)
    runs, fdr = 300, 0.1
    base = np.linspace(0.005, 0.05, 40)
    p = np.tile(base, (3, 1))
    p[2, :10] *= 2.0  # rising 1 → 2
    p[2, 10:20] /= 2.0  # falling 1 → 2
    var = (0.08 * p) ** 2
    fdp, recall = [], []
    for _ in range(runs):
        found = trends(_periods(p, var, rng), fdr=fdr)
        truth = {(f"q{i}", 2, "rising") for i in range(10)} | {(f"q{i}", 2, "falling") for i in range(10, 20)}
        got = {(q, int(t), "rising") for q, t, r in zip(found.query, found.period, found.rising, strict=True) if r}
        got |= {(q, int(t), "falling") for q, t, f in zip(found.query, found.period, found.falling, strict=True) if f}
        fdp.append(len(got - truth) / max(len(got), 1))
        recall.append(len(got & truth) / len(truth))
    # E[FDP] ≤ fdr·(true nulls / all tests) ≤ fdr; the mean of 300 proportions is within 4.9 standard errors
    assert np.mean(fdp) <= fdr + 4.9 * np.std(fdp) / math.sqrt(runs)
    assert np.mean(recall) >= 0.99


def test_min_change_tests_against_the_boundary() -> None:
    """With --min-change 0.5, a query that rose by exactly 50% is a true null (reported at most at the level), one
    that tripled is found; the boundary statistic is standard normal there (mean 0, variance 1)."""
    rng = np.random.default_rng(4)
    runs, fdr = 2000, 0.05
    p = np.array([[0.02, 0.02], [0.03, 0.06]])  # q0: ×1.5 (the boundary), q1: ×3
    var = (0.05 * p) ** 2
    z, boundary_found, strong_found = [], 0, 0
    for _ in range(runs):
        found = trends(_periods(p, var, rng), fdr=fdr, min_change=0.5)
        i0 = found.query.index("q0")
        z.append(found.z_rising[i0])
        boundary_found += bool(found.rising[i0])
        strong_found += bool(found.rising[found.query.index("q1")])
    z_arr = np.array(z)
    assert abs(z_arr.mean()) < 5 * 1 / math.sqrt(runs)
    chi = (runs - 1) * z_arr.var(ddof=1)  # ~ chi-square(runs - 1) for variance 1
    assert stats.chi2.sf(chi, runs - 1) > TAIL and stats.chi2.cdf(chi, runs - 1) > TAIL
    assert boundary_found <= _binomial_upper(runs, fdr)
    assert strong_found == runs


def test_queries_listed_in_one_period_only_are_not_tested() -> None:
    a = PeriodEstimates("a", ["x", "y"], np.array([0.1, 0.2]), np.array([1e-6, 1e-6]))
    b = PeriodEstimates("b", ["y", "z"], np.array([0.4, 0.3]), np.array([1e-6, 1e-6]))
    found = trends([a, b])
    assert found.query == ["y"] and found.rising.tolist() == [True]
    assert found.rows()[0] | {"z_rising": 0, "z_falling": 0} == {
        "query": "y", "from": "a", "to": "b", "p_before": 0.2, "p_after": 0.4, "change": 1.0, "z_rising": 0,
        "z_falling": 0, "trend": "rising"}
    assert found.series([a, b], "x") == [(0.1, 1e-6), None]


def test_bad_inputs_are_refused_by_name() -> None:
    a = PeriodEstimates("a", ["x"], np.array([0.1]), np.array([1e-6]))
    with pytest.raises(DataError, match="at least two periods"):
        trends([a])
    with pytest.raises(ParameterError, match="--fdr"):
        trends([a, a], fdr=1.0)
    with pytest.raises(ParameterError, match="--min-change"):
        trends([a, a], min_change=-0.1)
    for doc, needle in (({}, "not a BLENDER result"), ({"queries": [{"query": "x", "p_estimate": 0.1}]}, "baseline"),
                        ({"queries": [{"query": "x", "p_blended": "a", "var_blended": 1}]}, "not a number")):
        with pytest.raises(DataError, match=needle):
            PeriodEstimates.from_result(doc, "p0")


# ----- real results and the command ----------------------------------------------------------------
@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three periods of `hybriddp run` on synthetic logs whose query 'weather' is boosted in the third."""
    d = tmp_path_factory.mktemp("trends")
    runner = CliRunner()
    out = []
    for t in range(3):
        log = d / f"w{t}.csv"
        rows = ["user,query,url"]
        rng = np.random.default_rng(10 + t)
        weights = np.array([6.0, 5.0, 4.0, 3.0, 2.0]) * (np.array([1.0, 1, 1, 1, 4.0]) if t == 2 else 1.0)
        names = ["news", "maps", "mail", "shop", "weather"]
        for user in range(20000):
            q = names[rng.choice(5, p=weights / weights.sum())]
            rows.append(f"u{user},{q},https://{q}.example/")
        log.write_text("\n".join(rows) + "\n")
        res = d / f"w{t}.json"
        r = runner.invoke(cli, ["run", "--input", str(log), "--epsilon", "4", "-M", "10", "--seed", str(t),
                                "--output", str(res)])
        assert r.exit_code == 0, r.output + r.stderr
        out.append(res)
    return out


def test_trends_of_real_results(results: list[Path]) -> None:
    periods = [PeriodEstimates.from_result(json.loads(p.read_text()), p.stem) for p in results]
    found = trends(periods, min_change=0.5)
    verdicts = {(r["query"], r["to"]): r["trend"] for r in found.rows()}
    assert verdicts[("weather", "w2")] == "rising"
    # nothing changed by 50% from w0 to w1 (the estimates the opt-in anchor moved carry the bound's cost in var)
    assert [k for k, v in verdicts.items() if v != "steady" and k[1] == "w1"] == []


def test_trends_command(results: list[Path], tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["trends", *map(str, results), "--min-change", "0.5"]
    r = runner.invoke(cli, args)
    assert r.exit_code == 0, r.output + r.stderr
    assert "weather" in r.output and "rising" in r.output
    r = runner.invoke(cli, [*args, "--json"])
    doc = json.loads(r.output)
    assert doc["periods"] == ["w0", "w1", "w2"] and doc["rising"] >= 1
    for name in ("t.csv", "t.json", "t.parquet"):
        assert runner.invoke(cli, [*args, "--output", str(tmp_path / name)]).exit_code == 0
        assert (tmp_path / name).stat().st_size > 0
    assert "weather" in (tmp_path / "t.csv").read_text()
    assert runner.invoke(cli, [*args, "--plot", str(tmp_path / "t.png")]).exit_code == 0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    for bad, needle in (([str(results[0])], "at least two"), ([*map(str, results), "--fdr", "2"], "--fdr"),
                        ([str(tmp_path / "missing.json"), str(results[0])], "not found"),
                        ([*map(str, results), "--output", str(tmp_path / "x.txt")], "--output")):
        r = runner.invoke(cli, ["trends", *bad])
        assert r.exit_code != 0 and "Traceback" not in r.output + r.stderr and needle in r.output + r.stderr, (
            bad, r.output, r.stderr)


def test_the_test_reads_the_published_variance_as_it_is() -> None:
    """var_blended is already the published estimate's mean squared error, the anchor's bound included (ALGORITHM.md
    §7.2): what the anchor moved an estimate by (p_blended − p_undefended) is not added to it again."""
    doc = {"queries": [{"query": "a", "p_blended": 0.05, "var_blended": 1e-6, "p_undefended": 0.09,
                        "var_optin_sum": 9e-6, "clamped": True},
                       {"query": "b", "p_blended": 0.2, "var_blended": 4e-6, "p_undefended": 0.2},
                       {"query": "*", "p_blended": 0.01, "var_blended": 1e-6}]}
    pe = PeriodEstimates.from_result(doc, "w")
    assert pe.queries == ["a", "b"]
    assert pe.var.tolist() == [1e-6, 4e-6]


def test_trends_of_real_results_use_their_calibrated_variances(results: list[Path]) -> None:
    """Real `hybriddp run` documents under the default defense, one with a query the anchor's bound moved: the
    trend test's variances, and the charts' standard deviations, are the published var_blended, nothing else."""
    docs = [json.loads(p.read_text()) for p in results]
    moved = [(d["queries"][i]["query"], p.stem) for d, p in zip(docs, results, strict=True)
             for i in range(len(d["queries"])) if d["queries"][i]["query"] != "*"
             and d["queries"][i]["p_blended"] != d["queries"][i]["p_undefended"]]
    assert moved, "no query moved by the anchor: the check below would not tell"
    periods = [PeriodEstimates.from_result(d, p.stem) for d, p in zip(docs, results, strict=True)]
    for d, pe in zip(docs, periods, strict=True):
        published = {r["query"]: r["var_blended"] for r in d["queries"] if r["query"] != "*"}
        assert dict(zip(pe.queries, pe.var.tolist(), strict=True)) == published
    doc = trend_document(periods, trends(periods, min_change=0.5))
    for q, points in doc["series"].items():
        for pe, point in zip(periods, points, strict=True):
            if point is not None:
                assert point[1] == math.sqrt(float(pe.var[pe.queries.index(q)]))


def test_experiment_trends_quick(tmp_path: Path) -> None:
    """The experiment end to end on a tiny drifting log: its files, a verdict per policy, and ε per person by basic
    composition over the rounds a user takes part in."""
    import csv
    runner = CliRunner()
    out = tmp_path / "tr"
    r = runner.invoke(cli, ["experiment", "trends", "--dataset", "aol", "--quick", "--trials", "1",
                            "--participation", "1,3", "--out", str(out)])
    assert r.exit_code == 0, r.output + r.stderr
    assert {p.name for p in out.iterdir()} == {"periods.csv", "trends.csv", "summary.csv", "trends.png", "report.md"}
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert [(s["participation"], s["rounds_per_user"], s["epsilon_basic"]) for s in summary] == [
        ("1", "3", "12.0"), ("3", "1", "4.0")]
    periods = list(csv.DictReader((out / "periods.csv").open()))
    assert len(periods) == 2 * 2 * 3  # policies × (drift, none) × periods
    users = {(p["participation"], p["drift"]): int(p["users"]) for p in periods}
    assert users[("3", "True")] < users[("1", "True")] / 2  # a third of the population per period
    report = (out / "report.md").read_text()
    assert "| 1/3 |" in report and "basic composition" in report
    for bad, needle in ((["--dataset", "x.tsv"], "--dataset"), (["--dataset", "aol", "--participation", "0"],
                                                               "--participation"),
                        (["--dataset", "aol", "--participation", "a"], "--participation")):
        r = runner.invoke(cli, ["experiment", "trends", *bad, "--quick", "--out", str(tmp_path / "bad")])
        assert r.exit_code != 0 and needle in r.output + r.stderr and "Traceback" not in r.output + r.stderr
    r = runner.invoke(cli, ["experiment", "fig9", "--dataset", "aol", "--periods", "3"])
    assert r.exit_code != 0 and "--periods" in r.output + r.stderr


def test_pooling_periods_finds_lasting_changes_the_pairs_miss_and_keeps_the_error_rate() -> None:
    """12 periods; 20 of 40 queries step ×1.6 at period 6 and stay there. Pairwise tests find few of them, pooling
    3 periods a side finds nearly all (located within 2 periods); without drift, pooled tests (overlapping, so
    positively dependent: BH still holds) report a trend in at most the level's share of runs."""
    rng = np.random.default_rng(6)
    base = np.linspace(0.01, 0.03, 40)
    p = np.tile(base, (12, 1))
    p[6:, :20] *= 1.6
    var = (0.12 * p) ** 2
    recall = {1: [], 3: []}
    for _ in range(60):
        periods = _periods(p, var, rng)
        for w in (1, 3):
            found = trends(periods, fdr=0.05, window=w)
            hit = {q for q, t, r in zip(found.query, found.period, found.rising, strict=True) if r and abs(t - 6) < w}
            recall[w].append(len(hit & {f"q{i}" for i in range(20)}) / 20)
    assert np.mean(recall[1]) < 0.6 and np.mean(recall[3]) > 0.95
    runs, any_found = 400, 0
    flat = np.tile(base, (12, 1))
    for _ in range(runs):
        found = trends(_periods(flat, (0.12 * flat) ** 2, rng), fdr=0.05, window=3)
        any_found += bool(found.rising.any() or found.falling.any())
    assert any_found <= _binomial_upper(runs, 0.05)
    with pytest.raises(ParameterError, match="--window"):
        trends(periods, window=0)

"""The attacks of ``hybriddp experiment poisoning`` and the experiment itself (ALGORITHM.md §7.2): each attack sends
what it says, the oracle that knows the bound reaches it and never passes it, the experiment measures the undefended
blend falling to an attack that the defended one resists, and its outputs carry a verdict per claim of issues 28 and
40."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from hybriddp.core.headlist import HeadList
from hybriddp.core.params import BlenderParams
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.experiments.poisoning import (
    PoisoningConfig,
    honest_cost,
    oracle_attack,
    poisoning_rows,
    shifts,
    summarize,
)
from hybriddp.experiments.poisoning_report import (
    issue40_verdicts,
    rate_verdict,
    upper_bound,
    verdict_text,
    verdicts,
    write_outputs,
)
from hybriddp.server.anchor import AnchorPolicy
from hybriddp.server.party import server_side
from hybriddp.simulation.attacks import fake_counts, target_of
from hybriddp.simulation.evaluate import ground_truth, truth_vectors
from hybriddp.simulation.pipeline import run_blender
from logdata import zipf_log


def small_list() -> tuple[HeadList, LocalAlgParams]:
    hl = HeadList.from_lists([0, 1, 2], [[1, 2], [3], [4, 5, 6]])
    return hl, LocalAlgParams.build(hl, 4.0, 1e-5, 0.85, 1)


def test_each_attack_sends_what_it_says() -> None:
    hl, lp = small_list()
    p = np.linspace(1.0, 2.0, hl.n_entries)
    target = target_of(hl, 2, p)
    assert target.top_entry == target.entries[np.argmax(p[target.entries])]
    rng = np.random.default_rng(0)
    direct = fake_counts("direct", 500, target, hl, lp, rng)
    assert direct.sum() == 500 and direct[target.top_entry] == 500
    spread = fake_counts("spread", 501, target, hl, lp, rng)
    assert spread.sum() == 501 and set(np.flatnonzero(spread)) == set(target.entries)
    assert spread[target.entries].max() - spread[target.entries].min() <= 1
    capped = fake_counts("adaptive", 300, target, hl, lp, rng, adaptive_budget=lambda d: 10**9)
    assert capped.sum() == 300 and set(np.flatnonzero(capped)) <= set(target.entries)
    assert fake_counts("adaptive", 300, target, hl, lp, rng, adaptive_budget=lambda d: 42).sum() == 42
    with pytest.raises(ValueError, match="unknown attack"):
        fake_counts("bribe", 3, target, hl, lp, rng)
    with pytest.raises(ValueError, match="needs oracle"):
        fake_counts("oracle", 3, target, hl, lp, rng)


def test_the_oracle_reaches_the_bound_and_never_passes_it() -> None:
    """The attacker that knows the bound (ALGORITHM.md §7.2, "The bound"): on a round of a small synthetic log
    (2,000 opt-in users), for two targets of true rank 14 and 20 it sends the fewest fakes (3% fewer do not do it)
    that put the target query's published estimate at p̂_O + κ_i·s_i and its ranking score at p̂_O + min(κ_i, κ_q)·s,
    and the check flags nothing. Five times as many fakes move the undefended blend past twice the bound and the
    defended estimate, and every other entry's, not past it; the bound itself is at most z*·σ_O at the test's point."""
    log = zipf_log(n_users=40_000, n_queries=120, urls_per_query=3, seed=2)
    run = run_blender(log, BlenderParams(epsilon=4.0, head_list_size=40), seed=1)
    policy = AnchorPolicy()
    truth, _ = ground_truth(run.log, (run.curator.sampled_s, run.curator.sampled_t, run.sampled_c))
    tq, tr = truth_vectors(run.head_list, truth)
    order = np.argsort(-tq, kind="stable")
    cap = round(0.1 * run.client.n)

    def publish(counts: np.ndarray) -> Any:
        return server_side(run.release, run.report_counts + counts, run.params.project, run.params.estimator, policy)
    honest = publish(np.zeros(run.head_list.n_entries, dtype=np.int64)).check
    optin = run.release.optin
    a_q = np.clip(np.nan_to_num(optin.p_query), 0.0, 1.0)
    x_q = np.clip(a_q + np.sqrt(optin.variances_at(np.clip(np.nan_to_num(optin.p_record), 0, 1), a_q)[1]), 0, 1)
    sd_o = np.sqrt(optin.variances_at(np.zeros(run.head_list.n_entries), x_q)[1])
    for rank in (14, 20):
        target = target_of(run.head_list, int(order[rank - 1]), tr)
        oracle = oracle_attack(run, target, policy, cap)
        sent = fake_counts("oracle", cap, target, run.head_list, run.lp, np.random.default_rng(0), oracle=oracle)
        f = oracle.plan()
        assert 0 < sent.sum() == f < cap and set(np.flatnonzero(sent)) <= set(target.entries)
        assert fake_counts("oracle", f // 2, target, run.head_list, run.lp, np.random.default_rng(0),
                           oracle=oracle).sum() == f // 2
        out = publish(sent)
        sh = shifts(out.check, out.blended.queries_ranking, target.query, honest)
        assert not out.check.flagged_any
        assert 0.97 <= sh["shift"] <= 1 + 1e-9 and 0.97 <= sh["rank_reach"] <= 1 + 1e-9, (rank, sh)
        assert sh["max_shift_all"] <= 1 + 1e-9
        assert not oracle.seen(int(0.97 * f)).at_caps  # the fewest fakes that do it, within 3%
        assert out.check.queries.bound[target.query] <= out.check.critical_z * sd_o[target.query]
        more = publish(oracle.counts(5 * f))
        sh = shifts(more.check, more.blended.queries_ranking, target.query, honest)
        assert sh["shift_undefended"] >= 2.0 and sh["shift"] <= 1 + 1e-9 and sh["max_shift_all"] <= 1 + 1e-9
        assert sh["rank_excess"] <= 1e-9 and sh["rank_shift"] <= sh["kappa_rank"] + 1e-9


def test_the_randomizer_attack_follows_localalgs_report_law() -> None:
    """200,000 fakes that hold the target record: their reports are multinomial with the target's row of LocalAlg's
    exact report distribution (chi-square, p > 1e-6)."""
    hl, lp = small_list()
    target = target_of(hl, 0, np.ones(hl.n_entries))
    n = 200_000
    counts = fake_counts("randomizer", n, target, hl, lp, np.random.default_rng(3))
    expected = n * output_distribution(lp)[target.top_entry]
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    df = hl.n_entries - 1
    # Wilson–Hilferty: the chi-square quantile at 1 − 1e-6 (z = 4.753) for df degrees of freedom
    limit = df * (1 - 2 / (9 * df) + 4.753 * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < limit


def test_upper_bound_is_clopper_pearson() -> None:
    # with no success the bound solves (1 − b)^n = 0.05
    for n in (10, 40, 200):
        assert upper_bound(0, n) == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-6)
    # and in general P[Binomial(n, b) ≤ k] = 0.05
    b = upper_bound(3, 40)
    assert sum(math.comb(40, i) * b**i * (1 - b) ** (40 - i) for i in range(4)) == pytest.approx(0.05, rel=1e-6)
    assert upper_bound(5, 5) == 1.0


def test_a_rate_holds_only_when_its_upper_bound_meets_the_target() -> None:
    """0 successes in 4 trials is within a 5% target, but its 95% upper bound is 1 − 0.05^(1/4) = 52.7%: not enough
    trials, not "holds". 0 of 59 is the fewest that can show ≤ 5% (1 − 0.05^(1/59) = 4.95%, of 58: 5.03%); a
    measured rate above the target does not hold however few the trials."""
    assert rate_verdict(0, 4, 0.05) == {"holds": False, "verdict": "not enough trials"}
    assert rate_verdict(0, 58, 0.05)["verdict"] == "not enough trials"
    assert rate_verdict(0, 59, 0.05) == {"holds": True, "verdict": "holds"}
    assert rate_verdict(1, 4, 0.05) == {"holds": False, "verdict": "does not hold"}
    assert rate_verdict(3, 78, 0.05)["verdict"] == "not enough trials"  # 3.8%, upper bound 9.6%
    assert verdict_text({"holds": True, "reference": True}) == "reference"
    assert verdict_text({"holds": False, "verdict": "not enough trials"}) == "not enough trials"


def test_the_experiment_measures_the_defense_and_writes_its_verdicts(tmp_path) -> None:
    log = zipf_log(n_users=40_000, n_queries=120, urls_per_query=3, seed=2)
    params = BlenderParams(epsilon=4.0, head_list_size=40)
    config = PoisoningConfig(trials=3, attacks=("direct", "randomizer"), fractions=(0.05,), ranks=(11, 30))
    rows = list(poisoning_rows(log, params, config))
    by = {(s["attack"], s["defended"]): s for s in summarize(rows)}
    assert by[("direct", False)]["success_rate"] == 1.0  # 5% fakes reporting the target put it in the top 10
    # flagged, and held at κ_q·s from its opt-in estimate (2,000 opt-in users: that is not always outside the top 10)
    assert by[("direct", True)]["success_rate"] < 1.0 and by[("direct", True)]["detection_rate"] == 1.0
    assert by[("direct", True)]["mean_target_rank"] > by[("direct", False)]["mean_target_rank"]
    assert by[("direct", True)]["max_shift_all"] <= 1 + 1e-9 and by[("direct", True)]["max_rank_excess"] <= 1e-9
    assert by[("honest", True)]["trials"] == 3
    cost = honest_cost(3, seed=1, sizes=(1_000,))
    assert cost[0]["optin_users"] == 1_000 and cost[0]["rounds"] == 3 and cost[0]["rmse_ratio_records"] > 0
    paths = write_outputs(tmp_path, rows, {"dataset": "zipf", "trials": 3}, cost)
    assert [p.name for p in paths] == ["trials.csv", "summary.csv", "poisoning.png", "report.md", "honest_cost.csv"]
    assert all(p.stat().st_size > 0 for p in paths)
    text = (tmp_path / "report.md").read_text()
    assert "## Verdicts (issue 28)" in text and "output-manipulation" in text
    assert "## Verdicts (issue 40)" in text and "## The bound under attack" in text and "## Honest cost" in text
    assert any(v["claim"].startswith("false alarms") for v in verdicts(rows))
    checks40 = {v["claim"].split(":")[0]: v for v in issue40_verdicts(rows, cost)}
    assert checks40["direct"]["reference"]  # 2,000 opt-in users: the ≤ 5% target applies from 10,000
    assert checks40["the attacker's largest shift within the derived bound"]["holds"]
    assert "honest cost at 1,000 opt-in users" in checks40


def test_honest_trials_is_an_option_of_poisoning_only() -> None:
    from clihelpers import assert_clean_error, invoke

    assert_clean_error(invoke("experiment", "fig12", "--dataset", "aol", "--honest-trials", 5, ok=False),
                       "--honest-trials", "poisoning` only")
    assert_clean_error(invoke("experiment", "poisoning", "--dataset", "aol", "--honest-trials", 0, ok=False),
                       "--honest-trials")


def test_honest_cost_rounds_are_checked_before_any_work(tmp_path) -> None:
    from hybriddp.core.errors import ParameterError
    from hybriddp.experiments import DatasetSpec
    from hybriddp.experiments.poisoning_report import run_poisoning

    with pytest.raises(ParameterError, match=r"honest_cost_rounds\) = 1 .*0 \(no table\) or an integer >= 2"):
        run_poisoning(DatasetSpec(str(tmp_path / "absent.tsv")), trials=1, out_dir=tmp_path, honest_cost_rounds=1)

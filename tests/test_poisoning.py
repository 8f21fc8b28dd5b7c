"""The attacks of ``hybriddp experiment poisoning`` and the experiment itself (ALGORITHM.md §7.2): each attack sends
what it says, the experiment measures the undefended blend falling to an attack that the defended one resists, and
its outputs carry a verdict per claim."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybriddp.core.headlist import HeadList
from hybriddp.core.params import BlenderParams
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.experiments.poisoning import PoisoningConfig, poisoning_rows, summarize
from hybriddp.experiments.poisoning_report import upper_bound, verdicts, write_outputs
from hybriddp.simulation.attacks import fake_counts, target_of
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


def test_the_experiment_measures_the_defense_and_writes_its_verdicts(tmp_path) -> None:
    log = zipf_log(n_users=40_000, n_queries=120, urls_per_query=3, seed=2)
    params = BlenderParams(epsilon=4.0, head_list_size=40)
    config = PoisoningConfig(trials=3, attacks=("direct", "randomizer"), fractions=(0.05,), ranks=(11, 30))
    rows = list(poisoning_rows(log, params, config))
    by = {(s["attack"], s["defended"]): s for s in summarize(rows)}
    assert by[("direct", False)]["success_rate"] == 1.0  # 5% fakes reporting the target put it in the top 10
    assert by[("direct", True)]["success_rate"] == 0.0 and by[("direct", True)]["detection_rate"] == 1.0
    assert by[("direct", True)]["mean_target_rank"] > by[("direct", False)]["mean_target_rank"]
    assert by[("honest", True)]["trials"] == 3
    paths = write_outputs(tmp_path, rows, {"dataset": "zipf", "trials": 3})
    assert [p.name for p in paths] == ["trials.csv", "summary.csv", "poisoning.png", "report.md"]
    assert all(p.stat().st_size > 0 for p in paths)
    text = (tmp_path / "report.md").read_text()
    assert "## Verdicts" in text and "output-manipulation" in text
    assert any(v["claim"].startswith("false alarms") for v in verdicts(rows))


def test_honest_trials_is_an_option_of_poisoning_only() -> None:
    from clihelpers import assert_clean_error, invoke

    assert_clean_error(invoke("experiment", "fig12", "--dataset", "aol", "--honest-trials", 5, ok=False),
                       "--honest-trials", "poisoning` only")
    assert_clean_error(invoke("experiment", "poisoning", "--dataset", "aol", "--honest-trials", 0, ok=False),
                       "--honest-trials")

"""Hybrid mean estimation (ALGORITHM.md §11): the mechanisms (mean/mechanisms.py) and the device randomizer
(device/mean.py): formulas against Monte Carlo, w*, unknown σ²; with scripted noise, every scale, draw and field of
MeanEstimate against hand-computed fractions; the device's draw, clamp and density by hand; every refusal whole.

Monte Carlo tolerances: every check allows Z = 5 standard errors of the MSE estimate (the SE is
measured from the trials), so a correct formula fails with probability < 1e-6 per check, and
runs are seeded so they never flake; a formula off by more than ~10 SE is caught (shown below
with deliberately wrong formulas).
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import subprocess
import sys
from fractions import Fraction as F

import numpy as np
import pytest
from scipy import stats

from clihelpers import exact_message
from hybriddp import mean as hm
from hybriddp.core.errors import DataError, ParameterError
from hybriddp.device.localalg import UniformReplay
from hybriddp.device.mean import (
    NumericRandomizer,
    SeededSource,
    SystemSource,
    clamp,
    laplace,
    output_log_density,
    randomize_value,
)
from hybriddp.mean.inputs import ClampCount
from hybriddp.mean.mechanisms import FullLM, Hybrid, HybridUnknownVariance, MeanEstimate, OnlyTCM

Z = 5.0
GRID = list(itertools.product([0.01, 0.05, 0.2], [0.5, 1.0, 4.0], [100, 10_000]))  # (c, ε, n)
GRID_TRIALS = 20_000
UNKNOWN_VARIANCE_FACTOR = 1.5  # stated bound: MSE(Hybrid, unknown σ²) ≤ 1.5 × MSE_H(w*) on GRID (ρ = 0.2)


# ----- ALGORITHM.md §11 numbers ---------------------------------------------------------------------
def test_spec_numbers() -> None:
    """R ≈ 2.03 at c = 0.05, ε = 1, n ≈ 1.9e3, Δ = 1, σ² = 1/12; MSE_H = 4.903e-4 at n = 2000."""
    n = np.linspace(1000, 3000, 20_001)
    r = hm.improvement(n, 0.05, epsilon=1.0, sigma2=1 / 12)
    i = int(np.argmax(r))
    assert r[i] == pytest.approx(2.03, abs=0.005)
    assert 1850 <= n[i] <= 1950
    assert hm.mse_hybrid_optimal(2000, 0.05, epsilon=1.0, sigma2=1 / 12) == pytest.approx(4.903e-4, abs=5e-8)
    assert hm.optimal_weight(2000, 0.05, epsilon=1.0, sigma2=1 / 12) == pytest.approx(0.5148, abs=1e-4)
    # the peak is exactly where OnlyTCM overtakes FullLM: n× = 1920
    assert hm.crossover_n(0.05, epsilon=1.0, sigma2=1 / 12) == pytest.approx(1920.0)
    assert hm.improvement(1920.0, 0.05, epsilon=1.0, sigma2=1 / 12) == pytest.approx(r.max(), rel=1e-7)
    assert hm.mse_full_lm(1920.0, epsilon=1.0) == pytest.approx(hm.mse_only_tcm(1920.0, 0.05, epsilon=1.0,
                                                                                sigma2=1 / 12))
    assert hm.crossover_n(0.01, epsilon=1.0, sigma2=1 / 12) == math.inf  # σ²(1−c)/c ≥ 2Δ²/ε²: never


def test_spec_number_by_simulation() -> None:
    """ALGORITHM.md §11: MSE_H 4.903e-4 analytic vs 4.905e-4 simulated (ε = 1, c = 0.05, n = 2000, uniform)."""
    res = hm.simulate(2000, 0.05, 1.0, trials=100_000, seed=11)
    m = res.mse["mse_hybrid"]
    assert m.analytic == pytest.approx(4.903e-4, abs=5e-8)
    assert abs(m.simulated - m.analytic) <= Z * m.simulated_se
    assert m.simulated_se < 0.01 * m.analytic  # the check is tight: 5 SE < 5% of the value


def test_formula_identities() -> None:
    kw = {"epsilon": 1.3, "sigma2": 0.07, "width": 2.0}
    n, c = 777.0, 0.08
    a, b, s = hm.hybrid_terms(n, c, **kw)
    assert hm.mse_hybrid(1.0, n, c, **kw) == pytest.approx(hm.mse_only_tcm(n, c, **kw), rel=1e-12)  # w=1: OnlyTCM
    assert hm.mse_hybrid(0.0, n, c, **kw) == pytest.approx(b + c * c * s, rel=1e-12)
    assert a == pytest.approx(2 * 4 / (1.3**2 * (c * n) ** 2))
    assert hm.mse_full_lm(n, epsilon=1.3, width=2.0) == pytest.approx(2 * 4 / (1.3**2 * n))
    # R ≥ 1 once n_T = c·n ≥ 1: MSE_H(w*) ≤ MSE_H(c) ≤ MSE_F and MSE_H(w*) ≤ MSE_H(1) = MSE_T
    for c in (0.01, 0.05, 0.3, 0.9):
        grid = np.logspace(math.log10(max(1 / c, 1 / (1 - c))), 7, 500)
        for eps in (0.3, 1.0, 5.0):
            kw2 = {"epsilon": eps, "sigma2": 1 / 12}
            assert np.all(hm.mse_hybrid(c, grid, c, **kw2) <= hm.mse_full_lm(grid, epsilon=eps) * (1 + 1e-12))
            assert np.all(hm.improvement(grid, c, **kw2) >= 1 - 1e-12)
    # below one opt-in user the curator's "mean" is worse than a local report: R < 1 is possible
    assert hm.improvement(30.0, 0.01, epsilon=1.0, sigma2=1 / 12) < 1


@pytest.mark.parametrize("seed", range(6))
def test_w_star_minimizes_mse_h(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, c, eps = float(rng.integers(50, 100_000)), float(rng.uniform(0.01, 0.5)), float(rng.uniform(0.2, 8))
    width = float(rng.uniform(0.5, 10))
    kw = {"epsilon": eps, "sigma2": float(rng.uniform(0, width**2 / 4)), "width": width}
    w_star = hm.optimal_weight(n, c, **kw)
    assert 0.0 < w_star < 1.0
    w = np.linspace(-0.5, 1.5, 200_001)  # step 1e-5
    mse = hm.mse_hybrid(w, n, c, **kw)
    best = hm.mse_hybrid(w_star, n, c, **kw)
    assert best <= mse.min() * (1 + 1e-12)
    assert abs(w[np.argmin(mse)] - w_star) <= 1e-5
    # and with the split budget of the unknown-variance Hybrid
    w2 = hm.optimal_weight(n, c, optin_epsilon=0.8 * eps, **kw)
    assert hm.mse_hybrid(w2, n, c, optin_epsilon=0.8 * eps, **kw) <= hm.mse_hybrid(
        w, n, c, optin_epsilon=0.8 * eps, **kw).min() * (1 + 1e-12)


# ----- analytic vs Monte Carlo on the grid --------------------------------------------------
@pytest.fixture(scope="module")
def grid_results() -> dict[tuple[float, float, int], hm.SimulationResult]:
    return {(c, eps, n): hm.simulate(n, c, eps, trials=GRID_TRIALS, seed=100 + i)
            for i, (c, eps, n) in enumerate(GRID)}


@pytest.mark.parametrize("key", ["mse_full_lm", "mse_only_tcm", "mse_hybrid"])
def test_analytic_matches_monte_carlo_on_grid(grid_results, key: str) -> None:
    for point, res in grid_results.items():
        m = res.mse[key]
        assert abs(m.simulated - m.analytic) <= Z * m.simulated_se, (key, point, m)
        assert m.simulated_se <= 0.05 * m.analytic  # tolerance ≤ 25% of the value at worst


def test_deliberately_wrong_formulas_fail(grid_results) -> None:
    """MSE_T without its sampling term, and MSE_F without its factor 2, are rejected by the same test."""
    rejected_t = rejected_f = detectable = 0
    for (_c, eps, n), res in grid_results.items():
        m = res.mse["mse_only_tcm"]
        n_t = res.n_optin
        wrong = 2.0 / (eps**2 * n_t**2)  # noise only, sampling term σ²(1−c)/(cn) forgotten
        if m.analytic - wrong > 10 * m.simulated_se:  # the omitted term is visible at this point
            detectable += 1
            rejected_t += abs(m.simulated - wrong) > Z * m.simulated_se
        f = res.mse["mse_full_lm"]
        rejected_f += abs(f.simulated - 1.0 / (eps**2 * n)) > Z * f.simulated_se
    assert detectable >= 12  # most of the grid: wherever opt-in noise does not swamp sampling
    assert rejected_t == detectable
    assert rejected_f == len(GRID)


@pytest.mark.parametrize("dist,points", [
    ("bernoulli:0.3", [(0.01, 0.5, 100), (0.05, 1.0, 10_000), (0.2, 4.0, 10_000)]),
    ("beta:2,5", [(0.05, 1.0, 100), (0.2, 4.0, 1000)]),
])
def test_other_distributions(dist: str, points: list[tuple[float, float, int]]) -> None:
    for c, eps, n in points:
        res = hm.simulate(n, c, eps, distribution=dist, lower=-2.0, upper=3.0, trials=20_000, seed=7)
        assert res.sigma2 == pytest.approx(25 * hm.Distribution.parse(dist).variance)
        for key in ("mse_full_lm", "mse_only_tcm", "mse_hybrid"):
            m = res.mse[key]
            assert abs(m.simulated - m.analytic) <= Z * m.simulated_se, (dist, c, eps, n, key, m)


def test_uniform_bit_decomposition_is_exact() -> None:
    """Σ of m NumPy uniforms via 53 Binomial(m, 1/2) bit counts: same mean, variance and shape."""
    rng = np.random.default_rng(3)
    d = hm.Distribution.parse("uniform")
    s, _ = d.group_sums(rng, 3, 200_000, squares=False)
    direct = rng.random((200_000, 3)).sum(axis=1)
    assert abs(s.mean() - 1.5) < Z * math.sqrt(0.25 / 200_000)
    assert s.var() == pytest.approx(0.25, rel=0.02)
    assert stats.ks_2samp(s, direct).pvalue > 1e-6


def test_simulate_is_reproducible_and_validates() -> None:
    a = hm.simulate(500, 0.1, 1.0, trials=5000, seed=5)
    b = hm.simulate(500, 0.1, 1.0, trials=5000, seed=5)
    assert a.mse == b.mse
    with pytest.raises(ParameterError, match=r"trials \(--trials\) = 1 .*from 2 to"):
        hm.simulate(500, 0.1, 1.0, trials=1)


# ----- the unknown-variance Hybrid ----------------------------------------------------------
def test_unknown_variance_within_stated_factor(grid_results) -> None:
    worst = 0.0
    for point, res in grid_results.items():
        known = res.mse["mse_hybrid"].analytic
        unk = res.mse["mse_hybrid_unknown_variance"]
        assert unk.simulated <= UNKNOWN_VARIANCE_FACTOR * known + Z * unk.simulated_se, (point, unk, known)
        # it also never beats the budget-split ideal by more than noise + the plug-in's correlation
        worst = max(worst, unk.simulated / known)
    assert worst > 1.05  # the price of estimating σ² is real on this grid


def test_unknown_variance_small_groups_skewed_data() -> None:
    for dist in ("bernoulli:0.02", "beta:0.5,0.5"):
        res = hm.simulate(100, 0.2, 1.0, distribution=dist, trials=40_000, seed=9)
        unk, known = res.mse["mse_hybrid_unknown_variance"], res.mse["mse_hybrid"].analytic
        assert unk.simulated <= UNKNOWN_VARIANCE_FACTOR * known + Z * unk.simulated_se


def test_private_variance_sensitivity_bound() -> None:
    """|s²(x) − s²(x')| ≤ Δ²/n_T for x, x' differing in one value in [0, Δ] (the noise scale used)."""
    rng = np.random.default_rng(0)
    for n_t in (2, 3, 5, 20):
        worst = 0.0
        for _ in range(400):
            x = rng.choice([0.0, 1.0, rng.random()], size=n_t) if rng.random() < 0.5 else rng.random(n_t)
            for new in (0.0, 1.0, rng.random()):
                y = x.copy()
                y[0] = new
                worst = max(worst, abs(np.var(x, ddof=1) - np.var(y, ddof=1)))
        assert worst <= 1.0 / n_t + 1e-12
    # attained: n_T = 2, {0, 1} → {0, 0}
    assert np.var([0.0, 1.0], ddof=1) - np.var([0.0, 0.0], ddof=1) == pytest.approx(1 / 2)


def test_unknown_variance_class_matches_vectorized_simulation() -> None:
    """The mechanism class on drawn data agrees with the vectorized simulate() (two Monte Carlos)."""
    n, c, eps, trials = 50, 0.2, 1.0, 3000
    mech = hm.HybridUnknownVariance(lower=0.0, upper=1.0, epsilon=eps)
    rng = np.random.default_rng(21)
    err2 = np.empty(trials)
    for i in range(trials):
        x = rng.random(n)
        est = mech.estimate(x[:10], x[10:], rng=rng)
        err2[i] = (est.estimate - x.mean()) ** 2
    vec = hm.simulate(n, c, eps, trials=40_000, seed=4).mse["mse_hybrid_unknown_variance"]
    se = math.hypot(err2.std(ddof=1) / math.sqrt(trials), vec.simulated_se)
    assert abs(err2.mean() - vec.simulated) <= Z * se


# ----- fixed data: the model of `mean estimate` ---------------------------------------------
def test_mechanisms_on_fixed_data_match_their_expected_error() -> None:
    """Data fixed, opt-in subset random each trial: E[(est − μ̄)²] = formula with σ² = s² (ddof 1)."""
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.exponential(1.0, 55), [6.0, 7.5, 9.9, -1.0, 12.0]])  # skewed, 2 to clamp
    lo, hi, eps, n_t = 0.0, 10.0, 2.0, 12
    xc = np.clip(x, lo, hi)
    s2 = float(np.var(xc, ddof=1))
    mechs = {"tcm": hm.OnlyTCM(lower=lo, upper=hi, epsilon=eps), "hyb": hm.Hybrid(lower=lo, upper=hi, epsilon=eps,
                                                                                    sigma2=s2),
             "full": hm.FullLM(lower=lo, upper=hi, epsilon=eps)}
    trials = 2500
    errs: dict[str, list[float]] = {k: [] for k in mechs}
    expected = {}
    for _ in range(trials):
        perm = rng.permutation(len(x))
        t, loc = x[perm[:n_t]], x[perm[n_t:]]
        for k, m in mechs.items():
            est = m.estimate(t, loc, rng=rng, sigma2=s2)
            errs[k].append((est.estimate - xc.mean()) ** 2)
            expected[k] = est.expected_squared_error
            assert est.clamped.total == sum((t < lo) | (t > hi)) + sum((loc < lo) | (loc > hi))
    for k, e in errs.items():
        e = np.asarray(e)
        assert abs(e.mean() - expected[k]) <= Z * e.std(ddof=1) / math.sqrt(trials), k


def test_simulate_on_data_reports() -> None:
    x = np.r_[np.linspace(0, 10, 400), [-5.0, 15.0, 20.0]]
    run = hm.simulate_on_data(x, lower=0, upper=10, epsilon=1.0, optin_fraction=0.1, seed=1)
    assert (run.n, run.n_optin, run.n_local) == (403, 40, 363)
    assert run.clamped == hm.ClampCount(1, 2)
    assert run.true_mean == pytest.approx(x.mean()) and run.clamped_mean == pytest.approx(np.clip(x, 0, 10).mean())
    assert set(run.estimates) == {"full_lm", "only_tcm", "hybrid_oracle", "hybrid_unknown_variance"}
    assert all(e.clamped.total == 3 for e in run.estimates.values())
    assert any("clamped" in note for note in run.notes)
    unk = run.estimates["hybrid_unknown_variance"]
    assert 0 <= unk.private_sigma2 <= 25 and 0 < unk.weight < 1
    assert run.to_json()["warning"]  # seeded
    again = hm.simulate_on_data(x, lower=0, upper=10, epsilon=1.0, optin_fraction=0.1, seed=1)
    assert again.estimates["hybrid_oracle"].estimate == run.estimates["hybrid_oracle"].estimate


def test_clamping_is_counted_and_logged(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="hybriddp.mean"):
        est = hm.FullLM(lower=0, upper=1, epsilon=1).estimate([0.5, 2.0], [-1.0, 0.2, 0.3],
                                                              rng=np.random.default_rng(0))
    assert est.clamped == hm.ClampCount(below=1, above=1)
    assert "clamped" in caplog.text


# ----- errors -------------------------------------------------------------------------------
@pytest.mark.parametrize("call,needles", [
    (lambda: hm.MeanSetting(1.0, 1.0, 1.0), ["upper (--upper) = 1.0", "> lower = 1.0"]),
    (lambda: hm.MeanSetting(2.0, 1.0, 1.0), ["upper (--upper) = 1.0", "> lower = 2.0"]),
    (lambda: hm.MeanSetting(0.0, math.inf, 1.0), ["upper (--upper) = inf", "finite"]),
    (lambda: hm.MeanSetting(0.0, 1.0, 0.0), ["epsilon (--epsilon) = 0.0", "> 0"]),
    (lambda: hm.MeanSetting(0.0, 1.0, -1.0), ["epsilon (--epsilon) = -1.0", "> 0"]),
    (lambda: hm.mse_full_lm(100, epsilon=math.nan), ["epsilon (--epsilon) = nan", "> 0"]),
    (lambda: hm.group_sizes(100, 0.0), ["optin_fraction (--optin-fraction) = 0.0", "strictly between 0 and 1"]),
    (lambda: hm.group_sizes(100, 1.0), ["optin_fraction (--optin-fraction) = 1.0", "strictly between 0 and 1"]),
    (lambda: hm.group_sizes(100, 1.5), ["optin_fraction (--optin-fraction) = 1.5"]),
    (lambda: hm.group_sizes(10, 0.05), ["n (--n) = 10", ">= 11", "opt-in group"]),
    (lambda: hm.group_sizes(3, 0.9), ["optin_fraction (--optin-fraction) = 0.9", "local group is non-empty"]),
    (lambda: hm.group_sizes(1, 0.5), ["n (--n) = 1", ">= 2"]),
    (lambda: hm.simulate(10, 0.05, 1.0), ["n (--n) = 10"]),
    (lambda: hm.Distribution.parse("beta:1"), ["distribution (--distribution) = 'beta:1'", "beta:A,B"]),
    (lambda: hm.Distribution.parse("bernoulli:2"), ["bernoulli:P with 0 <= P <= 1"]),
    (lambda: hm.Hybrid(lower=0, upper=1, epsilon=1, sigma2=-0.1), ["sigma2 = -0.1", ">= 0"]),
    (lambda: hm.HybridUnknownVariance(lower=0, upper=1, epsilon=1, variance_share=1.0),
     ["variance_share (--variance-share) = 1.0", "strictly between 0 and 1"]),
])
def test_bad_parameters_name_the_parameter(call, needles: list[str]) -> None:
    with pytest.raises(ParameterError) as info:
        call()
    for needle in needles:
        assert needle in str(info.value)
    assert "is not allowed: it must be" in str(info.value)


def test_bad_data() -> None:
    with pytest.raises(DataError, match="NaN"):
        hm.FullLM(lower=0, upper=1, epsilon=1).estimate([0.1, math.nan], [0.2])
    with pytest.raises(DataError, match="both groups non-empty"):
        hm.Hybrid(lower=0, upper=1, epsilon=1, sigma2=0.1).estimate([], [0.2, 0.3])


# ----- the mechanisms with scripted noise: every scale, draw and field by hand ----------------
# A scripted generator hands out known Laplace draws and records the scale of each request, so the estimate,
# the weight, the error and every field of MeanEstimate are checked against hand-computed fractions.
# Setting: [lower, upper] = [−1, 3] (Δ = 4), ε = 2; opt-in values 0, 1, 2, 5 (5 is clamped to 3: t = 0, 1, 2, 3,
# mean 3/2, n_T = 4); local values −2, 1, 3, 3, 0, 2 (−2 clamped to −1: mean 4/3, n_L = 6); n = 10, c = 2/5.

OPTIN = [0.0, 1.0, 2.0, 5.0]
LOCAL = [-2.0, 1.0, 3.0, 3.0, 0.0, 2.0]
SETTING = {"lower": -1.0, "upper": 3.0, "epsilon": 2.0}
CLAMPED = ClampCount(below=1, above=1)
MEAN_T, MEAN_L = F(3, 2), F(4, 3)


class ScriptedLaplace:
    """Stands in for a NumPy Generator: scalar draws come from ``scalars`` in order; an array draw of size k
    is 1/2, 1, 3/2, ..., k/2. Every call's (loc, scale, size) is recorded."""

    def __init__(self, *scalars: float) -> None:
        self.scalars = list(scalars)
        self.calls: list[tuple[float, float, int | None]] = []

    def laplace(self, loc: float, scale: float, size: int | None = None) -> float | np.ndarray:
        self.calls.append((loc, scale, size))
        if size is None:
            return self.scalars.pop(0)
        return (np.arange(size) + 1) / 2.0


def _array_noise_mean(k: int) -> F:
    return F(k + 1, 4)  # mean of 1/2, 1, ..., k/2


def _close(x: float, y: F | float) -> bool:
    return math.isclose(x, float(y), rel_tol=1e-13, abs_tol=1e-15)


# ----- FullLM --------------------------------------------------------------------------------------------------

def test_full_lm_by_hand() -> None:
    """Reports: the 10 clamped values (mean 14/10) plus draws 1/2..5 (mean 11/4) at scale Δ/ε = 2.
    MSE_F = 2Δ²/(ε²n) = 32/40 = 4/5."""
    rng = ScriptedLaplace()
    est = FullLM(**SETTING).estimate(OPTIN, LOCAL, rng=rng)
    assert rng.calls == [(0.0, 2.0, 10)]
    assert _close(est.estimate, F(14, 10) + _array_noise_mean(10))
    assert _close(est.expected_squared_error, F(4, 5))
    assert (est.mechanism, est.n_optin, est.n_local, est.clamped) == ("FullLM", 4, 6, CLAMPED)
    assert (est.sigma2, est.sigma2_source, est.weight, est.private_sigma2) == (None, "not needed", None, None)
    assert est.guarantee == "every user: 2-LDP (Laplace scale Δ/ε = 2 on the device)"
    assert est.rmse == pytest.approx(math.sqrt(0.8), rel=1e-14)
    assert FullLM(**SETTING).expected_squared_error(4, 6, sigma2=0.3) == pytest.approx(0.8, rel=1e-14)


def test_estimate_to_json_whole() -> None:
    est = FullLM(**SETTING).estimate(OPTIN, LOCAL, rng=ScriptedLaplace())
    assert est.to_json() == {"mechanism": "FullLM", "estimate": est.estimate, "expected_squared_error": 0.8,
                             "rmse": est.rmse, "n_optin": 4, "n_local": 6, "clamped": {"below": 1, "above": 1},
                             "sigma2": None, "sigma2_source": "not needed", "weight": None,
                             "guarantee": "every user: 2-LDP (Laplace scale Δ/ε = 2 on the device)",
                             "private_sigma2": None}
    one = MeanEstimate("m", 1.5, 0.25, 1, 2, ClampCount(3, 4), 0.5, "given", 0.75, "g", 0.125)
    assert one.rmse == 0.5
    assert one.to_json() == {"mechanism": "m", "estimate": 1.5, "expected_squared_error": 0.25, "rmse": 0.5,
                             "n_optin": 1, "n_local": 2, "clamped": {"below": 3, "above": 4}, "sigma2": 0.5,
                             "sigma2_source": "given", "weight": 0.75, "guarantee": "g", "private_sigma2": 0.125}


# ----- OnlyTCM -------------------------------------------------------------------------------------------------

def test_only_tcm_by_hand() -> None:
    """μ̂_T = 3/2 + 1/4, one draw at scale Δ/(ε n_T) = 4/8 = 1/2. MSE_T = 2Δ²/(ε² n_T²) + σ²(1−c)/(c n)
    = 32/64 + σ²·(3/5)/4: σ² = Δ²/4 = 4 (worst case) gives 1/2 + 3/5; σ² = 1 gives 1/2 + 3/20."""
    rng = ScriptedLaplace(0.25)
    est = OnlyTCM(**SETTING).estimate(OPTIN, LOCAL, rng=rng)
    assert rng.calls == [(0.0, 0.5, None)]
    assert _close(est.estimate, MEAN_T + F(1, 4))
    assert _close(est.expected_squared_error, F(1, 2) + F(3, 5))
    assert (est.sigma2, est.sigma2_source, est.weight) == (4.0, "worst case Δ²/4", 1.0)
    assert (est.mechanism, est.n_optin, est.n_local, est.clamped) == ("OnlyTCM", 4, 6, CLAMPED)
    assert est.guarantee == "opt-in users: 2-DP, trusted curator (Laplace scale Δ/(ε·n_T)); local users: not used"
    given = OnlyTCM(**SETTING).estimate(OPTIN, LOCAL, rng=ScriptedLaplace(-1.0), sigma2=1)
    assert _close(given.estimate, MEAN_T - 1)
    assert (given.sigma2, given.sigma2_source) == (1.0, "given")
    assert _close(given.expected_squared_error, F(1, 2) + F(3, 20))
    assert _close(OnlyTCM(**SETTING).expected_squared_error(4, 6), F(1, 2) + F(3, 5))


# ----- Hybrid, known σ² ----------------------------------------------------------------------------------------

def _hybrid_mse(w: F, sigma2: F, eps_t: F = F(2)) -> F:
    """w²A + (1−w)²B + (w−c)²S with A = 2Δ²/(ε_T² n_T²), B = 2Δ²/(ε² n_L), S = σ²/(c(1−c)n)."""
    a, b, s = F(32) / (eps_t**2 * 16), F(32, 4 * 6), sigma2 / (F(2, 5) * F(3, 5) * 10)
    return w * w * a + (1 - w) ** 2 * b + (w - F(2, 5)) ** 2 * s


def _w_star(sigma2: F, eps_t: F = F(2)) -> F:
    a, b, s = F(32) / (eps_t**2 * 16), F(32, 4 * 6), sigma2 / (F(2, 5) * F(3, 5) * 10)
    return (b + F(2, 5) * s) / (a + b + s)


def test_hybrid_by_hand() -> None:
    """σ² = 1: A = 1/2, B = 4/3, S = 5/12, w* = (4/3 + 1/6)/(9/4) = 2/3. μ̂_T = 3/2 + 1/4 (scale 1/2),
    μ̂_L = 4/3 + 7/4 (draws 1/2..3 at scale 2): estimate (2/3)(7/4) + (1/3)(37/12) = 79/36."""
    assert _w_star(F(1)) == F(2, 3)
    rng = ScriptedLaplace(0.25)
    mech = Hybrid(**SETTING, sigma2=1)
    est = mech.estimate(OPTIN, LOCAL, rng=rng)
    assert rng.calls == [(0.0, 0.5, None), (0.0, 2.0, 6)]
    assert _close(est.estimate, F(79, 36))
    assert _close(est.weight, F(2, 3)) and _close(mech.weight_for(4, 6), F(2, 3))
    assert _close(est.expected_squared_error, _hybrid_mse(F(2, 3), F(1)))
    assert (est.sigma2, est.sigma2_source, est.private_sigma2) == (1.0, "given", None)
    assert (est.mechanism, est.n_optin, est.n_local, est.clamped) == ("Hybrid", 4, 6, CLAMPED)
    assert est.guarantee == ("opt-in users: 2-DP, trusted curator (Laplace scale Δ/(ε·n_T)); local users: "
                             "2-LDP (Laplace scale Δ/ε on the device); σ² is public")
    # sigma2 at estimate time changes only the variance the error is evaluated at, not the weight
    other = mech.estimate(OPTIN, LOCAL, rng=ScriptedLaplace(0.25), sigma2=0.5)
    assert _close(other.weight, F(2, 3)) and _close(other.estimate, F(79, 36))
    assert _close(other.expected_squared_error, _hybrid_mse(F(2, 3), F(1, 2)))
    assert other.sigma2 == 0.5
    # the weight for another variance, and the error at a given weight
    assert _close(mech.weight_for(4, 6, sigma2=3.0), _w_star(F(3)))
    assert _close(mech.expected_squared_error(4, 6), _hybrid_mse(F(2, 3), F(1)))
    assert _close(mech.expected_squared_error(4, 6, sigma2=2.0), _hybrid_mse(_w_star(F(1)), F(2)))
    assert _close(mech.expected_squared_error(4, 6, weight=0.25), _hybrid_mse(F(1, 4), F(1)))


def test_hybrid_with_a_fixed_weight() -> None:
    mech = Hybrid(**SETTING, sigma2=1, weight=0.25)
    assert mech.weight == 0.25 and mech.sigma2 == 1.0
    est = mech.estimate(OPTIN, LOCAL, rng=ScriptedLaplace(0.25))
    assert est.weight == 0.25 and mech.weight_for(4, 6) == 0.25
    assert _close(est.estimate, F(1, 4) * F(7, 4) + F(3, 4) * F(37, 12))
    assert _close(est.expected_squared_error, _hybrid_mse(F(1, 4), F(1)))
    assert Hybrid(**SETTING, sigma2=0).weight is None


@pytest.mark.parametrize("weight", [True, "x", [0.5], math.nan, math.inf])
def test_hybrid_weight_must_be_one_finite_number(weight: object) -> None:
    with pytest.raises(ParameterError, match=re.escape(f"weight = {weight!r} is not allowed: it must be a finite "
                                                        "number.")):
        Hybrid(**SETTING, sigma2=1, weight=weight)


@pytest.mark.parametrize("sigma2", [-0.5, math.nan, "x", True])
def test_hybrid_sigma2_must_be_a_variance(sigma2: object) -> None:
    with pytest.raises(ParameterError, match=re.escape(f"sigma2 = {sigma2!r} is not allowed: it must be a finite "
                                                        "number >= 0")):
        Hybrid(**SETTING, sigma2=sigma2)


# ----- Hybrid, unknown σ² ----------------------------------------------------------------------------------------

def test_hybrid_unknown_variance_by_hand() -> None:
    """ρ = 1/5: ε_v = 2/5, ε_m = 8/5. s²_T = 5/3 (ddof 1 of 0..3); draw 1/4 at scale Δ²/(n_T ε_v) = 16/(8/5)
    = 10: σ̂² = 23/12. μ̂_T = 3/2 + 1/4 at scale Δ/(n_T ε_m) = 4/(32/5) = 5/8; μ̂_L = 37/12 (scale 2).
    ŵ = w*(σ̂²) with A' = 2Δ²/(ε_m² n_T²) = 32/(64/25·16) = 25/32."""
    rng = ScriptedLaplace(0.25, 0.25)
    mech = HybridUnknownVariance(**SETTING)
    assert mech.variance_share == 0.2 and mech.weight is None and mech.sigma2 == 4.0
    assert _close(mech.variance_epsilon, F(2, 5)) and _close(mech.mean_epsilon, F(8, 5))
    est = mech.estimate(OPTIN, LOCAL, rng=rng)
    assert [c[2] for c in rng.calls] == [None, None, 6]
    assert [c[1] for c in rng.calls] == pytest.approx([10.0, 0.625, 2.0], rel=1e-14)
    s2_hat = F(5, 3) + F(1, 4)
    w = _w_star(s2_hat, eps_t=F(8, 5))
    assert _close(est.private_sigma2, s2_hat) and _close(est.sigma2, s2_hat)
    assert est.sigma2_source == "private estimate"
    assert _close(est.weight, w)
    assert _close(est.estimate, w * F(7, 4) + (1 - w) * F(37, 12))
    assert _close(est.expected_squared_error, _hybrid_mse(w, s2_hat, eps_t=F(8, 5)))
    assert (est.mechanism, est.n_optin, est.n_local, est.clamped) == ("Hybrid, unknown σ²", 4, 6, CLAMPED)
    assert est.guarantee == ("opt-in users: 2-DP, trusted curator, by sequential composition of 0.4 (variance, "
                             "Laplace scale Δ²/(n_T·ε_v)) + 1.6 (mean, Laplace scale Δ/(n_T·ε_m)); local users: "
                             "2-LDP; the weight is post-processing")
    # a given σ² only changes where the error is evaluated (same ŵ)
    given = mech.estimate(OPTIN, LOCAL, rng=ScriptedLaplace(0.25, 0.25), sigma2=1)
    assert (given.sigma2, given.sigma2_source) == (1.0, "given") and _close(given.weight, w)
    assert _close(given.private_sigma2, s2_hat)
    assert _close(given.expected_squared_error, _hybrid_mse(w, F(1), eps_t=F(8, 5)))
    assert _close(mech.expected_squared_error(4, 6, sigma2=1.0), _hybrid_mse(_w_star(F(1), F(8, 5)), F(1), F(8, 5)))
    assert _close(mech.expected_squared_error(4, 6, sigma2=1.0, weight=0.5), _hybrid_mse(F(1, 2), F(1), F(8, 5)))
    assert _close(mech.weight_for(4, 6, 1.0), _w_star(F(1), F(8, 5)))


def test_private_variance_clip_and_one_value() -> None:
    """σ̂² is clipped to [0, Δ²/4 = 4]; with n_T = 1 the sample variance is 0 and the scale is 16/(1·ε_v)."""
    mech = HybridUnknownVariance(**SETTING, variance_share=0.5)  # ε_v = 1
    t = np.array([0.0, 1.0, 2.0, 3.0])
    assert mech.private_variance(t, ScriptedLaplace(100.0)) == 4.0
    assert mech.private_variance(t, ScriptedLaplace(-100.0)) == 0.0
    assert mech.private_variance(t, ScriptedLaplace(2.0)) == pytest.approx(5 / 3 + 2, rel=1e-14)
    rng = ScriptedLaplace(0.5)
    assert mech.private_variance(np.array([2.0]), rng) == 0.5 and rng.calls == [(0.0, 16.0, None)]
    rng = ScriptedLaplace(0.0)
    assert mech.private_variance(np.array([1.0, 3.0]), rng) == 2.0 and rng.calls == [(0.0, 8.0, None)]


def test_hybrid_unknown_variance_needs_a_variance() -> None:
    mech = HybridUnknownVariance(**SETTING)
    with pytest.raises(ValueError, match="^" + re.escape("HybridUnknownVariance.weight_for needs the (private) "
                                                         "variance estimate") + "$"):
        mech.weight_for(4, 6)
    with pytest.raises(ValueError, match="^" + re.escape("HybridUnknownVariance.expected_squared_error needs a "
                                                         "variance") + "$"):
        mech.expected_squared_error(4, 6)
    with pytest.raises(ParameterError, match="variance_share"):
        HybridUnknownVariance(**SETTING, variance_share=1.0)


# ----- shared: empty groups, defaults --------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [FullLM, OnlyTCM, Hybrid, HybridUnknownVariance])
def test_both_groups_must_be_non_empty(cls: type) -> None:
    kw = {"sigma2": 1.0} if cls is Hybrid else {}
    mech = cls(**SETTING, **kw)
    for t, loc, nt, nl in [([], [1.0], 0, 1), ([1.0], [], 1, 0)]:
        with pytest.raises(DataError, match=re.escape(
                f"{cls.name} needs both groups non-empty: got {nt} opt-in and {nl} local values (ALGORITHM.md §11)")):
            mech.estimate(t, loc, rng=np.random.default_rng(0))
    one = mech.estimate([1.0], [2.0], rng=np.random.default_rng(0))  # one of each is enough
    assert (one.n_optin, one.n_local) == (1, 1)


@pytest.mark.parametrize("cls", [FullLM, OnlyTCM, Hybrid, HybridUnknownVariance])
def test_without_a_generator_the_noise_comes_from_os_entropy(cls: type) -> None:
    kw = {"sigma2": 1.0} if cls is Hybrid else {}
    a = cls(**SETTING, **kw).estimate(OPTIN, LOCAL).estimate
    b = cls(**SETTING, **kw).estimate(OPTIN, LOCAL).estimate
    assert math.isfinite(a) and a != b


def test_properties_of_the_setting() -> None:
    mech = FullLM(lower=-1, upper=3, epsilon=2)
    assert mech.width == 4.0 and mech.epsilon == 2.0 and isinstance(mech.epsilon, float)


@pytest.mark.parametrize("mechanism", [FullLM(**SETTING), OnlyTCM(**SETTING), Hybrid(**SETTING, sigma2=0.5)])
def test_bad_groups_are_named_in_the_message(mechanism) -> None:
    """Which group holds the bad value, with the NaN's position or the shape, whole."""
    with pytest.raises(DataError, match="^" + re.escape(
            "opt-in values: value #2 is NaN; every user needs one numeric value") + "$"):
        mechanism.estimate([0.0, 1.0, math.nan], LOCAL, rng=np.random.default_rng(0))
    with pytest.raises(DataError, match="^" + re.escape(
            "local values: value #0 is NaN; every user needs one numeric value") + "$"):
        mechanism.estimate(OPTIN, [math.nan, 1.0], rng=np.random.default_rng(0))
    with pytest.raises(DataError, match="^" + re.escape(
            "local values: expected a 1-D sequence of numbers, got shape (2, 1)") + "$"):
        mechanism.estimate(OPTIN, [[1.0], [2.0]], rng=np.random.default_rng(0))


# ----- the device randomizer ----------------------------------------------------------------
def test_device_module_imports_no_numpy() -> None:
    code = ("import sys, hybriddp.device.mean as d; r = d.randomize_value(0.3, lower=0, upper=1, epsilon=1); "
            "assert 'numpy' not in sys.modules, sorted(sys.modules); print(r)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert math.isfinite(float(proc.stdout))


@pytest.mark.parametrize("value,center", [(0.3, 0.3), (7.0, 2.0), (-3.0, -1.0)])
def test_device_output_fits_laplace(value: float, center: float) -> None:
    r = NumericRandomizer(lower=-1.0, upper=2.0, epsilon=1.5, source=SeededSource(12))
    draws = [r.randomize(value) for _ in range(20_000)]
    assert stats.kstest(draws, stats.laplace(loc=center, scale=3.0 / 1.5).cdf).pvalue > 1e-6
    assert r.clamped == (0 if value == center else 20_000)


def test_device_matches_batch_randomizer() -> None:
    """The device's reports and FullLM's NumPy noise have the same distribution (two-sample KS)."""
    r = NumericRandomizer(lower=0.0, upper=4.0, epsilon=0.7, source=SeededSource(2))
    device = [r.randomize(1.0) for _ in range(10_000)]
    batch = 1.0 + np.random.default_rng(2).laplace(0.0, 4.0 / 0.7, 10_000)
    assert stats.ks_2samp(device, batch).pvalue > 1e-6


@pytest.mark.parametrize("lower,upper,epsilon", [(0.0, 1.0, 1.0), (-5.0, 20.0, 0.3), (10.0, 10.5, 6.0)])
def test_device_is_epsilon_ldp_exactly(lower: float, upper: float, epsilon: float) -> None:
    """Closed form: |ln f(r|x) − ln f(r|x')| ≤ ε for all x, x' (even outside [lo, hi]) and all r,
    with equality at x = lo, x' = hi for every r ≥ hi."""
    width = upper - lower
    xs = [lower - width, lower, lower + 0.3 * width, lower + 0.5 * width, upper, upper + 3 * width]
    rs = [lower - 50 * width, lower - width, lower, lower + 0.25 * width, upper, upper + 0.1, upper + 50 * width]
    worst = 0.0
    for x, x2, r in itertools.product(xs, xs, rs):
        kw = {"lower": lower, "upper": upper, "epsilon": epsilon}
        ratio = output_log_density(r, x, **kw) - output_log_density(r, x2, **kw)
        assert ratio <= epsilon * (1 + 1e-12) + 1e-12
        worst = max(worst, ratio)
    assert worst == pytest.approx(epsilon, rel=1e-9)
    for r in (upper, upper + 1.0, upper + 100.0):
        kw = {"lower": lower, "upper": upper, "epsilon": epsilon}
        assert output_log_density(r, upper, **kw) - output_log_density(r, lower, **kw) == pytest.approx(epsilon)
    # the density integrates to 1 (it is a density of the output)
    grid = np.linspace(lower - 60 * width / epsilon, upper + 60 * width / epsilon, 4001)
    dens = np.exp([output_log_density(float(g), lower + 0.4 * width, **kw) for g in grid])
    assert float(dens.sum() * (grid[1] - grid[0])) == pytest.approx(1.0, rel=1e-3)


def test_device_clamps_counts_and_keeps_value_out_of_logs(caplog) -> None:
    r = NumericRandomizer(lower=0.0, upper=1.0, epsilon=1.0, source=SeededSource(0))
    with caplog.at_level(logging.WARNING, logger="hybriddp.device.mean"):
        for v in (0.5, 1.5, -0.25, 0.9, 123.456):
            assert isinstance(r.randomize(v), float)
    assert r.clamped == 3
    assert "clamped" in caplog.text and "123.456" not in caplog.text and "1.5" not in caplog.text
    assert isinstance(randomize_value(0.4, lower=0, upper=1, epsilon=1), float)  # OS randomness by default
    assert isinstance(NumericRandomizer(lower=0, upper=1, epsilon=1).source, SystemSource)


def test_device_seeded_is_reproducible() -> None:
    a = [NumericRandomizer(lower=0, upper=1, epsilon=1, source=SeededSource(4)).randomize(0.2) for _ in range(3)]
    b = [NumericRandomizer(lower=0, upper=1, epsilon=1, source=SeededSource(4)).randomize(0.2) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize("kwargs,needles", [
    ({"lower": 1.0, "upper": 1.0, "epsilon": 1.0}, ["upper = 1.0", "> lower = 1.0"]),
    ({"lower": 0.0, "upper": 1.0, "epsilon": 0.0}, ["epsilon = 0.0", "> 0"]),
    ({"lower": 0.0, "upper": 1.0, "epsilon": -2}, ["epsilon = -2", "> 0"]),
    ({"lower": math.nan, "upper": 1.0, "epsilon": 1.0}, ["lower = nan", "finite"]),
])
def test_device_bad_parameters(kwargs: dict[str, float], needles: list[str]) -> None:
    with pytest.raises(ParameterError) as info:
        NumericRandomizer(**kwargs)
    for needle in needles:
        assert needle in str(info.value)


def test_device_rejects_nan() -> None:
    with pytest.raises(ParameterError, match="value = nan"):
        NumericRandomizer(lower=0, upper=1, epsilon=1).randomize(math.nan)


# ----- the device randomizer by hand: the Laplace draw −ln(1 − U) with a fair sign, the clamp, the density ---
LN2 = math.log(2.0)


@pytest.mark.parametrize(("u_sign", "u_mag", "expected"), [
    (0.25, 0.75, -2.0 * 2 * LN2),  # U < 1/2: negative; −ln(1 − 3/4) = ln 4
    (0.4999, 0.5, -2.0 * LN2),
    (0.5, 0.75, 2.0 * 2 * LN2),  # U = 1/2 is the positive half
    (0.9999, 0.5, 2.0 * LN2),
    (0.1, 0.0, 0.0),  # −ln 1 = 0
])
def test_laplace_draw_by_hand(u_sign: float, u_mag: float, expected: float) -> None:
    got = laplace(2.0, UniformReplay([u_sign, u_mag]))
    assert got == pytest.approx(expected, rel=1e-15, abs=0.0)


def test_clamp_edges_and_types() -> None:
    for value, lower, upper, expected in [(2, 0, 5, (2.0, False)), (0, 0, 5, (0.0, False)), (5, 0, 5, (5.0, False)),
                                          (-1, 0, 5, (0.0, True)), (7, 0, 5, (5.0, True)),
                                          (-0.5, -0.5, 0.5, (-0.5, False)), (0.5000001, -0.5, 0.5, (0.5, True))]:
        got = clamp(value, lower, upper)
        assert got == expected and type(got[0]) is float


@pytest.mark.parametrize(("report", "value", "expected"), [
    (3.0, 1.0, -1.0 - 2 * LN2),  # b = (2 − 0)/1 = 2: −|3 − 1|/2 − ln 4
    (3.0, 5.0, -0.5 - 2 * LN2),  # 5 clamps to 2
    (3.0, -1.0, -1.5 - 2 * LN2),  # −1 clamps to 0
    (-1.0, 1.0, -1.0 - 2 * LN2),
    (1.0, 1.0, -2 * LN2),
])
def test_output_log_density_by_hand(report: float, value: float, expected: float) -> None:
    got = output_log_density(report, value, lower=0.0, upper=2.0, epsilon=1.0)
    assert got == pytest.approx(expected, rel=1e-15)


def test_output_log_density_other_scale_and_checks() -> None:
    # [−1, 3], ε = 2: b = 2; r = 0, x = 1: −1/2 − ln 4.  [1, 2], ε = 4: b = 1/4; r = 2, x = 1.5: −2 − ln(1/2)
    assert output_log_density(0.0, 1.0, lower=-1.0, upper=3.0, epsilon=2.0) == pytest.approx(-0.5 - 2 * LN2)
    assert output_log_density(2.0, 1.5, lower=1.0, upper=2.0, epsilon=4.0) == pytest.approx(-2.0 + LN2)
    with pytest.raises(ParameterError, match=exact_message(
            "upper = 0.0 is not allowed: it must be > lower = 1.0. Give the range [lower, upper] the values are "
            "known to lie in.")):
        output_log_density(0.0, 0.0, lower=1.0, upper=0.0, epsilon=1.0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lower": True}, "lower = True is not allowed: it must be a finite number."),
    ({"lower": "0"}, "lower = '0' is not allowed: it must be a finite number."),
    ({"lower": None}, "lower = None is not allowed: it must be a finite number."),
    ({"lower": -math.inf}, "lower = -inf is not allowed: it must be a finite number."),
    ({"upper": False}, "upper = False is not allowed: it must be a finite number."),
    ({"upper": math.nan}, "upper = nan is not allowed: it must be a finite number."),
    ({"upper": math.inf}, "upper = inf is not allowed: it must be a finite number."),
    ({"upper": [1]}, "upper = [1] is not allowed: it must be a finite number."),
    ({"lower": 1, "upper": 1}, "upper = 1 is not allowed: it must be > lower = 1. Give the range [lower, upper] "
                               "the values are known to lie in."),
    ({"lower": 2.5, "upper": 1.0}, "upper = 1.0 is not allowed: it must be > lower = 2.5. Give the range "
                                   "[lower, upper] the values are known to lie in."),
    ({"epsilon": True}, "epsilon = True is not allowed: it must be a finite number > 0."),
    ({"epsilon": "1"}, "epsilon = '1' is not allowed: it must be a finite number > 0."),
    ({"epsilon": 0}, "epsilon = 0 is not allowed: it must be a finite number > 0."),
    ({"epsilon": -0.5}, "epsilon = -0.5 is not allowed: it must be a finite number > 0."),
    ({"epsilon": math.inf}, "epsilon = inf is not allowed: it must be a finite number > 0."),
    ({"epsilon": math.nan}, "epsilon = nan is not allowed: it must be a finite number > 0."),
])
def test_numeric_randomizer_refuses_settings(kwargs: dict, message: str) -> None:
    setting = {"lower": 0.0, "upper": 1.0, "epsilon": 1.0, **kwargs}
    with pytest.raises(ParameterError, match=exact_message(message)):
        NumericRandomizer(**setting)


def test_numeric_randomizer_accepts_the_edges_and_stores_floats() -> None:
    r = NumericRandomizer(lower=0, upper=math.nextafter(0.0, 1.0), epsilon=5e-324)  # lower < upper by one step
    assert (r.lower, r.upper, r.epsilon) == (0.0, 5e-324, 5e-324)
    r = NumericRandomizer(lower=-1, upper=3, epsilon=2)
    assert all(type(v) is float for v in (r.lower, r.upper, r.epsilon)) and (r.lower, r.upper, r.epsilon) == (
        -1.0, 3.0, 2.0)
    assert r.scale == 2.0  # (3 − (−1))/2
    assert NumericRandomizer(lower=1.0, upper=2.0, epsilon=4.0).scale == 0.25
    assert r.clamped == 0


def test_numeric_randomizer_by_hand(caplog: pytest.LogCaptureFixture) -> None:
    """[−1, 3], ε = 2 (b = 2) with replayed uniforms: report = clamp(x) ± 2·(−ln(1 − U))."""
    src = UniformReplay([0.25, 0.75, 0.5, 0.5, 0.6, 0.0, 0.7, 0.5, 0.1, 0.75, 0.5, 0.0])
    r = NumericRandomizer(lower=-1, upper=3, epsilon=2, source=src)
    with caplog.at_level(logging.WARNING, logger="hybriddp.device.mean"):
        assert r.randomize(1) == pytest.approx(1.0 - 4 * LN2, rel=1e-15)
        assert r.clamped == 0
        assert r.randomize(5.0) == pytest.approx(3.0 + 2 * LN2, rel=1e-15)  # clamped to 3
        assert r.clamped == 1
        got = r.randomize(-1)  # on the edge: not clamped
        assert got == -1.0 and type(got) is float
        assert r.randomize(3.0) == pytest.approx(3.0 + 2 * LN2, rel=1e-15)
        assert r.clamped == 1
        assert r.randomize(-1.5) == pytest.approx(-1.0 - 4 * LN2, rel=1e-15)  # clamped to −1
        assert r.clamped == 2
    assert [(rec.levelname, rec.getMessage()) for rec in caplog.records] == [
        ("WARNING", "a value outside [-1, 3] was clamped before randomizing (1 so far on this device)"),
        ("WARNING", "a value outside [-1, 3] was clamped before randomizing (2 so far on this device)"),
    ]
    assert r.randomize(0.0) == 0.0  # (0.5, 0.0): +0


@pytest.mark.parametrize(("value", "shown"), [(True, "True"), ("1.0", "'1.0'"), (None, "None"), (math.nan, "nan"),
                                               ([1.0], "[1.0]")])
def test_numeric_randomizer_refuses_values(value: object, shown: str) -> None:
    r = NumericRandomizer(lower=0, upper=1, epsilon=1, source=UniformReplay([]))
    with pytest.raises(ParameterError, match=exact_message(
            f"value = {shown} is not allowed: it must be a number (NaN is not allowed).")):
        r.randomize(value)  # type: ignore[arg-type]
    assert r.clamped == 0


def test_randomize_value_uses_the_source_given() -> None:
    # [0, 4], ε = 1/2: b = 8; x = 1, uniforms (0.25, 0.5): 1 − 8 ln 2
    got = randomize_value(1, lower=0, upper=4, epsilon=0.5, source=UniformReplay([0.25, 0.5]))
    assert got == pytest.approx(1.0 - 8 * LN2, rel=1e-15)
    assert randomize_value(9, lower=0, upper=4, epsilon=0.5, source=UniformReplay([0.5, 0.0])) == 4.0
    with pytest.raises(ParameterError, match=exact_message("epsilon = 0 is not allowed: it must be a finite number "
                                                           "> 0.")):
        randomize_value(1, lower=0, upper=4, epsilon=0, source=UniformReplay([]))

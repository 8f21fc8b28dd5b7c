"""Hybrid mean estimation (ALGORITHM.md §11): formulas against Monte Carlo, w*, unknown σ², device randomizer.

Monte Carlo tolerances: every check allows Z = 5 standard errors of the MSE estimate (the SE is
measured from the trials), so a correct formula fails with probability < 1e-6 per check, and
runs are seeded so they never flake; a formula off by more than ~10 SE is caught (shown below
with deliberately wrong formulas).
"""

from __future__ import annotations

import itertools
import logging
import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from hybriddp import mean as hm
from hybriddp.errors import DataError, ParameterError
from hybriddp.mean_device import NumericRandomizer, SeededSource, SystemSource, output_log_density, randomize_value

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


# ----- the device randomizer ----------------------------------------------------------------
def test_device_module_imports_no_numpy() -> None:
    code = ("import sys, hybriddp.mean_device as d; r = d.randomize_value(0.3, lower=0, upper=1, epsilon=1); "
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
    with caplog.at_level(logging.WARNING, logger="hybriddp.mean_device"):
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

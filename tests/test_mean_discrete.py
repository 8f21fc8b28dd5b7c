"""The service curator's mean and variance with exact discrete Laplace noise (hybriddp.curator.mean; ALGORITHM.md
§11, §3.2).

* Privacy, exactly: the sensitivity of every released integer (brute force on small grids, the proven bound
  on the service's grid) and the ratio of neighbouring output pmfs ≤ e^ε at every output, from the discrete
  Laplace pmf written out here (P[Y = y] = (1 − q)/(1 + q)·q^|y|, q = e^{−1/t}); a scale one unit too small fails.
* The sampler: the noise the mechanism adds fits that pmf (χ², p > 1e-6, seeded), and a 20% larger scale does not.
* The estimators by Monte Carlo: mean = the mean of the snapped values (the coarsened midpoint), variance =
  Var Y·(Δ·G/(K·n))², both derived here; each within 5 standard errors, seeded so nothing flakes, and a wrong
  expectation (the raw mean on a coarse grid) is rejected.
* Production randomness: with no generator every random integer comes from secrets.randbelow, in the
  curator and in the service's mean round.
"""

from __future__ import annotations

import math
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from hybriddp.core.errors import DataError, ParameterError
from hybriddp.core.rng import SecretsIntegers
from hybriddp.curator.mean import (
    GRID_STEPS,
    MAX_SCALE,
    TARGET_SCALE,
    DiscreteMeanCurator,
    coarsening_unit,
    integer_scale,
)
from hybriddp.mean import Hybrid, HybridUnknownVariance
from secretshelpers import counting_randbelow

K = GRID_STEPS
Z = 5.0


# ----- the discrete Laplace, written out independently of hybriddp.core.noise --------------------------------------
def log_pmf(y: int, t: Fraction) -> Fraction:
    """log P[Y = y] − log P[Y = 0] = −|y|/t, exactly (the normalizer (1 − q)/(1 + q) is common to all y)."""
    return -Fraction(abs(y)) / t


def pmf(y: np.ndarray, t: float) -> np.ndarray:
    q = math.exp(-1.0 / t)
    return (1 - q) / (1 + q) * q ** np.abs(y)


def cdf(y: np.ndarray, t: float) -> np.ndarray:
    """P[Y ≤ y] for integers y: q^{−y}/(1 + q) below 0, 1 − q^{y+1}/(1 + q) from 0 (sum of the geometric series)."""
    y = np.asarray(y, dtype=np.float64)
    q = math.exp(-1.0 / t)
    return np.where(y >= 0, 1.0 - np.exp(-(y + 1) / t) / (1 + q), np.exp(y / t) / (1 + q))


def variance(t: float) -> float:
    """Var Y = Σ y²·P[y] = 2q/(1 − q)², with 1 − q = −expm1(−1/t) (no cancellation at large t)."""
    q, one_minus_q = math.exp(-1.0 / t), -math.expm1(-1.0 / t)
    return 2 * q / one_minus_q**2


def snap(x: np.ndarray, lower: float, upper: float, steps: int) -> list[int]:
    """Round to the nearest of steps + 1 grid points over [lower, upper] (the grid the tests expect)."""
    pos = (np.clip(x, lower, upper) - lower) / (upper - lower) * steps
    return [int(v) for v in np.clip(np.rint(pos), 0, steps)]


def parameters(sensitivity: int, epsilon: float, target: int = TARGET_SCALE) -> tuple[int, int, Fraction]:
    g = coarsening_unit(sensitivity, epsilon, target)
    d = -(-sensitivity // g)
    return g, d, Fraction(integer_scale(d, epsilon))


# ----- (1) privacy, exactly ---------------------------------------------------------------------------------------
def max_log_ratio(d: int, t: Fraction, outputs: list[int]) -> Fraction:
    """max over w of log P[W = w | z = 0] − log P[W = w | z = d], W = z + Y."""
    return max(log_pmf(w, t) - log_pmf(w - d, t) for w in outputs)


@pytest.mark.parametrize("epsilon", [0.05, 0.8, 1.0, 1 / 3, 4.0, 300.0])
@pytest.mark.parametrize("which", ["mean", "variance n=2", "variance n=10^6"])
def test_released_integer_is_exactly_epsilon_dp(epsilon: float, which: str) -> None:
    """Neighbouring ⌊Z/G⌋ differ by ≤ d; the pmf ratio ≤ e^ε at every output w (exact rational arithmetic).

    The log ratio (|w − d| − |w|)/t is constant below 0 and above d and monotone between, so the outputs
    checked (far tails, both breakpoints and their neighbours, random points between) cover its maximum; the
    small-grid test below enumerates every output.
    """
    n = {"mean": 0, "variance n=2": 2, "variance n=10^6": 10**6}[which]
    sensitivity = K if n == 0 else (n - 1) * K * K
    g, d, t = parameters(sensitivity, epsilon)
    assert g & (g - 1) == 0 and d == -(-sensitivity // g)
    rng = np.random.default_rng(1)
    for a in [0, 1, g - 1, g, *rng.integers(0, 2**62, 50).tolist()]:  # ⌊·/G⌋ moves by ≤ d when Z moves by ≤ D
        for b in (a + sensitivity, a + sensitivity - 1, a + g - 1):
            assert abs(b // g - a // g) <= d
    inner = sorted({0, 1, d // 2, d - 1, d, d + 1, *rng.integers(0, d + 1, 200).tolist()})
    outputs = [-10**18, -7 * int(t), -1, *inner, d + 7 * int(t), 10**18]
    worst = max_log_ratio(d, t, outputs)
    assert worst <= Fraction(epsilon)  # ε as the exact rational of its float
    assert worst == Fraction(d) / t  # attained below 0, so the bound is tight
    if t > 2**31:  # and barely loose: the integer scale costs at most 1/t of ε
        assert Fraction(d) / t > Fraction(epsilon) * (1 - Fraction(1, 2**30))
    # a scale one unit smaller (the float d/ε rounded down, say) breaks the guarantee
    assert max_log_ratio(d, t - 1, outputs) > Fraction(epsilon)


@pytest.mark.parametrize(("sensitivity", "epsilon", "target"), [(1, 0.5, 8), (4, 1.0, 8), (7, 0.3, 16), (64, 1.0, 4),
                                                                 (10, 3.0, 2), (5, 2.5, 1)])
def test_every_output_on_small_grids(sensitivity: int, epsilon: float, target: int) -> None:
    """Every a, b with |a − b| ≤ D and every output w: P[W = w | a]/P[W = w | b] ≤ e^ε, from float pmfs too."""
    g, d, t = parameters(sensitivity, epsilon, target)
    assert d <= t * epsilon  # the coarsening met its target
    shifts = {(b // g) - (a // g) for a in range(0, 3 * g + sensitivity) for b in range(a, a + sensitivity + 1)}
    assert max(shifts) == d  # ⌊Z/G⌋ moves by at most d, and d is reached
    outputs = list(range(-3 * sensitivity - 60, 3 * sensitivity + 60))
    for shift in shifts:  # P[W = w | z = 0] / P[W = w | z = shift] at every output, both directions
        assert max_log_ratio(shift, t, outputs) <= Fraction(epsilon)
        assert max_log_ratio(-shift, t, outputs) <= Fraction(epsilon)
        ratio = pmf(np.array(outputs), float(t)) / pmf(np.array(outputs) - shift, float(t))
        assert ratio.max() <= math.exp(epsilon) * (1 + 1e-12)
    if t > 1:
        assert max_log_ratio(d, t - 1, outputs) > Fraction(epsilon)


@pytest.mark.parametrize("steps", [1, 3, 5])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_statistics_sensitivity_brute_force(steps: int, n: int) -> None:
    """S = Σk moves by ≤ K, Q = n·Σk² − S² by ≤ max(n − 1, 1)·K² (attained for n ≥ 2), over every data set of
    n values on the grid {0..K} and every replacement of one value."""
    import itertools

    worst_s = worst_q = 0
    for data in itertools.product(range(steps + 1), repeat=n):
        s0, q0 = sum(data), n * sum(v * v for v in data) - sum(data) ** 2
        for new in range(steps + 1):
            other = (new, *data[1:])
            worst_s = max(worst_s, abs(sum(other) - s0))
            worst_q = max(worst_q, abs(n * sum(v * v for v in other) - sum(other) ** 2 - q0))
    assert worst_s == steps
    assert worst_q == (n - 1) * steps * steps
    assert worst_q <= max(n - 1, 1) * steps * steps


def test_the_curator_uses_these_parameters() -> None:
    """The mean's release is ⌊S/G⌋ + Y with (G, d, t) for D = K; the variance's for D = (n − 1)K²."""
    x = np.random.default_rng(0).uniform(-1, 3, 25)
    cur = DiscreteMeanCurator(lower=-1, upper=3, epsilon=0.8, variance_epsilon=0.2, rng=np.random.default_rng(1))
    m, v = cur.private_mean(x), cur.private_variance(x)
    for rel, (sens, eps) in ((m.release, (K, 0.8)), (v.release, (24 * K * K, 0.2))):
        g, d, t = parameters(sens, eps)
        assert (rel.unit, rel.sensitivity, rel.scale) == (g, d, t)
        assert rel.epsilon_attained == Fraction(d) / t <= Fraction(eps)
    k = snap(x, -1, 3, K)
    assert k == cur.snap(x).tolist()
    s = sum(k)
    # the estimates are exact functions of the noisy integer: μ̂ = lo + Δ·(G·W + (G − 1)/2)/(K·n)
    g = m.release.unit
    assert m.estimate == -1 + 4 * float(Fraction(g * m.release.noisy * 2 + g - 1, 2 * K * 25))
    assert abs(m.release.noisy - s // g) < 40 * m.release.scale  # W − ⌊S/G⌋ is the noise
    q = 25 * sum(v * v for v in k) - s * s
    gv = v.release.unit
    raw = Fraction(gv * v.release.noisy * 2 + gv - 1, 2 * K * K * 25 * 24)
    assert v.estimate == 16 * float(min(max(raw, Fraction(0)), Fraction(1, 4)))
    assert abs(v.release.noisy - q // gv) < 40 * v.release.scale


def test_epsilon_too_small_for_the_sampler_is_refused() -> None:
    assert integer_scale(1, 2.0**-52) == MAX_SCALE
    with pytest.raises(ParameterError, match="variance_epsilon"):
        integer_scale(1, 2.0**-53, "variance_epsilon")
    cur = DiscreteMeanCurator(lower=0, upper=1, epsilon=1e-17, rng=np.random.default_rng(0))
    with pytest.raises(ParameterError, match="2\\^52"):
        cur.private_mean([0.5])
    with pytest.raises(DataError, match="at least one"):
        cur.private_mean([])
    with pytest.raises(ValueError, match="variance_epsilon"):
        cur.private_variance([0.5, 0.7])
    with pytest.raises(ParameterError, match="grid_steps"):
        DiscreteMeanCurator(lower=0, upper=1, epsilon=1, grid_steps=0)


# ----- (2) the sampler: the noise added fits the discrete Laplace ------------------------------------------------
def chi_square_pvalue(draws: np.ndarray, t: float) -> float:
    """χ² of the draws against the pmf: integer bins when t is small, else ~40 bins of width t/4 (the tails
    pooled), each bin's probability from the closed-form cdf."""
    if t < 20:
        edges = np.arange(-math.ceil(6 * t), math.ceil(6 * t) + 1)
    else:
        edges = np.unique(np.round(np.linspace(-5, 5, 41) * t))
    probs = np.diff(np.concatenate([[0.0], cdf(edges, t), [1.0]]))  # (−∞, e0], (e0, e1], …, (e_last, ∞)
    observed = np.bincount(np.searchsorted(edges, draws, side="left"), minlength=len(probs))
    return float(stats.chisquare(observed, probs * len(draws)).pvalue)


@pytest.mark.parametrize(("epsilon", "steps", "statistic"), [(1.0, K, "mean"), (0.8, K, "mean"), (2.0, 8, "mean"),
                                                             (0.2, K, "variance")])
def test_added_noise_fits_the_discrete_laplace(epsilon: float, steps: int, statistic: str) -> None:
    """All values at ``lower``: S = Q = 0, so the released integer W is the noise itself."""
    cur = DiscreteMeanCurator(lower=0, upper=1, epsilon=epsilon, variance_epsilon=epsilon, grid_steps=steps,
                              rng=np.random.default_rng(round(epsilon * 100) + steps))
    release = cur.private_mean if statistic == "mean" else cur.private_variance
    t = release([0.0, 0.0, 0.0]).release.scale
    draws = np.array([release([0.0, 0.0, 0.0]).release.noisy for _ in range(8000)])
    assert chi_square_pvalue(draws, t) > 1e-6
    assert chi_square_pvalue(draws, 1.2 * t) < 1e-6  # the test has power
    assert draws.var() == pytest.approx(variance(t), rel=0.1)


# ----- (3) the estimators by Monte Carlo -------------------------------------------------------------------------
def monte_carlo(estimates: np.ndarray, expected: float, var: float, t: float) -> tuple[float, float]:
    """(z of the mean against ``expected``, z of the sample variance against ``var``).

    Var(s²) ≈ (κ − 1)·var²/R with κ the kurtosis of the discrete Laplace: Y is the difference of two
    independent geometric variables (P[k] ∝ q^k), whose excess kurtosis is 6 + (1 − q)²/q; a difference
    halves it, so κ = 3 + 3 + (1 − q)²/(2q) (→ 6, the Laplace's, as t grows).
    """
    r = len(estimates)
    q = math.exp(-1.0 / t)
    kurtosis = 6 + math.expm1(-1.0 / t) ** 2 / (2 * q)
    z_mean = (estimates.mean() - expected) / math.sqrt(var / r)
    z_var = (estimates.var(ddof=1) - var) / (var * math.sqrt((kurtosis - 1) / r))
    return float(z_mean), float(z_var)


COARSE_GRID_CASES = {
    # the service's grid, random values (some clamped)
    "service grid": (1.0, K, TARGET_SCALE, np.random.default_rng(4).uniform(-1.0, 3.5, 40)),
    # 16 steps (a quarter each), values 0.4 of a step above a grid point: the snapped mean is 0.1 lower
    "values between grid points": (2.0, 16, TARGET_SCALE, -1 + (np.array([0, 3, 7, 12, 15, 2, 9]) + 0.4) / 4),
    # 64 steps, target scale 2: G = 32, the sum S = 32 is at the bottom of its cell, the midpoint 15.5 steps up
    "coarsened sum": (1.0, 64, 2, -1 + np.array([10.0, 20.0, 2.0, 0.0, 0.0]) / 16),
}


@pytest.mark.parametrize("case", list(COARSE_GRID_CASES))
def test_mean_is_the_snapped_mean_with_the_stated_variance(case: str) -> None:
    epsilon, steps, target, x = COARSE_GRID_CASES[case]
    lower, upper, n = -1.0, 3.0, len(x)
    cur = DiscreteMeanCurator(lower=lower, upper=upper, epsilon=epsilon, grid_steps=steps, target_scale=target,
                              rng=np.random.default_rng(7))
    runs = [cur.private_mean(x) for _ in range(6000)]
    g, t = runs[0].release.unit, runs[0].release.scale
    assert g == {"service grid": 256, "values between grid points": 1, "coarsened sum": 32}[case]
    s = sum(snap(x, lower, upper, steps))
    expected = lower + (upper - lower) * (g * (s // g) + (g - 1) / 2) / (steps * n)  # midpoint of the coarse cell
    var = ((upper - lower) * g / (steps * n)) ** 2 * variance(t)
    z_mean, z_var = monte_carlo(np.array([r.estimate for r in runs]), expected, var, t)
    assert abs(z_mean) < Z and abs(z_var) < Z
    assert runs[0].noise_variance == pytest.approx(var, rel=1e-9)
    clamped_mean = float(np.clip(x, lower, upper).mean())
    assert abs(expected - clamped_mean) <= runs[0].bias_bound
    if steps == K:  # the service's grid: the continuous formula A = 2Δ²/(ε²n²) is right to 2^-30
        assert var == pytest.approx(2 * (upper - lower) ** 2 / (epsilon * n) ** 2, rel=2.0**-30)
    else:  # a coarse grid: the expectation is not the clamped mean, and the Monte Carlo sees the difference
        raw_z, _ = monte_carlo(np.array([r.estimate for r in runs]), clamped_mean, var, t)
        assert abs(raw_z) > 10


def test_variance_is_the_snapped_sample_variance_with_the_stated_variance() -> None:
    lower, upper, eps_v, n = 0.0, 10.0, 4.0, 1000
    x = np.random.default_rng(3).beta(2, 5, n) * 10
    cur = DiscreteMeanCurator(lower=lower, upper=upper, epsilon=1.0, variance_epsilon=eps_v,
                              rng=np.random.default_rng(8))
    runs = [cur.private_variance(x) for _ in range(4000)]
    g, t = runs[0].release.unit, runs[0].release.scale
    k = snap(x, lower, upper, K)
    q = n * sum(v * v for v in k) - sum(k) ** 2
    unit = (upper - lower) ** 2 / (K * K * n * (n - 1))
    expected = unit * (g * (q // g) + (g - 1) / 2)
    var = (unit * g) ** 2 * variance(t)
    assert min(expected, 25.0 - expected) > 60 * unit * g * t  # 60 noise scales: the clip to [0, Δ²/4] never acts
    z_mean, z_var = monte_carlo(np.array([r.estimate for r in runs]), expected, var, t)
    assert abs(z_mean) < Z and abs(z_var) < Z
    assert runs[0].noise_variance == pytest.approx(var, rel=1e-9)
    # the float mechanism's scale Δ²/(n·ε_v): the same noise, to 2^-30
    assert var == pytest.approx(2 * ((upper - lower) ** 2 / (n * eps_v)) ** 2, rel=2.0**-30)
    assert abs(expected - float(np.var(x, ddof=1))) <= runs[0].bias_bound


def test_variance_clip_and_a_single_user() -> None:
    cur = DiscreteMeanCurator(lower=0, upper=2, epsilon=1, variance_epsilon=1e-3, rng=np.random.default_rng(2))
    out = [cur.private_variance([0.0, 2.0, 1.0]).estimate for _ in range(200)]
    assert min(out) == 0.0 and max(out) == 1.0  # Δ²/4 = 1, noise scale Δ²/(n ε_v) ≈ 1333: both clips hit
    one = cur.private_variance([1.5])  # n = 1: s² := 0 plus noise of scale Δ²/ε_v, as the float mechanism
    assert one.release.sensitivity * one.release.unit >= K * K
    assert one.noise_variance == pytest.approx(2 * (4 / 1e-3) ** 2, rel=2.0**-30)


# ----- (4) production: the OS CSPRNG --------------------------------------------------------------------------
def test_without_a_generator_every_integer_comes_from_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    cur = DiscreteMeanCurator(lower=0, upper=1, epsilon=1.0, variance_epsilon=0.5)
    assert isinstance(cur.noise.rng, SecretsIntegers)
    calls = counting_randbelow(monkeypatch)
    cur.private_mean([0.25, 0.5])
    cur.private_variance([0.25, 0.5])
    assert len(calls) >= 2 * 4  # U, its acceptance, ≥ 1 geometric step, the sign
    # randbelow(n) = n − 1 fixes every draw: U = t − 1 accepted, V = 0, sign −, so W = ⌊S/G⌋ − (t − 1)
    counting_randbelow(monkeypatch, fake=lambda n: n - 1)
    rel = cur.private_mean([0.25, 0.5]).release
    s = sum(snap(np.array([0.25, 0.5]), 0, 1, K))
    assert rel.noisy == s // rel.unit - (rel.scale - 1)


class _FakeStore:
    def __init__(self, values: list[tuple[int, float]]) -> None:
        self.values = values

    def optin_values(self, num: int) -> tuple[np.ndarray, np.ndarray]:
        users = np.array([u for u, _ in self.values], dtype=np.int64)
        return users, np.array([v for _, v in self.values])


@pytest.mark.parametrize("sigma2", [None, 4.0])
def test_the_service_mean_round_uses_the_os_csprng_unless_seeded(monkeypatch: pytest.MonkeyPatch,
                                                                 sigma2: float | None) -> None:
    from hybriddp.service.roundparams import mean_mechanism
    from hybriddp.service.rounds import _curate_mean

    params = {"epsilon": 1.0, "lower": 0.0, "upper": 10.0, "sigma2": sigma2, "variance_share": 0.2, "seed": None}
    store = _FakeStore([(1, 2.0), (1, 4.0), (2, 25.0), (3, 5.5), (4, 7.0)])
    info = SimpleNamespace(num=1, id="r-1", params=params)
    calls = counting_randbelow(monkeypatch)
    _, estimates = _curate_mean(store, info)
    assert len(calls) >= (8 if sigma2 is None else 4)  # every draw from the OS
    assert set(estimates) == {"format", "version", "headlist", "n_optin", "mean", "sigma2", "sigma2_source"}
    assert estimates["n_optin"] == 4 and isinstance(estimates["mean"], float)
    assert estimates["sigma2_source"] == ("private estimate" if sigma2 is None else "given")
    assert 0.0 <= estimates["sigma2"] <= 25.0 and (sigma2 is None or estimates["sigma2"] == sigma2)
    assert isinstance(mean_mechanism(params), HybridUnknownVariance if sigma2 is None else Hybrid)
    # a seeded round (experiments only) draws from its generator, reproducibly, and never from the OS
    calls.clear()
    seeded = SimpleNamespace(num=1, id="r-1", params={**params, "seed": 5})
    first, again = _curate_mean(store, seeded)[1], _curate_mean(store, seeded)[1]
    assert calls == [] and first == again

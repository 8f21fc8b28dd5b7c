"""The noise of the curator (core/noise.py): the exact discrete Laplace sampler (CKS 2020), checked statistically
and traced draw by draw with scripted integers; its rational scale, never below 2m_O/ε; its pmf, tail, variance,
survival and head-list threshold τ_d, by hand, by exact summation and in 50-digit decimals; the Laplace noise's
closed forms; the factory.

Expected values come from an independent derivation (exact fractions, exact summation, high-precision decimals,
hand-computed cases), never from the formula under test.
"""

from __future__ import annotations

import itertools
import math
import re
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from hybriddp.core import noise as noise_mod
from hybriddp.core.errors import ParameterError
from hybriddp.core.noise import (
    MAX_DENOMINATOR,
    NOISE_LABELS,
    DiscreteLaplaceNoise,
    LaplaceNoise,
    _bernoulli_exp_frac,
    _farey_successor,
    ceil_fraction,
    discrete_laplace_pmf,
    discrete_laplace_tail,
    discrete_laplace_variance,
    effective_scale,
    noise_factory,
    rational_scale,
    sample_discrete_laplace,
)
from hybriddp.core.params import head_list_threshold
from hybriddp.curator.mechanisms import create_head_list
from secretshelpers import counting_randbelow


class IntegerOnlyGenerator:
    """Wraps a Generator and refuses every floating-point draw."""

    def __init__(self, seed: int) -> None:
        self._g = np.random.default_rng(seed)

    def integers(self, *args, **kwargs):
        return self._g.integers(*args, **kwargs)

    def __getattr__(self, name: str):
        raise AssertionError(f"floating-point draw {name} used by the discrete sampler")


# ----- rational_scale: the smallest bounded-denominator rational not below the float scale ------------

def _brute_ceil_fraction(x: Fraction, n: int) -> Fraction:
    """min over q ≤ n of ⌈x·q⌉/q: the smallest p/q ≥ x, by enumeration."""
    return min(Fraction(-(-x.numerator * q // x.denominator), q) for q in range(1, n + 1))


def _brute_rational_scale(scale: float, n: int) -> Fraction:
    """min over q ≤ n of the smallest p/q whose float is ≥ scale, by enumeration."""
    best = None
    for q in range(1, n + 1):
        p = math.floor(Fraction(math.nextafter(scale, 0.0)) * q)  # its float is below scale
        while float(Fraction(p, q)) < scale:
            p += 1
        if best is None or Fraction(p, q) < best:
            best = Fraction(p, q)
    return best


@pytest.mark.parametrize(("eps", "m_o", "expected"), [
    (5.0, 1, Fraction(2, 5)), (2.5, 1, Fraction(4, 5)), (1.2, 1, Fraction(5, 3)), (4.0, 1, Fraction(1, 2)),
    (5.0, 2, Fraction(4, 5)), (2.5, 2, Fraction(8, 5)), (1.2, 2, Fraction(10, 3)), (0.75, 1, Fraction(8, 3)),
    (7.3, 1, Fraction(20, 73)),
])
def test_rational_scale_is_exact_when_the_scale_is_a_small_fraction(eps: float, m_o: int, expected: Fraction) -> None:
    """2m_O/ε = 2/5 at ε = 5 gives t = 2/5 exactly (it was 3/5: 50% more curator noise)."""
    assert rational_scale(2 * m_o / eps) == expected


@pytest.mark.parametrize("m_o", [1, 2, 3, 7])
def test_rational_scale_never_below_and_within_one_step(m_o: int) -> None:
    for eps in [*np.round(np.arange(0.7, 12.0, 0.01), 2).tolist(), math.log(3), math.pi, 1 / 0.3]:
        b = 2 * m_o / eps
        t = rational_scale(b)
        assert float(t) >= b and t.denominator <= MAX_DENOMINATOR
        assert t - Fraction(b) <= Fraction(1, MAX_DENOMINATOR)


def _scales(rng: np.random.Generator, n: int) -> list[float]:
    """Floats of small fractions and their float neighbours, uniform and log-uniform floats."""
    out = []
    for _ in range(300):
        f = float(Fraction(int(rng.integers(1, 40 * n)), int(rng.integers(1, 2 * n))))
        out += [f, math.nextafter(f, 0.0), math.nextafter(f, math.inf)]
    out += rng.uniform(0.01, 30.0, 300).tolist() + np.exp(rng.uniform(-8, 8, 300)).tolist()
    return [*out, 2.0**53 + 2, 2.0**40, 1.0, 3.0]  # 2^53 + 2: the tie below it rounds down


@pytest.mark.parametrize("n", [1, 2, 7, 64, 97])
def test_rational_scale_and_ceil_fraction_match_brute_force(n: int) -> None:
    rng = np.random.default_rng(n)
    for scale in _scales(rng, n):
        assert rational_scale(scale, n) == _brute_rational_scale(scale, n), scale
        x = Fraction(scale) + Fraction(int(rng.integers(0, 3)), 10**30)
        assert ceil_fraction(x, n) == _brute_ceil_fraction(x, n), x


def test_rational_scale_tie_rounding_down_takes_the_next_fraction() -> None:
    """Below 2^53 + 2 the real 2^53 + 1 rounds (to even) down, so t is the next fraction above it."""
    assert rational_scale(2.0**53 + 2, 1000) == 2**53 + 1 + Fraction(1, 1000)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_rational_scale_rejects_bad_scales(bad: float) -> None:
    with pytest.raises(ParameterError, match="noise scale"):
        rational_scale(bad)


# (ε, m_O) pairs: scales 2m_O/ε that are small fractions (1/2, 2/5, 4/3) and ones that are not
SCALE_CASES = [(4.0, 1), (5.0, 1), (1.5, 1), (4.0, 2), (1.2, 1), (0.7, 3), (math.pi, 2), (math.log(3), 1),
               (7.3, 3), (2.9, 2)]
ULP_SLACK = Fraction(1, 2**52)  # t may lie below the float b by at most b·2^-53 (b itself is rounded)


def _true_scale(eps: float, m_o: int) -> Fraction:
    """2m_O/ε exactly, for the float ε given (not the float quotient)."""
    return Fraction(2 * m_o) / Fraction(eps)


@pytest.mark.parametrize(("eps", "m_o"), SCALE_CASES)
def test_rational_scale_is_never_below_two_m_over_epsilon(eps: float, m_o: int) -> None:
    """The scale is rounded up, never down: t must be ≥ the exact 2m_O/ε (to the float's precision),
    have a denominator ≤ 2^20, and be the smallest such fraction: enumerated over every denominator."""
    exact = _true_scale(eps, m_o)
    t = rational_scale(2 * m_o / eps)
    assert MAX_DENOMINATOR == 2**20  # ALGORITHM.md §3.2
    assert t.denominator <= 2**20
    assert t >= exact * (1 - ULP_SLACK)
    assert t - exact <= Fraction(1, 2**20)
    if exact.denominator <= 1000:  # a small fraction is used exactly (1/2 at ε = 4, 2/5 at ε = 5, 4/3 at 1.5)
        assert t == exact.limit_denominator(1000)


@pytest.mark.parametrize(("eps", "m_o"), SCALE_CASES)
@pytest.mark.parametrize("max_den", [1, 3, 10, 97])
def test_rational_scale_with_small_denominator_is_the_enumerated_ceiling(eps: float, m_o: int, max_den: int) -> None:
    """With denominators ≤ N the answer is the smallest p/q (q ≤ N) whose float is ≥ the float b, by
    enumeration: ⌈b·q⌉/q, or (⌈b·q⌉ − 1)/q when that rounds to a float ≥ b (e.g. 5/3 for b = 2/1.2,
    which lies 10⁻¹⁶ above 5/3). A rounded-down t would be a smaller fraction whose float is below b."""
    b = 2 * m_o / eps
    fb = Fraction(b)

    def smallest_over(q: int) -> Fraction:
        p = -((-fb.numerator * q) // fb.denominator)
        return Fraction(p - 1, q) if float(Fraction(p - 1, q)) >= b else Fraction(p, q)

    expected = min(smallest_over(q) for q in range(1, max_den + 1))
    t = rational_scale(b, max_den)
    assert t == expected
    assert float(t) >= b and t >= fb * (1 - ULP_SLACK)


@pytest.mark.parametrize(("bad", "shown"), [(0.0, "0.0"), (-1.0, "-1.0"), (math.inf, "inf"), (math.nan, "nan")])
def test_rational_scale_refusal_message(bad: float, shown: str) -> None:
    with pytest.raises(ParameterError, match="^" + re.escape(
            f"noise scale = {shown} is not allowed: it must be a finite number > 0.") + "$"):
        rational_scale(bad)
    assert rational_scale(5e-324) == Fraction(1, 2**20)  # the smallest positive scale is allowed


def test_ceil_fraction_by_hand() -> None:
    """The smallest p/q ≥ x with q ≤ N, found by listing every q ≤ N here:
    x = 0.3 = 3/10 itself when N ≥ 10; N = 7: 1/3 (2/7 < 0.3 < 1/3); N = 3: 1/3; N = 2: 1/2; N = 1: 1.
    x = 355/113 (π's convergent), N = 100: 22/7; N = 7: 22/7; N = 6: 19/6; N = 1: 4."""
    cases = [(Fraction(3, 10), 10, Fraction(3, 10)), (Fraction(3, 10), 7, Fraction(1, 3)),
             (Fraction(3, 10), 3, Fraction(1, 3)), (Fraction(3, 10), 2, Fraction(1, 2)), (Fraction(3, 10), 1, 1),
             (Fraction(355, 113), 100, Fraction(22, 7)), (Fraction(355, 113), 7, Fraction(22, 7)),
             (Fraction(355, 113), 6, Fraction(19, 6)), (Fraction(355, 113), 1, 4), (Fraction(7, 2), 1, 4),
             (Fraction(-3, 10), 2, 0), (Fraction(5, 1), 1, 5)]
    for x, n, expected in cases:
        brute = _brute_ceil_fraction(x, n)
        assert brute == expected
        assert ceil_fraction(x, n) == expected, (x, n)


@pytest.mark.parametrize("n", [1, 2, 5, 7, 12])
def test_farey_successor_by_enumeration(n: int) -> None:
    """The right neighbour of every p/q (q ≤ N) in [0, 3] among the fractions with denominator ≤ N,
    found by listing them all."""
    grid = sorted({Fraction(p, q) for q in range(1, n + 1) for p in range(0, 4 * q + 1)})
    for x, nxt in itertools.pairwise(grid):
        if x < 3:
            assert _farey_successor(x, n) == nxt, (x, n)


def test_effective_scale() -> None:
    """Laplace draws at the nominal scale; discrete at the rational t: 2/5 exactly for 0.4, and for π the
    fraction with denominator ≤ 2^20 just above π (not π itself)."""
    assert effective_scale("laplace", math.pi) == math.pi
    assert effective_scale("discrete", 0.4) == 0.4
    t = effective_scale("discrete", math.pi)
    assert math.pi < t <= math.pi + 2.0**-20
    assert float(Fraction(t).limit_denominator(2**20)) == t


# ----- the exact sampler: traced by hand with scripted integers, its scale, its law ---------------------------



def _chi_square_pvalue(x: np.ndarray, scale: float) -> float:
    """Chi-square p-value of draws ``x`` against the exact pmf; cells with < 5 expected pooled."""
    lim = max(3, int(6 * scale))
    values = np.arange(-lim, lim + 1)
    observed = np.array([(x == v).sum() for v in values] + [(np.abs(x) > lim).sum()])
    p = discrete_laplace_pmf(values, scale)
    expected = np.append(p, max(0.0, 1 - p.sum())) * len(x)
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] < 5:  # fold a tiny remainder into the last big cell
        obs[-2] += obs[-1]
        exp[-2] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("scale", [0.5, 2 / 1.5, 2.0, 8.0, 2 / 0.3])
def test_sampler_matches_pmf_chi_square(scale: float) -> None:
    t = rational_scale(scale)
    x = sample_discrete_laplace(IntegerOnlyGenerator(int(scale * 100)), t, 200_000)
    assert _chi_square_pvalue(x, float(t)) > 1e-6
    assert x.var() == pytest.approx(discrete_laplace_variance(float(t)), rel=0.05)


class ScriptedIntegers:
    """Stands in for the integer source: ``integers(low, high, size)`` hands out the next scripted values (one per
    element of an array ``high``, or ``size`` of them) and records each call as (low, high, size)."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)
        self.calls: list[tuple] = []

    def integers(self, low: int, high, size: int | None = None) -> np.ndarray:
        if np.ndim(high):
            highs = [int(h) for h in np.asarray(high)]
            self.calls.append((low, highs, size))
        else:
            highs = [int(high)] * size
            self.calls.append((low, int(high), size))
        out = [self.values.pop(0) for _ in highs]
        assert all(low <= v < h for v, h in zip(out, highs, strict=True)), (out, highs)  # a valid script
        return np.array(out, dtype=np.int64)


# scale 3/2 (CKS20: t = 3, s = 2), two draws. Round 1 (both pending): U = (0, 1); Bernoulli(e^{−U/3}) by K = 1, 2, ..:
# A ~ [integers(0, 3K) < U]: U = 0 stops at once (K = 1, odd: accept); U = 1: 0 < 1 (K = 2), 1 < 1 no: K = 2 even,
# reject. V for U = 0: steps Bernoulli(e^{−1}) = [0 < 1], [0 < 1], [2 < 1] → K = 3 odd: a step; then [0 < 1],
# [1 < 1] → K = 2: stop; V = 1. Y = ⌊(0 + 3·1)/2⌋ = 1, B = 0: +1 for the first draw.
# Round 2 (the second draw): U = 0 accepted ([1 < 0] no); V = 0; Y = 0 with B = 1: rejected (−0 would double 0).
# Round 3: U = 2 accepted ([2 < 2] no); V = 0; Y = ⌊2/2⌋ = 1, B = 1: −1.
SCRIPT = [0, 1, 0, 0, 1, 0, 0, 2, 0, 1, 0,
          0, 1, 0, 1, 1,
          2, 2, 0, 1, 1]
CALLS = [(0, 3, 2), (0, [3, 3], None), (0, [6], None), (0, [1], None), (0, [2], None), (0, [3], None),
         (0, [1], None), (0, [2], None), (0, 2, 1),
         (0, 3, 1), (0, [3], None), (0, [1], None), (0, [2], None), (0, 2, 1),
         (0, 3, 1), (0, [3], None), (0, [1], None), (0, [2], None), (0, 2, 1)]


def test_discrete_laplace_sampler_traced_by_hand() -> None:
    src = ScriptedIntegers(*SCRIPT)
    got = sample_discrete_laplace(src, Fraction(3, 2), 2)
    assert got.tolist() == [1, -1] and got.dtype == np.int64
    assert src.calls == CALLS and src.values == []
    src = ScriptedIntegers(*SCRIPT)  # the noise class uses the rational scale 3/2 of the float 1.5
    x = DiscreteLaplaceNoise(src).sample(1.5, 2)
    assert x.tolist() == [1.0, -1.0] and x.dtype == np.float64 and src.calls == CALLS
    assert sample_discrete_laplace(ScriptedIntegers(), Fraction(3, 2), 0).tolist() == []


def test_bernoulli_exp_frac_traced_by_hand() -> None:
    """Three Bernoulli(e^{−num/5}) at once: num = 0 stops at K = 1 (true); num = 4: [3 < 4] (K = 2), [9 < 4] no:
    false; num = 5: [4 < 5], [1 < 5] (K = 3), [14 < 5] no: true."""
    src = ScriptedIntegers(0, 3, 4, 9, 1, 14)
    got = _bernoulli_exp_frac(src, np.array([0, 4, 5]), 5)
    assert got.tolist() == [True, False, True]
    assert src.calls == [(0, [5, 5, 5], None), (0, [10, 10], None), (0, [15], None)]


@pytest.mark.parametrize(("eps", "m_o"), SCALE_CASES)
def test_discrete_noise_samples_variance_and_survival_use_a_scale_of_at_least_two_m_over_epsilon(
        monkeypatch: pytest.MonkeyPatch, eps: float, m_o: int) -> None:
    """The sampler's scale, checked against 2m_O/ε itself (not against the pmf at the same scale):
    the Fraction that DiscreteLaplaceNoise.sample hands to the exact sampler is ≥ 2m_O/ε."""
    seen: list[Fraction] = []
    real = noise_mod.sample_discrete_laplace

    def spy(rng, scale: Fraction, size: int) -> np.ndarray:
        seen.append(scale)
        return real(rng, scale, size)

    monkeypatch.setattr(noise_mod, "sample_discrete_laplace", spy)
    noise = DiscreteLaplaceNoise(np.random.default_rng(1))
    noise.sample(2 * m_o / eps, 5)
    exact = _true_scale(eps, m_o)
    assert len(seen) == 1 and isinstance(seen[0], Fraction)
    assert exact * (1 - ULP_SLACK) <= seen[0] <= exact + Fraction(1, 2**20)
    # the variance and survival the estimators use are those of a scale within 2^-20 above 2m_O/ε:
    # Var = 2q/(1−q)², q = e^{−1/t}, is increasing in t
    def var_at(t: float) -> float:
        q = math.exp(-1 / t)
        return 2 * q / (1 - q) ** 2

    lo, hi = float(exact), float(exact + Fraction(1, 2**20))
    assert var_at(lo) * (1 - 1e-12) <= noise.variance(2 * m_o / eps) <= var_at(hi) * (1 + 1e-12)


@pytest.mark.parametrize(("eps", "m_o"), [(4.0, 1), (1.2, 1), (2.0, 3)])
def test_sampler_scale_matches_two_m_over_epsilon_statistically(eps: float, m_o: int) -> None:
    """200,000 seeded draws: the mean of |Y| against its exact expectation at t = 2m_O/ε, computed by
    summing |y|·P[y] by hand (P[y] ∝ e^{−|y|/t}); a z-test at p ≈ 1e-7. The same draws are far from
    the value at a 5% smaller scale, so the test has power."""
    n = 200_000
    x = DiscreteLaplaceNoise(np.random.default_rng(17 + m_o)).sample(2 * m_o / eps, n)

    def moments(t: float) -> tuple[float, float]:
        ys = range(1, 4000)
        z = 1 + 2 * math.fsum(math.exp(-y / t) for y in ys)
        m1 = 2 * math.fsum(y * math.exp(-y / t) for y in ys) / z
        m2 = 2 * math.fsum(y * y * math.exp(-y / t) for y in ys) / z
        return m1, m2 - m1 * m1

    mean, var = moments(2 * m_o / eps)
    z_score = (np.abs(x).mean() - mean) / math.sqrt(var / n)
    assert abs(z_score) < 5.3  # two-sided p ≈ 1.2e-7
    mean_small, var_small = moments(0.95 * 2 * m_o / eps)
    assert abs((np.abs(x).mean() - mean_small) / math.sqrt(var_small / n)) > 5.3


def test_seeded_noise_is_reproducible_and_float() -> None:
    a = LaplaceNoise(np.random.default_rng(5)).sample(1.0, 8)
    b = LaplaceNoise(np.random.default_rng(5)).sample(1.0, 8)
    assert np.array_equal(a, b) and a.dtype == np.float64
    d = DiscreteLaplaceNoise(np.random.default_rng(5)).sample(0.5, 8)
    assert d.dtype == np.float64 and np.array_equal(d, DiscreteLaplaceNoise(np.random.default_rng(5)).sample(0.5, 8))
    assert np.array_equal(d, np.round(d))


# ----- production randomness: rng=None draws from the OS -----------------------------------------------

@pytest.mark.parametrize(("scale", "wrong"), [(Fraction(5, 3), Fraction(2)), (Fraction(2), Fraction(5, 3))])
def test_os_randomness_sampler_matches_pmf_chi_square(scale: Fraction, wrong: Fraction) -> None:
    """rng=None: OS randomness, so not seeded; p > 1e-6 makes a false alarm a one-in-a-million event.

    40 000 draws reject the neighbouring scale (5/3 vs 2: the old rounding at ε = 1.2) at p < 1e-6
    essentially always (p is typically below 1e-100 there), so the test has power.
    """
    x = DiscreteLaplaceNoise(None).sample(float(scale), 40_000)
    assert _chi_square_pvalue(x, float(scale)) > 1e-6
    assert _chi_square_pvalue(x, float(wrong)) < 1e-6


def test_discrete_noise_without_rng_draws_every_integer_from_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting_randbelow(monkeypatch)
    x = DiscreteLaplaceNoise(None).sample(5 / 3, 200)
    assert len(x) == 200 and len(calls) >= 4 * 200  # U, its acceptance, ≥ 1 geometric step, the sign
    # with randbelow(n) = n − 1 the draw is fully determined: U = 4, accepted, V = 0, Y = ⌊4/3⌋ = 1, sign −
    counting_randbelow(monkeypatch, fake=lambda n: n - 1)
    assert DiscreteLaplaceNoise().sample(5 / 3, 50).tolist() == [-1.0] * 50


def test_laplace_noise_without_rng_is_seeded_from_the_os(monkeypatch: pytest.MonkeyPatch) -> None:
    import secrets

    calls: list[int] = []
    real = secrets.randbits
    monkeypatch.setattr(secrets, "randbits", lambda k: calls.append(k) or real(k))
    a, b = LaplaceNoise(None), LaplaceNoise()
    assert calls == [128, 128] and isinstance(a.rng, np.random.Generator)
    assert not np.array_equal(a.sample(1.0, 8), b.sample(1.0, 8))


def test_secrets_integers_bounds_shapes_and_uniformity() -> None:
    from hybriddp.core.rng import SecretsIntegers

    r = SecretsIntegers()
    high = np.array([1, 2, 3, 1000])
    draws = np.array([r.integers(0, high) for _ in range(300)])
    assert draws.shape == (300, 4) and (draws >= 0).all() and (draws < high).all()
    assert set(draws[:, 1].tolist()) == {0, 1} and set(draws[:, 2].tolist()) == {0, 1, 2}
    assert r.integers(5, 6, (2, 3)).tolist() == [[5] * 3] * 2
    x = r.integers(0, 7, 35_000)
    assert x.dtype == np.int64 and stats.chisquare(np.bincount(x, minlength=7)).pvalue > 1e-6
    with pytest.raises(ParameterError, match="high > low"):
        r.integers(0, np.array([3, 0]))


# ----- pmf, tail, variance and survival; the head-list threshold τ_d ------------------------------------------

def test_pmf_sums_to_one_and_tail_formula() -> None:
    for t in (0.5, 1.3, 5.0):
        y = np.arange(-400, 401)
        assert discrete_laplace_pmf(y, t).sum() == pytest.approx(1.0, abs=1e-12)
        for k in (1, 2, 7):
            assert discrete_laplace_tail(k, t) == pytest.approx(discrete_laplace_pmf(np.arange(k, 2000), t).sum())
        assert discrete_laplace_tail(0, t) == pytest.approx(discrete_laplace_pmf(np.arange(0, 2000), t).sum())


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0, 7.3])
@pytest.mark.parametrize("m_o", [1, 2])
def test_exact_dp_of_discrete_laplace_on_counts(eps: float, m_o: int) -> None:
    """Counts with L1 sensitivity 2m_O: the pmf ratio at every output is ≤ e^ε (exact, closed form)."""
    t = rational_scale(2 * m_o / eps)
    assert float(t) >= 2 * m_o / eps  # never a smaller scale than asked (to the float's precision)
    y = np.arange(-60, 61)
    for shift in range(1, 2 * m_o + 1):
        log_ratio = np.log(discrete_laplace_pmf(y, float(t))) - np.log(discrete_laplace_pmf(y - shift, float(t)))
        assert log_ratio.max() <= eps + 1e-9
    # attained at the full sensitivity, so the test is tight
    worst = np.log(discrete_laplace_pmf(0, float(t))) - np.log(discrete_laplace_pmf(2 * m_o, float(t)))
    assert worst == pytest.approx(2 * m_o / float(t)) and worst == pytest.approx(eps, rel=1e-5)


def test_discrete_laplace_closed_forms_by_hand() -> None:
    """t = 1/ln 2, so e^{−1/t} = 1/2: P[0] = (1/2)/(3/2) = 1/3, P[±1] = 1/6, P[±2] = 1/12; P[Y ≥ 1] = 1/3,
    P[Y ≥ 2] = 1/6, P[Y ≥ 0] = 2/3, P[Y ≥ −1] = 5/6; Var = 2·(1/2)/(1/2)² = 4."""
    t = 1 / math.log(2.0)
    np.testing.assert_allclose(discrete_laplace_pmf(np.array([0, 1, -1, 2, -2]), t),
                               [1 / 3, 1 / 6, 1 / 6, 1 / 12, 1 / 12], rtol=1e-14)
    assert float(discrete_laplace_pmf(3, t)) == pytest.approx(1 / 24, rel=1e-14)
    for k, tail in [(1, 1 / 3), (2, 1 / 6), (3, 1 / 12), (0, 2 / 3), (-1, 5 / 6), (-2, 11 / 12)]:
        assert discrete_laplace_tail(k, t) == pytest.approx(tail, rel=1e-14)
    assert discrete_laplace_variance(t) == pytest.approx(4.0, rel=1e-14)
    noise = DiscreteLaplaceNoise(np.random.default_rng(0))
    # survival(x) = P[Y > x] = P[Y ≥ ⌊x⌋ + 1] at the rational scale of 1/ln 2 (within 2^-20 of it)
    t_used = effective_scale("discrete", t)
    assert abs(t_used - t) < 2.0**-20 and t_used >= t
    for x, k in [(0.0, 1), (0.5, 1), (1.0, 2), (-0.5, 0), (-1.0, 0), (-1.5, -1)]:
        assert noise.survival(x, t) == pytest.approx(discrete_laplace_tail(k, t_used), rel=1e-14)
    assert noise.variance(t) == pytest.approx(discrete_laplace_variance(t_used), rel=1e-14)


def _tail_by_summation(k: int, t: float) -> float:
    """P[Y ≥ k] for the discrete Laplace at scale t, summing the pmf (1−q)/(1+q)·q^|y| term by term."""
    q = math.exp(-1 / t)
    c = (1 - q) / (1 + q)
    if k >= 0:
        return math.fsum(c * q**y for y in range(k, k + 20_000))
    return 1 - math.fsum(c * q ** abs(y) for y in range(-20_000, k))


@pytest.mark.parametrize("t", [0.5, 4 / 3, 2.0, 7.0])
@pytest.mark.parametrize("k", [-5, -2, -1, 0, 1, 3])
def test_discrete_laplace_tail_for_every_integer_k(t: float, k: int) -> None:
    """P[Y ≥ k] by summing the pmf, for negative k too (the symmetry branch)."""
    assert discrete_laplace_tail(k, t) == pytest.approx(_tail_by_summation(k, t), rel=1e-12, abs=1e-15)


def test_laplace_noise_closed_forms_by_hand() -> None:
    """b = 2: Var = 2b² = 8; P[Y > 2 ln 2] = ½·½ = 1/4, P[Y > 0] = 1/2, P[Y > −2 ln 2] = 3/4."""
    noise = LaplaceNoise(np.random.default_rng(0))
    assert noise.variance(2.0) == 8.0 and noise.variance(0.5) == 0.5
    ln2 = math.log(2.0)
    assert noise.survival(2 * ln2, 2.0) == pytest.approx(0.25, rel=1e-15)
    assert noise.survival(0.0, 2.0) == 0.5
    assert noise.survival(-2 * ln2, 2.0) == pytest.approx(0.75, rel=1e-15)
    assert noise.survival(-4 * ln2, 2.0) == pytest.approx(0.875, rel=1e-15)


@pytest.mark.parametrize(("x", "b", "expected"), [
    (0.0, 1.0, 0.5), (1.0, 1.0, 0.5 * math.exp(-1)), (2.0, 4.0, 0.5 * math.exp(-0.5)),
    (-1.0, 1.0, 1 - 0.5 * math.exp(-1)), (-2.0, 4.0, 1 - 0.5 * math.exp(-0.5)), (-3.0, 0.5, 1 - 0.5 * math.exp(-6)),
])
def test_laplace_survival_by_hand(x: float, b: float, expected: float) -> None:
    """P[Y > x] for Y ~ Laplace(0, b): ½e^{−x/b} above 0, 1 − ½e^{x/b} below."""
    assert LaplaceNoise(np.random.default_rng(0)).survival(x, b) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("eps", [0.75, 1.0, 2.0, 4.0, 6.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-7, 1e-5, 1e-3, 0.05])
def test_threshold_single_record_survives_with_at_most_half_delta_exactly(eps: float, delta: float) -> None:
    """τ_d is the smallest integer with P[1 + Y > τ_d] ≤ δ/2 (closed form, m_O = 1)."""
    noise = DiscreteLaplaceNoise(np.random.default_rng(0))
    tau_d = noise.head_list_threshold(eps, delta, 1)
    assert tau_d == int(tau_d)
    t = float(rational_scale(2 / eps))
    survive = discrete_laplace_tail(int(tau_d), t)  # P[Y ≥ τ_d] = P[1 + Y > τ_d]
    assert survive <= delta / 2
    if tau_d > 1:
        assert discrete_laplace_tail(int(tau_d) - 1, t) > delta / 2  # and one lower would not do
    assert noise.survival(tau_d - 1, 2 / eps) == pytest.approx(survive)
    # never a lower bar than the continuous formula needs to give the same δ guarantee
    assert tau_d <= math.ceil(head_list_threshold(eps, delta, 1))


def test_threshold_sampled_single_record_survival() -> None:
    """Sampled: 10^6 singletons through CreateHeadList with discrete noise survive at ≤ δ/2."""
    eps, delta = 4.0, 0.02
    noise = DiscreteLaplaceNoise(np.random.default_rng(5))
    n = 1_000_000
    q = np.arange(n)
    hl = create_head_list(q, np.zeros(n, dtype=np.int64), epsilon=eps, delta=delta, m_o=1, noise=noise)
    p = discrete_laplace_tail(int(noise.head_list_threshold(eps, delta, 1)), float(rational_scale(2 / eps)))
    assert p <= delta / 2
    assert stats.binomtest(hl.n_queries, n, p).pvalue > 1e-6


def test_m_o_above_one_uses_ceiling_of_continuous_threshold() -> None:
    noise = DiscreteLaplaceNoise(np.random.default_rng(0))
    assert noise.head_list_threshold(4.0, 1e-5, 3) == math.ceil(head_list_threshold(4.0, 1e-5, 3))


def _continuous_tau(eps: float, delta: float, m_o: int) -> Decimal:
    """τ = (2m_O/ε)·ln((e^{ε/2} + m_O − 1)/δ), in 50-digit decimals (ALGORITHM.md §3)."""
    getcontext().prec = 50
    e, d = Decimal(eps), Decimal(delta)
    return (2 * m_o / e) * (((e / 2).exp() + m_o - 1) / d).ln()


@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0, 6.5])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-7, 1e-9])
def test_discrete_threshold_m_o_1_is_smallest_k_by_exact_summation(eps: float, delta: float) -> None:
    """m_O = 1: τ_d = the smallest integer k ≥ 1 with P[Y ≥ k] ≤ δ/2 (ALGORITHM.md §3.2), P by summation."""
    t = 2 / eps  # these ε give small-fraction scales, used exactly
    assert rational_scale(t) == Fraction(2) / Fraction(eps)
    k = 1
    while _tail_by_summation(k, t) > delta / 2:
        k += 1
    assert abs(_tail_by_summation(k, t) / (delta / 2) - 1) > 1e-6  # not a rounding coin-flip
    assert DiscreteLaplaceNoise(np.random.default_rng(0)).head_list_threshold(eps, delta, 1) == k


def test_discrete_threshold_known_values() -> None:
    """ALGORITHM.md §3.2: ε = 4 gives τ_d = 7 at δ = 1e-5 and 9 at δ = 1e-7 (m_O = 1); by hand for
    m_O = 2 at ε = 4, δ = 1e-5: b = 1, τ = ln(e² + 1) + 5·ln 10 = 2.1269 + 11.5129 = 13.64, so τ_d = 14
    (the m_O = 1 rule would give 12: e^{−k}/(1 + e^{−1}) ≤ 5e-6 from k = 12 on)."""
    noise = DiscreteLaplaceNoise(np.random.default_rng(0))
    assert noise.head_list_threshold(4.0, 1e-5, 1) == 7
    assert noise.head_list_threshold(4.0, 1e-7, 1) == 9
    assert noise.head_list_threshold(4.0, 1e-5, 2) == 14
    assert noise.head_list_threshold(4.0, 1e-5, 3) == 21  # b = 1.5, τ = 1.5·(2.2395 + 11.5129) = 20.63


@pytest.mark.parametrize("m_o", [2, 3])
@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-3), (2.0, 1e-5), (4.0, 1e-5), (4.0, 1e-7), (6.5, 1e-9)])
def test_discrete_threshold_m_o_above_one_is_ceiling_of_continuous_tau(m_o: int, eps: float, delta: float) -> None:
    """m_O > 1: τ_d = ⌈τ⌉ (ALGORITHM.md §3.2), τ in 50-digit decimals. The m_O = 1 rule
    would give a lower bar than the union bound of §3.1 needs."""
    tau = _continuous_tau(eps, delta, m_o)
    assert abs(tau - tau.to_integral_value()) > Decimal("1e-6")  # not a rounding coin-flip
    expected = int(tau.to_integral_value(rounding="ROUND_CEILING"))
    got = DiscreteLaplaceNoise(np.random.default_rng(0)).head_list_threshold(eps, delta, m_o)
    assert got == expected
    # the m_O = 1 rule at this scale would differ, so the m_O > 1 branch is what is checked
    t = 2 * m_o / eps
    k1 = 1
    while _tail_by_summation(k1, t) > delta / 2:
        k1 += 1
    assert k1 != expected


def test_discrete_threshold_when_the_tail_equals_half_delta_exactly() -> None:
    """τ_d is the smallest k with P[Y ≥ k] ≤ δ/2, equality allowed: with δ = 2·P[Y ≥ 5] (doubling is exact in
    floating point) that is k = 5, since P[Y ≥ 4] = e^{1/t}·P[Y ≥ 5] > δ/2."""
    for eps in (1.0, 2.5, 4.0):
        t = float(rational_scale(2.0 / eps))
        delta = 2.0 * discrete_laplace_tail(5, t)
        assert delta / 2 == discrete_laplace_tail(5, t) < discrete_laplace_tail(4, t)
        assert DiscreteLaplaceNoise(np.random.default_rng(0)).head_list_threshold(eps, delta, 1) == 5.0


def test_noise_factory_and_labels() -> None:
    assert noise_factory("discrete") is DiscreteLaplaceNoise
    assert noise_factory("laplace") is LaplaceNoise
    assert NOISE_LABELS == {"discrete": DiscreteLaplaceNoise.label, "laplace": LaplaceNoise.label}
    with pytest.raises(ValueError, match="--noise"):
        noise_factory("gaussian")


def test_noise_factory() -> None:
    assert noise_factory("discrete") is DiscreteLaplaceNoise and noise_factory("laplace") is LaplaceNoise
    with pytest.raises(ParameterError, match="^" + re.escape(
            "noise (--noise) = 'gauss' is not allowed: it must be 'discrete' or 'laplace'.") + "$"):
        noise_factory("gauss")


def test_sample_interface_returns_integers_as_floats() -> None:
    noise = DiscreteLaplaceNoise(np.random.default_rng(3))
    x = noise.sample(0.5, 1000)
    assert x.dtype == np.float64 and np.array_equal(x, np.round(x))
    assert noise.variance(0.5) == pytest.approx(discrete_laplace_variance(0.5))


@pytest.mark.parametrize("n", [2**60 + 2, 2**64 + 1, 2**70 + 3])
def test_ceil_fraction_is_exact_for_denominator_bounds_beyond_float_precision(n: int) -> None:
    """With a bound N far above 2^53 the answer is still exact integer arithmetic, derived by hand: every fraction
    in (j, j + 1) with denominator ≤ N lies in [j + 1/N, j + 1 − 1/N], so the smallest p/q ≥ j + 1 − 1/M (M > N) is
    j + 1, and the smallest p/q ≥ j + 1/M is j + 1/N."""
    for j in (0, 5, -3):
        for m in (n + 1, 2 * n, n * n):
            assert ceil_fraction(j + 1 - Fraction(1, m), n) == j + 1, (j, m)
            assert ceil_fraction(j + Fraction(1, m), n) == j + Fraction(1, n), (j, m)


@pytest.mark.parametrize("t", [1 / 700, 1 / 300, 1 / 40, 0.3, 2.0])
def test_discrete_laplace_variance_at_small_scales_matches_a_50_digit_sum(t: float) -> None:
    """Var Y = Σ y²·P[y] summed term by term in 50-digit decimals from the pmf (1 − r)/(1 + r)·r^|y|, r = e^{−1/t};
    down to t = 1/700, where e^{1/t} is within a few powers of ten of the float range and r ≈ 10^−304."""
    getcontext().prec = 50
    r = (-1 / Decimal(t)).exp()
    c = (1 - r) / (1 + r)
    total = 2 * sum((Decimal(y) ** 2 * c * r**y for y in range(1, 400)), Decimal(0))
    assert discrete_laplace_variance(t) == pytest.approx(float(total), rel=1e-12)
    assert discrete_laplace_variance(t) > 0

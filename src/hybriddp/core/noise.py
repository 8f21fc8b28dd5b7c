"""Exact discrete Laplace noise for counts (Canonne, Kamath, Steinke 2020; ALGORITHM.md §3.2).

Floating-point Laplace leaks through the low-order bits of its output (Mironov, CCS 2012), so
hybriddp's default curator noise is the **discrete Laplace** (two-sided geometric)
distribution, P[Y = y] ∝ e^{−|y|/t} for integers y, sampled *exactly* from integer randomness
(Algorithms 1–2 of Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy",
NeurIPS 2020). No floating-point number is involved in a draw: Bernoulli(n/d) is
``integers(0, d) < n`` and everything else is integer arithmetic.

The scale is a rational t ≥ 2m_O/ε: the smallest fraction with denominator ≤ 2^20 that is not
below the float 2m_O/ε (:func:`rational_scale`; exactly 2m_O/ε when that is such a fraction, e.g.
2/5 at ε = 5), so counts with L1 sensitivity 2m_O get at least ε-DP (the ratio of neighbouring
probabilities is at most e^{2m_O/t}). CreateHeadList's threshold is recomputed for this distribution: with m_O = 1 it is
the smallest integer τ_d such that a record seen once survives (1 + Y > τ_d) with probability
at most δ/2, exactly; with m_O > 1 it is ⌈τ⌉ of the continuous formula, whose guarantee carries
over because the discrete tail P[Y ≥ k] = e^{−k/t}/(1 + e^{−1/t}) lies below the continuous
tail P[Y_cont > k − 1] = ½e^{−(k−1)/t} at every integer k.

Randomness: the samplers call only ``rng.integers(low, high, size)``. In production (``rng=None``,
the default of both noise classes) :class:`DiscreteLaplaceNoise` draws every integer straight from
the OS CSPRNG (:class:`hybriddp.core.rng.SecretsIntegers`, :func:`secrets.randbelow`) and
:class:`LaplaceNoise` uses a NumPy generator seeded from OS entropy. A seeded generator
(``stage_rng(seed, stream)``) makes experiments reproducible and gives no privacy.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Protocol

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.core.params import check_head_list_params, head_list_threshold
from hybriddp.core.rng import SecretsIntegers, make_rng

IntegerSource = np.random.Generator | SecretsIntegers
"""Where the exact samplers get uniform integers: a NumPy generator or the OS CSPRNG."""

MAX_DENOMINATOR = 1 << 20


def ceil_fraction(x: Fraction, max_denominator: int = MAX_DENOMINATOR) -> Fraction:
    """The smallest p/q ≥ ``x`` with 1 ≤ q ≤ ``max_denominator``, exactly.

    Stern–Brocot search between Farey neighbours a/b < x < c/d (bc − ad = 1), moving each end
    as many mediant steps at once as keeps it on its side of x: any fraction strictly between two
    Farey neighbours has a denominator ≥ b + d, so once b + d > ``max_denominator`` the answer is
    c/d. O(length of x's continued fraction) big-integer steps.
    """
    if x.denominator <= max_denominator:
        return x
    p, q = x.numerator, x.denominator
    a, b, c, d = p // q, 1, p // q + 1, 1  # a/b < x < c/d (x is not an integer here)
    while True:
        # largest k with (a + kc)/(b + kd) < x, i.e. k·(qc − pd) < pb − qa
        k = min((p * b - q * a - 1) // (q * c - p * d), (max_denominator - b) // d)
        a, b = a + k * c, b + k * d
        if b + d > max_denominator:
            return Fraction(c, d)
        # largest k with (c + ka)/(d + kb) > x, i.e. k·(pb − qa) < qc − pd
        k = min((q * c - p * d - 1) // (p * b - q * a), (max_denominator - d) // b)
        c, d = c + k * a, d + k * b
        if b + d > max_denominator:
            return Fraction(c, d)


def _farey_successor(x: Fraction, max_denominator: int) -> Fraction:
    """The smallest p/q > ``x`` with q ≤ ``max_denominator`` (x's right Farey neighbour)."""
    a, b = x.numerator, x.denominator
    d0 = -pow(a, -1, b) % b  # bc − ad = 1 needs ad ≡ −1 (mod b); 0 for b = 1
    d = d0 + (max_denominator - d0) // b * b
    return Fraction((1 + a * d) // b, d)


@functools.lru_cache(maxsize=4096)
def rational_scale(scale: float, max_denominator: int = MAX_DENOMINATOR) -> Fraction:
    """The exact rational scale t the discrete sampler uses for a nominal float ``scale``.

    t is the smallest p/q with q ≤ ``max_denominator`` whose value, rounded to a float, is
    ≥ ``scale``. So a scale that is the float of such a fraction is used exactly (2/5 for
    ε = 5, 5/3 for ε = 1.2, m_O = 1), and t ≤ scale + 1/``max_denominator`` otherwise. Exactly
    ≥ the float's own value is not asked for: b = 2m_O/ε is itself a rounded quotient (0.4 lies
    2·10⁻¹⁷ above 2/5), and t ≥ b·(1 − 2⁻⁵³) keeps the ε attained within a factor 1 + 2⁻⁵² of
    the ε asked for, which is the precision of ε itself.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise parameter_error("noise scale", scale, "a finite number > 0")
    # every real number ≥ lo (> lo if the tie at lo rounds down) rounds to a float ≥ scale
    lo = (Fraction(math.nextafter(scale, 0.0)) + Fraction(scale)) / 2
    t = ceil_fraction(lo, max_denominator)
    if float(t) < scale:  # t == lo and the tie rounded down (possible only for scale ≥ 2^32)
        t = _farey_successor(t, max_denominator)
    return t


def _bernoulli_exp_frac(rng: IntegerSource, num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(e^{−num/den}) for 0 ≤ num ≤ den, exactly (CKS20 Algorithm 1, γ ≤ 1).

    K = 1, 2, ...: draw A ~ Bernoulli(γ/K) = [integers(0, den·K) < num] until A = 0; the
    result is 1 iff the final K is odd.
    """
    num = np.asarray(num)  # integers
    k = np.full(len(num), 1)
    active = np.full(len(num), True)
    while active.any():
        idx = np.flatnonzero(active)
        a = rng.integers(0, den * k[idx]) < num[idx]
        k[idx[a]] += 1
        active[idx] = a
    return k % 2 == 1


def _bernoulli_exp_minus_one(rng: IntegerSource, size: int) -> np.ndarray:
    """Bernoulli(e^{−1}) exactly."""
    return _bernoulli_exp_frac(rng, np.full(size, 1), 1)


def sample_discrete_laplace(rng: IntegerSource, scale: Fraction, size: int) -> np.ndarray:
    """``size`` exact draws of the discrete Laplace with P[y] ∝ e^{−|y|/scale} (CKS20 Alg. 2).

    With scale = t/s (CKS20's notation): U ~ Unif{0..t−1}; accept with Bernoulli(e^{−U/t});
    V ~ Geometric with Bernoulli(e^{−1}) steps; X = U + tV (so P[X = x] ∝ e^{−x/t});
    Y = ⌊X/s⌋ (so P[Y = y] ∝ e^{−ys/t}); B ~ Bernoulli(½); reject (B = 1, Y = 0); return
    (1 − 2B)·Y. Rejected draws are redrawn (vectorized over the pending ones).
    """
    t, s = scale.numerator, scale.denominator
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while len(pending):
        m = len(pending)
        u = rng.integers(0, t, m)
        ok = _bernoulli_exp_frac(rng, u, t)
        u = u[ok]
        v = np.zeros_like(u)  # int64
        going = np.full(len(u), True)
        while going.any():
            idx = np.flatnonzero(going)
            step = _bernoulli_exp_minus_one(rng, len(idx))
            v[idx[step]] += 1
            going[idx] = step
        y = (u + t * v) // s
        b = rng.integers(0, 2, len(y))
        keep = ~((b == 1) & (y == 0))
        vals = ((1 - 2 * b) * y)[keep]
        take = min(len(vals), m)
        out[pending[:take]] = vals[:take]
        pending = pending[take:]
    return out


def discrete_laplace_pmf(y: np.ndarray | int, scale: float) -> np.ndarray:
    """P[Y = y] = (1 − e^{−1/t})/(1 + e^{−1/t})·e^{−|y|/t}."""
    q = math.exp(-1.0 / scale)
    return (1 - q) / (1 + q) * np.exp(-np.abs(y) / scale)


def discrete_laplace_tail(k: int, scale: float) -> float:
    """P[Y ≥ k] for an integer k ≥ 1: e^{−k/t}/(1 + e^{−1/t})."""
    q = math.exp(-1.0 / scale)
    if k < 1:  # k ≤ 0
        return 1.0 - discrete_laplace_tail(1 - k, scale)  # symmetry: P[Y ≥ k] = 1 − P[Y ≥ 1−k]
    return math.exp(-k / scale) / (1 + q)


def discrete_laplace_variance(scale: float) -> float:
    """Var Y = 2e^{−1/t}/(1 − e^{−1/t})²."""
    q = math.exp(-1.0 / scale)
    return 2 * q / (1 - q) ** 2


class NoiseSource(Protocol):
    """Noise added to counts by the curator (ALGORITHM.md §3, §4).

    A noise class is constructed with ``rng``: None for production OS randomness, or a seeded
    NumPy generator for reproducible experiments.

    ``name`` labels outputs (``--noise name``) and ``label`` describes it; ``variance(scale)`` is
    the variance of one draw, used by the variance formulas (ALGORITHM.md §4), and
    ``survival(x, scale)`` is P[Y > x], used to check the head-list threshold.
    """

    name: str
    label: str

    def sample(self, scale: float, size: int) -> np.ndarray:
        """``size`` independent draws with the given scale, as float64."""
        ...

    def variance(self, scale: float) -> float:
        """Variance of one draw."""
        ...

    def survival(self, x: float, scale: float) -> float:
        """P[Y > x] for one draw."""
        ...

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        """CreateHeadList's τ for this noise (ALGORITHM.md §3)."""
        ...


class DiscreteLaplaceNoise:
    """Exact discrete Laplace noise on integer counts (the default curator noise).

    ``rng=None`` (production): every integer comes from the OS CSPRNG (:class:`SecretsIntegers`);
    a seeded NumPy generator makes the draws reproducible (experiments only, no privacy).
    """

    name = "discrete"
    label = "discrete (exact two-sided geometric, integer randomness)"

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng: IntegerSource = SecretsIntegers() if rng is None else rng

    def sample(self, scale: float, size: int) -> np.ndarray:
        """Exact draws at the rational scale ≥ ``scale`` (returned as float64 of integers)."""
        return np.asarray(sample_discrete_laplace(self.rng, rational_scale(scale), size), dtype=np.float64)

    def variance(self, scale: float) -> float:
        """Variance at the rational scale actually used."""
        return discrete_laplace_variance(float(rational_scale(scale)))

    def survival(self, x: float, scale: float) -> float:
        """P[Y > x] = P[Y ≥ ⌊x⌋ + 1]."""
        return discrete_laplace_tail(math.floor(x) + 1, float(rational_scale(scale)))

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        """τ_d: keep a record iff N + Y > τ_d (see the module docstring)."""
        tau = check_head_list_params(epsilon, delta, m_o)
        if m_o > 1:
            return float(math.ceil(tau))
        t = float(rational_scale(2.0 / epsilon))  # 2m_O/ε with m_O = 1
        # smallest integer k with P[1 + Y > k] = P[Y ≥ k] = e^{−k/t}/(1 + e^{−1/t}) ≤ δ/2, i.e. k ≥ x with
        # x = t·(ln(2/δ) − ln(1 + e^{−1/t})): the answer is ⌈x⌉ (up to float rounding of the tail). The search
        # starts at ⌊x⌋ − 1, one step or more below it (the margin covers float error in x), and goes up.
        # pragma (mutation testing, docs/TESTING.md): mutants that lower the start change nothing, the search
        # still ends at the answer; the start line is not mutated
        k = max(1, math.floor(t * (math.log(2.0 / delta) - math.log(1 + math.exp(-1.0 / t)))) - 1)  # pragma: no mutate
        while discrete_laplace_tail(k, t) > delta / 2:
            k += 1
        return float(k)


class LaplaceNoise:
    """Continuous Laplace(0, b) noise, as in the paper (floating point).

    ``rng=None`` (production): a NumPy generator seeded from OS entropy (:func:`make_rng`); a
    seeded generator makes the draws reproducible (experiments only, no privacy).
    """

    name = "laplace"
    label = "laplace (continuous, floating point, paper-faithful)"

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng = make_rng(None) if rng is None else rng

    def sample(self, scale: float, size: int) -> np.ndarray:
        """Laplace(0, scale) draws."""
        return self.rng.laplace(0.0, scale, size)

    def variance(self, scale: float) -> float:
        """Var = 2b²."""
        return 2.0 * scale * scale

    def survival(self, x: float, scale: float) -> float:
        """P[Y > x] = ½e^{−x/b} for x ≥ 0, 1 − ½e^{x/b} otherwise."""
        if x >= 0:
            return 0.5 * float(np.exp(-x / scale))
        return 1.0 - 0.5 * float(np.exp(x / scale))

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        """τ = b_S·(ln(e^{ε/2} + m_O − 1) − ln δ) (Fig. 3 line 2)."""
        return head_list_threshold(epsilon, delta, m_o)


NOISE_CLASSES: dict[str, type[DiscreteLaplaceNoise] | type[LaplaceNoise]] = {
    cls.name: cls for cls in (DiscreteLaplaceNoise, LaplaceNoise)
}
"""``--noise`` name → noise class (the first is the default)."""

NOISE_LABELS = {name: cls.label for name, cls in NOISE_CLASSES.items()}


def effective_scale(name: str, scale: float) -> float:
    """The scale ``--noise name`` actually draws with for a nominal ``scale``: the rational
    t ≥ scale of :func:`rational_scale` for discrete noise, ``scale`` itself for Laplace."""
    return float(rational_scale(scale)) if name == DiscreteLaplaceNoise.name else scale


def noise_factory(name: str) -> type[DiscreteLaplaceNoise] | type[LaplaceNoise]:
    """The noise class for ``--noise discrete|laplace``.

    Instantiate it with the randomness to use: ``noise_factory(name)(None)`` (or no argument)
    for production, where the noise comes from the OS (the CSPRNG itself for ``discrete``, an
    OS-seeded generator for ``laplace``); ``noise_factory(name)(stage_rng(seed, stream))`` for a
    reproducible experiment, which gives no privacy.
    """
    if name not in NOISE_CLASSES:
        raise parameter_error("noise (--noise)", name, " or ".join(f"'{n}'" for n in NOISE_CLASSES))
    return NOISE_CLASSES[name]

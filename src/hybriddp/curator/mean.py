"""The collection service's curator for mean rounds: opt-in mean and private variance with exact discrete noise.

What the service's curator releases for the opt-in group of a mean round (ALGORITHM.md §11): the
opt-in mean μ̂_T and, when σ² is not given, the private variance σ̂². Both are computed from
integers only and noised with the exact discrete Laplace sampler of :mod:`hybriddp.core.noise`
(ALGORITHM.md §3.2), so no floating-point noise reaches an output (floating-point Laplace leaks
through its low-order bits, Mironov 2012). The float mechanisms of :mod:`hybriddp.mean.mechanisms`
remain what the simulations use.

The mechanism, for one statistic with budget ε:

1. **Grid.** Each clamped per-user value x ∈ [lo, hi] is snapped to k = rint((x − lo)/Δ·K) ∈
   {0, …, K}, K = :data:`GRID_STEPS` = 2⁴⁰ (step h = Δ/K). Rounding to nearest is off by at most
   half a step; the float arithmetic of the position adds less than 2⁻¹¹ of a step
   (3 roundings of relative size 2⁻⁵³ on a number ≤ 2⁴⁰), so |lo + h·k − x| ≤ (½ + 2⁻¹¹)·h. Any
   deterministic map into {0, …, K} keeps the sensitivities below, whatever its float error.
2. **Integer statistic Z with exact sensitivity D** (replace-one neighbours, n public):
   the mean uses S = Σk with D = K; the variance uses Q = n·Σk² − S² = n(n − 1)·s²(k) with
   D = (n − 1)·K² (n ≥ 2): replacing a by b changes Σ(k − k̄)² by (b − a)(a + b − 2m)(n − 1)/n, m
   the mean of the others, and |(b − a)(a + b − 2m)| = |(b − m)² − (a − m)²| ≤ K²; attained by
   {0, K} → {0, 0} at n = 2. For n = 1, Q ≡ 0 and D := K² (the noise of the float mechanism's
   scale Δ²/ε; a constant needs none, it is kept so that n_T = 1 behaves as in the library).
3. **Coarsening.** The released integer is ⌊Z/G⌋, G the smallest power of two for which the
   noise scale below is ≤ :data:`TARGET_SCALE` = 2³² (G = 1 when D/ε ≤ 2³² already). Its
   sensitivity is d = ⌈D/G⌉: for integers a ≤ b ≤ a + D, ⌊b/G⌋ − ⌊a/G⌋ ≤ ⌈D/G⌉. This keeps every
   integer of the sampler within int64 whatever n and ε are, and costs at most (G − 1)/2 in units
   of Z (the estimate takes the midpoint G·⌊Z/G⌋ + (G − 1)/2), about 2⁻³² noise scales.
4. **Noise.** W = ⌊Z/G⌋ + Y, Y ~ discrete Laplace with P[Y = y] ∝ e^{−|y|/t} at the integer scale
   t = ⌈d/ε⌉ (exact rational arithmetic on the float ε), so neighbouring outputs have probability
   ratio ≤ e^{d/t} ≤ e^ε: **ε-DP exactly**, not only to float precision. Drawn by
   :func:`hybriddp.core.noise.sample_discrete_laplace` from the integer source of a
   :class:`hybriddp.core.noise.DiscreteLaplaceNoise`: the OS CSPRNG (:func:`secrets.randbelow`) when
   ``rng`` is None, a seeded NumPy generator for experiments only (no privacy). t is passed as an
   exact integer (not through :func:`hybriddp.core.noise.rational_scale`, whose 2²⁰ denominators
   would overflow int64 at scales near 2³²). t ≤ 2⁵² is required (ε ≥ 2⁻⁵²); below that the
   round is refused.
5. **Back to values** (post-processing of W only): μ̂_T = lo + Δ·Ẑ/(K·n) with Ẑ = G·W + (G − 1)/2;
   σ̂² = clip(Δ²·Ẑ/(K²·n·max(n − 1, 1)), 0, Δ²/4) (Popoviciu's bound), each computed exactly as a
   fraction and rounded to a float once.

Error. μ̂_T has variance (Δ·G/(K·n))²·Var Y with Var Y = 2q/(1 − q)² = 1/(2 sinh²(1/(2t))),
q = e^{−1/t} (reported as ``noise_variance``). For 2⁻³² ≤ ε ≤ 2⁸ the coarsening puts d/ε in
(2³¹, 2³²], so G·t = (K/ε)·(1 + at most 2⁻³¹) and the variance is within a relative 2⁻³⁰ of the
continuous A = 2Δ²/(ε²n²) that the service's error formulas use; for larger ε, G = 1 and
t = ⌈K/ε⌉, within about ε·2⁻³⁹ (so up to ε ≈ 2³⁰; beyond, the noise is finer than the grid and
t = 1). The bias against the clamped mean is at most (Δ/K)·(½ + 2⁻¹¹) + Δ·(G − 1)/(2K·n)
(``bias_bound``): the first term is below 10⁻¹² Δ, the second below 2⁻³² of the noise scale
Δ/(ε·n); together at most 2⁻³⁰ of the noise's standard deviation √2·Δ/(ε·n) when ε·n ≤ 2¹¹, and
2⁻²¹ of it for a round of 10⁶ opt-in users at ε = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.noise import DiscreteLaplaceNoise, sample_discrete_laplace
from hybriddp.core.protocol import content_hash
from hybriddp.mean.inputs import MeanSetting, OnSetting, _epsilon, _values
from hybriddp.mean.mechanisms import Hybrid, HybridUnknownVariance

GRID_STEPS = 1 << 40
"""K: steps of the grid over [lower, upper] that per-user values are snapped to."""

TARGET_SCALE = 1 << 32
"""Largest noise scale (in units of the released integer) the coarsening aims for."""

MAX_SCALE = 1 << 52
"""Largest noise scale the exact sampler is given: keeps t·k and U + tV of its int64 arithmetic below 2⁶³."""

SNAP_SLACK = 2.0 ** -11
"""Bound on the float error of a snapped position, in steps (|lo + h·k − x| ≤ (½ + SNAP_SLACK)·h)."""

MEAN_DEVICE_FORMAT = "hybriddp-mean-round"
"""The format of a mean round's device document: the round, its range and ε, which devices randomize with."""
MEAN_OPTIN_FORMAT = "hybriddp-mean-optin"
"""The format of a mean round's opt-in estimates: n_T, μ̂_T and σ² (given or privately estimated)."""


def discrete_laplace_variance_at(scale: int | Fraction) -> float:
    """Var Y = 2q/(1 − q)² = 1/(2 sinh²(1/(2t))) of the discrete Laplace at scale t, accurate for large t.

    (2q/(1 − q)² computed directly keeps only about 6 correct digits at t ≈ 2³², from the cancellation in 1 − q.)
    """
    return 0.5 / math.sinh(0.5 / float(scale)) ** 2


def integer_scale(sensitivity: int, epsilon: float, name: str = "epsilon") -> int:
    """t = ⌈sensitivity/ε⌉, exactly (ε as the rational its float is), so sensitivity/t ≤ ε.

    Raises ParameterError (naming ``name``) when t exceeds :data:`MAX_SCALE`, i.e. ε below about
    sensitivity·2⁻⁵².
    """
    eps = Fraction(float(_epsilon(epsilon, name)))
    t = -(-sensitivity * eps.denominator // eps.numerator)
    if t > MAX_SCALE:
        raise parameter_error(name, float(epsilon), f">= {sensitivity}·2^-52 for the curator's exact discrete noise "
                              f"(its integer scale ceil({sensitivity}/epsilon) would exceed 2^52)",
                              "Typical values of epsilon are 0.1 to 10.")
    return t


def coarsening_unit(sensitivity: int, epsilon: float, target_scale: int = TARGET_SCALE) -> int:
    """G: the smallest power of two with ⌈⌈sensitivity/G⌉/ε⌉ ≤ ``target_scale``, or the first G ≥ sensitivity
    (sensitivity 1 per unit) if none is."""
    eps = Fraction(float(_epsilon(epsilon)))
    g = 1
    while g < sensitivity and -(-sensitivity // g) > target_scale * eps:  # ⌈d/ε⌉ ≤ T ⇔ d ≤ T·ε (d, T integers)
        g *= 2
    return g


@dataclass(frozen=True)
class IntegerRelease:
    """One integer statistic Z released as W = ⌊Z/G⌋ + Y, Y discrete Laplace at scale t: (d/t)-DP, d/t ≤ ε,
    for every Z that moves by at most G·d between neighbours (then ⌊Z/G⌋ moves by at most d = ``sensitivity``).

    Attributes
    ----------
    noisy : W, the only data-dependent number; everything else here is public.
    unit : G, a power of two.
    sensitivity : d = ⌈D/G⌉, the sensitivity of ⌊Z/G⌋.
    scale : t = ⌈d/ε⌉.
    """

    noisy: int
    unit: int
    sensitivity: int
    scale: int

    @property
    def estimate(self) -> Fraction:
        """Ẑ = G·W + (G − 1)/2: the midpoint of the Z's that ⌊Z/G⌋ = W − Y covers."""
        return self.unit * self.noisy + Fraction(self.unit - 1, 2)

    @property
    def epsilon_attained(self) -> Fraction:
        """d/t, the exact privacy loss (≤ the ε asked for)."""
        return Fraction(self.sensitivity, self.scale)

    @property
    def noise_variance(self) -> float:
        """Var(G·Y) in units of Z²."""
        return float(self.unit) ** 2 * discrete_laplace_variance_at(self.scale)


@dataclass(frozen=True)
class DiscreteEstimate:
    """A value the curator released: the estimate, the integer it came from and its error terms.

    Attributes
    ----------
    estimate : μ̂_T or σ̂² (a float computed from ``release.noisy`` and public numbers only).
    n : number of per-user values (n_T).
    epsilon : the budget asked for; ``release.epsilon_attained`` ≤ it.
    noise_variance : variance of ``estimate`` due to the noise (before the variance's clip), value units².
    bias_bound : |E[estimate] − the statistic of the clamped values| is at most this (before the clip).
    release : the integer mechanism's output and parameters.
    """

    estimate: float
    n: int
    epsilon: float
    noise_variance: float
    bias_bound: float
    release: IntegerRelease

    def to_json(self) -> dict[str, Any]:
        r = self.release
        return {"estimate": self.estimate, "n": self.n, "epsilon": self.epsilon,
                "noise_variance": self.noise_variance, "bias_bound": self.bias_bound,
                "noisy_integer": r.noisy, "unit": r.unit, "sensitivity": r.sensitivity, "scale": r.scale}


class DiscreteMeanCurator(OnSetting):
    """The service curator's opt-in mean (ε_m-DP) and private variance (ε_v-DP) with exact discrete
    Laplace noise (module docstring; ALGORITHM.md §11, §3.2). Opt-in users get ε_m + ε_v by sequential
    composition, the budget split of :class:`~hybriddp.mean.HybridUnknownVariance`.

    Parameters
    ----------
    lower, upper : the public range [lo, hi]; values are clamped to it.
    epsilon : ε_m, the budget of the mean.
    variance_epsilon : ε_v, the budget of the variance (None: :meth:`private_variance` is refused).
    rng : None (production: every random integer from the OS CSPRNG) or a seeded NumPy generator
        (experiments only: no privacy).
    grid_steps, target_scale : K and the coarsening target; the defaults (2⁴⁰, 2³²) are what the
        service uses, other values are for tests and studies.
    """

    def __init__(self, *, lower: float, upper: float, epsilon: float, variance_epsilon: float | None = None,
                 rng: np.random.Generator | None = None, grid_steps: int = GRID_STEPS,
                 target_scale: int = TARGET_SCALE) -> None:
        self.setting = MeanSetting(lower, upper, epsilon)
        self.variance_epsilon = None if variance_epsilon is None else float(_epsilon(variance_epsilon,
                                                                                     "variance_epsilon"))
        for name, value, top in (("grid_steps", grid_steps, GRID_STEPS), ("target_scale", target_scale, TARGET_SCALE)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise parameter_error(name, value, f"an integer in [1, {top}] (the default)")
        self.grid_steps = grid_steps
        self.target_scale = target_scale
        self.noise = DiscreteLaplaceNoise(rng)

    @classmethod
    def for_mechanism(cls, mechanism: Hybrid, rng: np.random.Generator | None = None) -> DiscreteMeanCurator:
        """The curator of a round run with ``mechanism``: ε_m = ε, or (1 − ρ)ε and ε_v = ρε when σ² is unknown."""
        s = mechanism.setting
        if isinstance(mechanism, HybridUnknownVariance):
            return cls(lower=s.lower, upper=s.upper, epsilon=mechanism.mean_epsilon,
                       variance_epsilon=mechanism.variance_epsilon, rng=rng)
        return cls(lower=s.lower, upper=s.upper, epsilon=mechanism.epsilon, rng=rng)

    def snap(self, values: Any) -> np.ndarray:
        """k = rint((clamp(x) − lo)/Δ·K) ∈ {0, …, K} per value (int64)."""
        x = _values(values, "opt-in values")
        if len(x) == 0:
            raise DataError("the curator needs at least one opt-in value (ALGORITHM.md §11)")
        lo, hi = float(self.setting.lower), float(self.setting.upper)
        z = np.rint((np.clip(x, lo, hi) - lo) / self.width * self.grid_steps)
        return np.clip(z, 0, self.grid_steps).astype(np.int64)

    def _release(self, statistic: int, sensitivity: int, epsilon: float, name: str) -> IntegerRelease:
        g = coarsening_unit(sensitivity, epsilon, self.target_scale)
        d = -(-sensitivity // g)
        t = integer_scale(d, epsilon, name)
        y = int(sample_discrete_laplace(self.noise.rng, Fraction(t), 1)[0])
        return IntegerRelease(statistic // g + y, g, d, t)

    def private_mean(self, values: Any) -> DiscreteEstimate:
        """μ̂_T = lo + Δ·Ẑ/(K·n) from S = Σk (sensitivity K): ε_m-DP, exactly."""
        k = self.snap(values)
        n, steps = len(k), self.grid_steps
        rel = self._release(sum(k.tolist()), steps, self.epsilon, "epsilon")
        estimate = float(self.setting.lower) + self.width * float(rel.estimate / (steps * n))
        scale = self.width / (steps * n)
        bias = self.width / steps * (0.5 + SNAP_SLACK + (rel.unit - 1) / (2 * n))
        return DiscreteEstimate(estimate, n, self.epsilon, scale * scale * rel.noise_variance, bias, rel)

    def private_variance(self, values: Any) -> DiscreteEstimate:
        """σ̂² = clip(Δ²·Ẑ/(K²·n·max(n − 1, 1)), 0, Δ²/4) from Q = n·Σk² − S² (sensitivity max(n − 1, 1)·K²):
        ε_v-DP, exactly. The clip is post-processing."""
        if self.variance_epsilon is None:
            raise ValueError("DiscreteMeanCurator.private_variance needs variance_epsilon")
        k = self.snap(values).tolist()
        n, steps = len(k), self.grid_steps
        m = max(n - 1, 1)
        q = n * sum(v * v for v in k) - sum(k) ** 2
        rel = self._release(q, m * steps * steps, self.variance_epsilon, "variance_epsilon")
        unit2 = self.width * self.width
        frac = min(max(rel.estimate / (steps * steps * n * m), Fraction(0)), Fraction(1, 4))
        scale = unit2 / (float(steps) ** 2 * n * m)
        # snapping moves s² by ≤ (n/(n−1))·(Δe + e²), e = (½ + slack)·h the largest snapping error; n = 1: s² ≡ 0
        e = (0.5 + SNAP_SLACK) * self.width / steps
        snap_bias = 0.0 if n == 1 else n / (n - 1) * (self.width * e + e * e)
        bias = snap_bias + scale * (rel.unit - 1) / 2
        return DiscreteEstimate(float(frac) * unit2, n, self.variance_epsilon, scale * scale * rel.noise_variance,
                                bias, rel)


def curate_mean(round_id: str, users: np.ndarray, values: np.ndarray, mechanism: Hybrid,
                rng: np.random.Generator | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The curator's release of a hybrid-mean round (ALGORITHM.md §11): (device document, opt-in estimates).

    ``users`` holds the user code of each of ``values``; a user who gave several values contributes the mean
    of their clamped values, so each user holds one value in [lower, upper]. The opt-in mean and, when
    ``mechanism`` does not know σ² (:class:`~hybriddp.mean.HybridUnknownVariance`), the private variance
    are released with exact discrete Laplace noise (:class:`DiscreteMeanCurator`): ε-DP exactly for the
    opt-in users (the service charges them ε before this runs). ``rng``: None draws every
    random integer from the OS CSPRNG; a seeded generator is for experiments only (no privacy).
    """
    s = mechanism.setting
    _, code = np.unique(users, return_inverse=True)
    per_user = np.bincount(code, weights=np.clip(values, s.lower, s.upper)) / np.bincount(code)
    curator = DiscreteMeanCurator.for_mechanism(mechanism, rng)
    if isinstance(mechanism, HybridUnknownVariance):
        sigma2, source = curator.private_variance(per_user).estimate, "private estimate"
    else:
        sigma2, source = float(mechanism.sigma2), "given"
    mu_t = curator.private_mean(per_user).estimate
    device: dict[str, Any] = {"format": MEAN_DEVICE_FORMAT, "version": 1, "round": round_id,
                              "lower": float(s.lower), "upper": float(s.upper), "epsilon": float(s.epsilon)}
    device["content_hash"] = content_hash(device)
    estimates = {"format": MEAN_OPTIN_FORMAT, "version": 1, "headlist": device["content_hash"],
                 "n_optin": len(per_user), "mean": mu_t, "sigma2": float(sigma2), "sigma2_source": source}
    return device, estimates

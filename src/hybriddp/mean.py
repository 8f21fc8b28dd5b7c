"""Hybrid mean estimation: a few users opt in, the rest randomize on their devices (SPEC §11).

Dubey & Korolova, "The Power of the Hybrid Model for Mean Estimation" (PPML @ NeurIPS 2018;
``papers/hybrid-model-mean-estimation-2018.txt``). Every one of n users holds a value in a
public range [lo, hi] (Δ = hi − lo). A fraction c of them opts in and trusts the curator
(n_T = round(c·n) users, trusted-curator model); the other n_L = n − n_T randomize locally.
The target is the sample mean μ̄ of all n users. Every mechanism uses the Laplace mechanism.

* :class:`FullLM` (paper Lemma 3.1): everyone reports x_i + Lap(Δ/ε); MSE_F = 2Δ²/(ε²n).
* :class:`OnlyTCM` (Lemma 3.2): mean of the opt-in values + Lap(Δ/(ε n_T));
  MSE_T = 2Δ²/(ε² n_T²) + σ²(1−c)/(c n).
* :class:`Hybrid` (Lemma 3.3): w·μ̂_T + (1−w)·μ̂_L with, for A = 2Δ²/(ε² n_T²),
  B = 2Δ²/(ε² n_L), S = σ²/(c(1−c)n),
  MSE_H(w) = w²A + (1−w)²B + (w − c)²S, minimized by w* = (B + cS)/(A + B + S).
* Improvement (Theorem 3.4): R = min(MSE_F, MSE_T)/MSE_H(w*).
* :class:`HybridUnknownVariance`: σ² is not known; the opt-in group spends ρ·ε of its budget
  on a private sample variance and (1 − ρ)·ε on its mean (see the class).

Where the expectation is taken (the error model)
------------------------------------------------
Over the Laplace noise and over *which* users opt in (a uniformly random subset of size n_T).
The formulas hold exactly, not only asymptotically, in two settings:

* **drawn data** (:func:`simulate`): the n values are i.i.d. from a distribution with variance
  σ² (fresh each trial); then μ̄_T − μ̄_L has variance σ²(1/n_T + 1/n_L) = S;
* **fixed data** (:func:`simulate_on_data`, ``hybriddp mean estimate``): the n values are given
  and only the opt-in subset is random (sampling without replacement); the formulas hold with
  σ² := s² = Σ(x_i − μ̄)²/(n − 1), the data's sample variance.

The formula functions take n and c as real numbers (for plots); the mechanisms and simulations
use the realized group sizes, c = n_T/n. Clamping to [lo, hi] happens before anything else;
the errors are about the mean of the clamped values, and clamping is counted and reported.

Randomness: NumPy generators from :func:`hybriddp.rng.make_rng` (OS-seeded unless a seed is
given; a seed is for experiments only and gives no privacy). One device's randomizer without
NumPy is :mod:`hybriddp.mean_device`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.errors import DataError, parameter_error
from hybriddp.rng import SEED_WARNING, make_rng

logger = logging.getLogger(__name__)

__all__ = [
    "VARIANCE_SHARE",
    "ClampCount",
    "DataRun",
    "Distribution",
    "FullLM",
    "Hybrid",
    "HybridUnknownVariance",
    "MeanEstimate",
    "MeanSetting",
    "MechanismMSE",
    "OnlyTCM",
    "SimulationResult",
    "clamp_values",
    "crossover_n",
    "group_sizes",
    "hybrid_terms",
    "improvement",
    "mse_full_lm",
    "mse_hybrid",
    "mse_hybrid_optimal",
    "mse_only_tcm",
    "optimal_weight",
    "plot_improvement_vs_n",
    "plot_mse_vs_n",
    "simulate",
    "simulate_on_data",
]

VARIANCE_SHARE = 0.2
"""ρ: the share of the opt-in budget :class:`HybridUnknownVariance` spends on the variance."""

Real = float | np.ndarray

OPTION_NAMES = {
    "epsilon": "--epsilon", "optin_fraction": "--optin-fraction", "lower": "--lower", "upper": "--upper",
    "n": "--n", "trials": "--trials", "variance_share": "--variance-share", "distribution": "--distribution",
}


def _label(name: str) -> str:
    return f"{name} ({OPTION_NAMES[name]})" if name in OPTION_NAMES else name


def _show(value: Any) -> Any:
    """A short form of a parameter for messages (arrays by their offending range)."""
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return value.item()
        return f"array with min {np.nanmin(value)!r} and max {np.nanmax(value)!r}"
    return value


def _real(name: str, value: Any, ok: Callable[[np.ndarray], np.ndarray], allowed: str, fix: str = "") -> Real:
    """``value`` as float or float array, checked elementwise by ``ok`` (finite is implied)."""
    if isinstance(value, bool):
        raise parameter_error(_label(name), value, allowed, fix)
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise parameter_error(_label(name), value, allowed, fix) from None
    if not (np.all(np.isfinite(arr)) and np.all(ok(arr))):
        raise parameter_error(_label(name), _show(value), allowed, fix)
    return float(arr) if arr.ndim == 0 else arr


def _epsilon(value: Any, name: str = "epsilon") -> Real:
    return _real(name, value, lambda a: a > 0, "a finite number > 0")


def _fraction(value: Any, name: str = "optin_fraction") -> Real:
    return _real(name, value, lambda a: (a > 0) & (a < 1), "strictly between 0 and 1 (0.05 = 5%)")


def _positive(value: Any, name: str) -> Real:
    return _real(name, value, lambda a: a > 0, "a finite number > 0")


def _variance(value: Any) -> Real:
    return _real("sigma2", value, lambda a: a >= 0, "a finite number >= 0 (a variance; at most Δ²/4 for a "
                 "distribution on [lower, upper], by Popoviciu's inequality)")


# ----- parameters ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MeanSetting:
    """The public parameters every mechanism shares, validated once (SPEC §11).

    Parameters
    ----------
    lower, upper : the public range [lo, hi] of a user's value; Δ = hi − lo.
    epsilon : ε > 0, the privacy loss of every user (opt-in and local alike).
    """

    lower: float
    upper: float
    epsilon: float

    def __post_init__(self) -> None:
        for name in ("lower", "upper"):
            _real(name, getattr(self, name), lambda a: a.ndim == 0, "a finite number")
        if not self.lower < self.upper:
            raise parameter_error(_label("upper"), self.upper, f"> lower = {self.lower!r}",
                                  "Give the range [lower, upper] the values are known to lie in; values "
                                  "outside it are clamped.")
        _epsilon(self.epsilon)

    @property
    def width(self) -> float:
        """Δ = upper − lower: the sensitivity of one user's value."""
        return float(self.upper) - float(self.lower)


def group_sizes(n: int, optin_fraction: float) -> tuple[int, int]:
    """(n_T, n_L) = (round(c·n), n − n_T); both groups must be non-empty (SPEC §11).

    ``round`` is Python's (as in :func:`hybriddp.pipeline.split_optin`).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise parameter_error(_label("n"), n, "an integer >= 2 (number of users)")
    c = _fraction(optin_fraction)
    n_t = round(c * int(n))
    n_l = int(n) - n_t
    if n_t < 1:
        need = math.ceil(0.5 / c + 1e-9)
        raise parameter_error(_label("n"), int(n), f">= {need} at optin_fraction = {c!r}, so that the opt-in "
                              f"group round(c·n) is non-empty (it has {n_t} users)",
                              "Use more users or a larger --optin-fraction.")
    if n_l < 1:
        raise parameter_error(_label("optin_fraction"), c, f"small enough that the local group is non-empty "
                              f"(n = {int(n)} gives n_T = {n_t}, n_L = {n_l})",
                              "Use more users or a smaller --optin-fraction.")
    return n_t, n_l


# ----- SPEC §11 formulas --------------------------------------------------------------------
def mse_full_lm(n: Real, *, epsilon: float, width: float = 1.0) -> Real:
    """MSE_F = 2Δ²/(ε² n): expected squared error of FullLM (Lemma 3.1, SPEC §11).

    Parameters
    ----------
    n : number of users (real, > 0; arrays broadcast).
    epsilon : ε > 0.
    width : Δ = hi − lo.
    """
    n = _positive(n, "n")
    eps, d = _epsilon(epsilon), _positive(width, "width")
    return 2.0 * d * d / (eps * eps * n)


def mse_only_tcm(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0) -> Real:
    """MSE_T = 2Δ²/(ε² n_T²) + σ²(1−c)/(c n), n_T = c·n: OnlyTCM (Lemma 3.2, SPEC §11).

    The first term is the curator's Laplace noise, the second the sampling error of the opt-in
    mean as an estimate of the mean of all n users.
    """
    n, c = _positive(n, "n"), _fraction(optin_fraction)
    eps, d, s2 = _epsilon(epsilon), _positive(width, "width"), _variance(sigma2)
    n_t = c * n
    return 2.0 * d * d / (eps * eps * n_t * n_t) + s2 * (1.0 - c) / (c * n)


def hybrid_terms(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0,
                 optin_epsilon: Real | None = None) -> tuple[Real, Real, Real]:
    """(A, B, S) of SPEC §11: A = 2Δ²/(ε_T² n_T²), B = 2Δ²/(ε² n_L), S = σ²/(c(1−c)n).

    A is the variance of the opt-in mean's noise, B that of the mean of n_L local reports, S
    that of μ̄_T − μ̄_L (the sampling term). ``optin_epsilon`` (default ε) is the budget the
    opt-in *mean* gets: (1 − ρ)·ε for :class:`HybridUnknownVariance`.
    """
    n, c = _positive(n, "n"), _fraction(optin_fraction)
    eps, d, s2 = _epsilon(epsilon), _positive(width, "width"), _variance(sigma2)
    eps_t = eps if optin_epsilon is None else _epsilon(optin_epsilon, "optin_epsilon")
    n_t, n_l = c * n, (1.0 - c) * n
    a = 2.0 * d * d / (eps_t * eps_t * n_t * n_t)
    b = 2.0 * d * d / (eps * eps * n_l)
    s = s2 / (c * (1.0 - c) * n)
    return a, b, s


def mse_hybrid(weight: Real, n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0,
               optin_epsilon: Real | None = None) -> Real:
    """MSE_H(w) = w²A + (1−w)²B + (w − c)²S: Hybrid with weight w on the opt-in mean (Lemma 3.3).

    w = 1 is OnlyTCM (MSE_H(1) = MSE_T); w = 0 uses the local reports alone.
    """
    w = _real("weight", weight, lambda a: np.ones_like(a, dtype=bool), "a finite number")
    c = _fraction(optin_fraction)
    a, b, s = hybrid_terms(n, c, epsilon=epsilon, sigma2=sigma2, width=width, optin_epsilon=optin_epsilon)
    return w * w * a + (1.0 - w) ** 2 * b + (w - c) ** 2 * s


def optimal_weight(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0,
                   optin_epsilon: Real | None = None) -> Real:
    """w* = (B + cS)/(A + B + S), the minimizer of MSE_H (dMSE_H/dw = 0; SPEC §11). In (0, 1)."""
    c = _fraction(optin_fraction)
    a, b, s = hybrid_terms(n, c, epsilon=epsilon, sigma2=sigma2, width=width, optin_epsilon=optin_epsilon)
    return (b + c * s) / (a + b + s)


def mse_hybrid_optimal(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0,
                       optin_epsilon: Real | None = None) -> Real:
    """MSE_H(w*): the expected squared error of the optimally weighted Hybrid."""
    kw = {"epsilon": epsilon, "sigma2": sigma2, "width": width, "optin_epsilon": optin_epsilon}
    w = optimal_weight(n, optin_fraction, **kw)
    return mse_hybrid(w, n, optin_fraction, **kw)


def improvement(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0) -> Real:
    """R = min(MSE_F, MSE_T)/MSE_H(w*) (Theorem 3.4, SPEC §11).

    R ≥ 1 whenever n_T = c·n ≥ 1: MSE_H(w*) ≤ MSE_H(1) = MSE_T, and MSE_H(w*) ≤ MSE_H(c) =
    c²A + (1−c)²B ≤ MSE_F because A = 2Δ²/(ε²n_T²) ≤ 2Δ²/(ε²n_T) (the curator's opt-in mean is at
    least as good as the opt-in users' local reports; equality at n_T = 1).

    SPEC check: R peaks at 2.03 near n ≈ 1.9e3 for c = 0.05, ε = 1, Δ = 1, σ² = 1/12.
    """
    kw = {"epsilon": epsilon, "sigma2": sigma2, "width": width}
    best = np.minimum(mse_full_lm(n, epsilon=epsilon, width=width), mse_only_tcm(n, optin_fraction, **kw))
    r = best / mse_hybrid_optimal(n, optin_fraction, **kw)
    return float(r) if np.ndim(r) == 0 else r


def crossover_n(optin_fraction: float, *, epsilon: float, sigma2: float, width: float = 1.0) -> float:
    """The n at which MSE_T = MSE_F: OnlyTCM beats FullLM for larger n (inf if never).

    From 2Δ²/(ε²n) = 2Δ²/(ε²c²n²) + σ²(1−c)/(cn):  n× = (2Δ²/(ε²c²)) / (2Δ²/ε² − σ²(1−c)/c),
    finite iff σ²(1−c)/c < 2Δ²/ε². R peaks there (1920 for c = 0.05, ε = 1, Δ = 1, σ² = 1/12,
    where R = 2.0304: the SPEC's "2.03 at n ≈ 1.9e3").
    """
    c, eps = float(_fraction(optin_fraction)), float(_epsilon(epsilon))
    d2, s2 = float(_positive(width, "width")) ** 2, float(_variance(sigma2))
    gap = 2.0 * d2 / eps**2 - s2 * (1.0 - c) / c
    return 2.0 * d2 / (eps**2 * c**2) / gap if gap > 0 else math.inf


# ----- clamping -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ClampCount:
    """How many values were below ``lower`` / above ``upper`` and were clamped."""

    below: int = 0
    above: int = 0

    @property
    def total(self) -> int:
        return self.below + self.above

    def __add__(self, other: ClampCount) -> ClampCount:
        return ClampCount(self.below + other.below, self.above + other.above)


def _values(values: Any, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise DataError(f"{what}: expected a 1-D sequence of numbers, got shape {arr.shape}")
    bad = np.flatnonzero(np.isnan(arr))
    if len(bad):
        raise DataError(f"{what}: value #{bad[0]} is NaN; every user needs one numeric value")
    return arr


def clamp_values(values: Any, lower: float, upper: float, *, log: bool = True) -> tuple[np.ndarray, ClampCount]:
    """Clamp to [lower, upper] and count what was clamped (SPEC §11: Δ must bound every value).

    A warning is logged when anything was clamped (unless ``log`` is False: the caller reports it).
    """
    arr = _values(values, "values")
    count = ClampCount(int(np.count_nonzero(arr < lower)), int(np.count_nonzero(arr > upper)))
    if count.total and log:
        logger.warning("%d of %d values were outside [%g, %g] and were clamped (%d below, %d above)",
                       count.total, len(arr), lower, upper, count.below, count.above)
    if count.total:
        arr = np.clip(arr, lower, upper)
    return arr, count


# ----- mechanisms ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MeanEstimate:
    """One run of a mechanism: the estimate and its analytic expected squared error.

    Attributes
    ----------
    mechanism : "FullLM", "OnlyTCM", "Hybrid" or "Hybrid, unknown σ²".
    estimate : the DP estimate of the mean of all users (of their clamped values).
    expected_squared_error : the analytic E[(estimate − μ̄)²] (SPEC §11), with ``sigma2``.
    n_optin, n_local : group sizes n_T and n_L.
    clamped : values that were clamped before randomizing (both groups).
    sigma2 : the variance used in the error formula (and for the weight), or None (FullLM).
    sigma2_source : where ``sigma2`` came from: "given", "worst case Δ²/4", "private estimate".
    weight : w on the opt-in mean (Hybrid), 1 for OnlyTCM, None for FullLM.
    guarantee : the privacy guarantee of each group, in words.
    private_sigma2 : σ̂², the private variance estimate (Hybrid with unknown σ² only).
    """

    mechanism: str
    estimate: float
    expected_squared_error: float
    n_optin: int
    n_local: int
    clamped: ClampCount
    sigma2: float | None
    sigma2_source: str
    weight: float | None
    guarantee: str
    private_sigma2: float | None = None

    @property
    def rmse(self) -> float:
        """Root of the expected squared error, in the units of the values."""
        return math.sqrt(self.expected_squared_error)

    def to_json(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "estimate": self.estimate,
                "expected_squared_error": self.expected_squared_error, "rmse": self.rmse,
                "n_optin": self.n_optin, "n_local": self.n_local,
                "clamped": {"below": self.clamped.below, "above": self.clamped.above},
                "sigma2": self.sigma2, "sigma2_source": self.sigma2_source, "weight": self.weight,
                "guarantee": self.guarantee, "private_sigma2": self.private_sigma2}


class _Mechanism:
    """Shared parts: the validated setting, clamping, group sizes."""

    name = ""

    def __init__(self, *, lower: float, upper: float, epsilon: float) -> None:
        self.setting = MeanSetting(lower, upper, epsilon)

    @property
    def width(self) -> float:
        return self.setting.width

    @property
    def epsilon(self) -> float:
        return float(self.setting.epsilon)

    def _groups(self, optin_values: Any, local_values: Any) -> tuple[np.ndarray, np.ndarray, ClampCount]:
        lo, hi = self.setting.lower, self.setting.upper
        t, ct = clamp_values(_values(optin_values, "opt-in values"), lo, hi)
        loc, cl = clamp_values(_values(local_values, "local values"), lo, hi)
        if len(t) < 1 or len(loc) < 1:
            raise DataError(f"{self.name} needs both groups non-empty: got {len(t)} opt-in and {len(loc)} "
                            "local values (SPEC §11)")
        return t, loc, ct + cl

    def _sigma2(self, sigma2: float | None) -> tuple[float, str]:
        if sigma2 is None:
            return self.width ** 2 / 4.0, "worst case Δ²/4"
        return float(_variance(sigma2)), "given"


class FullLM(_Mechanism):
    """Everyone randomizes locally: r_i = clamp(x_i) + Lap(Δ/ε); estimate = mean(r) (Lemma 3.1).

    Guarantee: every user, opt-in or not, gets ε-LDP. Expected squared error MSE_F = 2Δ²/(ε² n)
    (it does not depend on the data). The device-side randomizer is
    :class:`hybriddp.mean_device.NumericRandomizer`; this is its batch (NumPy) equivalent.
    """

    name = "FullLM"

    @property
    def guarantee(self) -> str:
        return f"every user: {self.epsilon:g}-LDP (Laplace scale Δ/ε = {self.width / self.epsilon:g} on the device)"

    def expected_squared_error(self, n_optin: int, n_local: int, sigma2: float | None = None) -> float:
        """MSE_F = 2Δ²/(ε²n), n = n_T + n_L (σ² is not needed)."""
        return float(mse_full_lm(n_optin + n_local, epsilon=self.epsilon, width=self.width))

    def estimate(self, optin_values: Any, local_values: Any, *, rng: np.random.Generator | None = None,
                 sigma2: float | None = None) -> MeanEstimate:
        """Randomize every value (both groups) on "devices" and average the reports."""
        rng = rng if rng is not None else make_rng(None)
        t, loc, clamped = self._groups(optin_values, local_values)
        x = np.concatenate([t, loc])
        reports = x + rng.laplace(0.0, self.width / self.epsilon, len(x))
        return MeanEstimate(self.name, float(reports.mean()), self.expected_squared_error(len(t), len(loc)),
                            len(t), len(loc), clamped, None, "not needed", None, self.guarantee)


class OnlyTCM(_Mechanism):
    """Only the opt-in group: mean(clamp(x_T)) + Lap(Δ/(ε n_T)) (Lemma 3.2).

    Guarantee: opt-in users get ε-DP in the trusted-curator model (replace-one neighbours: the
    opt-in mean moves by at most Δ/n_T); the local users' data is not used. The analytic error
    MSE_T needs σ²: pass ``sigma2`` (known), else the worst case Δ²/4 is used (an upper bound).
    """

    name = "OnlyTCM"

    @property
    def guarantee(self) -> str:
        return (f"opt-in users: {self.epsilon:g}-DP, trusted curator (Laplace scale Δ/(ε·n_T)); "
                "local users: not used")

    def expected_squared_error(self, n_optin: int, n_local: int, sigma2: float | None = None) -> float:
        """MSE_T with c = n_T/n (SPEC §11)."""
        n = n_optin + n_local
        s2, _ = self._sigma2(sigma2)
        return float(mse_only_tcm(n, n_optin / n, epsilon=self.epsilon, sigma2=s2, width=self.width))

    def estimate(self, optin_values: Any, local_values: Any, *, rng: np.random.Generator | None = None,
                 sigma2: float | None = None) -> MeanEstimate:
        """The curator's Laplace mechanism on the opt-in mean; ``local_values`` only count n."""
        rng = rng if rng is not None else make_rng(None)
        t, loc, clamped = self._groups(optin_values, local_values)
        est = float(t.mean() + rng.laplace(0.0, self.width / (self.epsilon * len(t))))
        s2, source = self._sigma2(sigma2)
        return MeanEstimate(self.name, est, self.expected_squared_error(len(t), len(loc), s2), len(t), len(loc),
                            clamped, s2, source, 1.0, self.guarantee)


class Hybrid(_Mechanism):
    """w·μ̂_T + (1−w)·μ̂_L with the optimal w* for a known σ² (Lemma 3.3, SPEC §11).

    μ̂_T = mean(clamp(x_T)) + Lap(Δ/(ε n_T)) (curator) and μ̂_L = mean of the local reports
    clamp(x_i) + Lap(Δ/ε). w* = (B + cS)/(A + B + S) minimizes MSE_H(w) = w²A + (1−w)²B + (w−c)²S.

    Guarantee: opt-in users ε-DP (trusted curator), local users ε-LDP. The weight depends only
    on public quantities (n_T, n_L, ε, Δ and the *known* σ²), so it costs no privacy.

    Parameters
    ----------
    sigma2 : the known population variance σ² of the values (0 ≤ σ² ≤ Δ²/4 for any
        distribution on [lo, hi]).
    weight : use this fixed w instead of w* (for studying MSE_H(w)).
    """

    name = "Hybrid"

    def __init__(self, *, lower: float, upper: float, epsilon: float, sigma2: float,
                 weight: float | None = None) -> None:
        super().__init__(lower=lower, upper=upper, epsilon=epsilon)
        self.sigma2 = float(_variance(sigma2))
        self.weight = None if weight is None else float(_real("weight", weight, lambda a: a.ndim == 0,
                                                              "a finite number"))

    @property
    def guarantee(self) -> str:
        return (f"opt-in users: {self.epsilon:g}-DP, trusted curator (Laplace scale Δ/(ε·n_T)); local users: "
                f"{self.epsilon:g}-LDP (Laplace scale Δ/ε on the device); σ² is public")

    def weight_for(self, n_optin: int, n_local: int, sigma2: float | None = None) -> float:
        """The weight used: the fixed one, else w* for these group sizes."""
        if self.weight is not None:
            return self.weight
        n = n_optin + n_local
        s2 = self.sigma2 if sigma2 is None else sigma2
        return float(optimal_weight(n, n_optin / n, epsilon=self.epsilon, sigma2=s2, width=self.width))

    def expected_squared_error(self, n_optin: int, n_local: int, sigma2: float | None = None,
                               weight: float | None = None) -> float:
        """MSE_H(w) with c = n_T/n; w defaults to :meth:`weight_for`, σ² to the known one."""
        n = n_optin + n_local
        s2 = self.sigma2 if sigma2 is None else sigma2
        w = self.weight_for(n_optin, n_local) if weight is None else weight
        return float(mse_hybrid(w, n, n_optin / n, epsilon=self.epsilon, sigma2=s2, width=self.width))

    def estimate(self, optin_values: Any, local_values: Any, *, rng: np.random.Generator | None = None,
                 sigma2: float | None = None) -> MeanEstimate:
        """Blend the curator's opt-in mean and the local reports' mean with weight w.

        ``sigma2`` here only changes the variance the *error* is evaluated at (e.g. the data's
        true variance in a simulation); the weight uses the known σ² given at construction.
        """
        rng = rng if rng is not None else make_rng(None)
        t, loc, clamped = self._groups(optin_values, local_values)
        mu_t = t.mean() + rng.laplace(0.0, self.width / (self.epsilon * len(t)))
        mu_l = (loc + rng.laplace(0.0, self.width / self.epsilon, len(loc))).mean()
        w = self.weight_for(len(t), len(loc))
        s2 = self.sigma2 if sigma2 is None else float(_variance(sigma2))
        return MeanEstimate(self.name, float(w * mu_t + (1.0 - w) * mu_l),
                            self.expected_squared_error(len(t), len(loc), s2, w), len(t), len(loc), clamped,
                            s2, "given", w, self.guarantee)


class HybridUnknownVariance(Hybrid):
    """Hybrid when σ² is unknown: estimate it privately from the opt-in group, plug it into w*.

    The opt-in group's budget ε is split by sequential composition:

    1. ρ·ε (ρ = ``variance_share``, default :data:`VARIANCE_SHARE` = 0.2) buys the variance:
       σ̂² = clip(s²_T + Lap(Δ²/(n_T ρ ε)), 0, Δ²/4), where s²_T is the sample variance
       (divisor n_T − 1) of the clamped opt-in values. Its sensitivity under replacing one
       value is ≤ Δ²/n_T: for values in [0, Δ], replacing a by b changes Σ(x − x̄)²/n_T by
       (b − a)(a + b − 2m)(n_T − 1)/n_T², m the mean of the others, and |(b−a)(a+b−2m)| =
       |(b−m)² − (a−m)²| ≤ Δ². The clip is post-processing (σ² ≤ Δ²/4 by Popoviciu). With
       n_T = 1 there is no sample variance: s²_T := 0 (a constant, so still ρε-DP).
    2. (1 − ρ)·ε buys the mean: μ̂_T = mean(x_T) + Lap(Δ/(n_T (1 − ρ) ε)).
    3. ŵ = w*(σ̂²) computed with A' = 2Δ²/((1−ρ)²ε² n_T²) — post-processing of DP outputs.

    Guarantee: opt-in users ε-DP in the trusted-curator model (ρε + (1−ρ)ε); local users ε-LDP,
    exactly as in :class:`Hybrid` (their budget is untouched). The price is A' = A/(1−ρ)² and the
    error of ŵ. The reported ``expected_squared_error`` is MSE_H(ŵ) with A' and σ² := σ̂² — what
    the analyst can compute without further privacy cost; it is the exact expected error of a
    blend with a fixed weight ŵ (ŵ is random and mildly correlated with the opt-in data, so it is
    not the exact unconditional error). The tests bound the real (Monte Carlo) error by a
    stated factor of the known-variance Hybrid's.
    """

    name = "Hybrid, unknown σ²"

    def __init__(self, *, lower: float, upper: float, epsilon: float,
                 variance_share: float = VARIANCE_SHARE) -> None:
        _Mechanism.__init__(self, lower=lower, upper=upper, epsilon=epsilon)
        self.variance_share = float(_fraction(variance_share, "variance_share"))
        self.sigma2 = self.width ** 2 / 4.0  # unused: the weight comes from σ̂²
        self.weight = None

    @property
    def variance_epsilon(self) -> float:
        """ε_v = ρ·ε, spent on the private variance."""
        return self.variance_share * self.epsilon

    @property
    def mean_epsilon(self) -> float:
        """ε_m = (1 − ρ)·ε, spent on the opt-in mean."""
        return (1.0 - self.variance_share) * self.epsilon

    @property
    def guarantee(self) -> str:
        return (f"opt-in users: {self.epsilon:g}-DP, trusted curator, by sequential composition of "
                f"{self.variance_epsilon:g} (variance, Laplace scale Δ²/(n_T·ε_v)) + {self.mean_epsilon:g} (mean, "
                f"Laplace scale Δ/(n_T·ε_m)); local users: {self.epsilon:g}-LDP; the weight is post-processing")

    def private_variance(self, optin_values: np.ndarray, rng: np.random.Generator) -> float:
        """σ̂² = clip(s² + Lap(Δ²/(n_T ε_v)), 0, Δ²/4) of clamped opt-in values (ρε-DP)."""
        n_t = len(optin_values)
        s2 = float(np.var(optin_values, ddof=1)) if n_t > 1 else 0.0
        noisy = s2 + rng.laplace(0.0, self.width ** 2 / (n_t * self.variance_epsilon))
        return float(np.clip(noisy, 0.0, self.width ** 2 / 4.0))

    def weight_for(self, n_optin: int, n_local: int, sigma2: float | None = None) -> float:
        """ŵ = w*(σ²) with the opt-in mean's budget (1 − ρ)ε; ``sigma2`` is σ̂² (required)."""
        if sigma2 is None:
            raise ValueError("HybridUnknownVariance.weight_for needs the (private) variance estimate")
        n = n_optin + n_local
        return float(optimal_weight(n, n_optin / n, epsilon=self.epsilon, sigma2=sigma2, width=self.width,
                                    optin_epsilon=self.mean_epsilon))

    def expected_squared_error(self, n_optin: int, n_local: int, sigma2: float | None = None,
                               weight: float | None = None) -> float:
        """MSE_H(w) with A' (budget (1−ρ)ε for the opt-in mean), at variance σ² and weight w.

        ``weight`` defaults to w*(σ²) — the ideal: what the blend would achieve if σ̂² = σ².
        """
        if sigma2 is None:
            raise ValueError("HybridUnknownVariance.expected_squared_error needs a variance")
        n = n_optin + n_local
        w = self.weight_for(n_optin, n_local, sigma2) if weight is None else weight
        return float(mse_hybrid(w, n, n_optin / n, epsilon=self.epsilon, sigma2=sigma2, width=self.width,
                                optin_epsilon=self.mean_epsilon))

    def estimate(self, optin_values: Any, local_values: Any, *, rng: np.random.Generator | None = None,
                 sigma2: float | None = None) -> MeanEstimate:
        """Private variance (ρε), private opt-in mean ((1−ρ)ε), local reports, blend with ŵ.

        The error is reported at σ̂² unless ``sigma2`` is given (e.g. the data's true variance
        in a simulation, to evaluate the blend that was actually used).
        """
        rng = rng if rng is not None else make_rng(None)
        t, loc, clamped = self._groups(optin_values, local_values)
        s2_hat = self.private_variance(t, rng)
        mu_t = t.mean() + rng.laplace(0.0, self.width / (self.mean_epsilon * len(t)))
        mu_l = (loc + rng.laplace(0.0, self.width / self.epsilon, len(loc))).mean()
        w = self.weight_for(len(t), len(loc), s2_hat)
        s2, source = (s2_hat, "private estimate") if sigma2 is None else (float(_variance(sigma2)), "given")
        return MeanEstimate(self.name, float(w * mu_t + (1.0 - w) * mu_l),
                            self.expected_squared_error(len(t), len(loc), s2, w), len(t), len(loc), clamped,
                            s2, source, w, self.guarantee, s2_hat)


# ----- distributions for simulations --------------------------------------------------------
_DYADIC = 2.0 ** -np.arange(1, 54)  # bit weights of a 53-bit uniform (NumPy's random())


@dataclass(frozen=True)
class Distribution:
    """A value distribution on [0, 1] (scaled to [lo, hi] by the caller).

    ``uniform``, ``beta:a,b`` (a, b > 0) or ``bernoulli:p`` (values lo and hi, 0 ≤ p ≤ 1).
    """

    kind: str
    params: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str | Distribution) -> Distribution:
        """Parse ``uniform`` / ``beta:a,b`` / ``bernoulli:p``."""
        if isinstance(text, Distribution):
            return text
        allowed = "uniform, beta:A,B with A, B > 0, or bernoulli:P with 0 <= P <= 1"
        kind, _, rest = str(text).strip().lower().partition(":")
        try:
            params = tuple(float(v) for v in rest.split(",")) if rest else ()
        except ValueError:
            raise parameter_error(_label("distribution"), text, allowed) from None
        ok = ((kind == "uniform" and not params)
              or (kind == "beta" and len(params) == 2 and all(math.isfinite(p) and p > 0 for p in params))
              or (kind == "bernoulli" and len(params) == 1 and 0.0 <= params[0] <= 1.0))
        if not ok:
            raise parameter_error(_label("distribution"), text, allowed)
        return cls(kind, params)

    def __str__(self) -> str:
        return self.kind + (":" + ",".join(f"{p:g}" for p in self.params) if self.params else "")

    @property
    def mean(self) -> float:
        """Mean on [0, 1]."""
        if self.kind == "uniform":
            return 0.5
        if self.kind == "beta":
            a, b = self.params
            return a / (a + b)
        return self.params[0]

    @property
    def variance(self) -> float:
        """Variance on [0, 1] (multiply by Δ² for [lo, hi])."""
        if self.kind == "uniform":
            return 1.0 / 12.0
        if self.kind == "beta":
            a, b = self.params
            return a * b / ((a + b) ** 2 * (a + b + 1.0))
        p = self.params[0]
        return p * (1.0 - p)

    def draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Values on [0, 1]."""
        if self.kind == "uniform":
            return rng.random(size)
        if self.kind == "beta":
            return rng.beta(self.params[0], self.params[1], size)
        return (rng.random(size) < self.params[0]).astype(np.float64)

    def elements_per_trial(self, m: int, squares: bool) -> int:
        """How many values :meth:`group_sums` materializes per trial for a group of m users."""
        if self.kind == "bernoulli":
            return 1
        if self.kind == "uniform" and not squares:
            return len(_DYADIC)
        return m

    def group_sums(self, rng: np.random.Generator, m: int, trials: int,
                   squares: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(Σ y, Σ y² or None) over m i.i.d. values, for each of ``trials`` trials.

        Exact in distribution, without an m × trials array where possible:

        * bernoulli: Σ y = Σ y² ~ Binomial(m, p);
        * uniform, sums only: NumPy's uniform is k·2⁻⁵³ with k uniform on 53 bits, whose bits are
          i.i.d. fair coins, so Σ_i U_i = Σ_j 2⁻ʲ N_j with N_j ~ Binomial(m, 1/2) independent;
        * otherwise the values are drawn, in blocks of at most ``_BLOCK_ELEMENTS``.
        """
        if self.kind == "bernoulli":
            s = rng.binomial(m, self.params[0], trials).astype(np.float64)
            return s, (s if squares else None)
        if self.kind == "uniform" and not squares:
            return rng.binomial(m, 0.5, (trials, len(_DYADIC))) @ _DYADIC, None
        s = np.empty(trials)
        q = np.empty(trials) if squares else None
        rows = max(1, _BLOCK_ELEMENTS // m)
        for i in range(0, trials, rows):
            y = self.draw(rng, (min(rows, trials - i), m))
            s[i:i + len(y)] = y.sum(axis=1)
            if q is not None:
                q[i:i + len(y)] = np.einsum("ij,ij->i", y, y)
        return s, q


_BLOCK_ELEMENTS = 1 << 21  # values per block (16 MB of float64) when values must be drawn
_MAX_JOB_TRIALS = 1 << 15


# ----- Monte Carlo (drawn data) -------------------------------------------------------------
@dataclass
class _Moments:
    """Count, mean and M2 of the squared errors (Chan et al.'s parallel combination)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @classmethod
    def of(cls, x: np.ndarray) -> _Moments:
        m = float(x.mean())
        return cls(len(x), m, float(((x - m) ** 2).sum()))

    def add(self, o: _Moments) -> None:
        n = self.count + o.count
        d = o.mean - self.mean
        self.m2 += o.m2 + d * d * self.count * o.count / n
        self.mean += d * o.count / n
        self.count = n

    @property
    def se(self) -> float:
        """Standard error of the mean squared error."""
        return math.sqrt(self.m2 / (self.count - 1) / self.count) if self.count > 1 else math.inf


@dataclass(frozen=True)
class MechanismMSE:
    """Analytic and Monte Carlo MSE of one mechanism."""

    analytic: float
    simulated: float
    simulated_se: float

    @property
    def z(self) -> float:
        """(simulated − analytic)/SE."""
        return (self.simulated - self.analytic) / self.simulated_se if self.simulated_se > 0 else 0.0


MECHANISM_KEYS = ("mse_full_lm", "mse_only_tcm", "mse_hybrid", "mse_hybrid_unknown_variance")


@dataclass(frozen=True)
class SimulationResult:
    """What :func:`simulate` measured. ``mse[key]`` for key in :data:`MECHANISM_KEYS`.

    For ``mse_hybrid_unknown_variance``, ``analytic`` is the *ideal* MSE_H(w*) with the split
    budget (what it would be if σ̂² were exact), not the exact error of the plug-in weight.
    """

    n: int
    n_optin: int
    n_local: int
    optin_fraction: float
    epsilon: float
    lower: float
    upper: float
    distribution: Distribution
    sigma2: float
    trials: int
    variance_share: float
    seed: int | None
    mse: dict[str, MechanismMSE]
    w_star: float
    r: float
    seconds: float

    @property
    def r_simulated(self) -> float:
        """min(simulated MSE_F, MSE_T)/simulated MSE_H."""
        m = self.mse
        return min(m["mse_full_lm"].simulated, m["mse_only_tcm"].simulated) / m["mse_hybrid"].simulated

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "n": self.n, "n_optin": self.n_optin, "n_local": self.n_local, "optin_fraction": self.optin_fraction,
            "epsilon": self.epsilon, "lower": self.lower, "upper": self.upper,
            "distribution": str(self.distribution), "sigma2": self.sigma2, "trials": self.trials,
            "model": "values drawn i.i.d. each trial; opt-in group a uniformly random subset of size "
                     "round(c·n); target: the sample mean of all n values",
        }
        for key, m in self.mse.items():
            name = "analytic_ideal" if key == "mse_hybrid_unknown_variance" else "analytic"
            obj[key] = {name: m.analytic, "simulated": m.simulated, "simulated_se": m.simulated_se}
        obj["mse_hybrid_unknown_variance"]["variance_share"] = self.variance_share
        obj.update({"w_star": self.w_star, "r": self.r, "r_simulated": self.r_simulated,
                    "seconds": round(self.seconds, 3), "seed": self.seed})
        if self.seed is not None:
            obj["warning"] = SEED_WARNING
        return obj


@dataclass(frozen=True)
class _Plan:
    n_t: int
    n_l: int
    epsilon: float
    variance_share: float
    dist: Distribution
    w_star: float


def _simulate_job(plan: _Plan, rng: np.random.Generator, k: int) -> list[_Moments]:
    """k trials in units of Δ (values on [0, 1]); squared errors of the four mechanisms.

    Per trial, with D = μ̄_T − μ̄_L and c = n_T/n (so μ̄ = c μ̄_T + (1−c) μ̄_L):
    FullLM error = mean of n Lap(1/ε) = (G − G')/(ε n), G, G' ~ Gamma(n, 1) (exact: Lap = E − E');
    OnlyTCM error = Lap(1/(ε n_T)) + (1 − c)D; Hybrid error = w·Lap_T + (1 − w)·noise_L + (w − c)D.
    """
    n_t, n_l, eps = plan.n_t, plan.n_l, plan.epsilon
    n = n_t + n_l
    c = n_t / n
    s_t, q_t = plan.dist.group_sums(rng, n_t, k, squares=True)
    s_l, _ = plan.dist.group_sums(rng, n_l, k, squares=False)
    d = s_t / n_t - s_l / n_l
    e_full = (rng.standard_gamma(n, k) - rng.standard_gamma(n, k)) / (eps * n)
    noise_l = (rng.standard_gamma(n_l, k) - rng.standard_gamma(n_l, k)) / (eps * n_l)
    lap_t = rng.laplace(0.0, 1.0 / (eps * n_t), k)
    e_tcm = lap_t + (1.0 - c) * d
    w = plan.w_star
    e_hyb = w * lap_t + (1.0 - w) * noise_l + (w - c) * d
    # unknown σ²: private sample variance (ρε), opt-in mean with (1 − ρ)ε, plug-in weight
    eps_v, eps_m = plan.variance_share * eps, (1.0 - plan.variance_share) * eps
    s2 = (q_t - s_t * s_t / n_t) / (n_t - 1) if n_t > 1 else np.zeros(k)
    s2_hat = np.clip(s2 + rng.laplace(0.0, 1.0 / (n_t * eps_v), k), 0.0, 0.25)
    w_hat = optimal_weight(n, c, epsilon=eps, sigma2=s2_hat, optin_epsilon=eps_m)
    lap_m = rng.laplace(0.0, 1.0 / (eps_m * n_t), k)
    e_unk = w_hat * lap_m + (1.0 - w_hat) * noise_l + (w_hat - c) * d
    return [_Moments.of(e * e) for e in (e_full, e_tcm, e_hyb, e_unk)]


def simulate(n: int, optin_fraction: float, epsilon: float, *, lower: float = 0.0, upper: float = 1.0,
             distribution: str | Distribution = "uniform", trials: int = 10_000, seed: int | None = None,
             variance_share: float = VARIANCE_SHARE,
             progress: Callable[[int, int], Any] | None = None) -> SimulationResult:
    """Analytic and Monte Carlo MSE of FullLM, OnlyTCM, Hybrid(w*) and Hybrid with unknown σ².

    The model (SPEC §11): each trial draws n values i.i.d. from ``distribution`` scaled to
    [lower, upper]; a uniformly random subset of n_T = round(c·n) users opts in (with i.i.d.
    values, the first n_T are such a subset); the target is the sample mean of all n values.
    The analytic MSEs use σ² = Δ²·Var(distribution on [0, 1]) and c = n_T/n.

    Vectorized over trials; no n × trials array: the local noise mean is exact via a difference
    of two Gamma draws; group sums are Binomial (bernoulli), a 53-term binomial bit decomposition
    (uniform, local group) or drawn in blocks of ≤ 2²¹ values (uniform opt-in group, which needs
    Σy² for the variance; beta). Cost: O(trials) for bernoulli; O(trials·n_T) for uniform (the
    opt-in group's values are drawn); O(trials·n) for beta (~40 ns per value). Trials run in
    jobs of ≤ 2¹⁵, each with its own child generator (``Generator.spawn``).

    Parameters
    ----------
    n, optin_fraction, epsilon : users, opt-in rate c, privacy loss ε.
    lower, upper : the value range (Δ = upper − lower).
    distribution : ``uniform`` | ``beta:a,b`` | ``bernoulli:p`` (on [lower, upper]).
    trials : Monte Carlo trials (≥ 2).
    seed : reproducible experiments; default OS randomness.
    variance_share : ρ of :class:`HybridUnknownVariance`.
    progress : ``progress(done_trials, trials)`` after each job.
    """
    setting = MeanSetting(lower, upper, epsilon)
    n_t, n_l = group_sizes(n, optin_fraction)
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 2:
        raise parameter_error(_label("trials"), trials, "an integer >= 2")
    rho = float(_fraction(variance_share, "variance_share"))
    dist = Distribution.parse(distribution)
    eps, width = float(epsilon), setting.width
    c = n_t / n
    sigma2 = width * width * dist.variance
    w_star = float(optimal_weight(n, c, epsilon=eps, sigma2=dist.variance))
    plan = _Plan(n_t, n_l, eps, rho, dist, w_star)
    per_trial = max(dist.elements_per_trial(n_t, True), dist.elements_per_trial(n_l, False))
    job = int(min(_MAX_JOB_TRIALS, max(1, _BLOCK_ELEMENTS // per_trial)))
    sizes = [min(job, trials - i) for i in range(0, trials, job)]
    rngs = make_rng(seed).spawn(len(sizes))
    logger.info("simulating %d trials in %d jobs of <= %d", trials, len(sizes), job)
    start = time.perf_counter()
    totals = [_Moments() for _ in MECHANISM_KEYS]
    done = 0
    for rng, k in zip(rngs, sizes, strict=True):
        for tot, m in zip(totals, _simulate_job(plan, rng, k), strict=True):
            tot.add(m)
        done += k
        if progress is not None:
            progress(done, trials)
    seconds = time.perf_counter() - start
    kw = {"epsilon": eps, "sigma2": sigma2, "width": width}
    analytic = [float(mse_full_lm(n, epsilon=eps, width=width)), float(mse_only_tcm(n, c, **kw)),
                float(mse_hybrid_optimal(n, c, **kw)),
                float(mse_hybrid_optimal(n, c, optin_epsilon=(1.0 - rho) * eps, **kw))]
    scale = width * width
    mse = {key: MechanismMSE(a, tot.mean * scale, tot.se * scale)
           for key, a, tot in zip(MECHANISM_KEYS, analytic, totals, strict=True)}
    return SimulationResult(int(n), n_t, n_l, float(optin_fraction), eps, float(lower), float(upper), dist, sigma2,
                            int(trials), rho, seed, mse, w_star, float(improvement(n, c, **kw)), seconds)


# ----- one run on fixed data ----------------------------------------------------------------
@dataclass(frozen=True)
class DataRun:
    """:func:`simulate_on_data`: one random opt-in split of fixed data, four mechanisms.

    ``estimates`` maps "full_lm", "only_tcm", "hybrid_oracle", "hybrid_unknown_variance" to a
    :class:`MeanEstimate` whose ``expected_squared_error`` is evaluated at the data's sample
    variance s² (divisor n − 1) of the clamped values: the exact expected error over the random
    opt-in subset and the noise, for this data (the Hybrid with unknown σ² at the weight it used).
    """

    n: int
    n_optin: int
    n_local: int
    epsilon: float
    lower: float
    upper: float
    true_mean: float
    clamped_mean: float
    sample_variance: float
    clamped: ClampCount
    estimates: dict[str, MeanEstimate]
    variance_share: float
    seed: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "n": self.n, "n_optin": self.n_optin, "n_local": self.n_local, "epsilon": self.epsilon,
            "lower": self.lower, "upper": self.upper, "true_mean": self.true_mean,
            "clamped_mean": self.clamped_mean, "sample_variance": self.sample_variance,
            "clamped": {"below": self.clamped.below, "above": self.clamped.above, "total": self.clamped.total},
            "variance_share": self.variance_share,
            "estimates": {k: v.to_json() for k, v in self.estimates.items()},
            "seed": self.seed, "notes": self.notes,
        }
        if self.seed is not None:
            obj["warning"] = SEED_WARNING
        return obj


def simulate_on_data(values: Any, *, lower: float, upper: float, epsilon: float, optin_fraction: float,
                     seed: int | None = None, variance_share: float = VARIANCE_SHARE) -> DataRun:
    """Simulate the hybrid model on real data: one value per user (SPEC §11).

    A uniformly random subset of round(c·n) users opts in; the others randomize locally. Runs
    FullLM, OnlyTCM, Hybrid with the *oracle* σ² = s² of the data (simulation only: it reads the
    raw data, so that weight is not private) and :class:`HybridUnknownVariance` (fully private).
    """
    setting = MeanSetting(lower, upper, epsilon)
    raw = _values(values, "values")
    n_t, _ = group_sizes(len(raw), optin_fraction)
    x, clamped = clamp_values(raw, setting.lower, setting.upper, log=False)
    rng_split, rng_f, rng_t, rng_h, rng_u = make_rng(seed).spawn(5)
    optin = np.zeros(len(x), dtype=bool)
    optin[rng_split.choice(len(x), size=n_t, replace=False)] = True
    x_t, x_l = x[optin], x[~optin]
    s2 = float(np.var(x, ddof=1))
    kw = {"lower": setting.lower, "upper": setting.upper, "epsilon": float(epsilon)}
    oracle = Hybrid(sigma2=s2, **kw)
    unknown = HybridUnknownVariance(variance_share=variance_share, **kw)
    estimates = {
        "full_lm": FullLM(**kw).estimate(x_t, x_l, rng=rng_f),
        "only_tcm": OnlyTCM(**kw).estimate(x_t, x_l, rng=rng_t, sigma2=s2),
        "hybrid_oracle": oracle.estimate(x_t, x_l, rng=rng_h),
        "hybrid_unknown_variance": unknown.estimate(x_t, x_l, rng=rng_u, sigma2=s2),
    }
    # clamping was done here on the raw data; report it once (the mechanisms saw clean values)
    estimates = {k: _with_clamped(v, clamped) for k, v in estimates.items()}
    notes = ["analytic RMSEs: expectation over the random opt-in subset and the noise, for this data, "
             "at its sample variance s² (divisor n − 1); Hybrid with unknown σ² at the weight it used",
             "Hybrid (oracle σ²) uses the data's true variance: a simulation benchmark, not private"]
    if clamped.total:
        notes.append(f"{clamped.total} values outside [{setting.lower:g}, {setting.upper:g}] were clamped "
                     f"({clamped.below} below, {clamped.above} above); the estimates target the clamped mean "
                     "(count from raw data: not differentially private, for your information)")
    return DataRun(len(x), n_t, len(x) - n_t, float(epsilon), float(lower), float(upper), float(raw.mean()),
                   float(x.mean()), s2, clamped, estimates, float(variance_share), seed, notes)


def _with_clamped(est: MeanEstimate, clamped: ClampCount) -> MeanEstimate:
    return replace(est, clamped=clamped)


# ----- the paper's figures ------------------------------------------------------------------
def _n_grid(n_min: float, n_max: float, c: float, points: int = 1500) -> np.ndarray:
    lo = max(float(n_min), 2.0 / c, 2.0 / (1.0 - c))
    return np.logspace(math.log10(lo), math.log10(max(float(n_max), lo * 10)), points)


def plot_mse_vs_n(path: str | Path, *, epsilon: float, optin_fraction: float, sigma2: float, width: float = 1.0,
                  n_min: float = 10.0, n_max: float = 1e6, subtitle: str = "") -> dict[str, Any]:
    """Paper Fig. 1: MSE_F, MSE_T and MSE_H(w*) against n, log–log, as a PNG (matplotlib Agg).

    Returns where OnlyTCM overtakes FullLM and where R peaks.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    c = float(_fraction(optin_fraction))
    kw = {"epsilon": epsilon, "sigma2": sigma2, "width": width}
    n = _n_grid(n_min, n_max, c)
    f = mse_full_lm(n, epsilon=epsilon, width=width)
    t = mse_only_tcm(n, c, **kw)
    h = mse_hybrid_optimal(n, c, **kw)
    r = np.minimum(f, t) / h
    fig = Figure(figsize=(7.5, 5.0), dpi=130, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.loglog(n, f, label="FullLM  (everyone local)", color="#1f77b4", lw=2)
    ax.loglog(n, t, label="OnlyTCM  (opt-in users only)", color="#ff7f0e", lw=2)
    ax.loglog(n, h, label="Hybrid  (optimal weight w*)", color="#2ca02c", lw=2.5)
    i = int(np.argmax(r))
    ax.axvline(n[i], color="grey", ls=":", lw=1)
    ax.plot([n[i]], [h[i]], "o", color="#2ca02c", ms=5)
    ax.annotate(f"largest gain over the better benchmark:\nR = {r[i]:.2f} at n ≈ {n[i]:,.0f}", (n[i], h[i]),
                xytext=(-40, -75), textcoords="offset points", ha="right", fontsize=9,
                arrowprops={"arrowstyle": "->", "color": "grey"})
    ax.set_xlabel("number of users n")
    ax.set_ylabel("expected squared error of the mean")
    ax.set_title(f"Fig. 1 — error vs n  (ε = {epsilon:g}, opt-in c = {c:.3g}, Δ = {width:g}, σ² = {sigma2:.4g})"
                 + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.12)
    ax.legend(frameon=False)
    fig.savefig(path)
    cross = crossover_n(c, epsilon=epsilon, sigma2=sigma2, width=width)
    return {"path": str(path), "r_max": float(r[i]), "n_at_r_max": float(n[i]),
            "n_tcm_beats_lm": cross if math.isfinite(cross) else None}


def plot_improvement_vs_n(path: str | Path, *, epsilon: float, optin_fractions: Sequence[float], sigma2: float,
                          width: float = 1.0, n_min: float = 10.0, n_max: float = 1e6,
                          highlight: float | None = None, subtitle: str = "") -> list[dict[str, Any]]:
    """Paper Fig. 2: R = min(MSE_F, MSE_T)/MSE_H(w*) against n for several opt-in rates (PNG).

    Returns the largest R of each curve and where it is; ``interior`` is False when R still
    grows at ``n_max`` (when σ²(1−c)/c ≥ 2Δ²/ε², OnlyTCM never overtakes FullLM).
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5.0), dpi=130, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    peaks = []
    cmap = matplotlib.colormaps["viridis"]
    cs = sorted({float(_fraction(c)) for c in optin_fractions})
    for j, c in enumerate(cs):
        n = _n_grid(n_min, n_max, c)
        r = improvement(n, c, epsilon=epsilon, sigma2=sigma2, width=width)
        i = int(np.argmax(r))
        interior = i < len(n) - 1  # else R still grows at n_max: OnlyTCM never overtakes FullLM here
        peaks.append({"optin_fraction": c, "r_max": float(r[i]), "n_at_r_max": float(n[i]), "interior": interior})
        bold = highlight is not None and math.isclose(c, highlight)
        color = cmap(j / max(1, len(cs) - 1) * 0.9)
        label = (f"c = {c:.3g}  (peak {r[i]:.2f} at n ≈ {n[i]:,.0f})" if interior
                 else f"c = {c:.3g}  (still rising: {r[i]:.2f} at n = {n[i]:,.0f})")
        ax.semilogx(n, r, color=color, lw=3 if bold else 1.6, label=label)
        if interior:
            ax.plot([n[i]], [r[i]], "o", color=color, ms=4)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(2.0, color="grey", ls="--", lw=0.8)
    ax.set_ylim(0.9, max(2.2, max(p["r_max"] for p in peaks) * 1.05))
    ax.set_xlabel("number of users n")
    ax.set_ylabel("improvement R = min(MSE_F, MSE_T) / MSE_H(w*)")
    ax.set_title(f"Fig. 2 — gain of Hybrid over the better benchmark  (ε = {epsilon:g}, Δ = {width:g}, "
                 f"σ² = {sigma2:.4g})" + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.grid(True, which="major", alpha=0.4)
    ax.legend(frameon=False, fontsize=9, loc="upper right")
    fig.savefig(path)
    return peaks

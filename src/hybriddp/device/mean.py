"""The numeric randomizer of one device: pure Python, no NumPy, OS randomness by default.

ALGORITHM.md §11 (hybrid mean estimation; Dubey & Korolova 2018, §2 "FullLM" and the local group of
"Hybrid"): a user who trusts no one reports

    r = clamp(x, lo, hi) + Lap(Δ/ε),   Δ = hi − lo,

and nothing else. Given the clamped input x̃, the output has the density
f(r | x̃) = exp(−|r − x̃|/b) / (2b) with b = Δ/ε, so for any two inputs x, x' and every output r

    ln f(r | x̃) − ln f(r | x̃') = (|r − x̃'| − |r − x̃|)/b ≤ |x̃ − x̃'|/b ≤ Δ/b = ε

(triangle inequality; equality for x̃ = lo, x̃' = hi and r ≥ hi): the randomizer is ε-locally
differentially private, whatever the raw values are, because clamping comes first.
:func:`output_log_density` is that closed form, used by the tests for an exact check.

Clamping is counted on the device (:attr:`NumericRandomizer.clamped`) and logged without the
value. The count is *not* part of the report: sending it would leak whether x was out of range.

Randomness comes from :class:`~hybriddp.device.localalg.SystemSource` (``random.SystemRandom``, i.e. the
OS) unless a source is passed; :class:`~hybriddp.device.localalg.SeededSource` exists for reproducible
experiments only and gives no privacy.

Floating point: like the rest of hybriddp (see :mod:`hybriddp.core.rng`) this is the textbook
floating-point Laplace mechanism. Its low-order bits can leak (Mironov, CCS 2012); a hardened
deployment should replace :func:`laplace` by a snapping or discrete-Laplace sampler.
"""

from __future__ import annotations

import logging
import math

from hybriddp.core.errors import parameter_error
from hybriddp.device.localalg import RandomSource, SeededSource, SystemSource

__all__ = [
    "NumericRandomizer",
    "SeededSource",
    "SystemSource",
    "clamp",
    "laplace",
    "output_log_density",
    "randomize_value",
]

logger = logging.getLogger(__name__)


def _check_setting(lower: float, upper: float, epsilon: float) -> None:
    for name, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise parameter_error(name, value, "a finite number")
    if not lower < upper:
        raise parameter_error("upper", upper, f"> lower = {lower!r}",
                              "Give the range [lower, upper] the values are known to lie in.")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (
            math.isfinite(epsilon) and epsilon > 0):
        raise parameter_error("epsilon", epsilon, "a finite number > 0")


def laplace(scale: float, source: RandomSource) -> float:
    """One Laplace(0, ``scale``) draw from two uniforms: a sign and an Exp(1) magnitude.

    E = −ln(1 − U) with U ∈ [0, 1) is Exp(1) (1 − U ∈ (0, 1], so the log is finite); a fair
    sign makes ±E Laplace(0, 1).
    """
    negative = source.uniform() < 0.5
    magnitude = -math.log1p(-source.uniform())
    return -scale * magnitude if negative else scale * magnitude


def clamp(value: float, lower: float, upper: float) -> tuple[float, bool]:
    """(value clamped to [lower, upper], whether it had to be clamped)."""
    if value < lower:
        return float(lower), True
    if value > upper:
        return float(upper), True
    return float(value), False


def output_log_density(report: float, value: float, *, lower: float, upper: float, epsilon: float) -> float:
    """ln f(report | value): the exact log density of the randomizer's output (closed form).

    f(r | x) = exp(−|r − clamp(x)|/b) / (2b), b = (upper − lower)/ε.
    """
    _check_setting(lower, upper, epsilon)
    b = (upper - lower) / epsilon
    x, _ = clamp(value, lower, upper)
    return -abs(report - x) / b - math.log(2.0 * b)


class NumericRandomizer:
    """Clamp to [lower, upper], add Laplace((upper − lower)/ε): ε-LDP (ALGORITHM.md §11).

    Parameters
    ----------
    lower, upper : the public range of the value (lower < upper, both finite).
    epsilon : privacy loss ε > 0 of the one report.
    source : randomness; default :class:`~hybriddp.device.localalg.SystemSource` (OS entropy).

    Attributes
    ----------
    clamped : how many values given to :meth:`randomize` were outside [lower, upper]. It stays
        on the device; it is not part of the report.

    Examples
    --------
    >>> r = NumericRandomizer(lower=0.0, upper=10.0, epsilon=1.0, source=SeededSource(1))
    >>> isinstance(r.randomize(3.5), float)
    True
    """

    def __init__(self, *, lower: float, upper: float, epsilon: float, source: RandomSource | None = None) -> None:
        _check_setting(lower, upper, epsilon)
        self.lower = float(lower)
        self.upper = float(upper)
        self.epsilon = float(epsilon)
        self.source: RandomSource = source if source is not None else SystemSource()
        self.clamped = 0

    @property
    def scale(self) -> float:
        """b = Δ/ε, the Laplace scale."""
        return (self.upper - self.lower) / self.epsilon

    def randomize(self, value: float) -> float:
        """The report to send for ``value``: clamp(value) + Lap(Δ/ε)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise parameter_error("value", value, "a number (NaN is not allowed)")
        x, was_clamped = clamp(value, self.lower, self.upper)
        if was_clamped:
            self.clamped += 1
            logger.warning("a value outside [%g, %g] was clamped before randomizing (%d so far on this device)",
                           self.lower, self.upper, self.clamped)
        return x + laplace(self.scale, self.source)


def randomize_value(value: float, *, lower: float, upper: float, epsilon: float,
                    source: RandomSource | None = None) -> float:
    """One ε-LDP report of ``value``: clamp to [lower, upper], add Laplace((upper − lower)/ε)."""
    return NumericRandomizer(lower=lower, upper=upper, epsilon=epsilon, source=source).randomize(value)

"""Validated parameters of hybrid mean estimation: the public setting, group sizes and clamping."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybriddp.errors import DataError, parameter_error

# the package's one logger, under the name the single module logged as ("hybriddp.mean")
logger = logging.getLogger(__package__)

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
    """The public parameters every mechanism shares, validated once (ALGORITHM.md §11).

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
    """(n_T, n_L) = (round(c·n), n − n_T); both groups must be non-empty (ALGORITHM.md §11).

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
    """Clamp to [lower, upper] and count what was clamped (ALGORITHM.md §11: Δ must bound every value).

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

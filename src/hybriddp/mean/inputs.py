"""Validated parameters of hybrid mean estimation: the public setting, group sizes and clamping."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybriddp.core.errors import DataError, parameter_error

# the package's one logger, under the name the single module logged as ("hybriddp.mean")
logger = logging.getLogger(__package__)

VARIANCE_SHARE = 0.2
"""ρ: the share of the opt-in budget :class:`HybridUnknownVariance` spends on the variance."""

Real = float | np.ndarray

MAX_USERS = 10**12
"""Largest n of ``mean simulate`` and of the plots' x axis (more than the world's population)."""

NOISE_SCALE_RANGE = (1e-75, 1e75)
"""Allowed noise standard deviations in units of Δ (√2/(ε·n_T) for the opt-in mean, √2/(ε·√n_L) for the mean
of the local reports): with Δ in :data:`WIDTH_RANGE` every squared error lies in [1e-300, 1e300], so the MSE
formulas, w* and the Monte Carlo stay finite and non-zero."""

WIDTH_RANGE = (1e-75, 1e75)
"""Allowed Δ = upper − lower, and |lower|, |upper| ≤ the upper end (sums of n values stay finite)."""

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


_FRACTION_HINTS = {"optin_fraction": " (0.05 = 5% of the users opt in)",
                   "variance_share": " (0.2: a fifth of the opt-in budget buys the variance, the rest the mean)"}


def _fraction(value: Any, name: str = "optin_fraction") -> Real:
    return _real(name, value, lambda a: (a > 0) & (a < 1), "strictly between 0 and 1" + _FRACTION_HINTS.get(name, ""))


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
        lo_w, hi_w = WIDTH_RANGE
        for name in ("lower", "upper"):
            _real(name, getattr(self, name), lambda a: (a.ndim == 0) & (np.abs(a) <= hi_w),
                  f"a finite number in [-{hi_w:g}, {hi_w:g}]", "Rescale the values (e.g. to thousands) so that sums "
                  "and squares of n of them stay finite.")
        if not self.lower < self.upper:
            raise parameter_error(_label("upper"), self.upper, f"> lower = {self.lower!r}",
                                  "Give the range [lower, upper] the values are known to lie in; values "
                                  "outside it are clamped.")
        if not self.width >= lo_w:
            raise parameter_error(_label("upper"), self.upper, f">= lower + {lo_w:g} (lower = {self.lower!r}): the "
                                  "range is too narrow for squared errors to stay non-zero doubles",
                                  "Rescale the values (e.g. to millionths).")
        _epsilon(self.epsilon)

    @property
    def width(self) -> float:
        """Δ = upper − lower: the sensitivity of one user's value."""
        return float(self.upper) - float(self.lower)


def group_sizes(n: int, optin_fraction: float) -> tuple[int, int]:
    """(n_T, n_L) = (round(c·n), n − n_T); both groups must be non-empty (ALGORITHM.md §11).

    ``round`` is Python's (as in :func:`hybriddp.simulation.pipeline.split_optin`).
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


def check_noise_scales(epsilon: float, n_optin: float, n_local: float, variance_share: float | None = None,
                       fraction_name: str = "optin_fraction") -> None:
    """Refuse an ε (or ρ) whose noise is too large or too small for the arithmetic (ALGORITHM.md §11).

    The noise standard deviations in units of Δ — √2/(ε·n_T) (opt-in mean), √2/(ε·√n_L) (mean of
    the local reports), √2/(ε·√n) (FullLM) and, with ``variance_share`` ρ, √2/(ρε·n_T) and
    √2/((1 − ρ)ε·n_T) — must lie in :data:`NOISE_SCALE_RANGE`. The message gives the range of ε
    (or ρ) that works for these group sizes. ``n_optin`` and ``n_local`` may be real (the plots);
    ``fraction_name`` names the opt-in rate in the message when no ε can work.
    """
    lo, hi = NOISE_SCALE_RANGE
    eps = float(epsilon)
    root2 = math.sqrt(2.0)
    consts = (root2 / n_optin, root2 / math.sqrt(n_local), root2 / math.sqrt(n_optin + n_local))
    eps_min, eps_max = max(consts) / hi, min(consts) / lo
    if eps_min > eps_max:
        raise parameter_error(_label(fraction_name), n_optin / (n_optin + n_local),
                              f"large enough that n_T = {n_optin:g} opt-in users are not {hi / lo:.0e} times fewer "
                              f"than sqrt(n_L) = {math.sqrt(n_local):g}: no epsilon keeps both noises in range",
                              "Use a larger opt-in fraction or more users.")
    if not eps_min <= eps <= eps_max:
        raise parameter_error(_label("epsilon"), eps, f"between {eps_min:.3g} and {eps_max:.3g} for n_T = {n_optin:g} "
                              f"opt-in and n_L = {n_local:g} local users: the Laplace noise's standard deviation "
                              f"sqrt(2)*Delta/(epsilon*n_T) (and sqrt(2)*Delta/(epsilon*sqrt(n_L))) must stay between "
                              f"{lo:g} and {hi:g} times Delta, or the squared errors overflow or vanish",
                              "Typical values of epsilon are 0.1 to 10.")
    if variance_share is not None:
        rho = float(variance_share)
        rho_min = root2 / (n_optin * eps * hi)
        if min(rho, 1.0 - rho) < rho_min:
            raise parameter_error(_label("variance_share"), rho, f"between {rho_min:.3g} and 1 - {rho_min:.3g} at "
                                  f"epsilon = {eps:g} with n_T = {n_optin:g}: the private variance (budget "
                                  "rho*epsilon) and the opt-in mean (budget (1 - rho)*epsilon) would get noise over "
                                  f"{hi:g} times Delta", f"The default is {VARIANCE_SHARE:g}.")


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


class OnSetting:
    """A mechanism on a :class:`MeanSetting`: its width Δ = upper − lower and its ε."""

    setting: MeanSetting

    @property
    def width(self) -> float:
        return self.setting.width

    @property
    def epsilon(self) -> float:
        return float(self.setting.epsilon)

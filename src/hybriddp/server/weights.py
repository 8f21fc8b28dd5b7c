"""Inverse-variance blending of two estimates (ALGORITHM.md §7, Fig. 7 lines 2–4; Theorem 6): for independent
unbiased estimates, w = σ²_C/(σ²_O + σ²_C) minimizes the variance of w·p̂_O + (1−w)·p̂_C, w²σ²_O + (1−w)²σ²_C.
The estimator strategies (:mod:`.blend`, :mod:`.consistency`) build on it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VARIANCE_FLOOR = 1e-300
"""Variances are floored here so the weight is always defined (ALGORITHM.md §7)."""


@dataclass
class Blended:
    """Blended estimates with their weights (w = weight of the opt-in estimate)."""

    p: np.ndarray
    var: np.ndarray
    weight_optin: np.ndarray


def blend(p_o: np.ndarray, var_o: np.ndarray, p_c: np.ndarray, var_c: np.ndarray) -> Blended:
    """w_r = σ̂²_C/(σ̂²_O + σ̂²_C); p̂ = w·p̂_O + (1−w)·p̂_C (Fig. 7 lines 2-4).

    An infinite variance (a group with no data) gets weight 0.
    """
    vo = np.maximum(np.asarray(var_o, dtype=np.float64), VARIANCE_FLOOR)
    vc = np.maximum(np.asarray(var_c, dtype=np.float64), VARIANCE_FLOOR)
    with np.errstate(invalid="ignore"):  # σ²_O = ∞ alone gives σ²_C/∞ = 0; both infinite: ½ below
        w = np.where(np.isinf(vc), 1.0, vc / (vo + vc))
    w = np.where(np.isinf(vo) & np.isinf(vc), 0.5, w)
    p = w * np.nan_to_num(p_o) + (1.0 - w) * np.nan_to_num(p_c)
    return Blended(p, fixed_weight_variance(w, vo, vc), w)


def fixed_weight_variance(w: np.ndarray, var_o: np.ndarray, var_c: np.ndarray) -> np.ndarray:
    """w²σ²_O + (1 − w)²σ²_C, the variance of a blend whose weights are fixed (Fig. 7 line 4); a group
    with weight 0 adds nothing (its variance may be infinite)."""
    with np.errstate(invalid="ignore"):
        return np.where(w == 0, var_c, np.where(w == 1, var_o, w * w * var_o + (1 - w) ** 2 * var_c))

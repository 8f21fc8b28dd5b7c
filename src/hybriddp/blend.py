"""BlendProbabilities: inverse-variance blending and simplex projection (ALGORITHM.md §7, Fig. 7).

Theorem 6: for independent unbiased estimates, w = σ²_C/(σ²_O + σ²_C) minimizes the variance
of w·p̂_O + (1−w)·p̂_C, giving w²σ²_O + (1−w)²σ²_C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hybriddp.client_estimates import ClientEstimates
    from hybriddp.curator import OptinEstimates

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
    with np.errstate(invalid="ignore"):
        var = np.where(w == 0, vc, np.where(w == 1, vo, w * w * vo + (1 - w) ** 2 * vc))
    return Blended(p, var, w)


def project_to_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {x ≥ 0, Σx = 1} (Wang & Carreira-Perpiñán 2013), O(N log N)."""
    v = np.asarray(v, dtype=np.float64)
    if v.size == 0:
        return v.copy()
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    j = np.arange(1, len(u) + 1)
    rho = np.flatnonzero(u + (1.0 - css) / j > 0)[-1]
    lam = (1.0 - css[rho]) / (rho + 1)
    return np.maximum(v + lam, 0.0)


@dataclass
class BlendOutput:
    """Record- and query-level blends (Fig. 2 line 5), raw and projected."""

    records: Blended
    queries: Blended
    records_projected: np.ndarray | None
    queries_final: np.ndarray

    @property
    def records_final(self) -> np.ndarray:
        """The record estimates a result reports: projected onto the simplex when asked."""
        return self.records_projected if self.records_projected is not None else self.records.p


def blend_estimates(optin: OptinEstimates, client: ClientEstimates, project: bool = True) -> BlendOutput:
    """BlendProbabilities for records and for queries (ALGORITHM.md §7)."""
    rec = blend(optin.p_record, optin.var_record, client.p_record, client.var_record)
    qry = blend(optin.p_query, optin.var_query, client.p_query, client.var_query)
    projected = project_to_simplex(rec.p) if project else None
    return BlendOutput(rec, qry, projected, qry.p)

"""BlendProbabilities: inverse-variance blending and simplex projection (ALGORITHM.md §7, Fig. 7).

Theorem 6: for independent unbiased estimates, w = σ²_C/(σ²_O + σ²_C) minimizes the variance
of w·p̂_O + (1−w)·p̂_C, giving w²σ²_O + (1−w)²σ²_C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hybriddp.params import ESTIMATORS

if TYPE_CHECKING:
    from hybriddp.client_estimates import ClientEstimates
    from hybriddp.curator import OptinEstimates
    from hybriddp.headlist import HeadList
    from hybriddp.randomizer import LocalAlgParams

POOLED_MAX_PASSES = 50
"""At most this many passes of :func:`blend_pooled`; it stops earlier once no weight moves by 1e-12."""

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


def blend_estimates(optin: OptinEstimates, client: ClientEstimates, project: bool = True, *,
                    estimator: str = "paper", lp: LocalAlgParams | None = None) -> BlendOutput:
    """BlendProbabilities for records and for queries (ALGORITHM.md §7); ``estimator`` names the
    weights (:data:`ESTIMATORS`; ``pooled`` needs the clients' LocalAlg parameters ``lp``)."""
    rec = blend(optin.p_record, optin.var_record, client.p_record, client.var_record)
    qry = blend(optin.p_query, optin.var_query, client.p_query, client.var_query)
    if estimator in ("pooled", "reuse", "consistent"):  # reuse: S already entered the opt-in estimates (§4.1)
        if lp is None:
            raise ValueError("the pooled estimator needs the clients' LocalAlg parameters (lp)")
        rec, qry = blend_pooled(optin, client, lp, rec, qry)
        if estimator == "consistent":  # §7.1: every query = the sum of its entries
            from hybriddp.consistency import make_consistent

            rec, qry = make_consistent(optin, client, lp, rec, qry)
    elif estimator != "paper":
        raise ValueError(f"estimator {estimator!r} is not one of {', '.join(ESTIMATORS)}")
    projected = project_to_simplex(rec.p) if project else None
    return BlendOutput(rec, qry, projected, qry.p)


def blend_pooled(optin: OptinEstimates, client: ClientEstimates, lp: LocalAlgParams, rec: Blended,
                 qry: Blended, max_passes: int = POOLED_MAX_PASSES) -> tuple[Blended, Blended]:
    """Blends whose weights do not move with the estimates they weigh (ALGORITHM.md §7, "Pooled weights").

    The paper's weight uses σ̂²_O at p̂_O and σ̂²_C at p̂_C. A group whose estimate came out low then
    also reports a low variance and gets more weight: the blend is biased low. Here both variances
    are evaluated at the blended estimate p̄ of the previous pass (clamped into [0, 1]), starting from
    the paper's blend, until p̄ is a fixed point: p̄ = w(p̄)·p̂_O + (1−w(p̄))·p̂_C. The optimally
    weighted p̄ is uncorrelated with the difference p̂_O − p̂_C (w·σ²_O = (1−w)·σ²_C), so the weight's
    error no longer correlates with what it multiplies to first order, and the reported variance
    w²σ²_O(p̄) + (1−w)²σ²_C(p̄) is that of the weights actually used.
    """
    from hybriddp.client_estimates import client_variances

    hl: HeadList = optin.head_list
    for _ in range(max_passes):
        w_r, w_q = rec.weight_optin, qry.weight_optin
        p_r, p_q = np.clip(rec.p, 0.0, 1.0), np.clip(qry.p, 0.0, 1.0)
        vc_r, vc_q = client_variances(p_r, p_q, hl, lp, client.n)
        vo_r, vo_q = optin.variances_at(p_r, p_q)
        rec = blend(optin.p_record, vo_r, client.p_record, vc_r)
        qry = blend(optin.p_query, vo_q, client.p_query, vc_q)
        if np.abs(rec.weight_optin - w_r).max(initial=0.0) < 1e-12 and np.abs(
                qry.weight_optin - w_q).max(initial=0.0) < 1e-12:
            break
    return rec, qry

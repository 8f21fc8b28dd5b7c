"""Consistent blends: each query equals the sum of its records (ALGORITHM.md §7.1, ``--estimator consistent``).

:func:`make_consistent` is the step the :attr:`~hybriddp.core.estimators.Blend.CONSISTENT` strategy applies after
the pooled blend (:data:`hybriddp.server.blend.STRATEGIES`).

After blending, a query's estimate p̄_q and the sum of its entries' estimates Σ_e p̄_e (its URLs and
its ⟨q,*⟩) disagree: the clients estimate a query directly from its reports, and each entry is
blended with its own weight. Hay, Rastogi, Miklau and Suciu (VLDB 2010) make a tree of noisy counts
consistent by least squares. Here every query's subtree y = (p̄_e…, p̄_q) is replaced by the
generalized least-squares estimate under the one constraint g·y = 0, g = (1, …, 1, −1):

    ŷ = y − Σgᵀ (g·y)/(gΣgᵀ),     Var(ŷ_i) = Σ_ii − (Σgᵀ)_i²/(gΣgᵀ),

the minimum-variance unbiased linear correction for the covariance Σ of y. This is post-processing
of the released estimates: privacy is unchanged. The reported variance is the blend's (its mean squared
error, §7) times the share 1 − ρ_i² = Var(ŷ_i)/Σ_ii that GLS keeps.

Σ is exact for the estimators of §4, §4.1 and §6 and costs O(entries) via segment sums (no matrices):

* clients: p̂_C,q = (Σ_e f_e − c₀)/a and p̂_C,e = (f_e − o_q + c·p̂_C,q)/D_q are linear in the report
  frequencies f of q's entries, whose covariance is (diag(r) − rrᵀ)/(n − 1);
* opt-in: p̂_O,q = Σ_e p̂_O,e, and Cov(p̂_O,e, p̂_O,e') = −p_e p_e'/n_ee' (n_ee' = |D_T| when neither
  entry reuses S, |D_S| + |D_T| otherwise), with the variances of :meth:`OptinEstimates.record_variances_at`
  on the diagonal;
* the blend: y = W·O + (I − W)·C with the blend's weights, the two groups independent.

Where Σ is evaluated matters, as for the blend weights (§7, "Pooled weights"). At the blends y, or at the
opt-in estimates (whose T-only wildcards enter g·y), the coefficients move with the residual they
multiply and the corrected wildcards and queries come out biased low (z to −12 over 8,000 runs). At the
corrected estimate ŷ itself, which GLS makes uncorrelated with g·y (Cov(ŷ, g·y) = Σgᵀ − Σgᵀ = 0), they do
not: Σ is evaluated at ŷ's records (clamped into [0, 1], query sums recomputed), found by repeating the
correction from the opt-in estimates until it stops moving. At such a consistent point Σ is a true
covariance matrix, so gΣgᵀ ≥ 0; queries where it is 0 (a single entry, or no data in either group) are
already consistent and are left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from hybriddp.server.client_estimates import _Geometry, client_variances
from hybriddp.server.weights import Blended, fixed_weight_variance

CONSISTENT_MAX_PASSES = 100
"""At most this many passes of :func:`make_consistent` (measured: 14–41 on an aol-like
list); it stops once no record moves by 1e-13."""

if TYPE_CHECKING:
    from hybriddp.core.reportlaw import LocalAlgParams
    from hybriddp.curator.estimates import OptinEstimates
    from hybriddp.server.client_estimates import ClientEstimates


class Subtree(NamedTuple):
    """Σ of every query's subtree, as much of it as the correction needs (:func:`subtree_covariances`)."""

    cov_rec: np.ndarray  # Cov(y_e, g·y) per entry
    cov_q: np.ndarray  # Cov(y_q, g·y) per query
    var_g: np.ndarray  # Var(g·y) = gΣgᵀ per query
    var_rec: np.ndarray  # Σ's diagonal: Var(y_e) = w²σ²_O + (1 − w)²σ²_C per entry
    var_q: np.ndarray  # and Var(y_q) per query


def subtree_covariances(optin: OptinEstimates, client: ClientEstimates, lp: LocalAlgParams, w_rec: np.ndarray,
                        w_q: np.ndarray, at: np.ndarray) -> Subtree:
    """Per query q, with the blends y_e = w_e·p̂_O,e + (1−w_e)·p̂_C,e and y_q likewise and the
    residual g·y = Σ_{e∈q} y_e − y_q: Cov(y_e, g·y) per entry, Cov(y_q, g·y) per query, Var(g·y) per
    query and the variances Var(y_e), Var(y_q) (ALGORITHM.md §7.1), all evaluated at the record
    probabilities ``at`` (clamped into [0, 1]; the queries at their sums)."""
    hl = optin.head_list
    eq, k = hl.entry_query, hl.k
    seg = _segment_sum(eq, k)
    p = np.clip(np.nan_to_num(at), 0.0, 1.0)
    p_q = np.minimum(seg(p), 1.0)
    var_o, var_oq = optin.variances_at(p, p_q)
    var_c, var_cq = client_variances(p, p_q, hl, lp, client.n)

    # --- opt-in: coefficients u_e = w_e − w_q of p̂_O,e in g·y; Σ_O = diag(d) − ppᵀ/n − β p̃p̃ᵀ
    n_t = optin.n
    n_all = n_t + optin.n_s
    s_o = np.zeros(hl.n_entries)
    if n_t >= 2:
        reused = optin.reused if optin.reused is not None else np.zeros(hl.n_entries, dtype=bool)
        beta = 1.0 / n_t - 1.0 / n_all
        p_t = np.where(reused, 0.0, p)  # entries whose pairs are T-only
        d = var_o + p * p / n_all + beta * p_t * p_t
        u = w_rec - w_q[eq]
        s_o = d * u - p * seg(p * u)[eq] / n_all - beta * p_t * seg(p_t * u)[eq]  # (Σ_O u)_e
    # --- clients: g·y's client part is Σ_e v_e f_e + const, Cov(f) = (diag(r) − rrᵀ)/(n − 1)
    n_c = client.n
    cov_fc = np.zeros(hl.n_entries)
    g = _Geometry(hl, lp) if lp.k > 1 else None
    if n_c >= 2 and g is not None:
        c = g.c
        r, _ = g.frequencies(p, p_q)
        h = 1.0 - w_rec
        h_q = -(1.0 - w_q)
        v = np.where(g.multi, h / g.d_q + (c * seg(h)[eq] / g.d_q + h_q[eq]) / g.a, (h + h_q[eq]) / g.a)
        cov_fc = r * (v - seg(r * v)[eq]) / (n_c - 1)  # Cov(f_e, client part of g·y)
    # --- Cov(y, g·y) = W·(B Σ_O Bᵀ)·u-part + (I − W)·(A Cov(f) Aᵀ)·h-part
    s_rec = w_rec * s_o
    s_q = w_q * seg(s_o)
    if g is not None:
        cq = seg(cov_fc) / g.a  # Cov(p̂_C,q, client part of g·y)
        s_rec = s_rec + (1.0 - w_rec) * np.where(g.multi, (cov_fc + g.c * cq[eq]) / g.d_q,
                                                 cq[eq])  # a single entry is its query's direct estimate
        s_q = s_q + (1.0 - w_q) * cq
    var_g = seg(s_rec) - s_q  # = gΣgᵀ
    return Subtree(s_rec, s_q, var_g, fixed_weight_variance(w_rec, var_o, var_c),
                   fixed_weight_variance(w_q, var_oq, var_cq))


def make_consistent(optin: OptinEstimates, client: ClientEstimates, lp: LocalAlgParams, rec: Blended,
                    qry: Blended, max_passes: int = CONSISTENT_MAX_PASSES) -> tuple[Blended, Blended]:
    """The GLS correction of every query subtree (ALGORITHM.md §7.1): afterwards each query's estimate
    is exactly the sum of its entries', and each variance is reduced by (Σgᵀ)_i²/(gΣgᵀ).

    Σ is evaluated at the corrected records themselves (clamped), found by repetition from the opt-in
    estimates until no record moves by 1e-13 (at most ``max_passes``), as the pooled weights are (§7).
    Each reported variance is the blend's times 1 − ρ_i², ρ_i = Corr(y_i, g·y) under Σ: subtracting the
    fixed-weight reduction from the blend's mean squared error instead over-reported the smallest
    ⟨q,*⟩ by 14% (ALGORITHM.md §7.1, "Reported variance").
    """
    eq, k = optin.head_list.entry_query, optin.head_list.k
    seg = _segment_sum(eq, k)
    resid = seg(rec.p) - qry.p  # g·y of every query
    at = optin.p_record
    for _ in range(max_passes):
        sub = subtree_covariances(optin, client, lp, rec.weight_optin, qry.weight_optin, at)
        s_rec, s_q, var_g = sub.cov_rec, sub.cov_q, sub.var_g
        ok = var_g > 1e-12 * np.abs(s_q).max(initial=1e-300)  # else the query is consistent already
        step = np.divide(resid, var_g, out=np.zeros(k), where=ok)
        p_rec = rec.p - s_rec * step[eq]
        done = np.abs(p_rec - at).max(initial=0.0) < 1e-13
        at = p_rec
        if done:
            break
    # exactly the sum (= qry.p − s_q·step up to rounding); a single entry is its query: their blends differ only
    # by the bias corrections' quadrature tolerance (§7), ~1e-11
    single = np.bincount(eq, minlength=k) == 1
    p_q = np.where(ok | single, seg(p_rec), qry.p)
    # reported variance: the blend's MSE times 1 − ρ², ρ = Corr(y_i, g·y) under the same Σ
    inv_g = np.divide(1.0, var_g, out=np.zeros(k), where=ok)
    var_rec = rec.var * _kept_share(s_rec * s_rec * inv_g[eq], sub.var_rec)
    var_q = qry.var * _kept_share(s_q * s_q * inv_g, sub.var_q)
    return Blended(p_rec, var_rec, rec.weight_optin), Blended(p_q, var_q, qry.weight_optin)


def _kept_share(reduction: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """1 − ρ² = 1 − (Σgᵀ)_i²/((gΣgᵀ)·Σ_ii), clamped into [0, 1]; 1 where Σ_ii is 0 or not finite."""
    good = np.isfinite(fixed) & (fixed > 0)
    return np.clip(1.0 - np.divide(reduction, fixed, out=np.zeros_like(reduction), where=good), 0.0, 1.0)


def _segment_sum(entry_query: np.ndarray, k: int) -> Callable[[np.ndarray], np.ndarray]:
    """x ↦ per-query sums of the per-entry array x."""
    return lambda x: np.bincount(entry_query, weights=x, minlength=k)

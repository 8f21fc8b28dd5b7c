"""BlendProbabilities: the server's blend strategies and simplex projection (ALGORITHM.md §7, Fig. 7).

Theorem 6: for independent unbiased estimates, w = σ²_C/(σ²_O + σ²_C) minimizes the variance
of w·p̂_O + (1−w)·p̂_C, giving w²σ²_O + (1−w)²σ²_C. Every strategy starts from the paper's blend
(:func:`~hybriddp.server.weights.blend`, Fig. 7); :data:`STRATEGIES` maps each
:class:`~hybriddp.core.estimators.Blend` to the steps that follow it: the pooled weights here, the consistent
queries in :mod:`hybriddp.server.consistency`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from hybriddp.core.estimators import Blend, estimator_named
from hybriddp.server.consistency import make_consistent
from hybriddp.server.weights import Blended, blend

if TYPE_CHECKING:
    from hybriddp.core.headlist import HeadList
    from hybriddp.core.reportlaw import LocalAlgParams
    from hybriddp.curator.estimates import OptinEstimates
    from hybriddp.server.client_estimates import ClientEstimates

POOLED_MAX_PASSES = 50
"""At most this many passes of :func:`blend_pooled`; it stops earlier once no weight moves by 1e-12."""

QUADRATURE_NODES = 8
"""Gauss–Hermite nodes per group in :func:`blend_error` (8 × 8 pseudo-rounds per entry)."""

QUADRATURE_TOLERANCE = 1e-4
"""The pseudo-rounds of :func:`blend_error` stop once no entry's squared error moves by this fraction in a pass."""

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
    """Record- and query-level blends (Fig. 2 line 5), raw and projected.

    ``records``/``queries`` are the raw blends (unbiased; ``p_blended_raw`` and ``var_blended``),
    ``records_projected`` the records' Euclidean projection onto the simplex (§7), ``queries_final`` the published
    queries (the server clips them into [0, 1] when defended, §7.2, and agrees them with the records, §7.3), and
    ``records_agreed`` the published records after that agreement (:attr:`records_final`)."""

    records: Blended
    queries: Blended
    records_projected: np.ndarray | None
    queries_final: np.ndarray
    queries_rank: np.ndarray | None = None
    """The defended round's guarded ranking score of each query (ALGORITHM.md §7.2, "The suggestions' ranking");
    None: rank by :attr:`queries_final`."""
    records_agreed: np.ndarray | None = None
    """The final records after the agreement step (ALGORITHM.md §7.3, :func:`hybriddp.server.agree.agree_blend`):
    the projected records (or, unprojected, the blend) with no listed query's URLs above the query; None: not
    applied."""

    @property
    def queries_ranking(self) -> np.ndarray:
        """What the suggestions rank queries by: the guarded score when the round was defended, else the estimate."""
        return self.queries_final if self.queries_rank is None else self.queries_rank

    @property
    def records_final(self) -> np.ndarray:
        """The record estimates a result reports: projected onto the simplex when asked, then agreed with the
        queries when the agreement step ran (ALGORITHM.md §7.3)."""
        if self.records_agreed is not None:
            return self.records_agreed
        return self.records_projected if self.records_projected is not None else self.records.p


def blend_estimates(optin: OptinEstimates, client: ClientEstimates, project: bool = True, *,
                    estimator: str = "paper", lp: LocalAlgParams | None = None) -> BlendOutput:
    """BlendProbabilities for records and for queries (ALGORITHM.md §7) with the blend strategy of the estimator
    named ``estimator`` (:data:`hybriddp.core.estimators.REGISTRY`; see :func:`blend_strategy`)."""
    return blend_strategy(estimator_named(estimator).blend, optin, client, project, lp=lp)


def blend_strategy(strategy: Blend, optin: OptinEstimates, client: ClientEstimates, project: bool = True, *,
                   lp: LocalAlgParams | None = None) -> BlendOutput:
    """BlendProbabilities for records and for queries with ``strategy`` (ALGORITHM.md §7, §7.1): the paper's
    blend, then the strategy's :data:`STRATEGIES` steps, which need the clients' LocalAlg parameters ``lp``."""
    rec = blend(optin.p_record, optin.var_record, client.p_record, client.var_record)
    qry = blend(optin.p_query, optin.var_query, client.p_query, client.var_query)
    for step in STRATEGIES[strategy]:
        if lp is None:
            raise ValueError(f"the {strategy.name.lower()} blend needs the clients' LocalAlg parameters (lp)")
        rec, qry = step(optin, client, lp, rec, qry)
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
    error no longer correlates with what it multiplies to first order. What bias remains (on entries small
    against their noise) and the mean squared error, weights' randomness included, come from
    :func:`blend_error` at p̄: the blend reports p̄ − b(p̄) with variance MSE(p̄) − b(p̄)² (§7, "Bias
    correction", "Reported variance").
    """
    from hybriddp.server.client_estimates import client_variances

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
    err_r, err_q = blend_error(optin, client, lp, rec.p, qry.p, max_passes)
    return (Blended(rec.p - err_r.bias, err_r.mse - err_r.bias**2, rec.weight_optin),
            Blended(qry.p - err_q.bias, err_q.mse - err_q.bias**2, qry.weight_optin))


class BlendError(NamedTuple):
    """The pooled blend's error at p̄ by quadrature (:func:`blend_error`), per entry or query."""

    bias: np.ndarray  # E[p̂] − p̄
    mse: np.ndarray  # E[(p̂ − p̄)²]


def blend_error(optin: OptinEstimates, client: ClientEstimates, lp: LocalAlgParams, p_record: np.ndarray,
                p_query: np.ndarray, max_passes: int = POOLED_MAX_PASSES,
                nodes: int = QUADRATURE_NODES) -> tuple[BlendError, BlendError]:
    """The pooled blend's bias and mean squared error at the blended estimate p̄, weights' randomness
    included (ALGORITHM.md §7, "Bias correction" and "Reported variance"); records, then queries.

    w²σ²_O(p̄) + (1−w)²σ²_C(p̄) is the variance of a blend whose weights are fixed. The pooled weights
    are computed from the data, and where an estimate is small against its own noise (a ⟨q,*⟩ seen a
    few times in T) their randomness adds several percent to the error. Here every entry is blended
    again in pseudo-rounds at p̄: p̂_O = p̄ + σ_O(p̄)·x, p̂_C = p̄ + σ_C(p̄)·y over the 8 × 8 Gauss–Hermite
    nodes (x, y), each with the pooled iteration, and the results are the quadratures of p̂ − p̄ and
    (p̂ − p̄)². For fixed weights they are exact (0 and w²σ²_O + (1−w)²σ²_C); they are deterministic.
    Each entry varies alone: a record's query is held at p̄_q, a query's records at p̄. Under reuse σ²_O here is
    :meth:`~hybriddp.curator.estimates.OptinEstimates.reported_variances_at`: a reused record's excess for τ is
    estimated from its released count (unbiased given listing, ALGORITHM.md §4.1, "Reported variance"), while
    the pseudo-rounds' weights keep the excess at p̄.
    """
    from hybriddp.server.client_estimates import client_variances

    hl = optin.head_list
    x, wx = np.polynomial.hermite_e.hermegauss(nodes)
    wx = wx / wx.sum()
    grid = (np.repeat(x, nodes)[:, None], np.tile(x, nodes)[:, None], np.outer(wx, wx).ravel()[:, None])
    p_r, p_q = np.clip(p_record, 0.0, 1.0), np.clip(p_query, 0.0, 1.0)

    def records(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return optin.record_variances_at(p), client_variances(p, p_q, hl, lp, client.n)[0]

    def queries(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return optin.query_variances_at(p, p_r), client_variances(p_r, p, hl, lp, client.n)[1]

    spread_r, spread_q = optin.reported_variances_at(p_r, p_q)
    return (_quadrature(p_r, records, grid, max_passes, spread_r),
            _quadrature(p_q, queries, grid, max_passes, spread_q))


def _quadrature(p: np.ndarray, variances: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
                grid: tuple[np.ndarray, np.ndarray, np.ndarray], max_passes: int,
                spread_o: np.ndarray | None = None) -> BlendError:
    """Σ_nodes weight·(p̂ − p) and Σ_nodes weight·(p̂ − p)² of the pooled blend of pseudo-estimates
    p ± σ·node (see :func:`blend_error`). The opt-in pseudo-estimates spread by ``spread_o`` (default: the opt-in
    variance at p that the weights use; under reuse, the one with the excess estimated from the released counts,
    ALGORITHM.md §4.1, "Reported variance"), and every pseudo-round is blended with the weights of ``variances``.

    Each pseudo-round's fixed point p̂ = w(p̂)·p̂_O + (1 − w(p̂))·p̂_C lies between p̂_O and p̂_C; it is found by
    Steffensen's acceleration of the pooled iteration (kept inside that interval), which converges in a few
    passes where the plain iteration can need dozens.
    """
    xo, xc, weight = grid
    vo, vc = variances(p)
    so = vo if spread_o is None else np.maximum(spread_o, 0.0)
    p_o = p + np.sqrt(np.where(np.isfinite(so), so, 0.0)) * xo  # a group without data gets weight 0 anyway
    p_c = p + np.sqrt(np.where(np.isfinite(vc), vc, 0.0)) * xc
    lo, hi = np.minimum(p_o, p_c), np.maximum(p_o, p_c)

    def step(x: np.ndarray) -> np.ndarray:  # one pass of the pooled iteration
        v_o, v_c = variances(np.clip(x, 0.0, 1.0))
        return blend(p_o, v_o, p_c, v_c).p

    x = blend(p_o, vo, p_c, vc).p
    mse = (weight * (x - p) ** 2).sum(axis=0)
    for _ in range(max_passes):
        g1 = step(x)
        g2 = step(g1)
        den = g2 - 2.0 * g1 + x
        with np.errstate(divide="ignore", invalid="ignore"):
            acc = x - (g1 - x) ** 2 / den
        x = np.where((den != 0) & (acc >= lo) & (acc <= hi), acc, g2)
        prev, mse = mse, (weight * (x - p) ** 2).sum(axis=0)
        if np.all(np.abs(mse - prev) <= QUADRATURE_TOLERANCE * mse):
            break
    no_data = np.isinf(vo) & np.isinf(vc)
    return BlendError(np.where(no_data, 0.0, (weight * (x - p)).sum(axis=0)), np.where(no_data, np.inf, mse))


Step = Callable[["OptinEstimates", "ClientEstimates", "LocalAlgParams", Blended, Blended], tuple[Blended, Blended]]
"""One step of a blend strategy: (opt-in estimates, client estimates, LocalAlg's parameters, record blend, query
blend) ↦ the new record and query blends."""

STRATEGIES: Mapping[Blend, tuple[Step, ...]] = MappingProxyType({
    Blend.PAPER: (),  # Fig. 7 as published
    Blend.POOLED: (blend_pooled,),  # §7, "Pooled weights"
    Blend.CONSISTENT: (blend_pooled, make_consistent),  # §7.1: the pooled blend, then every query = its entries' sum
})
"""The steps each server blend strategy applies after the paper's blend (ALGORITHM.md §7, §7.1)."""

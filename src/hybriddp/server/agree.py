"""Published numbers that agree (ALGORITHM.md §7.3): no listed query below the sum of its listed URLs.

The final columns are made level by level: the records are projected onto the simplex (§7), the queries clipped
into [0, 1] (§7.2), and each level is blended with its own weights. So a query's final estimate p_q can come out
below the sum of its listed URLs' final estimates Σ_u p_⟨q,u⟩, which no population allows (the query's records
are its listed URLs and its ⟨q,*⟩, and ⟨q,*⟩ ≥ 0). :func:`agree` removes every such contradiction by the
inverse-variance weighted least-squares projection of the query's block (p_q, p_⟨q,u⟩…) onto

    C_q = {x : x_q ≥ Σ_u x_⟨q,u⟩, every x_⟨q,u⟩ ≥ 0},

and gives the mass taken from the URLs to the query's ⟨q,*⟩, so the records stay on the simplex. It is
post-processing of published estimates: no privacy cost.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from hybriddp.core.headlist import HeadList
    from hybriddp.server.blend import BlendOutput

VARIANCE_FLOOR = 1e-300
"""Variances are floored here (a zero-variance estimate stays where it is)."""

VARIANCE_CAP = 1e300
"""Infinite or unknown (NaN) variances are capped here: such an estimate takes the whole correction."""


class Agreement(NamedTuple):
    """The agreed final estimates (:func:`agree`) and which listed queries moved."""

    p_record: np.ndarray
    p_query: np.ndarray
    moved: np.ndarray  # per query position (``*`` last, never moved): its block was contradicted and projected


def agree(hl: HeadList, p_record: np.ndarray, var_record: np.ndarray, p_query: np.ndarray,
          var_query: np.ndarray) -> Agreement:
    """Every listed query's final estimate at least the sum of its listed URLs' (ALGORITHM.md §7.3).

    For a listed query q with at least one listed (non-wildcard) URL, finite estimates, and
    d = Σ_u y_u − y_q > 0 (y: the final estimates given), the block (y_q, y_u…) is replaced by its projection
    x in the weighted norm Σ (x_i − y_i)²/v_i (v: the variances given, floored at 1e-300, infinite/NaN capped
    at 1e300) onto C_q = {x_q ≥ Σ_u x_u, x_u ≥ 0}. The constraint is then active, and with the URLs F not at 0

        λ = (Σ_{u∈F} y_u − y_q)/(v_q + Σ_{u∈F} v_u),  x_q = y_q + v_q·λ,  x_u = y_u − v_u·λ (u ∈ F), 0 otherwise,

    F found by fixing every URL the formula sends below 0 at 0 and recomputing (λ only grows, so this stops
    after at most one pass per URL; vectorized over all queries). The mass taken from the URLs, Σ_u (y_u − x_u),
    is added to the query's ⟨q,*⟩, so each query's record marginal, and the records' total, are unchanged.
    A query whose ⟨q,*⟩ is missing from ``hl`` keeps its URLs (their variances count as 0) and is raised to
    their sum. Queries without a contradiction (d ≤ 0), without a listed URL, or with a non-finite estimate in
    the block, and the query ``*``, are untouched.

    Guarantees: afterwards x_q ≥ Σ_u x_u for every listed query (exactly: x_q is at least the sum as numpy
    adds it here); on non-negative URL estimates (the projected records) every estimate of a moved block moves
    by at most d, in the direction that removes the contradiction (x_q ≥ y_q, x_u ≤ y_u), and the weighted
    squared distance to any point of C_q (the truth among them) does not grow: a projection onto a convex set
    is non-expansive. The inputs are not modified.
    """
    k = hl.k
    eq = hl.entry_query
    y_r = np.asarray(p_record, dtype=np.float64)
    y_q = np.asarray(p_query, dtype=np.float64)
    v_r = _sanitized(var_record)
    v_q = _sanitized(var_query)
    listed = np.arange(k) < k - 1
    is_url = ~hl.is_wildcard & listed[eq]
    wild = hl.wildcard_entry
    has_wild = listed & (hl.kq >= 1)
    has_wild[has_wild] = hl.is_wildcard[wild[has_wild]]
    v_r = np.where(~has_wild[eq], 0.0, v_r)  # no ⟨q,*⟩ to take the mass: the URLs stay, the query rises

    def per_query(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
        return np.bincount(eq[mask], weights=values[mask], minlength=k)

    n_urls = np.bincount(eq[is_url], minlength=k)
    finite_r = np.isfinite(y_r)
    finite = np.isfinite(y_q) & (np.bincount(eq[~finite_r], minlength=k) == 0)
    d = per_query(is_url, y_r) - y_q
    with np.errstate(invalid="ignore"):
        active = listed & (n_urls > 0) & finite & (d > 0)
    if not active.any():
        return Agreement(y_r.copy(), y_q.copy(), active)
    free = is_url & active[eq]
    lam = np.zeros(k)
    for _ in range(int(n_urls.max()) + 1):
        num = per_query(free, y_r) - y_q
        den = v_q + per_query(free, v_r)
        lam = np.where(active, num / np.where(active, den, 1.0), 0.0)
        below = free & (v_r > 0.0) & (y_r - v_r * lam[eq] < 0.0)  # v 0: no ⟨q,*⟩, the URL stays
        if not below.any():
            break
        free &= ~below
    x_r = y_r.copy()
    moved_url = is_url & active[eq]
    x_r[moved_url] = np.where(free[moved_url], y_r[moved_url] - v_r[moved_url] * lam[eq[moved_url]], 0.0)
    x_q = y_q.copy()
    sums = per_query(is_url, x_r)
    x_q[active] = np.maximum(y_q[active] + v_q[active] * lam[active], sums[active])
    taken = per_query(moved_url, y_r - x_r)
    gets = active & has_wild
    x_r[wild[gets]] += taken[gets]
    return Agreement(x_r, x_q, active)


def _sanitized(var: np.ndarray) -> np.ndarray:
    v = np.asarray(var, dtype=np.float64)
    return np.clip(np.where(np.isnan(v), VARIANCE_CAP, v), VARIANCE_FLOOR, VARIANCE_CAP)


def agree_blend(blended: BlendOutput, hl: HeadList) -> BlendOutput:
    """The blend with its final columns agreed (:func:`agree`, ALGORITHM.md §7.3): the projected records and the
    final queries, weighted by the blends' reported variances. The raw blends (``records``, ``queries``: the
    unbiased ``p_blended_raw`` and ``var_blended``) and the Euclidean projection ``records_projected`` are kept as
    they were; the agreed records go to ``records_agreed``. A defended round's ranking score is not recomputed
    here (:func:`hybriddp.server.party.server_side` caps the agreed estimate again). Without the projection
    (``--no-project``: the caller asked for the unbiased blends as they are) nothing is changed."""
    if blended.records_projected is None:  # --no-project: the raw blends are published as they are
        return blended
    out = agree(hl, blended.records_final, blended.records.var, blended.queries_final, blended.queries.var)
    return replace(blended, records_agreed=out.p_record, queries_final=out.p_query)

"""The suggestions' ranking guard chosen per round from what it costs an honest ranking (``--anchor-kappa-query auto``;
ALGORITHM.md §7.2, "The suggestions' ranking").

A query ranks by its published estimate b capped at p̂_O + κ·s: fake devices lift its rank score by at most κ·s
whatever its estimate's bound κ_i allows. On honest data the cap lowers a query's score by s·(X − κ)₊, X = (b − p̂_O)/s
(the blend's distance from the opt-in estimate in its own standard deviation, the normal–Laplace law of
:mod:`hybriddp.server.clamp` with the noise share f). That can drop the query below others, which costs the
suggestions' NDCG@``depth`` (ALGORITHM.md §9: gains 2^{b/T} − 1, T the top ``depth``'s sum; discounts
D(p) = 1/log₂(p + 1) for p ≤ depth, else 0). With positions and gains read from the published estimates (the truth's
best stand-in) and the other queries where they are, dropping i (at position p_i) below the queries j₁, j₂, … ranked
under it (positions p_i + 1, p_i + 2, …) loses, for each j_m it passes, (G_i − G_{j_m})·(D(p_i + m − 1) −
D(p_i + m))/IDCG: i steps down one place and j_m up one. So capping i alone at κ costs, in expectation, exactly

    cost_i(κ) = Σ_m (G_i − G_{j_m})·(D(p_i + m − 1) − D(p_i + m)) / IDCG · P(X_i > κ + (b_i − b_{j_m})/s_i).

:func:`rank_kappa` takes the round's smallest κ with Σ_i cost_i(κ) ≤ ``cost`` over the top ``depth``. The sum
over-counts when several queries are capped at once (two capped neighbours keep their order): measured, the honest
NDCG@10 loss is about half the budget. One κ per round, not per query: a query lifted into the top ``depth`` by fakes
would raise its own term, and a per-query κ would loosen the guard for exactly that query (measured on the aol
preset: 7 of 23 oracle targets of rank ≥ 20 in the top 10, against 4 of 23 per round at the same honest cost).
Whatever κ is, the ranking score is at most p̂_O + min(κ, κ_i)·s_i, κ at most the test's critical z.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybriddp.server.tails import normal_laplace_p

RANK_DEPTH = 10
"""The suggestions' depth whose NDCG the guard's cost counts (Fig. 12's NDCG@10)."""
BISECTIONS = 14
"""Bisection steps on [0, cap]: κ to within cap/2^14 (≈ 0.0003 at a cap of 5)."""


def _discounts(n: int, depth: int) -> np.ndarray:
    """D(p) = 1/log₂(p + 1) for the positions p = 1..n, 0 beyond ``depth``."""
    pos = np.arange(1, n + 1, dtype=np.float64)
    return np.where(pos <= depth, 1.0 / np.log2(pos + 1.0), 0.0)


@dataclass(frozen=True)
class _Pairs:
    """What cost_i(κ) needs besides κ, for the queries at the top ``depth`` positions (rows) against every ranked
    query (columns): the swap's NDCG weight (0 where the column is not ranked below the row), the gap in the row's
    s, and the row's noise share; computed once per round, since only κ changes while :func:`rank_kappa` bisects."""

    top: np.ndarray  # the query at each top position
    usable: np.ndarray  # per top position: s finite and > 0
    weight: np.ndarray
    gap: np.ndarray  # (b_i − b_j)/s_i
    share: np.ndarray
    n: int  # queries in all (the output's length)


def _pairs(published: np.ndarray, s: np.ndarray, share: np.ndarray, ranked: np.ndarray, depth: int) -> _Pairs | None:
    """The :class:`_Pairs` of a round, or None where no query's cap can cost anything (fewer than two ranked
    queries, nothing published, or no top query with a usable s)."""
    b = np.clip(np.nan_to_num(np.asarray(published, dtype=np.float64)), 0.0, 1.0)
    idx = np.flatnonzero(np.asarray(ranked, dtype=bool))
    if idx.size < 2:
        return None
    order = idx[np.argsort(-b[idx], kind="stable")]
    disc = _discounts(order.size, depth)
    total = float(b[order][:depth].sum())
    gain = np.exp2(b / total) - 1.0 if total > 0 else np.zeros(b.shape)
    idcg = float((gain[order] * disc).sum())
    top = order[:min(depth, order.size)]
    s_top, f_top = np.asarray(s, dtype=np.float64)[top], np.asarray(share, dtype=np.float64)[top]
    usable = np.isfinite(s_top) & (s_top > 0)
    if idcg <= 0.0 or not usable.any():
        return None
    gaps = b[top][:, None] - b[order][None, :]  # (top position, any position)
    step = np.concatenate([[0.0], disc[:-1] - disc[1:]])  # D(q − 1) − D(q) at position q (0-based q ≥ 1)
    weight = (gain[top][:, None] - gain[order][None, :]) * step[None, :] / idcg
    below = np.arange(order.size)[None, :] > np.arange(top.size)[:, None]
    weight = np.where(below & (gaps >= 0.0), weight, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = gaps / np.where(usable, s_top, 1.0)[:, None]
    return _Pairs(top, usable, weight, gap, np.broadcast_to(np.nan_to_num(f_top, nan=1.0)[:, None], gap.shape),
                  b.size)


def _cost(pairs: _Pairs, kappa: np.ndarray) -> np.ndarray:
    """cost_i(κ_i) of every query for the round's :class:`_Pairs` (0 off the top)."""
    out = np.zeros(pairs.n)
    k = np.asarray(kappa, dtype=np.float64)[pairs.top]
    tail = 0.5 * normal_laplace_p(k[:, None] + pairs.gap, pairs.share)
    out[pairs.top] = np.where(pairs.usable, (pairs.weight * tail).sum(axis=1), 0.0)
    return out


def rank_cost(kappa: np.ndarray, published: np.ndarray, s: np.ndarray, share: np.ndarray, ranked: np.ndarray,
              depth: int = RANK_DEPTH) -> np.ndarray:
    """cost_i(κ_i) of the module docstring for every query (0 for one outside the top ``depth`` of the ranked
    queries, not ranked, or with s 0 or infinite). ``ranked`` marks the queries the suggestions rank (``*`` is not)."""
    pairs = _pairs(published, s, share, ranked, depth)
    return np.zeros(np.asarray(published).shape[0]) if pairs is None else _cost(pairs, kappa)


def rank_kappa(published: np.ndarray, s: np.ndarray, share: np.ndarray, ranked: np.ndarray, cost: float,
               cap: float | np.ndarray, depth: int = RANK_DEPTH) -> np.ndarray:
    """One κ for the round: the smallest in [0, max ``cap``] whose total cost over the top ``depth``,
    Σ_i cost_i(min(κ, cap_i)), is at most ``cost`` (bisection: the cost falls as κ grows); every query gets
    min(κ, cap_i). One κ for all, not one per query: a query's own term grows when fakes lift it into the top
    ``depth``, so a per-query κ would loosen the guard for exactly the query an attacker lifts."""
    n = np.asarray(published).shape[0]
    caps = np.broadcast_to(np.asarray(cap, dtype=np.float64), (n,)).astype(np.float64)
    caps = np.where(np.isfinite(caps), np.maximum(caps, 0.0), 0.0)

    pairs = _pairs(published, s, share, ranked, depth)
    if pairs is None:
        return np.zeros(n)

    def total(k: float) -> float:
        return float(_cost(pairs, np.minimum(k, caps)).sum())
    if total(0.0) <= cost:
        return np.zeros(n)
    lo, hi = 0.0, float(caps.max(initial=0.0))
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if total(mid) > cost else (lo, mid)
    return np.minimum(hi, caps)


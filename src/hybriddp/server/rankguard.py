"""The suggestions' ranking guard chosen per round from what it costs an honest ranking (``--anchor-kappa-query auto``;
ALGORITHM.md §7.2, "The suggestions' ranking").

A query ranks by its published estimate b capped at p̂_O + κ·s: fake devices lift its rank score by at most κ·s
whatever its estimate's bound κ_i allows. On honest data the cap lowers query i's score by s_i·(X_i − κ)₊, with
X_i = (b_i − p̂_O,i)/s_i. X_i's law on honest data is the normal–Laplace law of :mod:`hybriddp.server.clamp` (noise
share f_i) scaled by ρ_i = σ_i/s_i: σ_i is the honest standard deviation of b_i − p̂_O,i at the published estimate,
s_i the anchor test's (evaluated one opt-in standard deviation above p̂_O, so larger on purpose: ρ ≈ 0.8 on the aol
preset). The X_i are independent across queries (different records' counts and noise) and, for the inverse-variance
blend, uncorrelated with the blend's own error.

The cost of κ is the expected NDCG@``depth`` the cap takes from the published ranking, all queries capped together:

    cost(κ) = E_X[ NDCG(order of b) − NDCG(order of b − s·(X − κ)₊) ],

NDCG as in ALGORITHM.md §9 (gains 2^{b/T} − 1, T the top ``depth``'s sum; discounts 1/log₂(p + 1)) with the
published estimates standing for the truth. The expectation is a fixed Monte Carlo quadrature: :data:`DRAWS` draws of
the normal and Laplace parts from a generator seeded with :data:`NODES_SEED`, the same draws for every κ and every
round. It is a numerical integral over known laws, not a randomized release: it draws nothing from the OS, reads
only published and public numbers, and gives the same κ whenever it is recomputed.

:func:`rank_kappa` takes the round's smallest κ with cost(κ) ≤ ``cost``. One κ per round, not per query: a query
lifted into the top ``depth`` by fakes would raise its own share of the cost, and a per-query κ would loosen the
guard for exactly that query (measured on the aol preset: 7 of 23 oracle targets of rank ≥ 20 in the top 10,
against 4 of 23 per round at the same honest cost). Whatever κ is, the ranking score is at most
p̂_O + min(κ, κ_i)·s_i, κ at most the test's critical z. Measured against the truth, the honest loss is about 0.5–0.8
of this cost (the published estimates are more spread than the truth): the budget is an upper bound in practice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

RANK_DEPTH = 10
"""The suggestions' depth whose NDCG the guard's cost counts (Fig. 12's NDCG@10)."""
BISECTIONS = 12
"""Bisection steps on [0, cap]: κ to within cap/2^12 (≈ 0.001 at a cap of 5)."""
DRAWS = 2000
"""Quadrature draws of X per query: the cost to within about 3% of a budget of 0.003 (tests/test_rankguard.py)."""
NODES_SEED = 0x4A6B
"""The quadrature's fixed seed: the nodes are part of the integral's definition, the same in every round."""


@dataclass(frozen=True)
class _Round:
    """What cost(κ) needs besides κ, computed once per round (only κ changes while :func:`rank_kappa` bisects): the
    queries that can reach the top ``depth`` (``cand``, the published order), their gains, the ideal DCG (the
    published order's own), each one's s and its drawn honest X (draws × candidates)."""

    cand: np.ndarray
    b: np.ndarray
    gain: np.ndarray
    idcg: float
    s: np.ndarray
    x: np.ndarray
    depth: int


def _discount(depth: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, depth + 2, dtype=np.float64))


@lru_cache(maxsize=8)
def _base_nodes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed standard normal and unit Laplace draws (DRAWS × n each; read-only, shared between rounds)."""
    rng = np.random.default_rng(NODES_SEED)
    z, lap = rng.standard_normal((DRAWS, n)), rng.laplace(0.0, 1.0, (DRAWS, n))
    z.flags.writeable = lap.flags.writeable = False
    return z, lap


def _nodes(n: int, share: np.ndarray) -> np.ndarray:
    """DRAWS × n draws of the unit-variance normal–Laplace law with noise share f (normal part variance 1 − f, Laplace
    part variance f), from the fixed quadrature seed."""
    z, lap = _base_nodes(n)
    f = np.clip(np.nan_to_num(share, nan=1.0), 0.0, 1.0)
    return z * np.sqrt(1.0 - f) + lap * np.sqrt(f / 2.0)


def _round(published: np.ndarray, s: np.ndarray, share: np.ndarray, ranked: np.ndarray, spread: np.ndarray | None,
           depth: int) -> _Round | None:
    """The :class:`_Round` of a round, or None where no cap can cost anything (fewer than two ranked queries,
    nothing published, or no top query with a usable s)."""
    b = np.clip(np.nan_to_num(np.asarray(published, dtype=np.float64)), 0.0, 1.0)
    idx = np.flatnonzero(np.asarray(ranked, dtype=bool))
    if idx.size < 2:
        return None
    order = idx[np.argsort(-b[idx], kind="stable")]
    top = order[:depth]
    total = float(b[top].sum())
    s_all = np.asarray(s, dtype=np.float64)
    usable = np.isfinite(s_all) & (s_all > 0)
    if total <= 0.0 or not usable[top].any():
        return None
    rho = np.ones(b.size) if spread is None else np.nan_to_num(np.asarray(spread, dtype=np.float64), nan=1.0)
    unit = np.where(usable, s_all, 0.0) * np.maximum(rho, 0.0)  # σ_i: X_i's honest spread in score units
    x_all = _nodes(order.size, np.asarray(share, dtype=np.float64)[order])
    # A query below the top can enter it only where a top query falls under it; none falls further than its
    # largest drawn drop (κ = 0), so the candidates are the queries at or above the lowest such score.
    floor = float((b[top] - unit[top] * np.maximum(x_all[:, :top.size].max(axis=0), 0.0)).min())
    keep = b[order] >= floor
    keep[:top.size] = True
    cand = order[keep]
    x = x_all[:, keep] * np.where(usable[cand], np.maximum(rho[cand], 0.0), 0.0)
    gain = np.exp2(b[cand] / total) - 1.0
    disc = _discount(depth)
    idcg = float((gain[:depth] * disc[:min(depth, cand.size)]).sum())
    if idcg <= 0.0:
        return None
    return _Round(cand, b[cand], gain, idcg, np.where(usable[cand], s_all[cand], 0.0), x, depth)


def _cost(r: _Round, kappa: np.ndarray, bound: np.ndarray) -> float:
    """cost(κ) of the module docstring, κ and κ_i (``bound``, inf: none) per candidate."""
    with np.errstate(invalid="ignore"):
        lift = np.where(np.isfinite(bound)[None, :], np.maximum(-r.x - bound[None, :], 0.0), 0.0)
    score = r.b[None, :] + r.s[None, :] * (lift - np.maximum(r.x - kappa[None, :], 0.0))
    k = min(r.depth, r.cand.size)
    if r.cand.size > k:
        top = np.argpartition(-score, k - 1, axis=1)[:, :k]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(score, top, axis=1), axis=1, kind="stable"), 1)
    else:
        top = np.argsort(-score, axis=1, kind="stable")
    dcg = (r.gain[top] * _discount(r.depth)[:k][None, :]).sum(axis=1)
    return float(1.0 - dcg.mean() / r.idcg)  # the published order, ranked by itself, has NDCG 1


def rank_cost(kappa: np.ndarray, published: np.ndarray, s: np.ndarray, share: np.ndarray, ranked: np.ndarray,
              spread: np.ndarray | None = None, bound: np.ndarray | None = None, depth: int = RANK_DEPTH) -> float:
    """cost(κ) of the module docstring: the expected NDCG@``depth`` loss of ranking every ranked query i by
    b_i − s_i·(X_i − κ_i)₊ + s_i·(−X_i − κ_bound,i)₊ together (the guard at ``kappa``, and the estimate's own
    bound κ_i (``bound``, default none) lifting a blend that fell below p̂_O − κ_i·s_i), X_i with the normal–Laplace
    law of noise share ``share`` scaled by ``spread`` (ρ_i, default 1). ``ranked`` marks the queries the
    suggestions rank (``*`` is not); s 0 or infinite: no cap."""
    r = _round(published, s, share, ranked, spread, depth)
    if r is None:
        return 0.0
    n = np.asarray(published).shape[0]
    lower = np.full(n, np.inf) if bound is None else np.broadcast_to(np.asarray(bound, dtype=np.float64), (n,))
    return _cost(r, np.asarray(kappa, dtype=np.float64)[r.cand], lower[r.cand])


def rank_kappa(published: np.ndarray, s: np.ndarray, share: np.ndarray, ranked: np.ndarray, cost: float,
               cap: float | np.ndarray, spread: np.ndarray | None = None, depth: int = RANK_DEPTH) -> np.ndarray:
    """One κ for the round: the smallest in [0, max ``cap``] whose cost(min(κ, cap_i)) is at most ``cost``
    (bisection: the cost falls as κ grows); every query gets min(κ, cap_i). One κ for all, not one per query: a
    query's own share of the cost grows when fakes lift it into the top ``depth``, so a per-query κ would loosen the
    guard for exactly the query an attacker lifts."""
    n = np.asarray(published).shape[0]
    caps = np.broadcast_to(np.asarray(cap, dtype=np.float64), (n,)).astype(np.float64)
    caps = np.where(np.isfinite(caps), np.maximum(caps, 0.0), 0.0)
    r = _round(published, s, share, ranked, spread, depth)
    if r is None:
        return np.zeros(n)
    cand_caps = caps[r.cand]

    def total(k: float) -> float:
        return _cost(r, np.minimum(k, cand_caps), cand_caps)
    if total(0.0) <= cost:
        return np.zeros(n)
    lo, hi = 0.0, float(caps.max(initial=0.0))
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if total(mid) > cost else (lo, mid)
    return np.minimum(hi, caps)

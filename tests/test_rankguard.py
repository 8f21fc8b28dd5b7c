"""The suggestions' ranking guard chosen per round (``--anchor-kappa-query auto``; ALGORITHM.md §7.2;
:mod:`hybriddp.server.rankguard`).

The cost of capping a query is checked against a Monte Carlo of what the cap does to an honest ranking: X drawn from
the normal–Laplace law by its two parts (not through the tail formula), the capped scores ranked, and NDCG computed
by :func:`hybriddp.simulation.scoring.ndcg` (its own code), with the published estimates standing for the truth.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybriddp.server.rankguard import rank_cost, rank_kappa
from hybriddp.simulation.scoring import ndcg


def _draw_x(rng: np.random.Generator, n: int, share: float) -> np.ndarray:
    """X = u + ℓ with unit variance: u normal with variance 1 − f, ℓ Laplace with variance f (scale √(f/2))."""
    return rng.normal(0.0, math.sqrt(1.0 - share), n) + rng.laplace(0.0, math.sqrt(share / 2.0), n)


def _mc_loss(b: np.ndarray, s: np.ndarray, share: float, kappa: float, capped: int, draws: int,
             seed: int) -> np.ndarray:
    """NDCG@10 losses when query ``capped`` alone is capped at b + κ·s − its own blend move, i.e. its score falls by
    s·(X − κ)₊, the others kept at b: one loss per draw of X."""
    rng = np.random.default_rng(seed)
    x = _draw_x(rng, draws, share)
    drop = s[capped] * np.maximum(x - kappa, 0.0)
    ideal = np.sort(b)[::-1][:10]
    base = ndcg(b[np.argsort(-b, kind="stable")][:10], ideal)
    out = np.empty(draws)
    for i, d in enumerate(drop):  # a test's Monte Carlo: the ranking is recomputed draw by draw
        score = b.copy()
        score[capped] -= d
        out[i] = base - ndcg(b[np.argsort(-score, kind="stable")][:10], ideal)
    return out


@pytest.mark.parametrize(("share", "kappa"), [(0.0, 0.0), (0.5, 0.3), (0.9, 1.0)])
def test_a_pair_costs_its_swap_times_the_chance_of_it(share: float, kappa: float) -> None:
    """Two ranked queries: capping the first swaps them exactly when s·(X − κ) > b₁ − b₂, so the cost is the swap's
    NDCG loss times P(X > κ + gap/s), the whole expected loss (no pairwise approximation). Checked against 40,000
    draws (z < 5: p ≈ 6e-7)."""
    b, s = np.array([0.30, 0.26]), np.array([0.05, 0.05])
    f = np.full(2, share)
    cost = rank_cost(np.full(2, kappa), b, s, f, np.ones(2, dtype=bool))
    loss = _mc_loss(b, s, share, kappa, 0, 40_000, seed=11)
    assert cost[1] == 0.0  # nothing ranks below the second: its cap costs nothing
    assert abs(loss.mean() - cost[0]) <= 5 * loss.std() / math.sqrt(loss.size) + 1e-12, (loss.mean(), cost[0])
    assert cost[0] > 0.0


def test_with_many_queries_the_cost_is_the_expected_loss() -> None:
    """Twelve queries, the third one capped: however far the cap drops it (past several others, out of the top 10),
    the cost is the expected NDCG@10 loss (40,000 draws, z < 5)."""
    b = np.array([0.2, 0.15, 0.12, 0.11, 0.10, 0.09, 0.08, 0.05, 0.04, 0.03, 0.02, 0.01])
    s = np.full(b.size, 0.03)
    f = np.full(b.size, 0.3)
    kappa = np.full(b.size, 0.2)
    cost = rank_cost(kappa, b, s, f, np.ones(b.size, dtype=bool))
    loss = _mc_loss(b, s, 0.3, 0.2, 2, 40_000, seed=12)
    assert abs(loss.mean() - cost[2]) <= 5 * loss.std() / math.sqrt(loss.size), (loss.mean(), cost[2])


def test_rank_kappa_is_the_rounds_smallest_within_the_budget() -> None:
    """One κ for the round: the total cost at it is within the budget (or it is at the cap), a κ 0.01 smaller would
    not be, every query gets min(κ, its cap)."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(3, 40))
        b = np.sort(rng.dirichlet(np.ones(n)))[::-1]
        s = rng.uniform(0.001, 0.05, n)
        f = rng.uniform(0.0, 1.0, n)
        ranked = np.ones(n, dtype=bool)
        ranked[-1] = False  # the ``*`` query
        budget = float(rng.choice([1e-3, 2.5e-3, 1e-2]))
        cap = rng.uniform(0.0, 5.0, n)
        k = rank_kappa(b, s, f, ranked, budget, cap)
        assert np.all((k >= 0.0) & (k <= cap + 1e-12))
        kappa = float(k[np.argmax(cap)])  # the round's κ (where the cap does not bind)
        assert np.allclose(k, np.minimum(kappa, cap))
        at = rank_cost(k, b, s, f, ranked).sum()
        assert at <= budget * (1 + 1e-9) or kappa >= cap.max() - 1e-3
        if kappa >= 0.01:
            below = rank_cost(np.minimum(kappa - 0.01, cap), b, s, f, ranked).sum()
            assert below > budget, "a smaller κ would have been within the budget"


def test_the_cost_falls_with_kappa_and_grows_with_the_opt_in_noise() -> None:
    b = np.array([0.2, 0.15, 0.12, 0.11, 0.10, 0.09])
    ranked = np.ones(b.size, dtype=bool)
    f = np.full(b.size, 0.5)
    grid = np.linspace(0.0, 4.0, 41)
    costs = np.array([rank_cost(np.full(b.size, k), b, np.full(b.size, 0.02), f, ranked)[:5].sum() for k in grid])
    assert np.all(np.diff(costs) <= 1e-15) and costs[0] > 10 * costs[-1]
    noisy = [rank_cost(np.zeros(b.size), b, np.full(b.size, sd), f, ranked)[:5].sum() for sd in (0.001, 0.01, 0.05)]
    assert noisy[0] < noisy[1] < noisy[2]
    # an opt-in group that ranks as well as the blend costs nothing to follow: κ 0
    assert np.all(rank_kappa(b, np.full(b.size, 1e-5), f, ranked, 2.5e-3, 3.0) == 0.0)


def test_auto_keeps_a_small_opt_in_groups_ranking_within_issue_40s_bound() -> None:
    """At 1,000 opt-in users (the issue-40 populations, fresh each round, truth from the law), the fixed default
    κ_q = 0.1 costs the honest NDCG@10 about 0.005; ``auto`` keeps it within 0.003 of the undefended blend's
    (docs/RESULTS.md "Issue 40")."""
    from hybriddp.server.anchor import AnchorPolicy
    from hybriddp.simulation.defended_calibration import calibrate_defended, defense_name

    auto = AnchorPolicy(kappa_query=None)
    cal = calibrate_defended(1_000, rounds=150, seed=41, defenses=("anchor", None, auto))
    undefended = float(np.nanmean(cal.runs["none"].ndcg10))
    fixed = float(np.nanmean(cal.runs["anchor"].ndcg10)) - undefended
    chosen = float(np.nanmean(cal.runs[defense_name(auto)].ndcg10)) - undefended
    assert chosen >= -0.003, chosen
    assert chosen > fixed + 0.001, (chosen, fixed)

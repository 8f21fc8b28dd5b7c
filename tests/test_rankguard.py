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

from hybriddp.server.rankguard import DRAWS, rank_cost, rank_kappa
from hybriddp.simulation.scoring import ndcg


def _mc_loss(b: np.ndarray, s: np.ndarray, share: np.ndarray, kappa: float, draws: int, seed: int,
             spread: np.ndarray | None = None, bound: np.ndarray | None = None) -> np.ndarray:
    """NDCG@10 losses when every query's score falls by s·(X − κ)₊ (and, with ``bound``, rises by s·(−X − bound)₊),
    X = ρ·(u + ℓ) drawn independently per query, u normal with variance 1 − f and ℓ Laplace with variance f (scale
    √(f/2)): one loss per draw, the ranking recomputed draw by draw."""
    rng = np.random.default_rng(seed)
    rho = np.ones(b.size) if spread is None else spread
    ideal = np.sort(b)[::-1][:10]
    base = ndcg(b[np.argsort(-b, kind="stable")][:10], ideal)
    xs = rho * (rng.normal(size=(draws, b.size)) * np.sqrt(1.0 - share)
                + rng.laplace(size=(draws, b.size)) * np.sqrt(share / 2.0))
    out = np.empty(draws)
    for i, x in enumerate(xs):  # a test's Monte Carlo: the ranking is recomputed draw by draw
        score = b - s * np.maximum(x - kappa, 0.0)
        if bound is not None:
            score = score + s * np.maximum(-x - bound, 0.0)
        out[i] = base - ndcg(b[np.argsort(-score, kind="stable")][:10], ideal)
    return out


def _tail(t: float, share: float) -> float:
    """P(X > t) for the unit normal–Laplace law by numerical integration of the normal's density against the
    Laplace part's tail (scipy's quad; independent of :func:`hybriddp.server.tails.normal_laplace_p`)."""
    from scipy import integrate, stats

    sd_n, scale = math.sqrt(1.0 - share), math.sqrt(share / 2.0)
    if share == 0.0:
        return float(stats.norm.sf(t))
    val, _ = integrate.quad(lambda u: stats.norm.pdf(u, scale=sd_n) * stats.laplace.sf(t - u, scale=scale),
                            -12 * sd_n, 12 * sd_n + abs(t), limit=200)
    return float(val)


@pytest.mark.parametrize(("share", "kappa"), [(0.0, 0.0), (0.5, 0.3), (0.9, 1.0)])
def test_a_pair_costs_its_swap_times_the_chance_of_it(share: float, kappa: float) -> None:
    """Two ranked queries, only the first with a cap (the second's s is 0): they swap exactly when
    s·(X − κ) > b₁ − b₂, so the expected loss is the swap's NDCG loss (computed by the ranking's own NDCG code)
    times P(X > κ + gap/s) (by numerical integration). The quadrature's 2,000 fixed draws get within 5 of their
    standard errors."""
    b, s = np.array([0.30, 0.26]), np.array([0.05, 0.0])
    cost = rank_cost(np.full(2, kappa), b, s, np.full(2, share), np.ones(2, dtype=bool))
    swap = 1.0 - ndcg(b[::-1], b)
    p = _tail(kappa + (b[0] - b[1]) / s[0], share)
    se = swap * math.sqrt(p * (1 - p) / DRAWS)
    assert abs(cost - swap * p) <= 5 * se + 1e-12, (cost, swap * p, se)
    assert cost > 0.0


def test_every_query_capped_together_costs_the_expected_loss() -> None:
    """Twenty-four queries, all capped at once (neighbours capped together keep their order, queries from below the
    top 10 can enter it), per-query s, noise shares and spreads ρ: the cost is the expected NDCG@10 loss of an
    independent Monte Carlo (8,000 draws; z < 5 against both errors)."""
    rng = np.random.default_rng(3)
    b = np.sort(rng.dirichlet(np.full(24, 2.0)))[::-1]
    s = rng.uniform(0.005, 0.02, b.size)
    f = rng.uniform(0.0, 0.9, b.size)
    rho = rng.uniform(0.6, 1.1, b.size)
    ranked = np.ones(b.size, dtype=bool)
    cost = rank_cost(np.full(b.size, 0.2), b, s, f, ranked, spread=rho)
    loss = _mc_loss(b, s, f, 0.2, 8_000, seed=12, spread=rho)
    se = loss.std() * math.sqrt(1 / loss.size + 1 / DRAWS)
    assert abs(loss.mean() - cost) <= 5 * se, (loss.mean(), cost, se)
    assert cost > 10 * se  # the comparison has teeth: the cost is far from 0


def test_the_estimates_own_bound_lifting_a_low_blend_is_counted() -> None:
    """With κ_i small, a blend far below p̂_O is lifted to p̂_O − κ_i·s, which reorders the ranking too: the cost
    with ``bound`` is the Monte Carlo's with the lift, and differs from the cost without it."""
    b = np.array([0.2, 0.15, 0.12, 0.11, 0.10, 0.09, 0.08, 0.07, 0.06, 0.05, 0.045, 0.04])
    s, f = np.full(b.size, 0.03), np.full(b.size, 0.3)
    ranked = np.ones(b.size, dtype=bool)
    bound = np.full(b.size, 0.3)
    with_lift = rank_cost(np.full(b.size, 1.0), b, s, f, ranked, bound=bound)
    without = rank_cost(np.full(b.size, 1.0), b, s, f, ranked)
    loss = _mc_loss(b, s, f, 1.0, 8_000, seed=13, bound=bound)
    se = loss.std() * math.sqrt(1 / loss.size + 1 / DRAWS)
    assert abs(loss.mean() - with_lift) <= 5 * se, (loss.mean(), with_lift, se)
    assert with_lift > without + 5 * se


def test_a_spread_is_the_same_as_a_smaller_unit() -> None:
    """The score falls by s·(ρY − κ)₊ = ρs·(Y − κ/ρ)₊: the cost at (κ, s, ρ) is the cost at (κ/ρ, ρs, 1) (same
    quadrature nodes, so equal to rounding), and ρ = 0 costs nothing."""
    rng = np.random.default_rng(4)
    b = np.sort(rng.dirichlet(np.ones(15)))[::-1]
    s, f, ranked = rng.uniform(0.005, 0.03, b.size), rng.uniform(0, 1, b.size), np.ones(b.size, dtype=bool)
    rho = rng.uniform(0.3, 1.2, b.size)
    a = rank_cost(np.full(b.size, 0.4), b, s, f, ranked, spread=rho)
    c = rank_cost(0.4 / rho, b, rho * s, f, ranked)
    assert a > 0 and math.isclose(a, c, rel_tol=1e-9, abs_tol=1e-15)
    assert rank_cost(np.zeros(b.size), b, s, f, ranked, spread=np.zeros(b.size)) == 0.0


def test_rank_kappa_is_the_rounds_smallest_within_the_budget() -> None:
    """One κ for the round: the total cost at it (with the estimates' bound, the caps) is within the budget (or it is
    at the cap), a κ 0.01 smaller would not be, every query gets min(κ, its cap)."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(3, 40))
        b = np.sort(rng.dirichlet(np.ones(n)))[::-1]
        s = rng.uniform(0.001, 0.05, n)
        f = rng.uniform(0.0, 1.0, n)
        rho = rng.uniform(0.5, 1.2, n)
        ranked = np.ones(n, dtype=bool)
        ranked[-1] = False  # the ``*`` query
        budget = float(rng.choice([1e-3, 2.5e-3, 1e-2]))
        cap = rng.uniform(0.0, 5.0, n)
        k = rank_kappa(b, s, f, ranked, budget, cap, spread=rho)
        assert np.all((k >= 0.0) & (k <= cap + 1e-12))
        kappa = float(k[np.argmax(cap)])  # the round's κ (where the cap does not bind)
        assert np.allclose(k, np.minimum(kappa, cap))
        at = rank_cost(k, b, s, f, ranked, spread=rho, bound=cap)
        assert at <= budget * (1 + 1e-9) or kappa >= cap.max() - 2e-3
        if kappa >= 0.01:
            below = rank_cost(np.minimum(kappa - 0.01, cap), b, s, f, ranked, spread=rho, bound=cap)
            assert below > budget, "a smaller κ would have been within the budget"


def test_the_cost_falls_with_kappa_and_grows_with_the_opt_in_noise() -> None:
    b = np.array([0.2, 0.15, 0.12, 0.11, 0.10, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03])
    ranked = np.ones(b.size, dtype=bool)
    f = np.full(b.size, 0.5)
    grid = np.linspace(0.0, 4.0, 41)
    costs = np.array([rank_cost(np.full(b.size, k), b, np.full(b.size, 0.02), f, ranked) for k in grid])
    assert np.all(np.diff(costs) <= 1e-15) and costs[0] > 10 * costs[-1]
    noisy = [rank_cost(np.zeros(b.size), b, np.full(b.size, sd), f, ranked) for sd in (0.001, 0.01, 0.05)]
    assert noisy[0] < noisy[1] < noisy[2]
    # an opt-in group that ranks as well as the blend costs nothing to follow: κ 0
    assert np.all(rank_kappa(b, np.full(b.size, 1e-5), f, ranked, 2.5e-3, 3.0) == 0.0)


def test_auto_keeps_a_small_opt_in_groups_ranking_within_issue_40s_bound() -> None:
    """At 1,000 opt-in users (the issue-40 populations, fresh each round, truth from the law), the fixed guard
    κ_q = 0.1 costs the honest NDCG@10 about 0.0055; the default, ``auto``, about 0.003 (−0.0028 ± 0.0004 on these
    150 rounds, −0.0033 ± 0.0004 on seed 7's: issue 40's 0.003 is met only within noise, docs/RESULTS.md "Issue 40:
    the ranking guard where deployments are"), so the bound here is 0.003 plus 2.5 standard errors, and the default
    must save at least 0.002 of the fixed guard's cost."""
    from hybriddp.server.anchor import DEFAULT_KAPPA_QUERY, FIXED_KAPPA_QUERY, AnchorPolicy
    from hybriddp.simulation.defended_calibration import calibrate_defended, defense_name

    assert DEFAULT_KAPPA_QUERY is None  # the shipped default is what "anchor" runs below
    fixed_policy = AnchorPolicy(kappa_query=FIXED_KAPPA_QUERY)
    cal = calibrate_defended(1_000, rounds=150, seed=41, defenses=("anchor", None, fixed_policy))
    undefended = float(np.nanmean(cal.runs["none"].ndcg10))
    fixed = float(np.nanmean(cal.runs[defense_name(fixed_policy)].ndcg10)) - undefended
    chosen = float(np.nanmean(cal.runs["anchor"].ndcg10)) - undefended
    assert chosen >= -0.004, chosen
    assert chosen > fixed + 0.002, (chosen, fixed)


def _issue40_round(n_optin: int, i: int) -> tuple[object, np.ndarray]:
    """Round ``i`` of the issue-40 populations (48 Zipf records over 12 queries, 20 × ``n_optin`` users): release and
    honest report counts."""
    from hybriddp.core.params import BlenderParams
    from hybriddp.core.records import SyntheticVocabulary
    from hybriddp.simulation.defended_calibration import _honest_round
    from hybriddp.simulation.selection import Population

    pop = Population.zipf(n_records=48, n_queries=12, exponent=1.1)
    params = BlenderParams(epsilon=4.0, head_list_size=100, optin_fraction=0.05)
    drawn = _honest_round(pop, n_optin, 20 * n_optin, params, (SyntheticVocabulary(12, "q"),
                          SyntheticVocabulary(48, "u")), np.random.default_rng([43, i]), 43_000 + i)
    assert drawn is not None
    return drawn[0], drawn[1]


def test_auto_keeps_the_fixed_guard_where_it_is_nearly_free_and_fakes_cannot_switch_it_off() -> None:
    """``auto`` (the default) keeps κ_q = 0.1 where the fixed guard's expected honest cost on the opt-in estimates'
    positions is within 0.005 (10,000 and 50,000 opt-in users: every round here) and gives it up for a looser one
    where the opt-in estimates misrank the top 10 (1,000: most rounds). The choice reads the opt-in release and the
    number of reports only: reports moved between entries (unflagged) leave its cost exactly as it was, and the same
    number of reports put anywhere (all on the lowest listed query, or at random: flagged and cleaned) moves it only
    through the cleaning's change of that number — down, as fewer reports are left — so no such reports switch the
    fixed guard off where it was kept; 10% more reports shaped like the honest ones raise it by less than 5%
    (ALGORITHM.md §7.2, "The default: the fixed guard where it is nearly free")."""
    from hybriddp.server.anchor import FIXED_GUARD_TOLERANCE, FIXED_KAPPA_QUERY, AnchorPolicy
    from hybriddp.server.party import server_side

    policy = AnchorPolicy()
    assert policy.kappa_query is None and FIXED_GUARD_TOLERANCE == 0.005
    rng = np.random.default_rng(4343)

    def check(rel: object, counts: np.ndarray) -> tuple[bool, float, bool]:
        """(fixed guard kept, its cost, anything flagged)."""
        c = server_side(rel, counts, True, "reuse", policy).check
        q = c.queries
        want = np.where(q.flagged, 0.0, np.minimum(FIXED_KAPPA_QUERY, q.kappa))
        return bool(np.array_equal(q.kappa_rank[:-1], want[:-1])), q.fixed_guard_cost(), c.flagged_any
    given_up = 0
    for i in range(6):
        for n_optin in (1_000, 10_000, 50_000):
            rel, counts = _issue40_round(n_optin, i)
            kept, cost, flagged = check(rel, counts)
            assert kept == (cost <= FIXED_GUARD_TOLERANCE) and not flagged
            if n_optin == 1_000:
                given_up += not kept
                continue
            assert kept, (n_optin, i, cost)
            hl, total = rel.head_list, int(counts.sum())
            listed = np.where(np.arange(hl.k) < hl.k - 1, rel.optin.p_query, np.nan)
            low, top = int(np.nanargmin(listed)), int(np.nanargmax(listed))
            moved = counts.copy()  # 0.3% of the reports from the top query's first entry to the low query's
            src, dst = np.flatnonzero(hl.entry_query == top)[0], np.flatnonzero(hl.entry_query == low)[0]
            moved[src] -= total * 3 // 1000
            moved[dst] += total * 3 // 1000
            lump = np.zeros_like(counts)
            lump[dst] = total
            scattered = np.bincount(rng.integers(0, counts.size, total), minlength=counts.size).astype(counts.dtype)
            k_moved, c_moved, f_moved = check(rel, moved)
            assert k_moved and (f_moved or c_moved == cost), (n_optin, i, c_moved, cost)
            more = counts + counts // 10  # 10% more reports, shaped like the honest ones: not flagged
            for fake in (lump, scattered, more):
                k_fake, c_fake, _ = check(rel, fake)
                assert k_fake and c_fake <= 1.05 * cost + 1e-12, (n_optin, i, c_fake, cost)
    assert given_up >= 4, given_up

"""Reusing S (ALGORITHM.md §3.3, §4.1): the kept records' noisy counts are released with the head
list, and the opt-in estimates of the final records count S ∪ T.

* privacy: the release (keep decision and noisy count of every record) is checked *exactly* for
  neighbouring count vectors, by enumerating the product output distribution (discrete noise);
* the noisy counts are N(r, D_S) + the very draw that kept r;
* the estimator is unbiased and its reported variances match the empirical ones (Monte Carlo),
  against a covariance computed independently as a quadratic form of the two multinomials;
* the selection bias of a record kept just above τ matches the truncated noise law and stays
  within ALGORITHM.md §4.1's bound.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hybriddp.core.headlist import WILDCARD, HeadList
from hybriddp.core.noise import DiscreteLaplaceNoise, discrete_laplace_pmf, discrete_laplace_tail, rational_scale
from hybriddp.core.params import head_list_scale
from hybriddp.curator.mechanisms import create_head_list_with_counts, estimate_optin_probabilities, reuse_s

# ----- exact privacy of the released counts (ALGORITHM.md §3.3) ------------------------------------


def release_law(count: int, tau_d: int, t: float, top: int, leak: bool = False) -> np.ndarray:
    """Output law of one record: index 0 = not in the list, index i ≥ 1 = released with count τ_d + i
    (i ≤ top). A record absent from D_S (count 0) is never released: no noise is drawn for it.
    ``leak``: the broken variant that publishes the true count of a kept record (index ≤ 0 when the
    count itself is below the threshold folds into index 1; still a function of the count)."""
    law = np.zeros(top + 1)
    if count == 0:
        law[0] = 1.0
        return law
    law[0] = 1.0 - discrete_laplace_tail(tau_d - count + 1, t)  # P[count + Y ≤ τ_d]
    if leak:
        law[min(max(count - tau_d, 1), top)] = 1.0 - law[0]
    else:
        law[1:] = discrete_laplace_pmf(tau_d + np.arange(1, top + 1) - count, t)
    return law


def exact_delta(x: tuple[int, ...], xp: tuple[int, ...], eps: float, tau_d: int, t: float, top: int,
                leak: bool = False) -> float:
    """max over both directions of Σ_o (P(o) − e^ε·P'(o))⁺ over the joint output of the records whose
    counts differ, plus the P-mass cut off above τ_d + top (so the value is an upper bound)."""
    worst = 0.0
    for a, b in ((x, xp), (xp, x)):
        p = np.ones(1)
        q = np.ones(1)
        cut = 0.0
        for ca, cb in zip(a, b, strict=True):
            la, lb = release_law(ca, tau_d, t, top, leak), release_law(cb, tau_d, t, top, leak)
            cut += 1.0 - la.sum()
            p, q = np.multiply.outer(p, la).ravel(), np.multiply.outer(q, lb).ravel()
        worst = max(worst, float(np.maximum(p - math.exp(eps) * q, 0.0).sum()) + cut)
    return worst


def neighbours(m_o: int, top_count: int):
    """Count vectors of the records one user's ≤ m_O records touch, before and after the user's records
    change: −k on some records and +k on others (a user may hold one record twice)."""
    moves = [(-1, 1)] if m_o == 1 else [(-1, 1), (-2, 2), (-2, 1, 1), (-1, -1, 2), (-1, -1, 1, 1)]
    for d in moves:
        for x in itertools.product(range(top_count + 1), repeat=len(d)):
            xp = tuple(c + dc for c, dc in zip(x, d, strict=True))
            if min(xp) >= 0:
                yield x, xp


@pytest.mark.parametrize(("eps", "delta", "m_o"), [(4.0, 1e-5, 1), (1.0, 1e-3, 1), (2.0, 0.05, 1), (4.0, 0.05, 2),
                                                    (6.0, 0.1, 2)])
def test_released_counts_keep_epsilon_delta_exactly(eps: float, delta: float, m_o: int) -> None:
    """Every neighbouring pair with counts up to τ_d + 2 (m_O = 2: τ_d + 1): the exact hockey-stick
    divergence of the whole release (which records are kept, and their noisy counts) at e^ε is ≤ δ."""
    noise = DiscreteLaplaceNoise(np.random.default_rng(0))
    tau_d = int(noise.head_list_threshold(eps, delta, m_o))
    t = float(rational_scale(head_list_scale(eps, m_o)))
    top = 45 if m_o == 1 else 14
    pairs = list(neighbours(m_o, tau_d + 2 if m_o == 1 else tau_d + 1))
    assert max(exact_delta(x, xp, eps, tau_d, t, top) for x, xp in pairs) <= delta
    # the test has power: publishing a kept record's true count instead of its noisy one is caught
    assert max(exact_delta(x, xp, eps, tau_d, t, top, leak=True) for x, xp in pairs[::5]) > delta


# ----- the released counts ---------------------------------------------------------------------------------


class Recorder(DiscreteLaplaceNoise):
    def sample(self, scale: float, size: int) -> np.ndarray:
        self.last = super().sample(scale, size)
        return self.last


def test_counts_are_the_draws_that_kept_each_record() -> None:
    counts = {(1, 10): 40, (1, 11): 30, (2, 20): 25, (2, 21): 1, (3, 30): 2}
    q = np.concatenate([np.full(c, k[0]) for k, c in counts.items()])
    u = np.concatenate([np.full(c, k[1]) for k, c in counts.items()])
    noise = Recorder(np.random.default_rng(5))
    hl, s_counts = create_head_list_with_counts(q, u, epsilon=4.0, delta=1e-5, m_o=1, noise=noise)
    keys = sorted(counts)  # one draw per distinct record, in record-key order
    noisy = {k: counts[k] + noise.last[i] for i, k in enumerate(keys)}
    assert hl.n_records == 3  # the three frequent ones; 1 and 2 cannot pass τ_d = 7 with this noise
    qids = np.append(hl.query_ids, WILDCARD)
    for e in range(hl.n_entries):
        key = (int(qids[hl.entry_query[e]]), int(hl.entry_url[e]))
        if hl.is_wildcard[e]:
            assert np.isnan(s_counts[e])
        else:
            assert s_counts[e] == noisy[key] and noisy[key] > 7


def test_counts_of_a_log_without_urls_sit_on_the_query_entries() -> None:
    q = np.repeat([4, 9], [50, 30])
    hl, s_counts = create_head_list_with_counts(q, np.full(80, -1), epsilon=4.0, delta=1e-5, m_o=1,
                                                noise=DiscreteLaplaceNoise(np.random.default_rng(1)))
    assert hl.n_records == 0 and hl.n_queries == 2
    assert np.all(np.abs(s_counts[hl.wildcard_entry[:2]] - [50, 30]) <= 10)
    assert np.isnan(s_counts[hl.wildcard_entry[2]])


# ----- the estimator: unbiased, with the right variance (ALGORITHM.md §4.1) -----------------------------------

# (query, url) → probability. Five records are frequent (hundreds of S counts: always kept), the rest
# are rare enough that S never keeps them (expected count ≤ 3 against τ_d = 25).
DIST = {(1, 10): 0.30, (1, 11): 0.15, (1, 12): 0.001, (2, 20): 0.25, (2, 21): 0.12, (2, 22): 0.001,
        (3, 30): 0.05, (4, 40): 0.001, (5, 50): 0.001, (6, 60): 0.126}


def entry_truth(hl: HeadList) -> np.ndarray:
    recs = list(DIST)
    ent = hl.map_records(np.array([r[0] for r in recs]), np.array([r[1] for r in recs]))
    return np.bincount(ent, weights=[DIST[r] for r in recs], minlength=hl.n_entries)


def covariance(hl: HeadList, reused: np.ndarray, n_s: int, n_t: int, noise_var: float) -> np.ndarray:
    """Cov of the entry estimates, derived directly: p̂ = A_S·X_S + A_T·X_T + noise with X_S, X_T the
    multinomial entry counts of D_S and D_T (Cov X = n(diag π − ππᵀ)); A_S = 1/n on reused records, 0
    elsewhere; A_T = 1/n on reused records, 1/n_T elsewhere; noise: one draw per group counted."""
    pi = entry_truth(hl)
    n = n_s + n_t
    a_s = np.where(reused, 1.0 / n, 0.0)
    a_t = np.where(reused, 1.0 / n, 1.0 / n_t)
    cov_pi = np.diag(pi) - np.outer(pi, pi)
    cov = n_s * np.outer(a_s, a_s) * cov_pi + n_t * np.outer(a_t, a_t) * cov_pi
    return cov + np.diag(noise_var * (a_s**2 + a_t**2))


def test_reuse_estimates_are_unbiased_with_matching_variances() -> None:
    """|D_S| = 3000, |D_T| = 300, ε = 1, 4,000 trials, no trimming (M = 10): per entry and per query, the
    mean is within 5 s.e. of the truth, and both the empirical variance and the mean reported variance
    are within 6 s.d. of a sample variance of the independently derived one."""
    rng = np.random.default_rng(20261123)
    recs = list(DIST)
    probs = np.array([DIST[r] for r in recs])
    rq, ru = np.array([r[0] for r in recs]), np.array([r[1] for r in recs])
    n_s, n_t, eps, trials = 3000, 300, 1.0, 4000
    noise = DiscreteLaplaceNoise(rng)
    frequent = {(1, 10), (1, 11), (2, 20), (2, 21), (3, 30), (6, 60)}
    first = None
    rows = []
    for _ in range(trials):
        s = rng.choice(len(recs), size=n_s, p=probs)
        t = rng.choice(len(recs), size=n_t, p=probs)
        hl_s, s_counts = create_head_list_with_counts(rq[s], ru[s], epsilon=eps, delta=1e-5, m_o=1, noise=noise)
        est = reuse_s(estimate_optin_probabilities(rq[t], ru[t], hl_s, epsilon=eps, m_o=1, head_list_size=10,
                                                   noise=noise, s_counts=s_counts, n_s=n_s))
        hl = est.head_list
        keys = list(zip(np.append(hl.query_ids, WILDCARD)[hl.entry_query].tolist(), hl.entry_url.tolist(),
                        strict=True))
        if {k for k in keys if k[1] != WILDCARD} != frequent:
            continue  # δ's rare event: a rare record passed τ (counted below)
        if first is None:
            first, ref = est, keys
        pos = {k: i for i, k in enumerate(keys)}  # the final order follows T's estimates: use the first one's
        idx = [pos[k] for k in ref]
        qpos = {qid: i for i, qid in enumerate([*hl.query_ids.tolist(), WILDCARD])}
        qidx = [qpos[qid] for qid in [*first.head_list.query_ids.tolist(), WILDCARD]]
        assert np.array_equal(est.reused[idx], first.reused)
        rows.append((est.p_record[idx], est.var_record[idx], est.p_query[qidx], est.var_query[qidx]))
    assert len(rows) >= 0.99 * trials
    trials = len(rows)
    hl = first.head_list
    assert first.n_s == n_s and first.reused is not None
    assert {k for k, r in zip(ref, first.reused.tolist(), strict=True) if r} == frequent  # every kept record
    cov = covariance(hl, first.reused, n_s, n_t, noise.variance(head_list_scale(eps, 1)))
    agg = np.zeros((hl.k, hl.n_entries))
    agg[hl.entry_query, np.arange(hl.n_entries)] = 1.0
    truth = entry_truth(hl)
    tol = 6 * math.sqrt(2 / (trials - 1)) + 0.02  # + the clamp of p̂ in p(1−p), as in test_curator
    for name, col, true_mean, true_var in [("record", 0, truth, np.diag(cov)),
                                          ("query", 2, agg @ truth, np.diag(agg @ cov @ agg.T))]:
        p = np.array([r[col] for r in rows])
        v = np.array([r[col + 1] for r in rows])
        se = p.std(axis=0, ddof=1) / math.sqrt(trials)
        assert np.all(np.abs(p.mean(axis=0) - true_mean) <= 5 * se), name
        np.testing.assert_array_less(np.abs(p.var(axis=0, ddof=1) / true_var - 1), tol, err_msg=name)
        np.testing.assert_array_less(np.abs(v.mean(axis=0) / true_var - 1), tol, err_msg=name)
    # reusing S is what makes the records precise: 11× the records of T alone
    assert np.diag(cov)[hl.entry_url == 10][0] < DIST[(1, 10)] * (1 - DIST[(1, 10)]) / n_t / 8


# ----- the selection bias of a record kept just above τ (ALGORITHM.md §4.1) ------------------------------------


def bias_bound(count: int, tau_d: int, q: float) -> float:
    """ALGORITHM.md §4.1: E[N̂ − N | kept] ≤ q/(1 − q) when N > τ_d, else exactly (τ_d − N) + 1/(1 − q)."""
    return q / (1 - q) if count > tau_d else (tau_d - count) + 1 / (1 - q)


@pytest.mark.parametrize("count", [5, 7, 8, 10, 14])
def test_selection_bias_of_kept_counts_matches_the_truncated_law(count: int) -> None:
    """ε = 4, δ = 1e-5 (τ_d = 7, t = 1/2): one record with count N in D_S, 200,000 rounds (its noise only).
    The mean released count among the rounds that kept it is within 5 s.e. of the truncated law
    E[N + Y | N + Y > τ_d] computed from the pmf, and the bias is at most the bound (and the bound is
    attained when N ≤ τ_d: the tail above the threshold is geometric)."""
    eps, delta = 4.0, 1e-5
    noise = DiscreteLaplaceNoise(np.random.default_rng(count))
    tau_d = int(noise.head_list_threshold(eps, delta, 1))
    t = float(rational_scale(head_list_scale(eps, 1)))
    q = math.exp(-1 / t)
    y = np.arange(-80, 81)
    pmf = discrete_laplace_pmf(y, t)
    kept = count + y > tau_d
    exact = float((count + y[kept]) @ pmf[kept] / pmf[kept].sum()) - count
    assert exact <= bias_bound(count, tau_d, q) + 1e-12
    if count <= tau_d:
        assert exact == pytest.approx(bias_bound(count, tau_d, q), rel=1e-9)
    rounds = 200_000
    draws = count + noise.sample(head_list_scale(eps, 1), rounds)
    seen = draws[draws > tau_d] - count
    if len(seen) > 100:
        assert abs(seen.mean() - exact) <= 5 * seen.std(ddof=1) / math.sqrt(len(seen))
    if count >= tau_d + 3:
        assert exact < 0.01  # far above the threshold the bias vanishes


class NoNoise(DiscreteLaplaceNoise):
    """Zero noise (structure tests only); the discrete noise's variance and threshold."""

    def sample(self, scale: float, size: int) -> np.ndarray:
        return np.zeros(size)


def test_reuse_ranks_trimming_by_s_and_t_together() -> None:
    """M = 1 among three records of one query. T alone prefers (1, 10) (3 of 10 T records against 2); S
    (1,000 records) says (1, 11) is three times as frequent. The paper's trimming keeps (1, 10); with
    rank_with_s the pooled estimate keeps (1, 11), and the trimmed records fold into ⟨1,*⟩ either way."""
    hl = HeadList.from_lists([1], [[10, 11, 12]])
    s_counts = np.array([100.0, 300.0, 50.0, np.nan, np.nan])
    q = np.array([1] * 10)
    u = np.array([10, 10, 10, 11, 11, 12, 99, 99, 99, 99])
    for rank, kept_url in ((False, 10), (True, 11)):
        est = estimate_optin_probabilities(q, u, hl, epsilon=4.0, m_o=1, head_list_size=1, noise=NoNoise(None),
                                           s_counts=s_counts, n_s=1000, rank_with_s=rank)
        assert est.head_list.entry_url.tolist() == [kept_url, WILDCARD, WILDCARD]
        t_count = {10: 3, 11: 2}
        assert est.p_record[1] * 10 == pytest.approx(10 - t_count[kept_url])  # ⟨1,*⟩: the rest of query 1
        assert np.isfinite(est.s_counts).tolist() == [True, False, False]
    with pytest.raises(ValueError, match="s_counts"):
        estimate_optin_probabilities(q, u, hl, epsilon=4.0, m_o=1, head_list_size=1, noise=NoNoise(None),
                                     rank_with_s=True)

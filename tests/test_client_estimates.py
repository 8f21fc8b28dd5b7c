"""EstimateClientProbabilities (ALGORITHM.md §6, paper Fig. 5 / Observation 1): unbiasedness and the
corrected delta-method variances, by Monte Carlo; and exactly, by enumerating every count vector of n = 2, 3, 4
reports with its multinomial weight (E[p̂] = p and E[σ̂²] = E[(p̂ − p)²] for every entry and query); the edges.

Monte Carlo setting: a 6-query head list with mixed k_q (1, 2, 3, 4, 6 URLs incl. ``*``), n = 20,000 clients
with records drawn i.i.d. from a known distribution over its entries (the iid assumption of the
paper's variance derivation), randomized with :func:`randomize_batch`. T trials per setting:

* mean of p̂_C within 5 standard errors (s.d./√T) of the truth;
* mean of σ̂²_C vs the empirical variance of p̂_C: a sample variance over T trials has relative
  s.d. √(2/(T−1)); we allow 6 of those (plus 1% for the delta method's O(1/n²) terms).
Everything is seeded, so the tests cannot flake.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

from hybriddp.core.headlist import HeadList
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.device.batch import randomize_batch
from hybriddp.server.client_estimates import estimate_client_probabilities

# ----- helpers ---------------------------------------------------------------------------------

# queries 0..5 with 3, 1, 0, 5, 0, 2 real URLs → k_q = 4, 2, 1, 6, 1, 3, and * (k_q = 1); k = 7
URLS = [[1, 2, 3], [4], [], [5, 6, 7, 8, 9], [], [10, 11]]


def head_list() -> HeadList:
    return HeadList.from_lists(list(range(len(URLS))), URLS)


def true_distribution(hl: HeadList) -> np.ndarray:
    """A fixed, uneven distribution over all entries (wildcards included), every entry > 0."""
    w = np.linspace(3.0, 0.5, hl.n_entries) ** 2
    w[hl.wildcard_entry] *= 0.5
    return w / w.sum()


@dataclass
class MonteCarlo:
    p_rec: np.ndarray  # (T, n_entries)
    v_rec: np.ndarray
    p_q: np.ndarray  # (T, k)
    v_q: np.ndarray
    n: int


def simulate(hl: HeadList, lp: LocalAlgParams, p: np.ndarray, n: int, trials: int, seed: int) -> MonteCarlo:
    """T trials: n iid records from p → randomize_batch → report counts → estimates."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(p)
    cdf[-1] = 1.0
    out = MonteCarlo(np.empty((trials, hl.n_entries)), np.empty((trials, hl.n_entries)),
                     np.empty((trials, hl.k)), np.empty((trials, hl.k)), n)
    for t in range(trials):
        entries = np.searchsorted(cdf, rng.random(n), side="right")
        reports = randomize_batch(entries, hl, lp, rng)
        est = estimate_client_probabilities(np.bincount(reports, minlength=hl.n_entries), hl, lp)
        out.p_rec[t], out.v_rec[t], out.p_q[t], out.v_q[t] = est.p_record, est.var_record, est.p_query, est.var_query
    return out


def assert_unbiased(samples: np.ndarray, truth: np.ndarray, what: str) -> None:
    trials = samples.shape[0]
    se = samples.std(axis=0, ddof=1) / math.sqrt(trials)
    z = np.abs(samples.mean(axis=0) - truth) / se
    assert np.all(z <= 5), f"{what}: |mean − truth| / s.e. = {np.round(z, 2)}"


def variance_tolerance(trials: int) -> float:
    return 6 * math.sqrt(2 / (trials - 1)) + 0.01


def assert_variance_matches(samples: np.ndarray, var_est: np.ndarray, what: str) -> None:
    emp = samples.var(axis=0, ddof=1)
    rel = np.abs(var_est.mean(axis=0) / emp - 1)
    assert np.all(rel <= variance_tolerance(samples.shape[0])), f"{what}: relative error {np.round(rel, 3)}"


def paper_printed_record_variance(counts: np.ndarray, hl: HeadList, lp: LocalAlgParams) -> np.ndarray:
    """Theorem 5 as printed (its covariance term: 2n/(n−1)·c·(k−2+t)/(kt−1)·r̂_⟨q,u⟩)."""
    n = counts.sum()
    k, t = lp.k, lp.t
    eq = hl.entry_query
    r = counts / n
    r_q = np.bincount(eq, weights=counts, minlength=k) / n
    a = (k * t - 1) / (k - 1)
    var_q = r_q * (1 - r_q) / ((n - 1) * a * a)
    kq, tq = lp.kq[eq].astype(float), lp.tq[eq]
    multi = kq > 1
    kq1 = np.where(multi, kq - 1, 1)
    d = t * (tq - (1 - tq) / kq1)
    c = (1 - t) / ((k - 1) * kq) - (t - t * tq) / kq1
    v = (r * (1 - r) / (n - 1) + c * c * var_q[eq] + 2 * n / (n - 1) * c * (k - 2 + t) / (k * t - 1) * r) / d**2
    return np.where(multi, v, var_q[eq])


# ----- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("eps", "delta", "f_c", "trials", "seed"), [
    (4.0, 1e-5, 0.85, 1000, 1),  # paper defaults
    (2.0, 0.1, 0.5, 500, 2),     # a large δ, so the δ terms of t and t_q matter
])
def test_unbiased_and_variance_monte_carlo(eps: float, delta: float, f_c: float, trials: int, seed: int) -> None:
    hl = head_list()
    lp = LocalAlgParams.build(hl, eps, delta, f_c, 1)
    p = true_distribution(hl)
    mc = simulate(hl, lp, p, 20_000, trials, seed)
    p_query = np.bincount(hl.entry_query, weights=p, minlength=hl.k)
    assert_unbiased(mc.p_q, p_query, "queries")
    assert_unbiased(mc.p_rec, p, "records (incl. ⟨q,*⟩, ⟨*,*⟩, k_q = 1)")
    assert_variance_matches(mc.p_q, mc.v_q, "query variance")
    assert_variance_matches(mc.p_rec, mc.v_rec, "record variance")
    # k_q = 1 entries (⟨q,*⟩ of URL-less queries, ⟨*,*⟩) take the query's estimate
    single = hl.kq[hl.entry_query] == 1
    np.testing.assert_array_equal(mc.p_rec[:, single], mc.p_q[:, hl.entry_query[single]])
    np.testing.assert_array_equal(mc.v_rec[:, single], mc.v_q[:, hl.entry_query[single]])


def test_variance_formula_has_teeth() -> None:
    """On the same Monte Carlo, the printed Theorem 5 and the formula without the covariance
    term both fail the variance comparison (the printed one is not even positive on average
    for some records, ALGORITHM.md §6 Erratum)."""
    hl = head_list()
    lp = LocalAlgParams.build(hl, 4.0, 1e-5, 0.85, 1)
    p = true_distribution(hl)
    rng = np.random.default_rng(3)
    trials, n = 300, 20_000
    cdf = np.cumsum(p)
    cdf[-1] = 1.0
    est_p, printed, no_cov = [], [], []
    multi = hl.kq[hl.entry_query] > 1
    for _ in range(trials):
        reports = randomize_batch(np.searchsorted(cdf, rng.random(n), side="right"), hl, lp, rng)
        counts = np.bincount(reports, minlength=hl.n_entries).astype(float)
        est = estimate_client_probabilities(counts, hl, lp)
        est_p.append(est.p_record)
        printed.append(paper_printed_record_variance(counts, hl, lp))
        # drop the 2c·Cov term of the corrected formula
        eq = hl.entry_query
        kq, tq, t, k = lp.kq[eq].astype(float), lp.tq[eq], lp.t, lp.k
        kq1 = np.where(multi, kq - 1, 1)
        d = t * (tq - (1 - tq) / kq1)
        c = (1 - t) / ((k - 1) * kq) - t * (1 - tq) / kq1
        r = counts / n
        no_cov.append((r * (1 - r) / (n - 1) + c * c * est.var_query[eq]) / d**2)
    emp = np.var(est_p, axis=0, ddof=1)[multi]
    tol = variance_tolerance(trials)
    printed_mean = np.mean(printed, axis=0)[multi]
    assert np.any(printed_mean < 0)
    assert np.any(np.abs(printed_mean / emp - 1) > tol)
    assert np.any(np.abs(np.mean(no_cov, axis=0)[multi] / emp - 1) > tol)


def test_estimates_invert_the_expected_report_distribution() -> None:
    """Feeding the exact expected report frequencies r = p·P recovers p exactly (no sampling)."""
    hl = head_list()
    for eps, delta, f_c in [(4.0, 1e-5, 0.85), (1.0, 0.2, 0.3), (8.0, 1e-7, 0.99)]:
        lp = LocalAlgParams.build(hl, eps, delta, f_c, 1)
        p = true_distribution(hl)
        r = p @ output_distribution(lp)
        est = estimate_client_probabilities(r * 1e9, hl, lp)  # counts proportional to r
        np.testing.assert_allclose(est.p_record, p, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(est.p_query, np.bincount(hl.entry_query, weights=p), rtol=1e-6, atol=1e-12)


def test_k1_gives_one_with_zero_variance() -> None:
    hl = HeadList.from_lists([], [])
    lp = LocalAlgParams.build(hl, 4.0, 1e-5, 0.85, 1)
    est = estimate_client_probabilities(np.array([123]), hl, lp)
    assert est.p_record.tolist() == [1.0] and est.var_record.tolist() == [0.0]
    assert est.p_query.tolist() == [1.0] and est.var_query.tolist() == [0.0]


@pytest.mark.parametrize("n", [0, 1])
def test_no_reports_give_infinite_variance(n: int) -> None:
    hl = head_list()
    lp = LocalAlgParams.build(hl, 4.0, 1e-5, 0.85, 1)
    counts = np.zeros(hl.n_entries, dtype=np.int64)
    counts[0] = n
    est = estimate_client_probabilities(counts, hl, lp)
    assert est.n == n
    assert np.all(np.isinf(est.var_record)) and np.all(np.isinf(est.var_query))


def test_m_c_above_one_flags_approximate_variance() -> None:
    hl = head_list()
    lp = LocalAlgParams.build(hl, 4.0, 1e-5, 0.85, 2)
    counts = np.full(hl.n_entries, 100)
    assert estimate_client_probabilities(counts, hl, lp, m_c=1).variance_exact
    assert not estimate_client_probabilities(counts, hl, lp, m_c=2).variance_exact


# ----- by hand and exactly: every report outcome enumerated with its multinomial weight; the edges ------------

def test_client_estimates_from_two_reports_invert_the_randomizer() -> None:
    """n = 2 reports is the first case with estimates: p̂ must reproduce the observed report fractions
    through the randomizer's exact output distribution (p̂·P = r̂, ALGORITHM.md §5–6), and the query
    variance is r̂(1−r̂)/((n−1)a²) with a = P[q|q] − P[q|q'] read off P. n = 1: 0 with infinite variance."""
    hl = HeadList.from_lists([0, 1], [[0, 1], [2]])  # every entry a distinct record (k_q ≥ 2)
    lp = LocalAlgParams.build(hl, 2.0, 1e-5, 0.6, 1)
    P = output_distribution(lp)
    counts = np.zeros(hl.n_entries)
    counts[0] = counts[3] = 1  # two reports: ⟨q0,u0⟩ and ⟨q1,u2⟩
    est = estimate_client_probabilities(counts, hl, lp)
    # records: p̂ over the 6 entries, ⟨*,*⟩ (k_q = 1) carries the * query's estimate
    np.testing.assert_allclose(est.p_record @ P, counts / 2, atol=1e-12)
    q_of = hl.entry_query
    r_q = np.bincount(q_of, weights=counts, minlength=hl.k) / 2
    a = P[0, 0:3].sum() - P[hl.n_entries - 1, 0:3].sum()  # P[query 0 | record of q0] − P[query 0 | other]
    np.testing.assert_allclose(est.var_query, r_q * (1 - r_q) / (1 * a * a), rtol=1e-10)
    assert np.isfinite(est.var_record).all()
    single = np.zeros(hl.n_entries)
    single[0] = 1
    one = estimate_client_probabilities(single, hl, lp)
    assert (one.p_record == 0).all() and np.isinf(one.var_record).all() and np.isinf(one.var_query).all()


def _report_distribution(k: int, kq: list[int], t: Fraction, tq: list[Fraction], p: list[Fraction]) -> list[Fraction]:
    """P[report = entry] from ALGORITHM.md §5's table, summed over the record distribution p."""
    entries = [(q, u) for q in range(k) for u in range(kq[q])]
    r = []
    for q2, u2 in entries:
        total = Fraction(0)
        for (q, u), pi in zip(entries, p, strict=True):
            if q2 != q:
                prob = (1 - t) / (k - 1) / kq[q2]
            elif u2 == u:
                prob = t * tq[q]
            else:
                prob = t * (1 - tq[q]) / (kq[q] - 1)
            total += pi * prob
        r.append(total)
    return r


def _compositions(n: int, parts: int):
    """Every vector of ``parts`` non-negative integers summing to n."""
    for cuts in itertools.combinations(range(n + parts - 1), parts - 1):
        edges = (-1, *cuts, n + parts - 1)
        yield [edges[i + 1] - edges[i] - 1 for i in range(parts)]


@pytest.mark.parametrize("n", [2, 4])
def test_client_estimates_and_variances_are_exactly_unbiased(n: int) -> None:
    """With m_C = 1 the n reports are i.i.d. over the entries (ALGORITHM.md §6), so over all count vectors,
    weighted by their multinomial probability: E[p̂] = p, and E[σ̂²] = E[(p̂ − p)²] for every entry and query
    (the estimators are linear and the variance plug-ins unbiased). Head list: a (2 URLs + *), b (*), *."""
    hl = HeadList.from_lists([0, 1], [[0, 1], []])
    lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, 1)
    k, kq = 3, [3, 1, 1]
    p = [Fraction(3, 10), Fraction(1, 10), Fraction(1, 5), Fraction(1, 4), Fraction(3, 20)]
    p_query = [sum(p[:3]), p[3], p[4]]
    r = _report_distribution(k, kq, Fraction(lp.t), [Fraction(x) for x in lp.tq], p)
    assert sum(r) == 1
    e_p, e_p2, e_v = np.zeros(5), np.zeros(5), np.zeros(5)
    e_pq, e_pq2, e_vq = np.zeros(3), np.zeros(3), np.zeros(3)
    for counts in _compositions(n, 5):
        weight = Fraction(math.factorial(n))
        for c, ri in zip(counts, r, strict=True):
            weight *= ri ** c / math.factorial(c)
        w = float(weight)
        est = estimate_client_probabilities(np.array(counts), hl, lp)
        assert est.n == n and est.variance_exact
        e_p += w * est.p_record
        e_p2 += w * (est.p_record - np.array([float(x) for x in p])) ** 2
        e_v += w * est.var_record
        e_pq += w * est.p_query
        e_pq2 += w * (est.p_query - np.array([float(x) for x in p_query])) ** 2
        e_vq += w * est.var_query
    np.testing.assert_allclose(e_p, [float(x) for x in p], rtol=1e-9)
    np.testing.assert_allclose(e_pq, [float(x) for x in p_query], rtol=1e-9)
    np.testing.assert_allclose(e_v, e_p2, rtol=1e-9)
    np.testing.assert_allclose(e_vq, e_pq2, rtol=1e-9)
    np.testing.assert_array_equal(e_v[3:], e_vq[1:])  # k_q = 1: the query's variance


def test_client_estimates_exactly_unbiased_with_k_q_two() -> None:
    """As test_client_estimates_and_variances_are_exactly_unbiased, on a head list with k_q = 2, 3, 1 and 1
    (a: u0 + *, b: u1, u2 + *, c: *, *), n = 3 reports, ε = 1.5, δ = 0.2, f_C = 0.7."""
    hl = HeadList.from_lists([0, 1, 2], [[0], [1, 2], []])
    lp = LocalAlgParams.build(hl, 1.5, 0.2, 0.7, 1)
    k, kq, n = 4, [2, 3, 1, 1], 3
    p = [Fraction(1, 5), Fraction(1, 10), Fraction(3, 20), Fraction(1, 20), Fraction(1, 10), Fraction(1, 4),
         Fraction(3, 20)]
    p_query = [p[0] + p[1], p[2] + p[3] + p[4], p[5], p[6]]
    r = _report_distribution(k, kq, Fraction(lp.t), [Fraction(x) for x in lp.tq], p)
    e_p, e_p2, e_v = np.zeros(7), np.zeros(7), np.zeros(7)
    e_pq, e_pq2, e_vq = np.zeros(4), np.zeros(4), np.zeros(4)
    p_f, pq_f = np.array([float(x) for x in p]), np.array([float(x) for x in p_query])
    for counts in _compositions(n, 7):
        weight = Fraction(math.factorial(n))
        for c, ri in zip(counts, r, strict=True):
            weight *= ri ** c / math.factorial(c)
        w = float(weight)
        est = estimate_client_probabilities(counts, hl, lp)  # a plain list of counts
        e_p += w * est.p_record
        e_p2 += w * (est.p_record - p_f) ** 2
        e_v += w * est.var_record
        e_pq += w * est.p_query
        e_pq2 += w * (est.p_query - pq_f) ** 2
        e_vq += w * est.var_query
    np.testing.assert_allclose(e_p, p_f, rtol=1e-9)
    np.testing.assert_allclose(e_pq, pq_f, rtol=1e-9)
    np.testing.assert_allclose(e_v, e_p2, rtol=1e-9)
    np.testing.assert_allclose(e_vq, e_pq2, rtol=1e-9)


def test_client_estimates_edges() -> None:
    hl = HeadList.from_lists([0, 1], [[0, 1], []])
    lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, 2)
    one = estimate_client_probabilities([0, 0, 1, 0, 0], hl, lp, m_c=2)
    assert one.n == 1 and not one.variance_exact
    assert one.p_record.tolist() == [0.0] * 5 and one.p_query.tolist() == [0.0] * 3
    assert one.var_record.tolist() == [math.inf] * 5 and one.var_query.tolist() == [math.inf] * 3
    two = estimate_client_probabilities([1, 0, 1, 0, 0], hl, lp, m_c=1)
    assert two.n == 2 and two.variance_exact and np.isfinite(two.var_record).all()
    hl1 = HeadList.from_lists([], [])
    only = estimate_client_probabilities(np.array([5]), hl1, LocalAlgParams.build(hl1, 2.0, 0.1, 0.5, 2), m_c=2)
    assert only.n == 5 and not only.variance_exact
    assert (only.p_record.tolist(), only.var_record.tolist()) == ([1.0], [0.0])


def test_client_estimates_flag_exact_variances_on_every_path() -> None:
    """variance_exact is the boolean m_C == 1 whatever path the estimate takes (k = 1, n < 2, the formulas)."""
    hl1 = HeadList.from_lists([], [])
    hl = HeadList.from_lists([0, 1], [[0, 1], []])
    for m_c, expected in [(1, True), (2, False)]:
        lp1 = LocalAlgParams.build(hl1, 2.0, 0.1, 0.5, m_c)
        lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, m_c)
        for est in (estimate_client_probabilities([3], hl1, lp1, m_c=m_c),
                    estimate_client_probabilities([0, 1, 0, 0, 0], hl, lp, m_c=m_c),
                    estimate_client_probabilities([2, 1, 0, 3, 1], hl, lp, m_c=m_c)):
            assert est.variance_exact is expected


# ----- client_variances at given probabilities (ALGORITHM.md §6, §7 "Pooled weights") ------------------------------

def _section6_variances(p_rec: np.ndarray, p_q: np.ndarray, hl: HeadList, lp: LocalAlgParams,
                        n: int) -> tuple[np.ndarray, np.ndarray]:
    """σ²_C of ALGORITHM.md §6 written out entry by entry in plain floats: the report frequencies that p implies,
    r_q = a·p_q + (1−t)/(k−1) and r_⟨q,u⟩ = D_q·p + t(1−t_q)/(k_q−1)·p_q + (1−t)(1−p_q)/((k−1)k_q), each clamped
    into [0, 1], then σ²_C,q = r_q(1−r_q)/((n−1)a²) and the Erratum form for records; k_q = 1: the query's."""
    k, t = lp.k, float(lp.t)
    a = (k * t - 1) / (k - 1)
    r_q = [min(max(a * float(p_q[q]) + (1 - t) / (k - 1), 0.0), 1.0) for q in range(k)]
    var_q = [r * (1 - r) / ((n - 1) * a * a) for r in r_q]
    var_rec = []
    for e in range(hl.n_entries):
        q = int(hl.entry_query[e])
        kq, tq, pq = int(lp.kq[q]), float(lp.tq[q]), float(p_q[q])
        if kq == 1:
            var_rec.append(var_q[q])
            continue
        d = t * (tq - (1 - tq) / (kq - 1))
        c = (1 - t) / ((k - 1) * kq) - t * (1 - tq) / (kq - 1)
        r = d * float(p_rec[e]) + t * (1 - tq) / (kq - 1) * pq + (1 - t) * (1 - pq) / ((k - 1) * kq)
        r = min(max(r, 0.0), 1.0)
        var_rec.append((r * (1 - r) / (n - 1) + c * c * var_q[q] + 2 * c * r * (1 - r_q[q]) / ((n - 1) * a)) / d**2)
    return np.array(var_rec), np.array(var_q)


@pytest.mark.parametrize("n", [2, 3, 1000])
def test_client_variances_follow_section6_at_given_probabilities(n: int) -> None:
    """client_variances(p) is §6's σ²_C at the report frequencies p implies, for every n ≥ 2 (n = 2, the first
    with a variance, has n − 1 = 1), on the mixed head list (k_q = 1 … 6)."""
    from hybriddp.server.client_estimates import client_variances

    hl = head_list()
    lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, 1)
    p = true_distribution(hl)
    p_q = np.bincount(hl.entry_query, weights=p, minlength=hl.k)
    v_rec, v_q = client_variances(p, p_q, hl, lp, n)
    want_rec, want_q = _section6_variances(p, p_q, hl, lp, n)
    np.testing.assert_allclose(v_rec, want_rec, rtol=1e-12)
    np.testing.assert_allclose(v_q, want_q, rtol=1e-12)
    assert np.all(v_rec > 0) and np.all(v_q > 0)


def test_client_variances_with_two_queries_follow_section6() -> None:
    """k = 2 (one query without URLs, and *) is a real report law, not the k = 1 shortcut (variance 0): every
    entry's σ²_C is §6's, positive and finite."""
    from hybriddp.server.client_estimates import client_variances

    hl = HeadList.from_lists([0], [[]])
    lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, 1)
    assert lp.k == 2
    p = np.array([0.375, 0.625])[: hl.n_entries]
    p_q = np.bincount(hl.entry_query, weights=p, minlength=hl.k)
    v_rec, v_q = client_variances(p, p_q, hl, lp, 50)
    want_rec, want_q = _section6_variances(p, p_q, hl, lp, 50)
    np.testing.assert_allclose(v_rec, want_rec, rtol=1e-12)
    np.testing.assert_allclose(v_q, want_q, rtol=1e-12)
    assert np.all(v_q > 0) and np.all(np.isfinite(v_rec))


def test_client_variances_with_one_query_are_one_zero_each() -> None:
    """k = 1: the only record is ⟨*,*⟩ and the only query *, both certain: one zero variance each, the shape of
    estimate_client_probabilities' k = 1 output."""
    from hybriddp.server.client_estimates import client_variances

    hl = HeadList.from_lists([], [])
    lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, 1)
    v_rec, v_q = client_variances(np.ones(1), np.ones(1), hl, lp, 10)
    est = estimate_client_probabilities(np.array([10]), hl, lp)
    assert v_rec.shape == est.var_record.shape == (1,) and v_q.shape == est.var_query.shape == (1,)
    assert v_rec.tolist() == [0.0] and v_q.tolist() == [0.0]


def test_client_variances_clamp_the_implied_report_frequencies() -> None:
    """Probabilities outside [0, 1] (a blend before clamping) imply report frequencies outside [0, 1]; those are
    clamped, so a query's σ²_C is r(1−r)/… at r ∈ {0, 1}: exactly 0, never negative; records follow §6 at
    the clamped frequencies."""
    from hybriddp.server.client_estimates import client_variances

    hl = head_list()
    lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, 1)
    p = true_distribution(hl)
    p_q = np.array([-40.0, -5.0, 5.0, 40.0, 1e3, -1e3, 7.0])[: hl.k]
    p_rec = np.resize(np.array([-40.0, -0.5, 1.3, 1.8, 2.5, 40.0, 3.0]), hl.n_entries)
    p_rec[::3] = p[::3]  # some records in range, their queries out of it
    v_rec, v_q = client_variances(p_rec, p_q, hl, lp, 500)
    assert v_q.tolist() == [0.0] * hl.k
    want_rec, _ = _section6_variances(p_rec, p_q, hl, lp, 500)
    np.testing.assert_allclose(v_rec, want_rec, rtol=1e-12, atol=1e-300)


def test_client_variances_are_double_precision_whatever_the_input_type() -> None:
    """Probabilities given as exact fractions or as float32 give the float64 variances of the same values (no
    object arrays, no single-precision arithmetic)."""
    from hybriddp.server.client_estimates import client_variances

    hl = head_list()
    lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, 1)
    p32 = true_distribution(hl).astype(np.float32)
    p = p32.astype(np.float64)
    p_q = np.bincount(hl.entry_query, weights=p, minlength=hl.k).astype(np.float32).astype(np.float64)
    want_rec, want_q = client_variances(p, p_q, hl, lp, 700)
    for args in ((p32, p_q.astype(np.float32)), (p32, p_q), (p, p_q.astype(np.float32)),
                 ([Fraction(x) for x in p], [Fraction(x) for x in p_q])):
        v_rec, v_q = client_variances(args[0], args[1], hl, lp, 700)
        assert v_rec.dtype == np.float64 and v_q.dtype == np.float64
        np.testing.assert_allclose(v_rec, want_rec, rtol=1e-13)
        np.testing.assert_allclose(v_q, want_q, rtol=1e-13)

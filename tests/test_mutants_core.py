"""More mutants of the core killed (issue 14): blend, curator with scripted noise, ties, edges and messages.

Expected values are hand-computed or come from a reference written differently (a Python sort on
(−count, position) for "ties keep the head list's order").
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import warnings
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from hybriddp.blend import blend, blend_estimates, project_to_simplex
from hybriddp.curator import create_head_list, estimate_optin_probabilities, require_nonempty
from hybriddp.errors import EmptyHeadListError, HeadListError, ParameterError
from hybriddp.headlist import HeadList
from hybriddp.ledger import Charge
from hybriddp.noise import DiscreteLaplaceNoise, LaplaceNoise, _farey_successor, effective_scale, noise_factory


class ScriptedNoise:
    """A NoiseSource whose draws are given: ``draws(size)`` → array; τ fixed; Var Y = 2·scale² (Laplace)."""

    def __init__(self, draws=None, tau: float = 5.0) -> None:
        self.draws = draws if draws is not None else (lambda size: np.zeros(size))
        self.tau = tau
        self.scales: list[float] = []

    def sample(self, scale: float, size: int) -> np.ndarray:
        self.scales.append(scale)
        return np.asarray(self.draws(size), dtype=np.float64)

    def variance(self, scale: float) -> float:
        return 2.0 * scale * scale

    def survival(self, x: float, scale: float) -> float:  # pragma: no cover - not used here
        raise NotImplementedError

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        return self.tau


# ----- blend -----------------------------------------------------------------------------------------------------

def test_blend_estimates_records_and_queries_by_hand() -> None:
    """Records: (σ²_O, σ²_C) = (1, 3) → w = 3/4; (3, 1) → 1/4. Queries: (1, 1) → 1/2. Dyadic values: exact."""
    optin = SimpleNamespace(p_record=np.array([0.5, 0.25]), var_record=np.array([1.0, 3.0]),
                            p_query=np.array([0.75]), var_query=np.array([1.0]))
    client = SimpleNamespace(p_record=np.array([0.25, 0.75]), var_record=np.array([3.0, 1.0]),
                             p_query=np.array([0.25]), var_query=np.array([1.0]))
    out = blend_estimates(optin, client)
    assert out.records.weight_optin.tolist() == [0.75, 0.25]
    assert out.records.p.tolist() == [0.4375, 0.625]
    assert out.records.var.tolist() == [0.75, 0.75]
    assert out.queries.weight_optin.tolist() == [0.5] and out.queries.p.tolist() == [0.5]
    assert out.queries.var.tolist() == [0.5] and out.queries_final.tolist() == [0.5]
    # projection onto the simplex: 0.4375 + 0.625 = 1.0625, both lowered by 0.03125
    assert out.records_projected.tolist() == [0.40625, 0.59375]
    assert out.records_final.tolist() == [0.40625, 0.59375]
    raw = blend_estimates(optin, client, project=False)
    assert raw.records_projected is None and raw.records_final.tolist() == [0.4375, 0.625]


def test_blend_takes_any_real_variances_without_warnings() -> None:
    """Exact fractions and ints are read as float64; inf/inf and 0·inf never warn (they are handled)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = blend(np.array([0.75, 0.5, 0.5]), [Fraction(1, 4), float("inf"), float("inf")],
                  np.array([0.25, 0.25, 0.125]), [Fraction(3, 4), float("inf"), 2])
        assert b.var.dtype == np.float64 and b.weight_optin.dtype == np.float64
        assert b.weight_optin.tolist() == [0.75, 0.5, 0.0]
        assert b.p.tolist() == [0.625, 0.375, 0.125]
        assert b.var[0] == pytest.approx(3 / 16, rel=1e-15) and np.isinf(b.var[1]) and b.var[2] == 2.0
        both = blend(np.array([0.5]), np.array([1.0]), np.array([0.25]), np.array([np.inf]))
        assert both.weight_optin.tolist() == [1.0] and both.var.tolist() == [1.0] and both.p.tolist() == [0.5]


def test_project_to_simplex_of_exact_fractions_is_float() -> None:
    out = project_to_simplex([Fraction(1, 2), Fraction(3, 4)])
    assert out.dtype == np.float64 and out.tolist() == [0.375, 0.625]
    empty = project_to_simplex([])
    assert empty.dtype == np.float64 and empty.size == 0


# ----- CreateHeadList with scripted noise ---------------------------------------------------------------------

def test_create_head_list_adds_the_noise_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Counts 5 for ⟨1,10⟩ and 3 for ⟨2,20⟩, draws +2 and +2, τ = 6: only 5 + 2 = 7 > 6 passes (5 − 2 would
    not). The scale handed to the noise is b_S = 2m_O/ε = 2·2/4 = 1."""
    q = np.array([1] * 5 + [2] * 3)
    u = np.array([10] * 5 + [20] * 3)
    noise = ScriptedNoise(lambda size: np.full(size, 2.0), tau=6.0)
    with caplog.at_level(logging.DEBUG, logger="hybriddp.curator"):
        hl = create_head_list(q, u, epsilon=4.0, delta=1e-5, m_o=2, noise=noise)
    assert hl.query_ids.tolist() == [1] and hl.entry_url[:1].tolist() == [10] and hl.n_records == 1
    assert noise.scales == [1.0]
    assert [r.getMessage() for r in caplog.records if r.name == "hybriddp.curator"] == [
        "CreateHeadList: 1 of 2 distinct records passed tau=6.0000"]


def test_require_nonempty() -> None:
    """The message names public parameters and the fix only (no count of the data); the error carries the charges."""
    public = {"tau": 7.25, "epsilon": 4.0, "delta": 1e-5, "m_o": 2, "n_optin_users": 1234}
    require_nonempty(HeadList.from_lists([3], [[]]), **public)  # one query is enough
    charges = [Charge("optin-S", ["a"], 4.0, 1e-5)]
    with pytest.raises(EmptyHeadListError, match="^" + re.escape(
            "the head list is empty: CreateHeadList kept no record (none passed the privacy threshold τ = 7.25 at "
            "ε = 4, δ = 1e-05, m_O = 2, from 1,234 opt-in users). For a non-empty head list: more opt-in users "
            "(--optin-fraction, or --f-o for more of them in S), a larger --epsilon or --delta, or a smaller "
            "--m-o.") + "$") as info:
        require_nonempty(HeadList.from_lists([], []), **public, charges=charges)
    assert isinstance(info.value, HeadListError) and info.value.charges == charges
    assert (info.value.tau, info.value.epsilon, info.value.delta, info.value.m_o, info.value.n_optin_users) == (
        7.25, 4.0, 1e-5, 2, 1234)


# ----- EstimateOptinProbabilities with scripted noise -----------------------------------------------------------

def test_head_list_size_must_be_a_positive_integer() -> None:
    hl = HeadList.from_lists([1], [[10]])
    with pytest.raises(ParameterError, match="^" + re.escape(
            "head_list_size (--head-list-size) = 0 is not allowed: it must be an integer >= 1.") + "$"):
        estimate_optin_probabilities(np.array([1]), np.array([10]), hl, epsilon=1.0, m_o=1, head_list_size=0,
                                     noise=ScriptedNoise())


@pytest.mark.parametrize("n", [0, 1])
def test_optin_estimates_of_zero_and_one_record(n: int) -> None:
    """n = 0: every p̂ is 0 (no data; the draws are not used); n = 1: p̂ = (count + draw)/1."""
    hl = HeadList.from_lists([1], [[10]])  # entries ⟨1,10⟩, ⟨1,*⟩, ⟨*,*⟩
    noise = ScriptedNoise(lambda size: np.array([0.25, 0.5, 0.125]))
    est = estimate_optin_probabilities(np.array([1] * n), np.array([10] * n), hl, epsilon=2.0, m_o=1,
                                       head_list_size=5, noise=noise)
    assert noise.scales == [1.0]
    expected = [0.0, 0.0, 0.0] if n == 0 else [1.25, 0.5, 0.125]
    assert est.p_record.tolist() == expected
    assert est.n == n and est.noise_variance == 2.0
    assert est.draws_record.dtype == np.int64 and est.draws_query.dtype == np.int64
    assert est.draws_record.tolist() == [1, 1, 1] and est.draws_query.tolist() == [2, 1]
    assert np.isinf(est.var_record).all()


def _tied_log(n_queries: int, n_urls: int) -> tuple[HeadList, np.ndarray, np.ndarray, dict[tuple[int, int], int]]:
    """Query q's URL u has count (2 if q + u is even else 1) × (2 if q is odd else 1): two levels of ties,
    interleaved, among queries and among each query's URLs."""
    urls = [[100 * q + u for u in range(n_urls)] for q in range(n_queries)]
    hl = HeadList.from_lists(list(range(n_queries)), urls)
    counts = {(q, 100 * q + u): (2 if (q + u) % 2 == 0 else 1) * (2 if q % 2 else 1)
              for q in range(n_queries) for u in range(n_urls)}
    qs = np.repeat([q for q, _ in counts], list(counts.values()))
    us = np.repeat([u for _, u in counts], list(counts.values()))
    return hl, qs, us, counts


def test_trimming_breaks_ties_by_head_list_order() -> None:
    """20 queries × 20 URLs with tied counts, zero noise. The M kept records are the first M by
    (−count, position in HL_S); queries are listed by p̂_q, ties in HL_S order; URLs likewise."""
    hl, qs, us, counts = _tied_log(20, 20)
    position = {key: i for i, key in enumerate(counts)}
    for m in (400, 150, 37):
        est = estimate_optin_probabilities(qs, us, hl, epsilon=1.0, m_o=1, head_list_size=m, noise=ScriptedNoise())
        kept = sorted(counts, key=lambda key: (-counts[key], position[key]))[:m]
        per_query: dict[int, list[int]] = {}
        for q, u in sorted(kept, key=lambda key: (-counts[key], position[key])):
            per_query.setdefault(q, []).append(u)
        # a query's p̂_q is all of its records' mass (the dropped ones fold into ⟨q,*⟩)
        total = {q: sum(c for (qq, _), c in counts.items() if qq == q) for q in per_query}
        order = sorted(per_query, key=lambda q: (-total[q], q))
        got = est.head_list
        assert got.query_ids.tolist() == order, m
        for i, q in enumerate(order):
            lo, hi = got.url_offsets[i], got.url_offsets[i + 1] - 1
            assert got.entry_url[lo:hi].tolist() == per_query[q], (m, q)


# ----- noise: Laplace survival, effective scale, the factory, generators -----------------------------------------

@pytest.mark.parametrize(("x", "b", "expected"), [
    (0.0, 1.0, 0.5), (1.0, 1.0, 0.5 * math.exp(-1)), (2.0, 4.0, 0.5 * math.exp(-0.5)),
    (-1.0, 1.0, 1 - 0.5 * math.exp(-1)), (-2.0, 4.0, 1 - 0.5 * math.exp(-0.5)), (-3.0, 0.5, 1 - 0.5 * math.exp(-6)),
])
def test_laplace_survival_by_hand(x: float, b: float, expected: float) -> None:
    """P[Y > x] for Y ~ Laplace(0, b): ½e^{−x/b} above 0, 1 − ½e^{x/b} below."""
    assert LaplaceNoise(np.random.default_rng(0)).survival(x, b) == pytest.approx(expected, rel=1e-14)


def test_effective_scale() -> None:
    """Laplace draws at the nominal scale; discrete at the rational t: 2/5 exactly for 0.4, and for π the
    fraction with denominator ≤ 2^20 just above π (not π itself)."""
    assert effective_scale("laplace", math.pi) == math.pi
    assert effective_scale("discrete", 0.4) == 0.4
    t = effective_scale("discrete", math.pi)
    assert math.pi < t <= math.pi + 2.0**-20
    assert float(Fraction(t).limit_denominator(2**20)) == t


def test_noise_factory() -> None:
    assert noise_factory("discrete") is DiscreteLaplaceNoise and noise_factory("laplace") is LaplaceNoise
    with pytest.raises(ParameterError, match="^" + re.escape(
            "noise (--noise) = 'gauss' is not allowed: it must be 'discrete' or 'laplace'.") + "$"):
        noise_factory("gauss")


def test_seeded_noise_is_reproducible_and_float() -> None:
    a = LaplaceNoise(np.random.default_rng(5)).sample(1.0, 8)
    b = LaplaceNoise(np.random.default_rng(5)).sample(1.0, 8)
    assert np.array_equal(a, b) and a.dtype == np.float64
    d = DiscreteLaplaceNoise(np.random.default_rng(5)).sample(0.5, 8)
    assert d.dtype == np.float64 and np.array_equal(d, DiscreteLaplaceNoise(np.random.default_rng(5)).sample(0.5, 8))
    assert np.array_equal(d, np.round(d))


@pytest.mark.parametrize("n", [1, 2, 5, 7, 12])
def test_farey_successor_by_enumeration(n: int) -> None:
    """The right neighbour of every p/q (q ≤ N) in [0, 3] among the fractions with denominator ≤ N,
    found by listing them all."""
    grid = sorted({Fraction(p, q) for q in range(1, n + 1) for p in range(0, 4 * q + 1)})
    for x, nxt in itertools.pairwise(grid):
        if x < 3:
            assert _farey_successor(x, n) == nxt, (x, n)


# ----- client estimates: exact unbiasedness by enumerating every report outcome ----------------------------------

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
    from hybriddp.client_estimates import estimate_client_probabilities
    from hybriddp.randomizer import LocalAlgParams

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


def test_client_estimates_edges() -> None:
    from hybriddp.client_estimates import estimate_client_probabilities
    from hybriddp.randomizer import LocalAlgParams

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


# ----- the exact discrete Laplace sampler, traced by hand with scripted integers --------------------------------

class ScriptedIntegers:
    """Stands in for the integer source: ``integers(low, high, size)`` hands out the next scripted values (one per
    element of an array ``high``, or ``size`` of them) and records each call as (low, high, size)."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)
        self.calls: list[tuple] = []

    def integers(self, low: int, high, size: int | None = None) -> np.ndarray:
        if np.ndim(high):
            highs = [int(h) for h in np.asarray(high)]
            self.calls.append((low, highs, size))
        else:
            highs = [int(high)] * size
            self.calls.append((low, int(high), size))
        out = [self.values.pop(0) for _ in highs]
        assert all(low <= v < h for v, h in zip(out, highs, strict=True)), (out, highs)  # a valid script
        return np.array(out, dtype=np.int64)


# scale 3/2 (CKS20: t = 3, s = 2), two draws. Round 1 (both pending): U = (0, 1); Bernoulli(e^{−U/3}) by K = 1, 2, ..:
# A ~ [integers(0, 3K) < U]: U = 0 stops at once (K = 1, odd: accept); U = 1: 0 < 1 (K = 2), 1 < 1 no: K = 2 even,
# reject. V for U = 0: steps Bernoulli(e^{−1}) = [0 < 1], [0 < 1], [2 < 1] → K = 3 odd: a step; then [0 < 1],
# [1 < 1] → K = 2: stop; V = 1. Y = ⌊(0 + 3·1)/2⌋ = 1, B = 0: +1 for the first draw.
# Round 2 (the second draw): U = 0 accepted ([1 < 0] no); V = 0; Y = 0 with B = 1: rejected (−0 would double 0).
# Round 3: U = 2 accepted ([2 < 2] no); V = 0; Y = ⌊2/2⌋ = 1, B = 1: −1.
SCRIPT = [0, 1, 0, 0, 1, 0, 0, 2, 0, 1, 0,
          0, 1, 0, 1, 1,
          2, 2, 0, 1, 1]
CALLS = [(0, 3, 2), (0, [3, 3], None), (0, [6], None), (0, [1], None), (0, [2], None), (0, [3], None),
         (0, [1], None), (0, [2], None), (0, 2, 1),
         (0, 3, 1), (0, [3], None), (0, [1], None), (0, [2], None), (0, 2, 1),
         (0, 3, 1), (0, [3], None), (0, [1], None), (0, [2], None), (0, 2, 1)]


def test_discrete_laplace_sampler_traced_by_hand() -> None:
    from hybriddp.noise import sample_discrete_laplace

    src = ScriptedIntegers(*SCRIPT)
    got = sample_discrete_laplace(src, Fraction(3, 2), 2)
    assert got.tolist() == [1, -1] and got.dtype == np.int64
    assert src.calls == CALLS and src.values == []
    src = ScriptedIntegers(*SCRIPT)  # the noise class uses the rational scale 3/2 of the float 1.5
    x = DiscreteLaplaceNoise(src).sample(1.5, 2)
    assert x.tolist() == [1.0, -1.0] and x.dtype == np.float64 and src.calls == CALLS
    assert sample_discrete_laplace(ScriptedIntegers(), Fraction(3, 2), 0).tolist() == []


def test_bernoulli_exp_frac_traced_by_hand() -> None:
    """Three Bernoulli(e^{−num/5}) at once: num = 0 stops at K = 1 (true); num = 4: [3 < 4] (K = 2), [9 < 4] no:
    false; num = 5: [4 < 5], [1 < 5] (K = 3), [14 < 5] no: true."""
    from hybriddp.noise import _bernoulli_exp_frac

    src = ScriptedIntegers(0, 3, 4, 9, 1, 14)
    got = _bernoulli_exp_frac(src, np.array([0, 4, 5]), 5)
    assert got.tolist() == [True, False, True]
    assert src.calls == [(0, [5, 5, 5], None), (0, [10, 10], None), (0, [15], None)]


def test_discrete_laplace_closed_forms_by_hand() -> None:
    """t = 1/ln 2, so e^{−1/t} = 1/2: P[0] = (1/2)/(3/2) = 1/3, P[±1] = 1/6, P[±2] = 1/12; P[Y ≥ 1] = 1/3,
    P[Y ≥ 2] = 1/6, P[Y ≥ 0] = 2/3, P[Y ≥ −1] = 5/6; Var = 2·(1/2)/(1/2)² = 4."""
    from hybriddp.noise import discrete_laplace_pmf, discrete_laplace_tail, discrete_laplace_variance

    t = 1 / math.log(2.0)
    np.testing.assert_allclose(discrete_laplace_pmf(np.array([0, 1, -1, 2, -2]), t),
                               [1 / 3, 1 / 6, 1 / 6, 1 / 12, 1 / 12], rtol=1e-14)
    assert float(discrete_laplace_pmf(3, t)) == pytest.approx(1 / 24, rel=1e-14)
    for k, tail in [(1, 1 / 3), (2, 1 / 6), (3, 1 / 12), (0, 2 / 3), (-1, 5 / 6), (-2, 11 / 12)]:
        assert discrete_laplace_tail(k, t) == pytest.approx(tail, rel=1e-14)
    assert discrete_laplace_variance(t) == pytest.approx(4.0, rel=1e-14)
    noise = DiscreteLaplaceNoise(np.random.default_rng(0))
    # survival(x) = P[Y > x] = P[Y ≥ ⌊x⌋ + 1] at the rational scale of 1/ln 2 (within 2^-20 of it)
    t_used = effective_scale("discrete", t)
    assert abs(t_used - t) < 2.0**-20 and t_used >= t
    for x, k in [(0.0, 1), (0.5, 1), (1.0, 2), (-0.5, 0), (-1.0, 0), (-1.5, -1)]:
        assert noise.survival(x, t) == pytest.approx(discrete_laplace_tail(k, t_used), rel=1e-14)
    assert noise.variance(t) == pytest.approx(discrete_laplace_variance(t_used), rel=1e-14)


def test_laplace_noise_closed_forms_by_hand() -> None:
    """b = 2: Var = 2b² = 8; P[Y > 2 ln 2] = ½·½ = 1/4, P[Y > 0] = 1/2, P[Y > −2 ln 2] = 3/4."""
    noise = LaplaceNoise(np.random.default_rng(0))
    assert noise.variance(2.0) == 8.0 and noise.variance(0.5) == 0.5
    ln2 = math.log(2.0)
    assert noise.survival(2 * ln2, 2.0) == pytest.approx(0.25, rel=1e-15)
    assert noise.survival(0.0, 2.0) == 0.5
    assert noise.survival(-2 * ln2, 2.0) == pytest.approx(0.75, rel=1e-15)
    assert noise.survival(-4 * ln2, 2.0) == pytest.approx(0.875, rel=1e-15)


@pytest.mark.parametrize(("bad", "shown"), [(0.0, "0.0"), (-1.0, "-1.0"), (math.inf, "inf"), (math.nan, "nan")])
def test_rational_scale_refusal_message(bad: float, shown: str) -> None:
    from hybriddp.noise import rational_scale

    with pytest.raises(ParameterError, match="^" + re.escape(
            f"noise scale = {shown} is not allowed: it must be a finite number > 0.") + "$"):
        rational_scale(bad)
    assert rational_scale(5e-324) == Fraction(1, 2**20)  # the smallest positive scale is allowed


def test_ceil_fraction_by_hand() -> None:
    """The smallest p/q ≥ x with q ≤ N, found by listing every q ≤ N here:
    x = 0.3 = 3/10 itself when N ≥ 10; N = 7: 1/3 (2/7 < 0.3 < 1/3); N = 3: 1/3; N = 2: 1/2; N = 1: 1.
    x = 355/113 (π's convergent), N = 100: 22/7; N = 7: 22/7; N = 6: 19/6; N = 1: 4."""
    from hybriddp.noise import ceil_fraction

    cases = [(Fraction(3, 10), 10, Fraction(3, 10)), (Fraction(3, 10), 7, Fraction(1, 3)),
             (Fraction(3, 10), 3, Fraction(1, 3)), (Fraction(3, 10), 2, Fraction(1, 2)), (Fraction(3, 10), 1, 1),
             (Fraction(355, 113), 100, Fraction(22, 7)), (Fraction(355, 113), 7, Fraction(22, 7)),
             (Fraction(355, 113), 6, Fraction(19, 6)), (Fraction(355, 113), 1, 4), (Fraction(7, 2), 1, 4),
             (Fraction(-3, 10), 2, 0), (Fraction(5, 1), 1, 5)]
    for x, n, expected in cases:
        brute = min(Fraction(-(-x.numerator * q // x.denominator), q) for q in range(1, n + 1))
        assert brute == expected
        assert ceil_fraction(x, n) == expected, (x, n)


def test_client_estimates_exactly_unbiased_with_k_q_two() -> None:
    """As test_client_estimates_and_variances_are_exactly_unbiased, on a head list with k_q = 2, 3, 1 and 1
    (a: u0 + *, b: u1, u2 + *, c: *, *), n = 3 reports, ε = 1.5, δ = 0.2, f_C = 0.7."""
    from hybriddp.client_estimates import estimate_client_probabilities
    from hybriddp.randomizer import LocalAlgParams

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


def test_client_estimates_flag_exact_variances_on_every_path() -> None:
    """variance_exact is the boolean m_C == 1 whatever path the estimate takes (k = 1, n < 2, the formulas)."""
    from hybriddp.client_estimates import estimate_client_probabilities
    from hybriddp.randomizer import LocalAlgParams

    hl1 = HeadList.from_lists([], [])
    hl = HeadList.from_lists([0, 1], [[0, 1], []])
    for m_c, expected in [(1, True), (2, False)]:
        lp1 = LocalAlgParams.build(hl1, 2.0, 0.1, 0.5, m_c)
        lp = LocalAlgParams.build(hl, 2.0, 0.1, 0.5, m_c)
        for est in (estimate_client_probabilities([3], hl1, lp1, m_c=m_c),
                    estimate_client_probabilities([0, 1, 0, 0, 0], hl, lp, m_c=m_c),
                    estimate_client_probabilities([2, 1, 0, 3, 1], hl, lp, m_c=m_c)):
            assert est.variance_exact is expected


def test_discrete_threshold_when_the_tail_equals_half_delta_exactly() -> None:
    """τ_d is the smallest k with P[Y ≥ k] ≤ δ/2, equality allowed: with δ = 2·P[Y ≥ 5] (doubling is exact in
    floating point) that is k = 5, since P[Y ≥ 4] = e^{1/t}·P[Y ≥ 5] > δ/2."""
    from hybriddp.noise import discrete_laplace_tail, rational_scale

    for eps in (1.0, 2.5, 4.0):
        t = float(rational_scale(2.0 / eps))
        delta = 2.0 * discrete_laplace_tail(5, t)
        assert delta / 2 == discrete_laplace_tail(5, t) < discrete_laplace_tail(4, t)
        assert DiscreteLaplaceNoise(np.random.default_rng(0)).head_list_threshold(eps, delta, 1) == 5.0

"""Tests that kill the mutants issue 14 lists by name (mutation testing of the privacy-critical core).

Every expected value here comes from an independent derivation — exact fractions, exact summation,
high-precision decimals, hand-computed cases, a hand-written canonical JSON text — never from the
formula under test. Each test names the mutant it kills.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest

from hybriddp import noise as noise_mod
from hybriddp import randomizer
from hybriddp.blend import blend
from hybriddp.client_estimates import estimate_client_probabilities
from hybriddp.curator import estimate_optin_probabilities, optin_variance
from hybriddp.device import DeviceError, content_hash, validate_headlist
from hybriddp.headlist import HeadList
from hybriddp.noise import (
    MAX_DENOMINATOR,
    DiscreteLaplaceNoise,
    LaplaceNoise,
    discrete_laplace_tail,
    rational_scale,
)
from hybriddp.randomizer import LocalAlgParams, output_distribution, randomize_batch
from hybriddp.records import ArrayVocabulary

# (ε, m_O) pairs: scales 2m_O/ε that are small fractions (1/2, 2/5, 4/3) and ones that are not
SCALE_CASES = [(4.0, 1), (5.0, 1), (1.5, 1), (4.0, 2), (1.2, 1), (0.7, 3), (math.pi, 2), (math.log(3), 1),
               (7.3, 3), (2.9, 2)]
ULP_SLACK = Fraction(1, 2**52)  # t may lie below the float b by at most b·2^-53 (b itself is rounded)


def _true_scale(eps: float, m_o: int) -> Fraction:
    """2m_O/ε exactly, for the float ε given (not the float quotient)."""
    return Fraction(2 * m_o) / Fraction(eps)


# ----- noise.rational_scale: "round up, never below" ----------------------------------------------------------

@pytest.mark.parametrize(("eps", "m_o"), SCALE_CASES)
def test_rational_scale_is_never_below_two_m_over_epsilon(eps: float, m_o: int) -> None:
    """Mutant: the round-up step rounds down. t must be ≥ the exact 2m_O/ε (to the float's precision),
    have a denominator ≤ 2^20, and be the smallest such fraction: enumerated over every denominator."""
    exact = _true_scale(eps, m_o)
    t = rational_scale(2 * m_o / eps)
    assert MAX_DENOMINATOR == 2**20  # ALGORITHM.md §3.2
    assert t.denominator <= 2**20
    assert t >= exact * (1 - ULP_SLACK)
    assert t - exact <= Fraction(1, 2**20)
    if exact.denominator <= 1000:  # a small fraction is used exactly (1/2 at ε = 4, 2/5 at ε = 5, 4/3 at 1.5)
        assert t == exact.limit_denominator(1000)


@pytest.mark.parametrize(("eps", "m_o"), SCALE_CASES)
@pytest.mark.parametrize("max_den", [1, 3, 10, 97])
def test_rational_scale_with_small_denominator_is_the_enumerated_ceiling(eps: float, m_o: int, max_den: int) -> None:
    """With denominators ≤ N the answer is the smallest p/q (q ≤ N) whose float is ≥ the float b, by
    enumeration: ⌈b·q⌉/q, or (⌈b·q⌉ − 1)/q when that rounds to a float ≥ b (e.g. 5/3 for b = 2/1.2,
    which lies 10⁻¹⁶ above 5/3). A rounded-down t would be a smaller fraction whose float is below b."""
    b = 2 * m_o / eps
    fb = Fraction(b)

    def smallest_over(q: int) -> Fraction:
        p = -((-fb.numerator * q) // fb.denominator)
        return Fraction(p - 1, q) if float(Fraction(p - 1, q)) >= b else Fraction(p, q)

    expected = min(smallest_over(q) for q in range(1, max_den + 1))
    t = rational_scale(b, max_den)
    assert t == expected
    assert float(t) >= b and t >= fb * (1 - ULP_SLACK)


@pytest.mark.parametrize(("eps", "m_o"), SCALE_CASES)
def test_discrete_noise_samples_variance_and_survival_use_a_scale_of_at_least_two_m_over_epsilon(
        monkeypatch: pytest.MonkeyPatch, eps: float, m_o: int) -> None:
    """The sampler's scale, checked against 2m_O/ε itself (not against the pmf at the same scale):
    the Fraction that DiscreteLaplaceNoise.sample hands to the exact sampler is ≥ 2m_O/ε."""
    seen: list[Fraction] = []
    real = noise_mod.sample_discrete_laplace

    def spy(rng, scale: Fraction, size: int) -> np.ndarray:
        seen.append(scale)
        return real(rng, scale, size)

    monkeypatch.setattr(noise_mod, "sample_discrete_laplace", spy)
    noise = DiscreteLaplaceNoise(np.random.default_rng(1))
    noise.sample(2 * m_o / eps, 5)
    exact = _true_scale(eps, m_o)
    assert len(seen) == 1 and isinstance(seen[0], Fraction)
    assert exact * (1 - ULP_SLACK) <= seen[0] <= exact + Fraction(1, 2**20)
    # the variance and survival the estimators use are those of a scale within 2^-20 above 2m_O/ε:
    # Var = 2q/(1−q)², q = e^{−1/t}, is increasing in t
    def var_at(t: float) -> float:
        q = math.exp(-1 / t)
        return 2 * q / (1 - q) ** 2

    lo, hi = float(exact), float(exact + Fraction(1, 2**20))
    assert var_at(lo) * (1 - 1e-12) <= noise.variance(2 * m_o / eps) <= var_at(hi) * (1 + 1e-12)


@pytest.mark.parametrize(("eps", "m_o"), [(4.0, 1), (1.2, 1), (2.0, 3)])
def test_sampler_scale_matches_two_m_over_epsilon_statistically(eps: float, m_o: int) -> None:
    """200,000 seeded draws: the mean of |Y| against its exact expectation at t = 2m_O/ε, computed by
    summing |y|·P[y] by hand (P[y] ∝ e^{−|y|/t}); a z-test at p ≈ 1e-7. The same draws are far from
    the value at a 5% smaller scale, so the test has power."""
    n = 200_000
    x = DiscreteLaplaceNoise(np.random.default_rng(17 + m_o)).sample(2 * m_o / eps, n)

    def moments(t: float) -> tuple[float, float]:
        ys = range(1, 4000)
        z = 1 + 2 * math.fsum(math.exp(-y / t) for y in ys)
        m1 = 2 * math.fsum(y * math.exp(-y / t) for y in ys) / z
        m2 = 2 * math.fsum(y * y * math.exp(-y / t) for y in ys) / z
        return m1, m2 - m1 * m1

    mean, var = moments(2 * m_o / eps)
    z_score = (np.abs(x).mean() - mean) / math.sqrt(var / n)
    assert abs(z_score) < 5.3  # two-sided p ≈ 1.2e-7
    mean_small, var_small = moments(0.95 * 2 * m_o / eps)
    assert abs((np.abs(x).mean() - mean_small) / math.sqrt(var_small / n)) > 5.3


# ----- the discrete head-list threshold τ_d for m_O = 1, 2, 3 ------------------------------------------------

def _tail_by_summation(k: int, t: float) -> float:
    """P[Y ≥ k] for the discrete Laplace at scale t, summing the pmf (1−q)/(1+q)·q^|y| term by term."""
    q = math.exp(-1 / t)
    c = (1 - q) / (1 + q)
    if k >= 0:
        return math.fsum(c * q**y for y in range(k, k + 20_000))
    return 1 - math.fsum(c * q ** abs(y) for y in range(-20_000, k))


def _continuous_tau(eps: float, delta: float, m_o: int) -> Decimal:
    """τ = (2m_O/ε)·ln((e^{ε/2} + m_O − 1)/δ), in 50-digit decimals (ALGORITHM.md §3)."""
    getcontext().prec = 50
    e, d = Decimal(eps), Decimal(delta)
    return (2 * m_o / e) * (((e / 2).exp() + m_o - 1) / d).ln()


@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0, 6.5])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-7, 1e-9])
def test_discrete_threshold_m_o_1_is_smallest_k_by_exact_summation(eps: float, delta: float) -> None:
    """m_O = 1: τ_d = the smallest integer k ≥ 1 with P[Y ≥ k] ≤ δ/2 (ALGORITHM.md §3.2), P by summation."""
    t = 2 / eps  # these ε give small-fraction scales, used exactly
    assert rational_scale(t) == Fraction(2) / Fraction(eps)
    k = 1
    while _tail_by_summation(k, t) > delta / 2:
        k += 1
    assert abs(_tail_by_summation(k, t) / (delta / 2) - 1) > 1e-6  # not a rounding coin-flip
    assert DiscreteLaplaceNoise(np.random.default_rng(0)).head_list_threshold(eps, delta, 1) == k


def test_discrete_threshold_known_values() -> None:
    """ALGORITHM.md §3.2: ε = 4 gives τ_d = 7 at δ = 1e-5 and 9 at δ = 1e-7 (m_O = 1); by hand for
    m_O = 2 at ε = 4, δ = 1e-5: b = 1, τ = ln(e² + 1) + 5·ln 10 = 2.1269 + 11.5129 = 13.64, so τ_d = 14
    (the m_O = 1 rule would give 12: e^{−k}/(1 + e^{−1}) ≤ 5e-6 from k = 12 on)."""
    noise = DiscreteLaplaceNoise(np.random.default_rng(0))
    assert noise.head_list_threshold(4.0, 1e-5, 1) == 7
    assert noise.head_list_threshold(4.0, 1e-7, 1) == 9
    assert noise.head_list_threshold(4.0, 1e-5, 2) == 14
    assert noise.head_list_threshold(4.0, 1e-5, 3) == 21  # b = 1.5, τ = 1.5·(2.2395 + 11.5129) = 20.63


@pytest.mark.parametrize("m_o", [2, 3])
@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-3), (2.0, 1e-5), (4.0, 1e-5), (4.0, 1e-7), (6.5, 1e-9)])
def test_discrete_threshold_m_o_above_one_is_ceiling_of_continuous_tau(m_o: int, eps: float, delta: float) -> None:
    """m_O > 1: τ_d = ⌈τ⌉ (ALGORITHM.md §3.2), τ in 50-digit decimals. Mutant: m_O = 2 computed with the
    m_O = 1 rule, which gives a lower bar than the union bound of §3.1 needs."""
    tau = _continuous_tau(eps, delta, m_o)
    assert abs(tau - tau.to_integral_value()) > Decimal("1e-6")  # not a rounding coin-flip
    expected = int(tau.to_integral_value(rounding="ROUND_CEILING"))
    got = DiscreteLaplaceNoise(np.random.default_rng(0)).head_list_threshold(eps, delta, m_o)
    assert got == expected
    # the m_O = 1 rule at this scale would differ, so the m_O > 1 branch is what is checked
    t = 2 * m_o / eps
    k1 = 1
    while _tail_by_summation(k1, t) > delta / 2:
        k1 += 1
    assert k1 != expected


# ----- discrete_laplace_tail for k ≤ 0 ----------------------------------------------------------------------

@pytest.mark.parametrize("t", [0.5, 4 / 3, 2.0, 7.0])
@pytest.mark.parametrize("k", [-5, -2, -1, 0, 1, 3])
def test_discrete_laplace_tail_for_every_integer_k(t: float, k: int) -> None:
    """P[Y ≥ k] by summing the pmf, for negative k too (the symmetry branch)."""
    assert discrete_laplace_tail(k, t) == pytest.approx(_tail_by_summation(k, t), rel=1e-12, abs=1e-15)


# ----- blend: both variances infinite ------------------------------------------------------------------------

def test_blend_with_both_variances_infinite_averages_with_weight_one_half() -> None:
    """ALGORITHM.md §7: both infinite → w = ½ and the variance stays infinite. Dyadic inputs, so the
    expected values are exact: ½·0.75 + ½·0.25 = 0.5 (the mutant w = 1.5 gives 1.0)."""
    inf = np.inf
    b = blend(np.array([0.75, 0.75, 0.75, 0.75]), np.array([inf, inf, 0.25, 0.25]),
              np.array([0.25, 0.25, 0.25, 0.25]), np.array([inf, inf, inf, 0.75]))
    assert b.weight_optin.tolist() == [0.5, 0.5, 1.0, 0.75]
    assert b.p.tolist() == [0.5, 0.5, 0.75, 0.625]
    assert np.isinf(b.var[:2]).all() and b.var[2] == 0.25
    assert b.var[3] == pytest.approx(1 / (1 / 0.25 + 1 / 0.75), rel=1e-15)
    one = blend(np.array([0.5]), np.array([inf]), np.array([0.125]), np.array([inf]))
    assert one.p.tolist() == [0.3125] and one.weight_optin.tolist() == [0.5] and np.isinf(one.var[0])


# ----- trimming with url_level=False ----------------------------------------------------------------------------

def test_query_level_trimming_never_gives_the_wildcard_a_query_slot() -> None:
    """url_level=False: the candidates are the ⟨q,*⟩ of listed queries only; ⟨*,*⟩ is always kept and
    never takes one of the M slots, even when it is the heaviest entry (mutant: it does)."""
    hl = HeadList.from_lists([1, 2, 3, 4], [[], [], [], []])
    counts = {1: 10, 2: 40, 3: 30, 4: 5, 9: 200}  # query 9 is unlisted → ⟨*,*⟩ = 200, the largest
    q = np.repeat(np.array(list(counts)), list(counts.values()))
    u = np.full(len(q), -1)
    for m, kept in [(1, [2]), (2, [2, 3]), (3, [2, 3, 1]), (4, [2, 3, 1, 4])]:
        est = estimate_optin_probabilities(q, u, hl, epsilon=1000.0, m_o=1, head_list_size=m,
                                           noise=LaplaceNoise(np.random.default_rng(m)), url_level=False)
        assert est.head_list.query_ids.tolist() == kept
        assert est.head_list.n_records == 0
        folded = sum(c for qq, c in counts.items() if qq not in kept)
        n = sum(counts.values())
        expected = [counts[qq] / n for qq in kept] + [folded / n]
        np.testing.assert_allclose(est.p_record, expected, atol=1e-4)  # noise scale 0.002 on counts of 285
        assert est.draws_record.tolist() == [1] * m + [1 + (4 - m)]  # ⟨*,*⟩ and each dropped ⟨q,*⟩


# ----- randomizer: chunk count at n % CHUNK ∈ {0, 1, CHUNK − 1} -------------------------------------------------

def _expected_reports(entries: np.ndarray, hl: HeadList, lp: LocalAlgParams, seed: int, chunk: int) -> np.ndarray:
    """The reports from ⌈n/CHUNK⌉ spawned children, chunk i of length min(CHUNK, n − i·CHUNK)."""
    n = len(entries)
    children = np.random.default_rng(seed).spawn(-(-n // chunk))
    parts = [c.random((3, min(chunk, n - i * chunk))) for i, c in enumerate(children)]
    uniforms = np.concatenate(parts, axis=1) if parts else np.empty((3, 0))
    assert uniforms.shape == (3, n)
    return randomize_batch(entries, hl, lp, uniforms=uniforms)


def _check_batch(entries: np.ndarray, hl: HeadList, lp: LocalAlgParams, seed: int, chunk: int, threads: int) -> None:
    expected = _expected_reports(entries, hl, lp, seed, chunk)
    n = len(entries)
    junk = np.full(n, -7, dtype=np.int64)  # freed just before: an uninitialised report shows as -7 (or 0)
    del junk
    got = randomize_batch(entries, hl, lp, np.random.default_rng(seed), threads=threads)
    assert len(got) == n
    assert ((got >= 0) & (got < hl.n_entries)).all()  # every report initialised and valid
    assert np.array_equal(got, expected)
    # ε = 400 keeps every record (1 − t and 1 − t_q round to 0): counts are exactly the records'
    assert np.array_equal(np.bincount(got, minlength=hl.n_entries), np.bincount(entries, minlength=hl.n_entries))


def _hl_and_params() -> tuple[HeadList, LocalAlgParams]:
    hl = HeadList.from_lists([0, 1, 2], [[0, 1], [2], []])
    lp = LocalAlgParams.build(hl, 400.0, 1e-5, 0.85, 1)
    assert lp.one_minus_t == 0.0 and (lp.one_minus_tq == 0.0).all()
    return hl, lp


@pytest.mark.parametrize("threads", [1, 2])
def test_chunk_count_small_chunks(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """CHUNK = 8: n from 0 to 33 covers n % CHUNK ∈ {0, 1, 7} several times; entry 0 never occurs,
    so an uninitialised (zero or junk) report changes the counts."""
    monkeypatch.setattr(randomizer, "CHUNK", 8)
    hl, lp = _hl_and_params()
    for n in range(34):
        assert randomizer.n_chunks(n) == math.ceil(n / 8)
        entries = np.random.default_rng(n).integers(1, hl.n_entries, n)
        _check_batch(entries, hl, lp, 100 + n, 8, threads)


def test_chunk_count_real_chunk_size() -> None:
    """The real CHUNK = 2^20 at n = CHUNK − 1, CHUNK, CHUNK + 1."""
    chunk = randomizer.CHUNK
    assert chunk == 1 << 20
    hl, lp = _hl_and_params()
    for n in (chunk - 1, chunk, chunk + 1, 2 * chunk + 1):
        assert randomizer.n_chunks(n) == -(-n // chunk)
    for n in (chunk - 1, chunk, chunk + 1):
        entries = np.random.default_rng(n).integers(1, hl.n_entries, n)
        _check_batch(entries, hl, lp, 7, chunk, 2)


# ----- device: range checks on ε, δ, f_C ---------------------------------------------------------------------

def _doc(**fields) -> dict:
    doc = {"format": "hybriddp-headlist", "version": 1, "epsilon": 4.0, "delta": 1e-5, "f_c": 0.85, "m_c": 1,
           "url_level": True, "queries": [{"query": "a", "urls": ["u"]}]}
    doc.update(fields)
    doc["content_hash"] = content_hash(doc)
    return doc


TINY = 5e-324  # the smallest positive float
BELOW_ONE = math.nextafter(1.0, 0.0)
ABOVE_ONE = math.nextafter(1.0, 2.0)


@pytest.mark.parametrize(("field", "value", "ok"), [
    ("epsilon", 0.0, False), ("epsilon", 0, False), ("epsilon", -1.0, False), ("epsilon", TINY, True),
    ("epsilon", 1.0, True), ("epsilon", ABOVE_ONE, True),
    ("delta", 0.0, False), ("delta", 0, False), ("delta", TINY, True), ("delta", 0.5, True),
    ("delta", BELOW_ONE, True), ("delta", 1.0, False), ("delta", 1, False), ("delta", ABOVE_ONE, False),
    ("delta", -TINY, False),
    ("f_c", 0.0, False), ("f_c", 0, False), ("f_c", TINY, True), ("f_c", 0.5, True), ("f_c", BELOW_ONE, True),
    ("f_c", 1.0, True), ("f_c", 1, True), ("f_c", ABOVE_ONE, False), ("f_c", -TINY, False),
])
def test_device_range_checks_at_the_boundaries(field: str, value: float, ok: bool) -> None:
    """ε > 0, δ ∈ (0, 1), f_C ∈ (0, 1] (FORMATS.md), at 0, the smallest float, 1 and just beyond."""
    doc = _doc(**{field: value})
    if ok:
        assert validate_headlist(doc) is doc
    else:
        with pytest.raises(DeviceError, match=f"'{field}'"):
            validate_headlist(doc)


# ----- the head-list wire format and its content hash: a known-answer test -------------------------------

KAT_CANONICAL = ('{"delta":1e-05,"epsilon":4.0,"f_c":0.85,"format":"hybriddp-headlist","m_c":1,'
                 '"queries":[{"query":"café","urls":["http://a.example/été","http://b.example/"]},'
                 '{"query":"zürich","urls":[]}],"url_level":true,"version":1}')
"""The canonical JSON text, written by hand: keys sorted, separators "," and ":", non-ASCII as is."""
KAT_HASH = "sha256:c5505cf24735c2c0b95d8b484f938c254a229b2bc0cb9555fa9e6a9d5ca4774d"


def _kat_doc() -> dict:
    """The same document with its keys in a non-sorted order (as a writer might hold it)."""
    return {"version": 1, "format": "hybriddp-headlist", "url_level": True, "m_c": 1, "f_c": 0.85,
            "epsilon": 4.0, "delta": 1e-5,
            "queries": [{"urls": ["http://a.example/été", "http://b.example/"], "query": "café"},
                        {"urls": [], "query": "zürich"}]}


def test_content_hash_known_answer() -> None:
    """The pinned sha256 of the hand-written canonical text; content_hash must give exactly it
    (mutants: no sort_keys, other separators, ASCII escapes), whatever the key order in memory."""
    assert "sha256:" + hashlib.sha256(KAT_CANONICAL.encode("utf-8")).hexdigest() == KAT_HASH
    assert json.loads(KAT_CANONICAL) == _kat_doc()
    assert content_hash(_kat_doc()) == KAT_HASH
    signed = {**_kat_doc(), "content_hash": KAT_HASH}
    assert content_hash(signed) == KAT_HASH  # the hash field itself is left out
    assert validate_headlist(signed) is signed
    with pytest.raises(DeviceError, match="content_hash"):
        validate_headlist({**_kat_doc(), "content_hash": KAT_HASH[:-1] + "0"})


def test_head_list_writer_produces_the_known_answer() -> None:
    """`hybriddp headlist`'s document builder gives the same document and hash."""
    hl = HeadList.from_lists([0, 1], [[0, 1], []])
    doc = hl.to_device_json(ArrayVocabulary(["café", "zürich"]),
                            ArrayVocabulary(["http://a.example/été", "http://b.example/"]),
                            epsilon=4.0, delta=1e-5, f_c=0.85, m_c=1)
    assert doc["content_hash"] == KAT_HASH
    assert {k: v for k, v in doc.items() if k != "content_hash"} == _kat_doc()


# ----- opt-in estimator: clip of p̂ and the n < 2 edge ------------------------------------------------------

def test_optin_variance_clips_p_hat_and_is_finite_from_two_records() -> None:
    """σ̂² = p̃(1−p̃)/(n−1) + J·V/(n(n−1)), p̃ = p̂ clipped to [0, 1] (ALGORITHM.md §4), by hand:
    n = 5, V = 2: the noise part is J·2/20 = J/10; p̂ = −0.25 and 1.5 clip to 0 and 1 (no negative
    variance), p̂ = 0.5 gives 0.25/4 = 1/16."""
    p = np.array([-0.25, 1.5, 0.5, 0.5])
    j = np.array([1, 1, 1, 3])
    got = optin_variance(p, j, 5, 2.0)
    np.testing.assert_allclose(got, [0.1, 0.1, 1 / 16 + 0.1, 1 / 16 + 0.3], rtol=1e-14)
    # n = 2 is the first finite case: 0.25/1 + J·V/2; n = 1 and 0 have no variance estimate
    np.testing.assert_allclose(optin_variance(np.array([0.5]), np.array([1]), 2, 2.0), [1.25], rtol=1e-14)
    assert np.isinf(optin_variance(np.array([0.5]), np.array([1]), 1, 2.0)).all()
    assert np.isinf(optin_variance(np.array([0.5]), np.array([1]), 0, 2.0)).all()


def test_optin_estimates_with_two_records_have_finite_variances() -> None:
    hl = HeadList.from_lists([1], [[10]])
    est = estimate_optin_probabilities(np.array([1, 1]), np.array([10, 10]), hl, epsilon=1000.0, m_o=1,
                                       head_list_size=5, noise=LaplaceNoise(np.random.default_rng(0)))
    assert est.n == 2 and np.isfinite(est.var_record).all() and np.isfinite(est.var_query).all()
    one = estimate_optin_probabilities(np.array([1]), np.array([10]), hl, epsilon=1000.0, m_o=1,
                                       head_list_size=5, noise=LaplaceNoise(np.random.default_rng(0)))
    assert np.isinf(one.var_record).all() and np.isinf(one.var_query).all()


# ----- client estimator: the n < 2 edge -------------------------------------------------------------------------

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

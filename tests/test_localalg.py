"""LocalAlg (ALGORITHM.md §5, paper Fig. 6): its report law (core/reportlaw.py) and the device (device/localalg.py):
exact privacy, the closed form, both samplers, and one device's message.

* Theorem 3 is checked *exactly* on the closed-form output distribution: the hockey-stick
  divergence max_{x,x'} Σ_y max(0, P[y|x] − e^ε P[y|x']) is the smallest δ for which the DP
  inequality holds for every output set Y, so ``privacy_loss_delta(P, ε) ≤ δ`` is the theorem.
* The batch (NumPy) and device (pure Python) samplers are checked against that distribution
  with chi-square goodness-of-fit tests at p > 1e-6 (seeded, so they cannot flake), and against
  each other bit for bit on shared uniforms.
* By hand: LocalAlg's parameters and the privacy loss of a 3 × 3 example, the device's head-list index, each
  branch of its draws with replayed uniforms (thresholds hit exactly, draws not taken), and one device's message
  (sampling order, the ledger charge, the message id, every refusal of its records whole).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from clihelpers import exact_message
from headlisthelpers import signed_headlist
from hybriddp.core.headlist import HeadList
from hybriddp.core.protocol import DeviceError, budget_split, keep_probability, thresholds
from hybriddp.core.records import ArrayVocabulary
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution, privacy_loss_delta
from hybriddp.device.batch import randomize_batch
from hybriddp.device.ledger import DeviceLedger
from hybriddp.device.localalg import (
    DeviceHeadList,
    SeededSource,
    SystemSource,
    UniformReplay,
    local_alg,
    randomize_records,
)

# ----- helpers ---------------------------------------------------------------------------------

# Head-list shapes: the real URLs of each listed query (the wildcards are added by from_lists).
SHAPES: dict[str, list[list[int]]] = {
    "k=1 (only *)": [],
    "k=2, k_q=1": [[]],
    "k=2, k_q=3": [[1, 2]],
    "k_q=1 everywhere": [[], [], [], []],
    "mixed k_q": [[1], [1, 2, 3], [], [4, 5, 6, 7, 8, 9]],
    "k=50": [list(range(i % 4)) for i in range(49)],
}
EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
DELTAS = (1e-7, 1e-3, 0.05, 0.3)
F_CS = (0.1, 0.5, 0.85, 0.99)
GRID = list(itertools.product(EPSILONS, DELTAS, F_CS))

P_MIN = 1e-6  # chi-square acceptance level; every test below is seeded


def make_hl(urls_per_query: list[list[int]]) -> HeadList:
    """Head list with queries 0..len−1 and the given real URLs per query."""
    return HeadList.from_lists(list(range(len(urls_per_query))), urls_per_query)


def device_doc(hl: HeadList, *, epsilon: float, delta: float, f_c: float, m_c: int = 1) -> dict:
    """Device JSON of ``hl`` with query names ``q<i>`` and URL names ``u<id>``."""
    n_url = int(hl.entry_url.max()) + 1 if hl.n_records else 0
    return hl.to_device_json(
        ArrayVocabulary([f"q{i}" for i in range(max(hl.n_queries, 1))]),
        ArrayVocabulary([f"u{i}" for i in range(max(n_url, 1))]),
        epsilon=epsilon, delta=delta, f_c=f_c, m_c=m_c,
    )


def broken_params(hl: HeadList, epsilon: float, delta: float, f_c: float, mode: str) -> LocalAlgParams:
    """LocalAlg constants with a deliberate mistake, to show the DP check has teeth."""
    eps_q, delta_q, eps_u, delta_u = budget_split(epsilon, delta, f_c, 1)
    kq = hl.kq
    if mode == "t uses eps, not f_C*eps":
        t = keep_probability(epsilon, delta_q, hl.k)
        tq = [keep_probability(eps_u, delta_u, n) for n in kq]
    elif mode == "query stage at 1.5*eps_Q":
        t = keep_probability(1.5 * eps_q, delta_q, hl.k)
        tq = [keep_probability(eps_u, delta_u, n) for n in kq]
    elif mode == "t_q uses eps":
        t = keep_probability(eps_q, delta_q, hl.k)
        tq = [keep_probability(epsilon, delta_u, n) for n in kq]
    else:
        raise AssertionError(mode)
    tq_arr = np.array(tq)
    return LocalAlgParams(hl.k, kq, t, tq_arr, 1.0 - t, 1.0 - tq_arr)


def chisquare_pooled(observed: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square GOF p-value of counts against probabilities.

    Cells with expected count < 5 are pooled into one cell (the chi-square approximation needs
    expected counts ≳ 5); a cell with probability 0 must have count 0 (checked by the caller).
    """
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(probs, dtype=np.float64) * observed.sum()
    small = expected < 5
    obs = np.concatenate([observed[~small], [observed[small].sum()]]) if small.any() else observed
    exp = np.concatenate([expected[~small], [expected[small].sum()]]) if small.any() else expected
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    exp = exp * obs.sum() / exp.sum()  # remove float round-off in the totals
    return float(stats.chisquare(obs, exp).pvalue)


def device_entry(hl: HeadList, qi: int, ui: int) -> int:
    """Entry index of a device (query position, URL position)."""
    return int(hl.url_offsets[qi] + ui)


def entry_position(hl: HeadList, entry: int) -> tuple[int, int]:
    """(query position, URL position) of an entry index."""
    qi = int(np.searchsorted(hl.url_offsets, entry, side="right") - 1)
    return qi, int(entry - hl.url_offsets[qi])


# ----- exact privacy (Theorem 3) -----------------------------------------------------------------


@pytest.mark.parametrize("shape", list(SHAPES))
def test_closed_form_is_epsilon_delta_dp(shape: str) -> None:
    hl = make_hl(SHAPES[shape])
    for eps, delta, f_c in GRID:
        lp = LocalAlgParams.build(hl, eps, delta, f_c, 1)
        P = output_distribution(lp)
        assert P.shape == (hl.n_entries, hl.n_entries)
        assert np.all(P >= 0)
        np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        loss = privacy_loss_delta(P, eps)
        assert loss <= delta * (1 + 1e-9) + 1e-15, (shape, eps, delta, f_c, loss)


def test_privacy_loss_delta_matches_brute_force_over_output_sets() -> None:
    """privacy_loss_delta is the max over (x, x', Y) of P[Y|x] − e^ε P[Y|x'] (all 2^n sets Y)."""
    hl = make_hl([[1], [2, 3]])  # 6 entries → 64 output sets
    lp = LocalAlgParams.build(hl, 1.0, 0.2, 0.5, 1)
    P = output_distribution(lp)
    n = P.shape[0]
    for eps in (0.3, 0.8, 1.0, 1.5):
        best = 0.0
        for mask in range(1 << n):
            sel = np.array([(mask >> j) & 1 for j in range(n)], dtype=bool)
            mass = P[:, sel].sum(axis=1)
            best = max(best, float((mass[:, None] - math.exp(eps) * mass[None, :]).max()))
        assert privacy_loss_delta(P, eps) == pytest.approx(best, abs=1e-14)


def test_privacy_loss_delta_by_hand() -> None:
    """Σ_y max(0, P[y|x] − e^ε P[y|x']), maximised over the pairs (x, x'), worked out by hand.

    Rows x = 0, 1, 2. At ε = ln 2 the worst pair is x = 2 against x' = 0:
    (0.2 − 1.7)⁺ + (0.3 − 0.2)⁺ + (0.5 − 0.1)⁺ = 0.5; every other pair gives less (e.g. 2 vs 1: 0.1).
    At ε = 0 it is the total variation distance, largest for rows 0 and 2: 0.65. At ε = ln 100 nothing is left."""
    P = np.array([[0.85, 0.1, 0.05], [0.3, 0.5, 0.2], [0.2, 0.3, 0.5]])
    assert privacy_loss_delta(P, math.log(2.0)) == pytest.approx(0.5, rel=1e-12)
    assert privacy_loss_delta(P, 0.0) == pytest.approx(0.65, rel=1e-12)
    assert privacy_loss_delta(P, math.log(100.0)) == 0.0
    assert privacy_loss_delta(np.eye(2), 5.0) == 1.0  # a deterministic output: no ε helps
    # the first two rows only: row 1 against row 0 gives (0.5 − 0.2)⁺ + (0.2 − 0.1)⁺ = 0.4, row 0 against 1 0.25
    assert privacy_loss_delta(P[:2, :], math.log(2.0)) == pytest.approx(0.4, rel=1e-12)


@pytest.mark.parametrize("mode", ["t uses eps, not f_C*eps", "query stage at 1.5*eps_Q", "t_q uses eps"])
def test_dp_check_rejects_broken_randomizers(mode: str) -> None:
    """The exact check has teeth: a randomizer spending too much budget violates it somewhere."""
    hl = make_hl(SHAPES["mixed k_q"])
    violations = 0
    for eps, delta, f_c in GRID:
        P = output_distribution(broken_params(hl, eps, delta, f_c, mode))
        violations += privacy_loss_delta(P, eps) > delta * (1 + 1e-9) + 1e-15
    assert violations > 0


def test_epsilon_is_not_loose() -> None:
    """The guarantee is (nearly) tight: at 0.9ε the same distribution is not (0.9ε, δ)-DP."""
    hl = make_hl(SHAPES["mixed k_q"])
    for eps, delta, f_c in [(1.0, 1e-7, 0.5), (4.0, 1e-5, 0.85)]:
        P = output_distribution(LocalAlgParams.build(hl, eps, delta, f_c, 1))
        assert privacy_loss_delta(P, 0.9 * eps) > delta


@pytest.mark.parametrize("m_c", [2, 3, 5])
def test_m_c_splits_budget_per_report(m_c: int) -> None:
    """Each of m_C reports uses (ε/m_C, δ/m_C); its distribution is (ε/m_C, δ/m_C)-DP."""
    hl = make_hl(SHAPES["mixed k_q"])
    for eps, delta, f_c in [(4.0, 1e-5, 0.85), (1.0, 0.05, 0.5), (8.0, 0.3, 0.99)]:
        t, tq = thresholds(hl.k, hl.kq.tolist(), eps, delta, f_c, m_c)
        t1, tq1 = thresholds(hl.k, hl.kq.tolist(), eps / m_c, delta / m_c, f_c, 1)
        assert t == t1 and tq == tq1
        # t is the keep probability at which the (ε'_Q, δ'_Q/2) inequality against any other query is tight
        # (ALGORITHM.md §5, Theorem 3): t = e^{ε'_Q}·(1 − t)/(k − 1) + δ'_Q/2, with ε'_Q = f_C·ε/m_C,
        # δ'_Q = f_C·δ/m_C; and likewise for each t_q with the rest of the budget
        eq, dq = f_c * eps / m_c, f_c * delta / m_c
        assert t - math.exp(eq) * (1 - t) / (hl.k - 1) == pytest.approx(dq / 2, rel=1e-9, abs=1e-15)
        eu, du = (1 - f_c) * eps / m_c, (1 - f_c) * delta / m_c
        for kq, t_q in zip(hl.kq.tolist(), tq, strict=True):
            if kq > 1:
                assert t_q - math.exp(eu) * (1 - t_q) / (kq - 1) == pytest.approx(du / 2, rel=1e-9, abs=1e-15)
            else:
                assert t_q == 1.0
        P = output_distribution(LocalAlgParams.build(hl, eps, delta, f_c, m_c))
        assert privacy_loss_delta(P, eps / m_c) <= delta / m_c * (1 + 1e-9) + 1e-15


def test_two_reports_compose_to_epsilon_delta() -> None:
    """m_C = 2: the pair of reports of a client (independent randomizations of its two records)
    has distribution P⊗P; it is (ε, δ)-DP exactly, as basic composition promises."""
    hl = make_hl([[1], [2, 3], []])
    for eps, delta, f_c in [(1.0, 0.05, 0.5), (4.0, 1e-3, 0.85), (0.5, 0.3, 0.1)]:
        P = output_distribution(LocalAlgParams.build(hl, eps, delta, f_c, 2))
        assert privacy_loss_delta(np.kron(P, P), eps) <= delta * (1 + 1e-9) + 1e-15


# ----- closed form against the ALGORITHM.md formulas ------------------------------------------------------


def test_hand_example_k3() -> None:
    """k = 3, ε = 2 ln 3, f_C = ½, δ = 0.2 → ε'_Q = ε'_U = ln 3, δ'_Q = δ'_U = 0.1.

    t   = (3 + 0.05·2)/(3 + 2) = 0.62
    t_0 = (3 + 0.05·1)/(3 + 1) = 0.7625   (query 0: one URL + *, k_q = 2)
    t_1 = (3 + 0.05·2)/(3 + 2) = 0.62     (query 1: two URLs + *, k_q = 3)
    t_* = 1
    """
    hl = make_hl([[10], [20, 21]])
    lp = LocalAlgParams.build(hl, 2 * math.log(3), 0.2, 0.5, 1)
    assert lp.k == 3
    assert lp.kq.tolist() == [2, 3, 1]
    assert lp.t == pytest.approx(0.62, rel=1e-14)
    np.testing.assert_allclose(lp.tq, [0.7625, 0.62, 1.0], rtol=1e-14)
    P = output_distribution(lp)
    # entries: 0 ⟨q0,10⟩, 1 ⟨q0,*⟩, 2 ⟨q1,20⟩, 3 ⟨q1,21⟩, 4 ⟨q1,*⟩, 5 ⟨*,*⟩
    other_q0 = 0.38 / 2  # (1−t)/(k−1) per other query
    expected_row0 = [0.62 * 0.7625, 0.62 * 0.2375, other_q0 / 3, other_q0 / 3, other_q0 / 3, other_q0]
    np.testing.assert_allclose(P[0], expected_row0, rtol=1e-13)
    expected_row3 = [other_q0 / 2, other_q0 / 2, 0.62 * 0.38 / 2, 0.62 * 0.62, 0.62 * 0.38 / 2, other_q0]
    np.testing.assert_allclose(P[3], expected_row3, rtol=1e-13)
    expected_row5 = [other_q0 / 2, other_q0 / 2, other_q0 / 3, other_q0 / 3, other_q0 / 3, 0.62]
    np.testing.assert_allclose(P[5], expected_row5, rtol=1e-13)


def test_local_alg_params_by_hand() -> None:
    # the head list and parameters of _device(): a (u0, u1, *), b (*), *; ε = 1, δ = 0.1, f_C = ½
    lp = LocalAlgParams.build(make_hl([[0, 1], []]), 1.0, 0.1, 0.5, 1)
    e = math.exp(0.5)
    t = (e + 0.05) / (e + 2)  # k = 3 and k_a = 3 share t; k_b = k_* = 1 keep everything
    assert lp.k == 3 and lp.kq.tolist() == [3, 1, 1]
    assert lp.t == pytest.approx(t, rel=1e-15) and lp.tq.tolist() == pytest.approx([t, 1.0, 1.0], rel=1e-15)
    assert lp.one_minus_t == 1.0 - lp.t and lp.one_minus_tq.tolist() == [1.0 - x for x in lp.tq.tolist()]
    assert lp.tq.dtype == np.float64 and lp.one_minus_tq.dtype == np.float64


@pytest.mark.parametrize("shape", ["k=2, k_q=3", "mixed k_q", "k=50"])
def test_closed_form_matches_spec_formulas(shape: str) -> None:
    """Every cell of P from the ALGORITHM.md §5 description, computed entry by entry."""
    hl = make_hl(SHAPES[shape])
    eps, delta, f_c = 1.7, 0.01, 0.6
    e_q, d_q, e_u, d_u = f_c * eps, f_c * delta, (1 - f_c) * eps, (1 - f_c) * delta
    k, kq = hl.k, hl.kq
    t = (math.exp(e_q) + d_q / 2 * (k - 1)) / (math.exp(e_q) + k - 1)
    tq = [1.0 if n == 1 else (math.exp(e_u) + d_u / 2 * (n - 1)) / (math.exp(e_u) + n - 1) for n in kq]
    P = output_distribution(LocalAlgParams.build(hl, eps, delta, f_c, 1))
    eq = hl.entry_query
    for i in range(hl.n_entries):
        for j in range(hl.n_entries):
            qi, qj = eq[i], eq[j]
            if qi != qj:
                want = (1 - t) / (k - 1) / kq[qj]
            elif i == j:
                want = t * tq[qi]
            else:
                want = t * (1 - tq[qi]) / (kq[qi] - 1)
            assert P[i, j] == pytest.approx(want, rel=1e-12, abs=1e-300)


def test_edge_cases_k1_and_kq1() -> None:
    hl1 = make_hl([])
    lp1 = LocalAlgParams.build(hl1, 1.0, 1e-3, 0.5, 1)
    assert lp1.k == 1 and lp1.t == 1.0
    assert output_distribution(lp1).tolist() == [[1.0]]
    assert randomize_batch(np.zeros(10, dtype=np.int64), hl1, lp1, np.random.default_rng(0)).tolist() == [0] * 10
    lp = LocalAlgParams.build(make_hl([[], [5]]), 1.0, 1e-3, 0.5, 1)
    assert lp.tq[0] == 1.0 and lp.tq[2] == 1.0 and lp.tq[1] < 1.0  # k_q = 1 → URL stage skipped


# ----- the batch sampler ---------------------------------------------------------------------------

SAMPLER_CASES = [
    ("mixed k_q", 1.0, 0.3, 0.5),
    ("mixed k_q", 4.0, 1e-5, 0.85),
    ("k_q=1 everywhere", 1.0, 0.05, 0.5),
    ("k=2, k_q=3", 0.5, 1e-3, 0.1),
]


@pytest.mark.parametrize(("shape", "eps", "delta", "f_c"), SAMPLER_CASES)
def test_batch_sampler_chi_square(shape: str, eps: float, delta: float, f_c: float) -> None:
    """200k reports per input entry; empirical frequencies fit P[·|input] (p > 1e-6)."""
    hl = make_hl(SHAPES[shape])
    lp = LocalAlgParams.build(hl, eps, delta, f_c, 1)
    P = output_distribution(lp)
    rng = np.random.default_rng(20240501)
    n = 200_000
    for i in range(hl.n_entries):
        reports = randomize_batch(np.full(n, i), hl, lp, rng)
        counts = np.bincount(reports, minlength=hl.n_entries)
        assert len(counts) == hl.n_entries
        assert np.all(counts[P[i] == 0] == 0)
        assert chisquare_pooled(counts, P[i]) > P_MIN, (shape, i)


def test_chi_square_has_power_against_including_the_true_value() -> None:
    """The Mozilla port's bug (other query drawn uniform over *all* k, the true one included)
    is detected by the same chi-square test at 200k samples."""
    hl = make_hl(SHAPES["mixed k_q"])
    lp = LocalAlgParams.build(hl, 1.0, 0.3, 0.5, 1)
    rng = np.random.default_rng(7)
    n = 200_000
    i = 1  # ⟨q0,*⟩
    v = rng.random((3, n))
    q_all = (v[1] * lp.k).astype(np.int64)  # uniform over all queries, the true one included
    u_all = (v[2] * lp.kq[q_all]).astype(np.int64)
    correct = randomize_batch(np.full(n, i), hl, lp, uniforms=v)
    wrong = np.where(v[0] < lp.one_minus_t, hl.url_offsets[q_all] + u_all, correct)
    P = output_distribution(lp)
    assert chisquare_pooled(np.bincount(wrong, minlength=hl.n_entries), P[i]) < P_MIN


# ----- the device sampler ----------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "eps", "delta", "f_c"), SAMPLER_CASES[:3])
def test_device_sampler_chi_square(shape: str, eps: float, delta: float, f_c: float) -> None:
    """30k device randomizations per input (a few inputs); frequencies fit P (p > 1e-6)."""
    hl = make_hl(SHAPES[shape])
    lp = LocalAlgParams.build(hl, eps, delta, f_c, 1)
    P = output_distribution(lp)
    dhl = DeviceHeadList.from_json(device_doc(hl, epsilon=eps, delta=delta, f_c=f_c))
    src = SeededSource(12345)
    n = 30_000
    inputs = sorted({0, int(hl.wildcard_entry[0]), hl.n_entries - 1, int(np.argmax(hl.kq[hl.entry_query]))})
    for i in inputs:
        qi, ui = entry_position(hl, i)
        counts = np.zeros(hl.n_entries, dtype=np.int64)
        for _ in range(n):
            counts[device_entry(hl, *local_alg(qi, ui, dhl, src))] += 1
        assert chisquare_pooled(counts, P[i]) > P_MIN, (shape, i)


@pytest.mark.parametrize(("shape", "eps", "delta", "f_c"), [*SAMPLER_CASES, ("k=50", 2.0, 0.05, 0.85)])
def test_batch_and_device_agree_bit_for_bit(shape: str, eps: float, delta: float, f_c: float) -> None:
    hl = make_hl(SHAPES[shape])
    lp = LocalAlgParams.build(hl, eps, delta, f_c, 1)
    doc = json.loads(json.dumps(device_doc(hl, epsilon=eps, delta=delta, f_c=f_c)))  # a real round trip
    dhl = DeviceHeadList.from_json(doc)
    assert dhl.one_minus_t == lp.one_minus_t
    assert dhl.one_minus_tq == lp.one_minus_tq.tolist()
    rng = np.random.default_rng(99)
    n = 20_000
    entries = rng.integers(0, hl.n_entries, n)
    uniforms = rng.random((3, n))
    batch = randomize_batch(entries, hl, lp, uniforms=uniforms)
    device = np.array([
        device_entry(hl, *local_alg(*entry_position(hl, int(e)), dhl, UniformReplay(uniforms[:, j])))
        for j, e in enumerate(entries)
    ])
    np.testing.assert_array_equal(batch, device)
    assert (batch != entries).any()  # the randomization did something


def _device(**fields: object) -> DeviceHeadList:
    """Queries a (URLs u, v) and b (none): positions a = 0, b = 1, * = 2; k_a = 3, k_b = k_* = 1."""
    return DeviceHeadList.from_json(signed_headlist(epsilon=1.0, delta=0.1, f_c=0.5, **fields))


def test_device_head_list_index() -> None:
    hl = _device()
    assert (hl.k, hl.kq) == (3, [3, 1, 1])
    assert hl.query_index == {"a": 0, "b": 1} and hl.url_index == [{"u": 0, "v": 1}, {}, {}]
    # t = (e^½ + 0.025·2)/(e^½ + 2) (ε'_Q = ½, δ'_Q = 0.05); t_a = the same with k_a = 3; t_b = t_* = 1
    e = math.exp(0.5)
    t = (e + 0.05) / (e + 2)
    assert hl.one_minus_t == pytest.approx(1 - t, rel=1e-14)
    assert hl.one_minus_tq == pytest.approx([1 - t, 0.0, 0.0], rel=1e-14, abs=0.0)
    assert [hl.encode(*r) for r in [("a", "u"), ("a", "v"), ("a", "w"), ("a", None), ("b", "u"), ("b", None),
                                    ("c", "u"), ("c", None)]] == [(0, 0), (0, 1), (0, 2), (0, 2), (1, 0), (1, 0),
                                                                  (2, 0), (2, 0)]
    assert [hl.decode(*p) for p in [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)]] == [
        {"query": "a", "url": "u"}, {"query": "a", "url": "v"}, {"query": "a", "url": None},
        {"query": "b", "url": None}, {"query": None, "url": None}]
    assert hl.m_c == 1 and type(hl.m_c) is int


@pytest.mark.parametrize(("record", "uniforms", "expected", "left"), [
    # query stage: v1 < 1 − t → another query: j = ⌊v·(k − 1)⌋, skipping q; then a URL ⌊v·k_q'⌋
    ((1, 0), [0.0, 0.4, 0.5], (0, 1), 0),  # j = 0 < 1: query a; URL ⌊0.5·3⌋ = 1
    ((1, 0), [0.0, 0.6, 0.9], (2, 0), 0),  # j = 1 ≥ 1: query 2 (*); its only URL position
    ((0, 1), [0.0, 0.0, 0.99], (1, 0), 0),  # j = 0 ≥ 0: query 1
    ((2, 0), [0.0, 0.99, 0.7], (1, 0), 0),  # j = 1 < 2: query 1
    ((2, 0), [0.0, 0.2, 0.7], (0, 2), 0),  # j = 0: query 0, URL ⌊0.7·3⌋ = 2
    # URL stage of a (k_a = 3): v2 < 1 − t_a → another URL: j = ⌊v·2⌋ skipping u
    ((0, 1), ["1-t", 0.0, 0.5], (0, 2), 0),  # v1 = 1 − t exactly keeps the query; j = 1 ≥ 1
    ((0, 1), ["1-t", 0.0, 0.2], (0, 0), 0),  # j = 0 < 1
    ((0, 0), [0.99, 0.0, 0.2], (0, 1), 0),  # j = 0 ≥ 0
    ((0, 2), [0.99, 0.0, 0.99], (0, 1), 0),  # j = 1 < 2
    ((0, 1), [0.99, "1-tq", 0.5], (0, 1), 1),  # v2 = 1 − t_a exactly keeps the URL; v3 not drawn
    # b has k_b = 1: no URL stage, no second draw
    ((1, 0), [0.99, 0.0, 0.0], (1, 0), 2),
])
def test_local_alg_draws_by_hand(record: tuple[int, int], uniforms: list, expected: tuple[int, int], left: int) -> None:
    hl = _device()
    values = [hl.one_minus_t if v == "1-t" else hl.one_minus_tq[0] if v == "1-tq" else v for v in uniforms]
    src = UniformReplay(values)
    assert local_alg(*record, hl, src) == expected
    assert len(list(src._it)) == left  # how many of the uniforms were not drawn


def test_local_alg_with_only_the_wildcard_draws_nothing() -> None:
    hl = DeviceHeadList.from_json(signed_headlist(queries=[]))
    assert hl.k == 1
    assert local_alg(0, 0, hl, UniformReplay([])) == (0, 0)


def test_seeded_and_system_sources() -> None:
    ref = random.Random(11)
    src = SeededSource(11)
    for n in (1, 2, 7, 1000):
        assert src.uniform() == ref.random()
        assert src.below(n) == int(ref.random() * n)
    sysrc = SystemSource()
    assert all(0 <= sysrc.below(3) < 3 for _ in range(50)) and {sysrc.below(2) for _ in range(200)} == {0, 1}
    u = [sysrc.uniform() for _ in range(200)]
    assert all(0.0 <= x < 1.0 for x in u) and min(u) < 0.1 and max(u) > 0.9  # P(fail) = 2·0.9^200 ≈ 1e-9
    assert UniformReplay([0.5, 0.99]).below(4) == 2


# ----- randomize_records: the device entry point --------------------------------------------------


def identity_doc(m_c: int = 1) -> dict:
    """Head list q0:[u0,u1], q1:[u2], q2:[] with ε so large that LocalAlg never changes a record
    (1 − t and 1 − t_q round to exactly 0), so reports show which records were sampled."""
    hl = make_hl([[0, 1], [2], []])
    doc = device_doc(hl, epsilon=400.0 * m_c, delta=1e-6, f_c=0.5, m_c=m_c)
    dhl = DeviceHeadList.from_json(doc)
    assert dhl.one_minus_t == 0.0 and all(x == 0.0 for x in dhl.one_minus_tq)
    return doc


def test_randomize_records_samples_m_c_without_replacement() -> None:
    doc = identity_doc(m_c=2)
    records = [("q0", "u0"), ("q0", "u1"), ("q1", "u2"), ("q0", None), ("q2", None)]
    wire = [{"query": q, "url": u} for q, u in records]
    src = SeededSource(2024)
    pairs = {pair: 0 for pair in itertools.combinations(range(5), 2)}
    n = 10_000
    for _ in range(n):
        msg = randomize_records(doc, records, source=src)
        assert msg["headlist"] == doc["content_hash"]
        reps = msg["reports"]
        assert len(reps) == 2
        idx = tuple(sorted(wire.index(r) for r in reps))
        assert idx[0] != idx[1]  # without replacement
        pairs[idx] += 1
    # uniform over the C(5,2) = 10 subsets
    assert chisquare_pooled(np.array(list(pairs.values())), np.full(10, 0.1)) > P_MIN


def test_randomize_records_fewer_records_than_m_c() -> None:
    doc = identity_doc(m_c=3)
    msg = randomize_records(doc, [("q1", "u2")], source=SeededSource(1))
    assert msg["reports"] == [{"query": "q1", "url": "u2"}]
    assert randomize_records(doc, [], source=SeededSource(1))["reports"] == []


def test_randomize_records_maps_onto_head_list() -> None:
    doc = identity_doc()
    src = SeededSource(3)
    one = lambda q, u: randomize_records(doc, [(q, u)], source=src)["reports"]  # noqa: E731
    assert one("q0", "u1") == [{"query": "q0", "url": "u1"}]
    assert one("unknown query", "u0") == [{"query": None, "url": None}]  # q ∉ HL → ⟨*,*⟩
    assert one("q0", "u2") == [{"query": "q0", "url": None}]  # u ∉ HL[q0] → ⟨q0,*⟩
    assert one("q1", "unknown url") == [{"query": "q1", "url": None}]
    dhl = DeviceHeadList.from_json(doc)  # a record without URL (randomize_records refuses a device of only those)
    assert dhl.decode(*dhl.encode("q2", None)) == {"query": "q2", "url": None}  # no URL → ⟨q,*⟩


def test_randomize_records_k1_always_wildcard() -> None:
    hl = make_hl([])
    doc = device_doc(hl, epsilon=0.1, delta=0.3, f_c=0.5, m_c=2)
    for seed in range(50):
        msg = randomize_records(doc, [("a", "b"), ("c", None)], source=SeededSource(seed))
        assert msg["reports"] == [{"query": None, "url": None}] * 2


def test_randomize_records_default_source_is_os_randomness() -> None:
    doc = identity_doc()
    assert randomize_records(doc, [("q0", "u0")])["reports"] == [{"query": "q0", "url": "u0"}]


def test_randomize_records_rejects_tampered_head_list() -> None:
    doc = identity_doc()
    tampered = dict(doc, epsilon=doc["epsilon"] * 2)
    with pytest.raises(DeviceError, match="content_hash"):
        randomize_records(tampered, [("q0", "u0")], source=SeededSource(0))
    tampered = json.loads(json.dumps(doc))
    tampered["queries"][0]["urls"].append("u9")
    with pytest.raises(DeviceError, match="content_hash"):
        DeviceHeadList.from_json(tampered)


def test_randomize_records_sampling_order_and_charge(tmp_path) -> None:
    doc = signed_headlist(epsilon=2, delta=1e-5, f_c=0.5, m_c=2)  # an integer ε: charged as a float
    records = [("a", "u"), ("b", None), ("a", "v"), ("c", "x")]
    # sampling: ⌊0.6·4⌋ = 2 → record 2 (pool 0, 1, 3 left); ⌊0.5·3⌋ = 1 → record 1; then LocalAlg keeps both
    # (v1 = 0.999 ≥ 1 − t; record 2 has k_a = 3: v2 = 0.999 ≥ 1 − t_a; record 1 has k_b = 1: one draw)
    src = UniformReplay([0.6, 0.5, 0.999, 0.999, 0.999])
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=3.0, lifetime_delta=1e-4)
    msg = randomize_records(doc, records, source=src, ledger=ledger, message_id="B" * 22)
    assert msg == {"id": "B" * 22, "headlist": doc["content_hash"],
                   "reports": [{"query": "a", "url": "v"}, {"query": "b", "url": None}]}
    assert list(src._it) == []
    saved = json.loads((tmp_path / "dev.json").read_text(encoding="utf-8"))
    shape = {"kq": [3, 1, 1], "f_c": 0.5, "m_c": 2}  # a: u, v, ⟨a,*⟩; b: ⟨b,*⟩; ⟨*,*⟩ (the ledger's PLD accounting)
    assert saved["rounds"] == {doc["content_hash"]: {"epsilon": 2.0, "delta": 1e-5, "shape": shape}}
    assert type(ledger.state["rounds"][doc["content_hash"]]["epsilon"]) is float
    # a second message of the same round is refused by the ledger
    with pytest.raises(DeviceError, match="already reported"):
        randomize_records(doc, records, source=UniformReplay([0.0] * 10), ledger=ledger)


def test_randomize_records_takes_all_records_when_fewer_than_m_c() -> None:
    doc = signed_headlist(epsilon=1.0, delta=0.1, f_c=0.5, m_c=3)
    src = UniformReplay([0.5, 0.0, 0.999, 0.999, 0.999])  # ⌊0.5·2⌋ = 1, then ⌊0·1⌋ = 0
    msg = randomize_records(DeviceHeadList.from_json(doc), [("a", "u"), ("c", None)], source=src)
    assert msg["reports"] == [{"query": None, "url": None}, {"query": "a", "url": "u"}]
    assert len(msg["id"]) == 22
    with pytest.raises(DeviceError, match=r"^message id 'short' is not valid"):
        randomize_records(doc, [("a", "u")], source=src, message_id="short")


@pytest.mark.parametrize(("records", "index", "shown"), [
    ([("a", "u"), ("a",)], 1, "('a',)"),
    ([("a", "u", "v")], 0, "('a', 'u', 'v')"),
    ([(1, "u")], 0, "(1, 'u')"),
    ([("a", 2)], 0, "('a', 2)"),
    ([("a", "u"), ("b", None), "ab"], 2, "'ab'"),
    ([None], 0, "None"),
])
def test_check_records_messages(tmp_path, records: list, index: int, shown: str) -> None:
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=30.0, lifetime_delta=0.5)
    with pytest.raises(DeviceError, match=exact_message(
            f"record {index} = {shown} is not a (query, url) pair of strings; give each record as (query, clicked "
            "URL), with url None when the record has none")):
        randomize_records(signed_headlist(), records, source=UniformReplay([]), ledger=ledger)
    assert ledger.state["rounds"] == {}  # refused before the charge


def test_check_records_url_level_without_urls(tmp_path) -> None:
    doc = signed_headlist()
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=30.0, lifetime_delta=0.5)
    with pytest.raises(DeviceError, match=exact_message(
            "this device's 2 record(s) have no URL (they are (query, None)), but the head list "
            f"{doc['content_hash'][:19]}… is URL-level (url_level true): every record would be reported as ⟨q,*⟩, "
            "a click on an unlisted URL, "
            "which biases the estimate of every listed URL. Give the device its (query, clicked URL) records (for a "
            "table, name the URL column with --url-col), or use a head list built from a log without URLs "
            "(url_level false).")):
        randomize_records(doc, [("a", None), ["b", None]], source=UniformReplay([]), ledger=ledger)
    assert ledger.state["rounds"] == {}
    # one record with a URL is enough; a query-level list takes records without URLs; no records at all is fine
    src = UniformReplay([0.0, 0.999, 0.999])
    assert randomize_records(doc, [("a", None), ("a", "u")], source=src)["reports"] == [{"query": "a", "url": None}]
    level = signed_headlist(url_level=False, queries=[{"query": "a", "urls": []}])
    assert randomize_records(level, [("a", None)], source=UniformReplay([0.0, 0.999]))["reports"] == [
        {"query": "a", "url": None}]
    msg = randomize_records(doc, [], source=UniformReplay([]), ledger=ledger)
    assert msg["reports"] == [] and list(ledger.state["rounds"]) == [doc["content_hash"]]


def test_device_module_imports_no_numpy() -> None:
    code = "import sys, hybriddp.device.localalg; assert 'numpy' not in sys.modules, sorted(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_randomize_records_with_round_id_but_no_ledger_just_randomizes() -> None:
    """Without a ledger there is nothing to memoize: a round id alone changes nothing (ALGORITHM.md §15)."""
    doc = identity_doc()
    for _ in range(2):
        msg = randomize_records(doc, [("q1", "u2")], source=SeededSource(4), round_id="r1", message_id="C" * 22)
        assert msg == {"id": "C" * 22, "headlist": doc["content_hash"], "reports": [{"query": "q1", "url": "u2"}]}


def test_randomize_records_memo_resends_once_in_each_other_round(tmp_path) -> None:
    """§15 memoization: the reports made for a head list in round r1 are sent again, under the fresh message id, in
    every other round with the same head list (r2, r3), with no new charge; a second message in a round that
    already got them is refused."""
    doc = signed_headlist(epsilon=2, delta=1e-5, f_c=0.5, m_c=1)
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=3.0, lifetime_delta=1e-4)
    records = [("a", "u"), ("b", None)]
    first = randomize_records(doc, records, source=SeededSource(8), ledger=ledger, round_id="r1",
                              message_id="D" * 22)
    assert len(first["reports"]) == 1
    for rid, mid in (("r2", "E" * 22), ("r3", "F" * 22)):
        again = randomize_records(doc, records, source=UniformReplay([]), ledger=ledger, round_id=rid,
                                  message_id=mid)
        assert again == {"id": mid, "headlist": doc["content_hash"], "reports": first["reports"]}
    assert len(ledger.state["rounds"]) == 1  # charged once
    for rid in ("r1", "r2", "r3"):
        with pytest.raises(DeviceError, match="already reported"):
            randomize_records(doc, records, source=SeededSource(9), ledger=ledger, round_id=rid)


def test_randomize_records_without_round_id_keeps_no_memo(tmp_path) -> None:
    """§15: without the service's round id there is no memoization, so a later round with the same head list is
    refused (one report per head list), not answered from a memo."""
    doc = signed_headlist(epsilon=2, delta=1e-5, f_c=0.5, m_c=1)
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=3.0, lifetime_delta=1e-4)
    records = [("a", "u")]
    randomize_records(doc, records, source=SeededSource(8), ledger=ledger)
    assert "memo" not in ledger.state or not ledger.state["memo"]
    with pytest.raises(DeviceError, match="already reported"):
        randomize_records(doc, records, source=SeededSource(9), ledger=ledger, round_id="r2")

"""The trusted curator (ALGORITHM.md §3, §4): CreateHeadList and EstimateOptinProbabilities (curator/mechanisms.py),
with the opt-in variance (curator/estimates.py): statistically, and with scripted noise by hand (noise added, the
threshold, trimming with ties kept in head-list order, the edges n = 0, 1, 2, every refusal whole).

Statistical tests are seeded and use error bars from the number of trials: a mean is compared
with the truth within 5 standard errors, a variance with the empirical variance within 6 standard
deviations of a sample variance (relative s.d. √(2/(T−1)) for T trials), so they cannot flake.
"""

from __future__ import annotations

import logging
import math
import re

import numpy as np
import pytest
from scipy import stats

from hybriddp.core import params as params_mod
from hybriddp.core.errors import EmptyHeadListError, HeadListError, ParameterError
from hybriddp.core.headlist import WILDCARD, HeadList
from hybriddp.core.noise import LaplaceNoise
from hybriddp.core.params import check_head_list_params, head_list_scale, head_list_threshold
from hybriddp.core.records import NO_URL
from hybriddp.curator.estimates import optin_variance
from hybriddp.curator.mechanisms import create_head_list, estimate_optin_probabilities, require_nonempty
from hybriddp.privacy.ledger import Charge

# ----- helpers ---------------------------------------------------------------------------------


class ZeroNoise:
    """No noise at all (p̂ = count/n), for structural tests; reports Laplace's variance."""

    name = "zero"

    def sample(self, scale: float, size: int) -> np.ndarray:
        return np.zeros(size)

    def variance(self, scale: float) -> float:
        return 2.0 * scale * scale

    def survival(self, x: float, scale: float) -> float:
        return float(x < 0)

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        return head_list_threshold(epsilon, delta, m_o)


class RecordingNoise(LaplaceNoise):
    """Laplace noise that remembers its last draws (to recompute the estimates by hand)."""

    def sample(self, scale: float, size: int) -> np.ndarray:
        self.last = super().sample(scale, size)
        return self.last


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


def entry_keys(hl: HeadList) -> list[tuple[int, int]]:
    """(query id, URL id) of every entry; the query ``*`` is WILDCARD, URL ``*`` is WILDCARD."""
    qids = np.append(hl.query_ids, WILDCARD)
    return list(zip(qids[hl.entry_query].tolist(), hl.entry_url.tolist(), strict=True))


def query_keys(hl: HeadList) -> list[int]:
    return [*hl.query_ids.tolist(), WILDCARD]


def records_from(counts: dict[tuple[int, int], int], rng: np.random.Generator | None = None):
    """Query and URL arrays holding each record ``counts[r]`` times (shuffled if rng given)."""
    q = np.concatenate([np.full(c, k[0]) for k, c in counts.items()]).astype(np.int64)
    u = np.concatenate([np.full(c, k[1]) for k, c in counts.items()]).astype(np.int64)
    if rng is not None:
        perm = rng.permutation(len(q))
        q, u = q[perm], u[perm]
    return q, u


def reference_fold(hl: HeadList, p: np.ndarray, m: int) -> dict[tuple[int, int], tuple[float, int]]:
    """ALGORITHM.md §4 "Trim", written independently: key → (folded p̂, J)."""
    keys = entry_keys(hl)
    real = [i for i, (_, u) in enumerate(keys) if u != WILDCARD]
    kept = set(sorted(real, key=lambda i: -p[i])[:m])
    kept_queries = {keys[i][0] for i in kept}
    out: dict[tuple[int, int], tuple[float, int]] = {}
    for i, (q, u) in enumerate(keys):
        if q == WILDCARD or q in kept_queries:
            target = (q, u) if (u == WILDCARD or i in kept) else (q, WILDCARD)
        else:
            target = (WILDCARD, WILDCARD)
        s, j = out.get(target, (0.0, 0))
        out[target] = (s + p[i], j + 1)
    return out


# HL_S used by the estimation tests: q1:[10, 11, 12], q2:[20], q3:[30, 31]
HL_S_LISTS = ([1, 2, 3], [[10, 11, 12], [20], [30, 31]])
# a record distribution over list and off-list records; its image on HL_S is the truth
RECORD_DIST = {
    (1, 10): 0.20, (1, 11): 0.10, (1, 12): 0.05, (1, 13): 0.05,  # (1,13) → ⟨q1,*⟩
    (2, 20): 0.15, (2, 21): 0.05, (2, NO_URL): 0.05,              # → ⟨q2,*⟩
    (3, 30): 0.10, (3, 31): 0.10,
    (4, 40): 0.10, (5, 10): 0.05,                                 # → ⟨*,*⟩
}


def mapped_truth(hl: HeadList) -> dict[tuple[int, int], float]:
    """Probability of each HL_S entry key under RECORD_DIST (ALGORITHM.md §4 mapping)."""
    recs = list(RECORD_DIST)
    ent = hl.map_records(np.array([r[0] for r in recs]), np.array([r[1] for r in recs]))
    keys = entry_keys(hl)
    truth = dict.fromkeys(keys, 0.0)
    for e, r in zip(ent.tolist(), recs, strict=True):
        truth[keys[e]] += RECORD_DIST[r]
    return truth


# ----- CreateHeadList (ALGORITHM.md §3) --------------------------------------------------------------------


def test_threshold_paper_values() -> None:
    assert head_list_scale(4.0, 1) == 0.5
    assert round(head_list_threshold(4.0, 1e-5, 1), 4) == 6.7565
    assert check_head_list_params(4.0, 1e-5, 1) == head_list_threshold(4.0, 1e-5, 1)
    # m_O = 2: b = 4/ε, τ = b·(ln(e^{ε/2} + 1) − ln δ)
    assert head_list_threshold(4.0, 1e-5, 2) == pytest.approx(1.0 * (math.log(math.e**2 + 1) - math.log(1e-5)))


@pytest.mark.parametrize("epsilon", [0.7, 1.0, 2.0, 4.0, 8.0, 20.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-5, 1e-2, 0.3, 0.9])
def test_single_record_survival_is_delta_over_two(epsilon: float, delta: float) -> None:
    """m_O = 1: P[1 + Y > τ] = ½e^{−(τ−1)/b} = δ/2 (Theorem 1's δ/2 per neighbouring dataset)."""
    b = head_list_scale(epsilon, 1)
    tau = check_head_list_params(epsilon, delta, 1)
    closed = 0.5 * math.exp(-(tau - 1) / b)
    assert closed == pytest.approx(delta / 2, rel=1e-12)
    assert LaplaceNoise(np.random.default_rng(0)).survival(tau - 1, b) == pytest.approx(delta / 2, rel=1e-12)


def test_sampled_survival_of_singletons() -> None:
    """10^6 distinct records seen once each; the number kept is Binomial(10^6, δ/2).

    δ = 0.02 makes the expected 10^4 survivors measurable; binomial test p > 1e-6. The same test
    rejects the wrong rate δ (it has power)."""
    n, eps, delta = 1_000_000, 4.0, 0.02
    query = np.arange(n, dtype=np.int64)
    url = np.zeros(n, dtype=np.int64)
    hl = create_head_list(query, url, epsilon=eps, delta=delta, m_o=1,
                          noise=LaplaceNoise(np.random.default_rng(314159)))
    kept = hl.n_records
    assert hl.n_queries == kept  # one record per query
    assert stats.binomtest(kept, n, delta / 2).pvalue > 1e-6
    assert stats.binomtest(kept, n, delta).pvalue < 1e-6


@pytest.mark.parametrize(("epsilon", "delta"), [(math.log(2), 1e-5), (0.5, 1e-5), (-1.0, 1e-5), (float("nan"), 1e-5),
                                                 (4.0, 0.0), (4.0, 1.0), (4.0, -0.1), (4.0, 1.5)])
def test_create_head_list_rejects_bad_parameters(epsilon: float, delta: float) -> None:
    with pytest.raises(ParameterError):
        create_head_list(np.array([1]), np.array([1]), epsilon=epsilon, delta=delta, m_o=1,
                         noise=ZeroNoise())


def test_tau_below_one_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """τ ≥ m_O ≥ 1 for every valid (ε, δ, m_O) (τ = b(ln(e^{ε/2}+m−1) − ln δ) ≥ (2m/ε)(ε/2)), so
    the τ < 1 branch is unreachable through the formula; exercise it by patching τ."""
    for eps in (0.7, 4.0, 50.0):
        for delta in (1e-9, 0.5, 0.999):
            for m in (1, 2, 5):
                assert head_list_threshold(eps, delta, m) >= m
    monkeypatch.setattr(params_mod, "head_list_threshold", lambda *a: 0.5)
    with pytest.raises(ParameterError, match="tau"):
        check_head_list_params(4.0, 1e-5, 1)


def test_head_list_contains_only_records_of_d_s_and_wildcards() -> None:
    """Heavy records always pass; nothing outside D_S can enter; ⟨q,*⟩ and ⟨*,*⟩ are added.

    δ = 0.9 gives τ ≈ 1.05 at ε = 4: a record of count 0 would pass with probability ≈ 6%, so
    an implementation iterating over a dictionary of possible records would show here."""
    rng = np.random.default_rng(5)
    heavy = {(7, 70): 200, (7, 71): 150, (14, 140): 300, (21, NO_URL): 100}
    light = {(7 * i, 7 * i + 1): 1 for i in range(10, 400)}
    q, u = records_from({**heavy, **light}, rng)
    hl = create_head_list(q, u, epsilon=4.0, delta=0.9, m_o=1, noise=LaplaceNoise(rng))
    keys = entry_keys(hl)
    d_s = {**heavy, **light}
    real = [k for k in keys if k[1] != WILDCARD]
    assert set(real) <= set(d_s)
    assert {k for k in heavy if k[1] != NO_URL} <= set(real)
    assert 21 in hl.query_ids.tolist()  # a URL-less record lists its query
    assert np.all(hl.query_ids % 7 == 0)
    assert len(real) < len(d_s)  # some singletons were dropped (τ > 1)
    assert hl.entry_url[hl.wildcard_entry].tolist() == [WILDCARD] * hl.k  # ⟨q,*⟩ last for every q
    assert keys[-1] == (WILDCARD, WILDCARD)
    assert hl.kq[-1] == 1


def test_create_head_list_empty_input() -> None:
    hl = create_head_list(np.array([], dtype=np.int64), np.array([], dtype=np.int64), epsilon=4.0,
                          delta=1e-5, m_o=1, noise=ZeroNoise())
    assert hl.k == 1 and hl.n_entries == 1


def test_create_head_list_adds_the_noise_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Counts 5 for ⟨1,10⟩ and 3 for ⟨2,20⟩, draws +2 and +2, τ = 6: only 5 + 2 = 7 > 6 passes (5 − 2 would
    not). The scale handed to the noise is b_S = 2m_O/ε = 2·2/4 = 1."""
    q = np.array([1] * 5 + [2] * 3)
    u = np.array([10] * 5 + [20] * 3)
    noise = ScriptedNoise(lambda size: np.full(size, 2.0), tau=6.0)
    with caplog.at_level(logging.DEBUG, logger="hybriddp.curator.mechanisms"):
        hl = create_head_list(q, u, epsilon=4.0, delta=1e-5, m_o=2, noise=noise)
    assert hl.query_ids.tolist() == [1] and hl.entry_url[:1].tolist() == [10] and hl.n_records == 1
    assert noise.scales == [1.0]
    assert [r.getMessage() for r in caplog.records if r.name == "hybriddp.curator.mechanisms"] == [
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


# ----- EstimateOptinProbabilities (ALGORITHM.md §4) ----------------------------------------------------------


def hl_s() -> HeadList:
    return HeadList.from_lists(*HL_S_LISTS)


def test_mapping_onto_head_list() -> None:
    """Without noise and trimming p̂ = mapped count / |D_T|: q ∉ HL → ⟨*,*⟩, u ∉ HL[q] → ⟨q,*⟩."""
    counts = {(1, 10): 5, (1, 13): 3, (1, NO_URL): 1, (2, 20): 4, (2, 10): 2, (3, 31): 6, (4, 40): 7, (5, 10): 2}
    q, u = records_from(counts)
    est = estimate_optin_probabilities(q, u, hl_s(), epsilon=4.0, m_o=1, head_list_size=100, noise=ZeroNoise())
    got = dict(zip(entry_keys(est.head_list), est.p_record.tolist(), strict=True))
    n = sum(counts.values())
    want = {(1, 10): 5, (1, 11): 0, (1, 12): 0, (1, WILDCARD): 4, (2, 20): 4, (2, WILDCARD): 2,
            (3, 30): 0, (3, 31): 6, (3, WILDCARD): 0, (WILDCARD, WILDCARD): 9}
    assert got == {k: v / n for k, v in want.items()}
    assert est.n == n
    assert est.draws_record.tolist() == [1] * est.head_list.n_entries


def test_final_head_list_is_sorted_by_estimate() -> None:
    counts = {(1, 10): 1, (1, 12): 3, (2, 20): 9, (3, 30): 4, (3, 31): 6}
    q, u = records_from(counts)
    est = estimate_optin_probabilities(q, u, hl_s(), epsilon=4.0, m_o=1, head_list_size=100, noise=ZeroNoise())
    hl = est.head_list
    assert hl.query_ids.tolist() == [3, 2, 1]  # p̂_q = 10/23, 9/23, 4/23
    assert entry_keys(hl)[:3] == [(3, 31), (3, 30), (3, WILDCARD)]


def test_unbiased_and_variance_formula_monte_carlo() -> None:
    """D_T ~ multinomial(RECORD_DIST), n = 200, ε = 0.5 (b = 4: noise ≈ sampling variance), no
    trimming; T = 2000 trials.

    * mean of p̂_O within 5 s.e. of the mapped truth, per entry and per query;
    * mean of σ̂²_O vs the empirical variance of p̂_O: a sample variance over T trials has relative
      s.d. √(2/(T−1)) ≈ 0.032, so a 6-s.d. tolerance is 0.19 (plus 2% for the clamp of p̂ into
      [0,1] in p(1−p), which biases σ̂² up slightly for small p). Dropping the noise term (factor
      ≈ 2–9 here) or dividing by |p̂| instead of |D_T| (the printed Theorem 4) would fail.
    """
    rng = np.random.default_rng(424242)
    hl = hl_s()
    truth = mapped_truth(hl)
    keys = entry_keys(hl)
    recs = list(RECORD_DIST)
    probs = np.array([RECORD_DIST[r] for r in recs])
    rq, ru = np.array([r[0] for r in recs]), np.array([r[1] for r in recs])
    n, trials, eps = 200, 2000, 0.5
    noise = LaplaceNoise(rng)
    p_rec = np.empty((trials, len(keys)))
    v_rec = np.empty((trials, len(keys)))
    qk = query_keys(hl)
    p_q = np.empty((trials, len(qk)))
    v_q = np.empty((trials, len(qk)))
    for t in range(trials):
        idx = rng.choice(len(recs), size=n, p=probs)
        est = estimate_optin_probabilities(rq[idx], ru[idx], hl, epsilon=eps, m_o=1, head_list_size=100,
                                           noise=noise)
        pos = {k: i for i, k in enumerate(entry_keys(est.head_list))}
        order = [pos[k] for k in keys]
        p_rec[t], v_rec[t] = est.p_record[order], est.var_record[order]
        qpos = {k: i for i, k in enumerate(query_keys(est.head_list))}
        qorder = [qpos[k] for k in qk]
        p_q[t], v_q[t] = est.p_query[qorder], est.var_query[qorder]
    b = head_list_scale(eps, 1)
    for name, p, v, tr in [
        ("record", p_rec, v_rec, np.array([truth[k] for k in keys])),
        ("query", p_q, v_q, np.array([sum(truth[k] for k in keys if k[0] == q) for q in qk])),
    ]:
        se = p.std(axis=0, ddof=1) / math.sqrt(trials)
        assert np.all(np.abs(p.mean(axis=0) - tr) <= 5 * se), name
        emp = p.var(axis=0, ddof=1)
        tol = 6 * math.sqrt(2 / (trials - 1)) + 0.02
        np.testing.assert_array_less(np.abs(v.mean(axis=0) / emp - 1), tol, err_msg=name)
        # the theoretical variance p(1−p)/n + J·2b²/n² agrees too
        j = 1 if name == "record" else np.array([sum(1 for k in keys if k[0] == q) for q in qk])
        theory = tr * (1 - tr) / n + j * 2 * b * b / n**2
        np.testing.assert_array_less(np.abs(emp / theory - 1), 6 * math.sqrt(2 / (trials - 1)), err_msg=name)


def trim_case() -> tuple[HeadList, dict[tuple[int, int], int]]:
    """HL_S q1:[10..13], q2:[20, 21], q3:[30, 31, 32] and counts where M = 3 keeps (1,10),
    (1,11), (2,20) by a wide margin (≥ 195 counts against Laplace(4) noise)."""
    hl = HeadList.from_lists([1, 2, 3], [[10, 11, 12, 13], [20, 21], [30, 31, 32]])
    counts = {(1, 10): 300, (1, 11): 250, (1, 12): 5, (1, 13): 5, (1, 99): 10,
              (2, 20): 200, (2, 21): 4, (3, 30): 3, (3, 31): 3, (3, 32): 3, (3, 98): 2, (8, 80): 100}
    return hl, counts


def test_trim_and_fold_structure() -> None:
    hl, counts = trim_case()
    q, u = records_from(counts)
    noise = RecordingNoise(np.random.default_rng(11))
    est = estimate_optin_probabilities(q, u, hl, epsilon=0.5, m_o=1, head_list_size=3, noise=noise)
    n = sum(counts.values())
    old = (np.bincount(hl.map_records(q, u), minlength=hl.n_entries) + noise.last) / n
    final = est.head_list
    assert final.query_ids.tolist() == [1, 2]  # q3 kept no URL → gone
    keys = entry_keys(final)
    assert keys == [(1, 10), (1, 11), (1, WILDCARD), (2, 20), (2, WILDCARD), (WILDCARD, WILDCARD)]
    assert est.draws_record.tolist() == [1, 1, 3, 1, 2, 5]  # ⟨1,*⟩+12+13; ⟨2,*⟩+21; ⟨*,*⟩+q3's 4
    ref = reference_fold(hl, old, 3)
    for i, k in enumerate(keys):
        assert est.p_record[i] == pytest.approx(ref[k][0], rel=1e-12, abs=1e-15)
        assert est.draws_record[i] == ref[k][1]
    assert est.p_record.sum() == pytest.approx(old.sum(), rel=1e-12)  # folding preserves the total
    # query level: sums over the query's entries, J summed, same variance formula
    np.testing.assert_allclose(est.p_query, np.bincount(final.entry_query, weights=est.p_record), rtol=1e-12)
    assert est.draws_query.tolist() == [5, 3, 5]
    # Laplace at ε = 0.5, m_O = 1: b = 2/0.5 = 4, so one draw has variance 2·4² = 32 (by hand)
    assert est.noise_variance == 32.0
    pq = np.clip(est.p_query, 0, 1)
    np.testing.assert_allclose(est.var_query, pq * (1 - pq) / (n - 1) + est.draws_query * 32.0 / (n * (n - 1)),
                               rtol=1e-12)
    pc = np.clip(est.p_record, 0, 1)
    np.testing.assert_allclose(
        est.var_record, pc * (1 - pc) / (n - 1) + est.draws_record * 32.0 / (n * (n - 1)), rtol=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_trim_matches_reference_on_random_lists(seed: int) -> None:
    """Random HL_S, counts and M (from 1 to more than the number of records)."""
    rng = np.random.default_rng(seed)
    n_q = int(rng.integers(1, 8))
    urls = [sorted(rng.choice(100, size=int(rng.integers(0, 5)), replace=False).tolist()) for _ in range(n_q)]
    hl = HeadList.from_lists(list(range(n_q)), urls)
    recs = [(qi, u) for qi, us in enumerate(urls) for u in [*us, 500]] + [(99, 1)]
    counts = {r: int(rng.integers(0, 30)) for r in recs}
    counts[(99, 1)] += 1  # at least one record
    q, u = records_from(counts)
    m = int(rng.integers(1, hl.n_records + 3))
    noise = RecordingNoise(rng)
    est = estimate_optin_probabilities(q, u, hl, epsilon=1.0, m_o=1, head_list_size=m, noise=noise)
    old = (np.bincount(hl.map_records(q, u), minlength=hl.n_entries) + noise.last) / len(q)
    ref = reference_fold(hl, old, m)
    keys = entry_keys(est.head_list)
    assert set(keys) == set(ref)
    assert est.head_list.n_records == min(m, hl.n_records)
    for i, k in enumerate(keys):
        assert est.p_record[i] == pytest.approx(ref[k][0], rel=1e-12, abs=1e-15)
        assert est.draws_record[i] == ref[k][1]
    assert est.draws_record.sum() == hl.n_entries
    assert est.p_record.sum() == pytest.approx(old.sum(), rel=1e-12, abs=1e-15)


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


def test_folded_variance_counts_the_draws() -> None:
    """D_T fixed, only the Laplace noise varies (T = 3000 trials): Var(p̂_r) = J_r·2b²/n², and
    σ̂²_O's noise part J_r·2b²/(n(n−1)) matches it within 6 s.d. of a sample variance (relative
    √(2/(T−1)) ≈ 0.026 → 0.155). The paper's J = 1 for folded wildcards (J = 2, 3, 5 here) is off
    by a factor ≥ 2 and fails the same comparison."""
    hl, counts = trim_case()
    q, u = records_from(counts)
    n = len(q)
    rng = np.random.default_rng(77)
    noise = LaplaceNoise(rng)
    trials, eps = 3000, 0.5
    b = head_list_scale(eps, 1)
    ps = []
    for _ in range(trials):
        est = estimate_optin_probabilities(q, u, hl, epsilon=eps, m_o=1, head_list_size=3, noise=noise)
        assert entry_keys(est.head_list) == [(1, 10), (1, 11), (1, WILDCARD), (2, 20), (2, WILDCARD),
                                             (WILDCARD, WILDCARD)]
        ps.append(est.p_record)
    emp = np.var(ps, axis=0, ddof=1)
    pc = np.clip(est.p_record, 0, 1)
    noise_part = est.var_record - pc * (1 - pc) / (n - 1)
    j = est.draws_record
    np.testing.assert_allclose(noise_part, j * 2 * b * b / (n * (n - 1)), rtol=1e-9)
    tol = 6 * math.sqrt(2 / (trials - 1))
    np.testing.assert_array_less(np.abs(noise_part / emp - 1), tol)
    paper = 2 * b * b / (n * (n - 1))  # J = 1 everywhere
    assert np.all(np.abs(paper / emp[j > 1] - 1) > tol)


def test_query_level_only_mode_trims_whole_queries() -> None:
    """url_level=False (single-item logs): records are ⟨q,*⟩; M = 2 keeps the two largest
    queries, the others fold into ⟨*,*⟩."""
    counts = {(1, NO_URL): 10, (2, NO_URL): 40, (3, NO_URL): 30, (4, NO_URL): 5, (9, NO_URL): 15}
    q, u = records_from(counts)
    hl = HeadList.from_records(np.array([1, 2, 3, 4]), np.full(4, NO_URL))
    assert hl.n_records == 0 and hl.k == 5
    est = estimate_optin_probabilities(q, u, hl, epsilon=4.0, m_o=1, head_list_size=2, noise=ZeroNoise(),
                                       url_level=False)
    assert est.head_list.query_ids.tolist() == [2, 3]
    assert est.head_list.n_records == 0
    np.testing.assert_allclose(est.p_record, [0.4, 0.3, 0.3])
    assert est.draws_record.tolist() == [1, 1, 3]
    np.testing.assert_allclose(est.p_query, [0.4, 0.3, 0.3])


def test_query_level_trimming_never_gives_the_wildcard_a_query_slot() -> None:
    """url_level=False: the candidates are the ⟨q,*⟩ of listed queries only; ⟨*,*⟩ is always kept and
    never takes one of the M slots, even when it is the heaviest entry."""
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


def test_no_data_gives_infinite_variance() -> None:
    est = estimate_optin_probabilities(np.array([], dtype=np.int64), np.array([], dtype=np.int64), hl_s(),
                                       epsilon=4.0, m_o=1, head_list_size=10, noise=ZeroNoise())
    assert est.n == 0
    assert np.all(np.isinf(est.var_record)) and np.all(np.isinf(est.var_query))


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


def test_optin_estimates_with_two_records_have_finite_variances() -> None:
    hl = HeadList.from_lists([1], [[10]])
    est = estimate_optin_probabilities(np.array([1, 1]), np.array([10, 10]), hl, epsilon=1000.0, m_o=1,
                                       head_list_size=5, noise=LaplaceNoise(np.random.default_rng(0)))
    assert est.n == 2 and np.isfinite(est.var_record).all() and np.isfinite(est.var_query).all()
    one = estimate_optin_probabilities(np.array([1]), np.array([10]), hl, epsilon=1000.0, m_o=1,
                                       head_list_size=5, noise=LaplaceNoise(np.random.default_rng(0)))
    assert np.isinf(one.var_record).all() and np.isinf(one.var_query).all()


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


def test_head_list_size_must_be_positive() -> None:
    with pytest.raises(ParameterError):
        estimate_optin_probabilities(np.array([1]), np.array([10]), hl_s(), epsilon=4.0, m_o=1,
                                     head_list_size=0, noise=ZeroNoise())


def test_head_list_size_must_be_a_positive_integer() -> None:
    hl = HeadList.from_lists([1], [[10]])
    with pytest.raises(ParameterError, match="^" + re.escape(
            "head_list_size (--head-list-size) = 0 is not allowed: it must be an integer >= 1.") + "$"):
        estimate_optin_probabilities(np.array([1]), np.array([10]), hl, epsilon=1.0, m_o=1, head_list_size=0,
                                     noise=ScriptedNoise())

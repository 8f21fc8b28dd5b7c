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
import warnings

import numpy as np
import pytest
from scipy import stats

from hybriddp.core import params as params_mod
from hybriddp.core.errors import EmptyHeadListError, HeadListError, ParameterError
from hybriddp.core.headlist import WILDCARD, HeadList
from hybriddp.core.noise import LaplaceNoise
from hybriddp.core.params import check_head_list_params, head_list_scale, head_list_threshold
from hybriddp.core.records import NO_URL
from hybriddp.curator.estimates import OptinEstimates, optin_variance, reuse_query_variances
from hybriddp.curator.kept import KeptCount
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


# ----- opt-in variances under reuse of S (ALGORITHM.md §4.1) --------------------------------------------------


def test_reuse_query_variances_hand_computed_cases() -> None:
    """σ̂²_O,q = P₁(1−P₁)/(n−1) + J₁V/(n(n−1)) + P₂(1−P₂)/(|D_T|−1) + J₂V/(|D_T|(|D_T|−1)) − 2P₁P₂/n (§4.1), by hand
    at |D_T| = 4, |D_S| = 6 (n = 10), V = 1/2, with p̂ clamped into [0, 1] record by record, P₁ clamped, and
    P₂ = clamp(p̂_q) − P₁ clamped at 0:
    q0: reused 0.3 (J 2), others 0.1 (J 3) and 0.1 (J 1), p̂_q 0.5: P₁ .3, P₂ .2, J₁ 2, J₂ 4;
    q1: reused 0.4 (J 2), other 0.9, p̂_q 1.3 → 1: P₁ .4, P₂ .6, J₁ 2, J₂ 1;
    q2: reused 0.7 and 0.6 (J 2 each), other 0.05, p̂_q 1.35: P₁ = 1 (from 1.3), P₂ = 0, J₁ 4, J₂ 1;
    q3: reused 0.5 and −0.2 (→ 0), other 0.1, p̂_q 0.4 < P₁: P₁ .5, P₂ = 0, J₁ 4, J₂ 1;
    q4: no entry at all, p̂_q 0.25: T alone with no draws, 0.25·0.75/3."""
    p_rec = np.array([0.3, 0.1, 0.1, 0.4, 0.9, 0.7, 0.6, 0.05, 0.5, -0.2, 0.1])
    draws = np.array([2, 3, 1, 2, 1, 2, 2, 1, 2, 2, 1])
    reused = np.array([1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0], dtype=bool)
    entry_query = np.array([0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    p_query = np.array([0.5, 1.3, 1.35, 0.4, 0.25])
    got = reuse_query_variances(p_rec, p_query, draws, reused, entry_query, 4, 6, 0.5)
    expected = [0.21 / 9 + 1 / 90 + 0.16 / 3 + 2 / 12 - 0.012,
                0.24 / 9 + 1 / 90 + 0.24 / 3 + 0.5 / 12 - 0.048,
                2 / 90 + 0.5 / 12,
                0.25 / 9 + 2 / 90 + 0.5 / 12,
                0.0625]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # without a reused record (P₁ = 0) a query is §4's T estimate: p̂(1−p̂)/(|D_T|−1) + J·V/(|D_T|(|D_T|−1))
    none = reuse_query_variances(p_rec, p_query, draws, np.zeros(11, dtype=bool), entry_query, 4, 6, 0.5)
    np.testing.assert_allclose(none[:2], [0.25 / 3 + 6 * 0.5 / 12, 0.0 + 3 * 0.5 / 12], rtol=1e-12)


def _enumerated_excess(kept: KeptCount, p: float) -> float:
    """Var(X̃ | X > τ) − Var X by enumerating N ~ Binomial(|D_S|, p) against the discrete Laplace pmf of Y
    (q = e^{−1/t}, P[Y = y] = (1 − q)/(1 + q)·q^|y|), X = N + Y, X̃ = ``kept.corrected``."""
    m = np.arange(kept.n_s + 1)
    q = math.exp(-1.0 / kept.scale)
    y = np.arange(-60, 61)
    x = (m[:, None] + y[None, :]).ravel().astype(np.float64)
    w = (stats.binom.pmf(m, kept.n_s, p)[:, None] * ((1 - q) / (1 + q) * q ** np.abs(y))[None, :]).ravel()
    var_x = w @ x**2 - (w @ x) ** 2
    listed = x > kept.threshold
    wk = w[listed] / w[listed].sum()
    xt = kept.corrected(x[listed])
    return float(wk @ xt**2 - (wk @ xt) ** 2 - var_x)


def _reuse_fixture(kept: KeptCount | None, s_counts: np.ndarray | None) -> OptinEstimates:
    """HL = {⟨1,10⟩, ⟨1,11⟩, ⟨1,*⟩; ⟨2,20⟩, ⟨2,*⟩; ⟨*,*⟩}; the three real records reuse S (J = 2);
    |D_T| = 100, |D_S| = 200, noise of ε = 4 discrete Laplace (t = 1/2), τ_d = 7, so λ = |D_S|·p is near τ."""
    hl = HeadList.from_lists([1, 2], [[10, 11], [20]])
    p_rec = np.array([0.045, 0.05, 0.02, 0.035, 0.03, 0.01])
    draws = np.array([2, 2, 1, 2, 1, 1])
    p_q = np.array([0.115, 0.065, 0.01])
    reused = np.array([True, True, False, True, False, False])
    var_y = KeptCount(7.0, True, 0.5, 200).noise_variance
    return OptinEstimates(hl, p_rec, np.zeros(6), draws, p_q, np.zeros(3), np.array([5, 3, 1]), 100, var_y,
                          reused, 200, s_counts, kept)


def test_record_and_query_variances_add_the_enumerated_excess_of_the_corrected_count() -> None:
    """A reused record's σ̂²_O is §4's formula over n = |D_S| + |D_T| with its J, plus (Var(X̃ | kept) − Var X)/n²
    (§4.1 "Variance"), the excess checked against an exact enumeration of the law of X (to 0.1%, the table's
    interpolation); every other entry is T's §4 formula over |D_T| with nothing added. A query's σ̂²_O is the
    pooled §4.1 formula plus its reused records' excesses; without the correction (kept None) nothing is added."""
    kept = KeptCount(7.0, True, 0.5, 200)
    est = _reuse_fixture(kept, None)
    n, v = 300, est.noise_variance
    ex = np.array([_enumerated_excess(kept, float(p)) if r else 0.0
                   for p, r in zip(est.p_record, est.reused, strict=True)]) / n**2
    assert ex[0] > 1e-4 and ex[3] > 1e-4  # the excess is as large as the sampling variance here
    base = np.where(est.reused, optin_variance(est.p_record, est.draws_record, n, v),
                    optin_variance(est.p_record, est.draws_record, 100, v))
    got = est.record_variances_at(est.p_record)
    np.testing.assert_allclose(got[~est.reused], base[~est.reused], rtol=1e-12)
    np.testing.assert_allclose(got[est.reused], (base + ex)[est.reused], rtol=0, atol=1e-3 * ex.max())
    pooled = reuse_query_variances(est.p_record, est.p_query, est.draws_record, est.reused,
                                   est.head_list.entry_query, 100, 200, v)
    qry = est.query_variances_at(est.p_query, est.p_record)
    np.testing.assert_allclose(qry, pooled + np.array([ex[0] + ex[1], ex[3], 0.0]), rtol=0, atol=2e-3 * ex.max())
    assert qry[2] == pytest.approx(0.01 * 0.99 / 99 + v / 9900, rel=1e-12, abs=0.0)  # ⟨*,*⟩ alone: T's estimate
    rec2, qry2 = est.variances_at(est.p_record, est.p_query)
    np.testing.assert_array_equal(rec2, got)
    np.testing.assert_array_equal(qry2, qry)
    plain = _reuse_fixture(None, None)
    np.testing.assert_allclose(plain.record_variances_at(plain.p_record), base, rtol=1e-12)
    np.testing.assert_allclose(plain.query_variances_at(plain.p_query, plain.p_record), pooled, rtol=1e-12)


def test_reported_variances_use_the_excess_estimated_from_the_released_counts() -> None:
    """With S's released counts X known, a reused record's reported variance is §4's pooled formula plus
    r(X)/n² in place of the excess at p (§4.1 "Reported variance"), with ALGORITHM.md's values at ε = 4
    (discrete noise, τ_d = 7): r(8) = 0.16, r(9) = 71.8, r(10) = 2.4 counts²; a query adds its records' r.
    Entries without a released count (NaN) add nothing and stay T's §4 formula over |D_T|."""
    kept = KeptCount(7.0, True, 0.5, 200)
    est = _reuse_fixture(kept, np.array([9.0, 10.0, np.nan, 8.0, np.nan, np.nan]))
    n, v = 300, est.noise_variance
    r = np.array([71.8, 2.4, 0.0, 0.16, 0.0, 0.0]) / n**2
    base = np.where(est.reused, optin_variance(est.p_record, est.draws_record, n, v),
                    optin_variance(est.p_record, est.draws_record, 100, v))
    pooled = reuse_query_variances(est.p_record, est.p_query, est.draws_record, est.reused,
                                   est.head_list.entry_query, 100, 200, v)
    rec, qry = est.reported_variances_at(est.p_record, est.p_query)
    np.testing.assert_allclose(rec, base + r, rtol=1e-12, atol=0.03 / n**2)
    np.testing.assert_allclose(qry, pooled + np.array([r[0] + r[1], r[3], 0.0]), rtol=1e-12, atol=0.04 / n**2)
    assert rec[0] > est.record_variances_at(est.p_record)[0]  # r(9) is far above the excess at p = 0.045


def test_reported_variances_without_released_counts_are_the_blend_variances() -> None:
    """Without S's released counts (or without the correction) the reported variances are those of
    :meth:`variances_at` (ALGORITHM.md §4.1, "What crosses machines")."""
    kept = KeptCount(7.0, True, 0.5, 200)
    for est in (_reuse_fixture(kept, None), _reuse_fixture(None, np.array([9.0, 10.0, np.nan, 8.0, np.nan, np.nan]))):
        rec, qry = est.reported_variances_at(est.p_record, est.p_query)
        want_rec, want_qry = est.variances_at(est.p_record, est.p_query)
        np.testing.assert_array_equal(rec, want_rec)
        np.testing.assert_array_equal(qry, want_qry)


def test_optin_variance_is_silently_infinite_below_two_records() -> None:
    """n = 0 and n = 1 give σ̂² = ∞ without a floating-point warning, whether p̂(1−p̂) and J are 0 or not
    (0/0 and x/0 are both expected there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (0, 1):
            got = optin_variance(np.array([0.5, 0.0, 0.0]), np.array([1, 0, 1]), n, 2.0)
            assert np.isinf(got).all()


def test_optin_variance_does_not_overflow_for_huge_record_counts() -> None:
    """n(n−1) exceeds 2⁶³ at n = 4·10⁹; the §4 formula must still hold there:
    0.25/(n − 1) + 1·2/(n(n − 1)) with n = 4,000,000,000 (computed here with exact integers)."""
    n = 4_000_000_000
    got = optin_variance(np.array([0.5]), np.array([1]), n, 2.0)
    assert got[0] == pytest.approx(0.25 / (n - 1) + 2 / (n * (n - 1)), rel=1e-12, abs=0.0)

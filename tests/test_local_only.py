"""PEM heavy hitters and the local-only baseline (no opt-in group) end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybriddp.core.errors import ParameterError
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import NO_URL, ArrayVocabulary, RecordLog
from hybriddp.core.rng import STREAMS, stage_rng
from hybriddp.simulation.baselines.local_only import ItemCoding, mix64, run_local_only
from hybriddp.simulation.baselines.pem import default_eta, pem, prefix_schedule
from hybriddp.simulation.pipeline import Stages
from hybriddp.simulation.scoring import Truth, generalized_ndcg, query_ndcg
from logdata import zipf_log


# ----- PEM ------------------------------------------------------------------------------------
def test_prefix_schedule_and_default_eta() -> None:
    assert prefix_schedule(19, 50, 4) == [10, 14, 18, 19]  # γ = ⌈log2 50⌉ = 6; s_j = γ + jη, last = L
    assert prefix_schedule(22, 500, 2) == [11, 13, 15, 17, 19, 21, 22]
    assert prefix_schedule(5, 50, 4) == [5]  # the whole domain at once
    assert prefix_schedule(12, 4, 3, gamma=0) == [3, 6, 9, 12]
    assert default_eta(260_000, 50) == 4
    assert default_eta(2_500_000, 500) == 2
    assert default_eta(10**9, 10**4) == 1
    with pytest.raises(ValueError):
        prefix_schedule(33, 50, 2)
    with pytest.raises(ValueError):
        prefix_schedule(20, 50, 0)


def _easy_population(rng: np.random.Generator, n: int, n_bits: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k heavy items (Zipf mass 0.6, at random codes) over a uniform tail."""
    heavy = rng.choice(1 << n_bits, size=k, replace=False)
    w = 1.0 / np.arange(1, k + 1)
    n_heavy = np.floor(0.6 * n * w / w.sum()).astype(np.int64)
    tail = rng.integers(0, 1 << n_bits, n - int(n_heavy.sum()))
    values = np.concatenate([np.repeat(heavy, n_heavy), tail])
    return rng.permutation(values), heavy


def test_pem_recovers_true_top_k_at_large_epsilon() -> None:
    rng = np.random.default_rng(5)
    n, n_bits, k = 120_000, 18, 10
    values, heavy = _easy_population(rng, n, n_bits, k)
    res = pem(values, n_bits, 6.0, np.random.default_rng(6), k=k, eta=3)
    assert set(res.items.tolist()) == set(heavy.tolist())
    assert res.prefix_bits == [7, 10, 13, 16, 18]
    assert sum(res.users_per_round) == n  # every user reports in exactly one round
    assert max(res.users_per_round) - min(res.users_per_round) <= 1
    assert res.candidates_per_round == [128, 80, 80, 80, 40]
    true_freq = np.bincount(np.searchsorted(np.sort(heavy), values[np.isin(values, heavy)]), minlength=k) / n
    est = dict(zip(res.items.tolist(), res.freq.tolist(), strict=True))
    got = np.array([est[h] for h in np.sort(heavy).tolist()])
    # frequencies from the last round's group of n_g users: the group's own frequency differs from the
    # population's by sampling without replacement, f(1−f)(1/n_g − 1/n), and OLH's support count adds
    # [f·p(1−p) + (1−f)·q(1−q)]/(n_g(p−q)²), with p = e^ε/(e^ε + g − 1), q = 1/g, g = round(e^ε + 1) = 404
    n_g = res.users_per_round[-1]
    g = 404
    p_keep, q_hit = math.exp(6.0) / (math.exp(6.0) + g - 1), 1 / g
    sd = np.sqrt(true_freq * (1 - true_freq) * (1 / n_g - 1 / n)
                 + (true_freq * p_keep * (1 - p_keep) + (1 - true_freq) * q_hit * (1 - q_hit))
                 / (n_g * (p_keep - q_hit) ** 2))
    assert sd.max() < 0.004  # a few tenths of a percent, against frequencies from 0.02 to 0.2
    np.testing.assert_array_less(np.abs(got - true_freq), 6 * sd)  # each p ≈ 2e-9
    assert np.all(np.diff(res.freq) <= 0)  # ranked by estimate


def test_pem_domain_size_prunes_impossible_prefixes() -> None:
    """With a public domain [0, D), no candidate (and so no output) lies past D."""
    rng = np.random.default_rng(8)
    values = rng.integers(0, 600, 5000)  # 10 bits, 600 of 1024 codes used
    res = pem(values, 10, 0.5, np.random.default_rng(9), k=50, eta=2, domain_size=600)
    assert np.all(res.items < 600) and len(res.items) == 50
    assert res.candidates_per_round[0] == 150  # 8-bit prefixes p with 4p < 600
    unpruned = pem(values, 10, 0.5, np.random.default_rng(9), k=50, eta=2)
    assert unpruned.candidates_per_round[0] == 256


def test_pem_is_deterministic_for_a_generator_seed() -> None:
    values, _ = _easy_population(np.random.default_rng(1), 20_000, 14, 5)
    a = pem(values, 14, 3.0, np.random.default_rng(2), k=5)
    b = pem(values, 14, 3.0, np.random.default_rng(2), k=5)
    assert np.array_equal(a.items, b.items) and np.array_equal(a.freq, b.freq)


# ----- item coding ----------------------------------------------------------------------------
def test_item_coding_round_trip_and_mixing() -> None:
    log = zipf_log(n_users=3000, seed=2)
    coding = ItemCoding.build(log.query, log.url)
    codes = coding.encode(log.query, log.url)
    assert coding.n_items == len(np.unique(codes))
    assert 2 ** (coding.n_bits - 1) < coding.n_items <= 2**coding.n_bits
    assert np.array_equal(np.sort(np.unique(codes)), np.arange(coding.n_items))
    q, u = coding.decode(codes)
    assert np.array_equal(q, log.query) and np.array_equal(u, log.url)
    # codes do not follow id order (popular = small ids in the synthetic logs)
    assert not np.array_equal(np.argsort(coding.key_of_code), np.arange(coding.n_items))
    assert len(np.unique(mix64(np.arange(10_000)))) == 10_000  # a bijection
    # query-only coding
    qcoding = ItemCoding.build(log.query, log.url, url_level=False)
    assert qcoding.n_items == len(np.unique(log.query))
    assert np.all(qcoding.decode(qcoding.encode(log.query, log.url))[1] == NO_URL)


def test_new_streams_appended_without_moving_the_old_ones() -> None:
    assert STREAMS[:7] == ("partition", "split", "sample_optin", "sample_clients", "headlist_noise",
                           "optin_noise", "randomizer")
    assert STREAMS.index("local_split") >= 7 and STREAMS.index("local_discovery") >= 7
    child = np.random.SeedSequence(42).spawn(7)[STREAMS.index("randomizer")]
    assert stage_rng(42, "randomizer").random() == np.random.Generator(np.random.PCG64(child)).random()


# ----- run_local_only end to end --------------------------------------------------------------
@pytest.fixture(scope="module")
def log() -> RecordLog:
    return zipf_log(n_users=40_000, n_queries=300, urls_per_query=6, seed=3)


def test_run_local_only_end_to_end(log: RecordLog) -> None:
    params = BlenderParams(epsilon=4.0, head_list_size=20)
    stages = Stages()
    out = run_local_only(log, params, seed=11, stages=stages)
    s = out.sizes
    assert s["users"] == log.n_users == s["discovery_users"] + s["estimation_users"]
    assert s["discovery_users"] == round(0.5 * log.n_users)
    assert len(out.sampled) == log.n_users == s["sampled_records"]  # m_C = 1, every user has a record
    assert s["discovery_reports"] == s["discovery_users"]
    assert s["estimation_records"] == s["estimation_users"]
    assert out.head_list.n_records <= params.head_list_size
    assert s["head_list_records"] == out.head_list.n_records == s["discovered_records"]
    assert len(out.p_record) == len(out.p_record_raw) == out.head_list.n_entries
    assert len(out.p_query) == out.head_list.k
    assert np.all(out.p_record >= 0) and out.p_record.sum() == pytest.approx(1.0, abs=1e-9)
    assert out.p_record_raw.sum() == pytest.approx(1.0, abs=1e-9)  # the client estimator sums to 1
    assert out.p_query.sum() == pytest.approx(1.0, abs=1e-9)
    assert {"sample records", "PEM discovery", "randomize clients"} <= set(stages.seconds)
    # utility: the popular queries are found and ranked
    truth = Truth.from_records(out.sampled.query, out.sampled.url)
    assert query_ndcg(out.head_list, out.p_query, truth, 10) > 0.8
    assert generalized_ndcg(out.head_list, out.p_query, out.p_record, truth) > 0.5
    assert 0 in out.head_list.query_ids.tolist()  # the top Zipf query


def test_run_local_only_deterministic_for_a_seed(log: RecordLog) -> None:
    params = BlenderParams(epsilon=2.0, head_list_size=15)
    a = run_local_only(log, params, seed=5)
    b = run_local_only(log, params, seed=5)
    c = run_local_only(log, params, seed=6)
    assert np.array_equal(a.head_list.query_ids, b.head_list.query_ids)
    assert np.array_equal(a.head_list.entry_url, b.head_list.entry_url)
    assert np.array_equal(a.p_record_raw, b.p_record_raw) and np.array_equal(a.p_query, b.p_query)
    assert np.array_equal(a.sampled.rows, b.sampled.rows)
    assert a.sizes == b.sizes
    assert not np.array_equal(a.p_record_raw, c.p_record_raw)


def test_run_local_only_without_url_level() -> None:
    base = zipf_log(n_users=30_000, n_queries=200, seed=4)
    log = RecordLog(base.user_offsets, base.query, np.full(base.n_records, NO_URL, dtype=np.int32),
                    base.queries, ArrayVocabulary([]), has_urls=False)
    params = BlenderParams(epsilon=4.0, head_list_size=12, project=False)
    out = run_local_only(log, params, seed=1)
    hl = out.head_list
    assert hl.n_records == 0 and 0 < hl.n_queries <= 12  # queries only, no URLs
    assert np.array_equal(hl.kq, np.ones(hl.k))
    assert np.array_equal(out.p_record, out.p_record_raw)  # project=False
    np.testing.assert_allclose(out.p_record, out.p_query)  # one entry per query
    assert out.sizes["distinct_items"] == len(np.unique(out.sampled.query))


def test_run_local_only_with_several_records_per_user(log: RecordLog) -> None:
    params = BlenderParams(epsilon=4.0, head_list_size=20, m_c=3)
    out = run_local_only(log, params, seed=2, discovery_fraction=0.3)
    counts = np.diff(log.user_offsets)
    assert len(out.sampled) == int(np.minimum(counts, 3).sum())
    assert out.sizes["discovery_users"] == round(0.3 * log.n_users)
    assert out.sizes["discovery_reports"] == out.sizes["discovery_users"]  # one record each
    assert out.p_record.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.2, "half"])
def test_bad_discovery_fraction(log: RecordLog, fraction: object) -> None:
    with pytest.raises(ParameterError):
        run_local_only(log, BlenderParams(), seed=1, discovery_fraction=fraction)  # type: ignore[arg-type]


def test_hashed_coding_needs_no_domain_knowledge() -> None:
    rng = np.random.default_rng(3)
    q = rng.integers(0, 5000, 20_000)
    u = rng.integers(0, 7, 20_000)
    coding = ItemCoding.build(q, u, item_bits=32)
    assert coding.hashed and coding.n_bits == 32
    codes = coding.encode(q, u)
    assert codes.min() >= 0 and codes.max() < 2**32
    back_q, back_u = coding.decode(codes)
    assert np.mean((back_q == q) & (back_u == u)) > 0.999  # collisions are ~n²/2^33: rare
    assert coding.known(codes).all()
    unused = np.setdiff1d(np.arange(1000, dtype=np.int64), codes)[:5]  # codes no record hashes to
    assert len(unused) and not coding.known(unused).any()
    with pytest.raises(ValueError, match="item_bits"):
        ItemCoding.build(q, u, item_bits=40)
    out = run_local_only(zipf_log(n_users=20_000, seed=1), BlenderParams(head_list_size=10), seed=2, item_bits=32)
    assert out.sizes["item_bits"] == 32 and out.head_list.n_records <= 10

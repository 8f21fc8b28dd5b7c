"""The batch randomizer (device/batch.py): LocalAlg on arrays of records, by hand with replayed uniforms (each
branch, thresholds hit exactly, draws not taken); its chunks (their count at n % CHUNK ∈ {0, 1, CHUNK − 1}) and the
threads they run on draw exactly what chunk_uniforms replays."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from clihelpers import exact_message
from hybriddp.core.headlist import HeadList
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.core.threads import set_default_threads
from hybriddp.device import batch as randomizer
from hybriddp.device.batch import chunk_uniforms, randomize_batch


@pytest.mark.parametrize("threads", [1, 2])
def test_chunked_batch_equals_replayed_uniforms(monkeypatch, threads: int) -> None:
    monkeypatch.setattr(randomizer, "CHUNK", 1000)  # many chunks on a small input
    hl = HeadList.from_lists([0, 1, 2], [[0, 1], [2], []])
    lp = LocalAlgParams.build(hl, 2.0, 1e-5, 0.85, 1)
    entries = np.random.default_rng(1).integers(0, hl.n_entries, 5500)
    got = randomize_batch(entries, hl, lp, np.random.default_rng(9), threads=threads)
    uniforms = np.concatenate([v for _, v in chunk_uniforms(np.random.default_rng(9), len(entries))], axis=1)
    assert uniforms.shape == (3, 5500)
    assert np.array_equal(got, randomize_batch(entries, hl, lp, uniforms=uniforms))
    # and a different seed gives different reports
    assert not np.array_equal(got, randomize_batch(entries, hl, lp, np.random.default_rng(10), threads=threads))


# ----- LocalAlg on arrays, by hand with replayed uniforms -----------------------------------------------------

def _batch_setup() -> tuple[HeadList, LocalAlgParams]:
    # entries 0 ⟨a,u0⟩, 1 ⟨a,u1⟩, 2 ⟨a,*⟩, 3 ⟨b,*⟩, 4 ⟨*,*⟩; ε = 1, δ = 0.1, f_C = ½ as _device() of test_localalg.py
    hl = HeadList.from_lists([0, 1], [[0, 1], []])
    return hl, LocalAlgParams.build(hl, 1.0, 0.1, 0.5, 1)


def test_randomize_batch_by_hand() -> None:
    """The cases of test_local_alg_draws_by_hand (test_localalg.py) as entries, three uniforms (v1, v2, v3) per
    report."""
    hl, lp = _batch_setup()
    cases = [  # (record entry, v1, v2, v3, report entry)
        (3, 0.0, 0.4, 0.5, 1), (3, 0.0, 0.6, 0.9, 4), (1, 0.0, 0.0, 0.99, 3), (4, 0.0, 0.99, 0.7, 3),
        (4, 0.0, 0.2, 0.7, 2), (1, "1-t", 0.0, 0.5, 2), (1, "1-t", 0.0, 0.2, 0), (0, 0.99, 0.0, 0.2, 1),
        (2, 0.99, 0.0, 0.99, 1), (1, 0.99, "1-tq", 0.5, 1), (3, 0.99, 0.0, 0.0, 3), (4, 0.99, 0.0, 0.0, 4),
    ]

    def value(v: object) -> float:
        return lp.one_minus_t if v == "1-t" else float(lp.one_minus_tq[0]) if v == "1-tq" else float(v)

    entries = np.array([c[0] for c in cases])
    uniforms = np.array([[value(c[i]) for c in cases] for i in (1, 2, 3)])
    got = randomize_batch(entries, hl, lp, uniforms=uniforms)
    assert got.tolist() == [c[4] for c in cases] and got.dtype == np.int64
    with pytest.raises(ValueError, match=exact_message("randomize_batch needs rng or uniforms")):
        randomize_batch(entries, hl, lp)


def test_randomize_batch_with_only_the_wildcard() -> None:
    hl = HeadList.from_lists([], [])
    lp = LocalAlgParams.build(hl, 1.0, 0.1, 0.5, 1)
    got = randomize_batch([0, 0, 0], hl, lp)  # needs no randomness at all
    assert got.tolist() == [0, 0, 0] and got.dtype == np.int64


def test_randomize_batch_of_no_records() -> None:
    hl, lp = _batch_setup()
    for entries in ([], np.array([], dtype=np.int64)):
        got = randomize_batch(entries, hl, lp, np.random.default_rng(0))  # an empty list is read as integers
        assert got.tolist() == [] and got.dtype == np.int64


def test_randomize_batch_thread_pool_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks run on ``threads`` threads (default: default_threads()); one thread or one chunk: no pool."""
    hl, lp = _batch_setup()
    pools: list[int | None] = []

    class CountingPool(ThreadPoolExecutor):
        def __init__(self, max_workers: int | None = None) -> None:
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(randomizer, "ThreadPoolExecutor", CountingPool)
    monkeypatch.setattr(randomizer, "CHUNK", 4)
    entries = np.arange(10) % 5  # three chunks
    reference = randomizer.randomize_batch(entries, hl, lp, np.random.default_rng(3), threads=1)
    assert pools == []
    for threads, expected in [(3, [3]), (2, [2])]:
        pools.clear()
        got = randomizer.randomize_batch(entries, hl, lp, np.random.default_rng(3), threads=threads)
        assert pools == expected and got.tolist() == reference.tolist()
    pools.clear()
    randomizer.randomize_batch(entries[:4], hl, lp, np.random.default_rng(3), threads=4)  # one chunk
    assert pools == []
    try:
        for default, expected in [(5, [5]), (1, [])]:
            set_default_threads(default)
            pools.clear()
            got = randomizer.randomize_batch(entries, hl, lp, np.random.default_rng(3))
            assert pools == expected and got.tolist() == reference.tolist()
    finally:
        set_default_threads(None)


# ----- the chunks: their count at n % CHUNK ∈ {0, 1, CHUNK − 1}, and the thread pool --------------------------

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


@pytest.mark.parametrize("dtype", [np.uint64, np.int32, np.uint8])
def test_randomize_batch_returns_integer_entries_whatever_the_entries_integer_type(dtype: type) -> None:
    """Reports are head-list entry indices (int64, usable by np.bincount), and the same reports for the same
    records and uniforms whatever integer type the entries come in (unsigned 64-bit arithmetic must not turn
    ⟨q,u⟩ offsets into floats)."""
    hl, lp = _batch_setup()
    entries = np.random.default_rng(5).integers(0, hl.n_entries, 400)
    uniforms = np.random.default_rng(6).random((3, 400))
    want = randomize_batch(entries.astype(np.int64), hl, lp, uniforms=uniforms)
    got = randomize_batch(entries.astype(dtype), hl, lp, uniforms=uniforms)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert np.bincount(got, minlength=hl.n_entries).sum() == 400
    assert {int(x) for x in got} <= set(range(hl.n_entries)) and len(set(got.tolist())) == hl.n_entries


@pytest.mark.parametrize("dtype", [np.uint64, np.int32])
def test_local_alg_params_of_shape_stores_int64_kq_and_the_same_law(dtype: type) -> None:
    """LocalAlgParams.kq is int64 (its documented type) whatever integer array the shape comes in, so the report
    law built from it is a stochastic matrix equal to the one from a list of ints (ALGORITHM.md §5)."""
    shape = [3, 1, 2, 1]
    ref = LocalAlgParams.of_shape(shape, 1.0, 0.1, 0.5, 1)
    lp = LocalAlgParams.of_shape(np.array(shape, dtype=dtype), 1.0, 0.1, 0.5, 1)
    assert lp.kq.dtype == np.int64 and lp.kq.tolist() == shape and lp.k == 4
    law = output_distribution(lp)
    assert law.shape == (7, 7) and np.allclose(law.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.array_equal(law, output_distribution(ref))

"""The chunked, threaded batch randomizer draws exactly what chunk_uniforms replays."""

from __future__ import annotations

import numpy as np
import pytest

from hybriddp import randomizer
from hybriddp.headlist import HeadList
from hybriddp.randomizer import LocalAlgParams, chunk_uniforms, randomize_batch


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

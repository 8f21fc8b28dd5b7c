"""The union L1 (ALGORITHM.md §9): over the listed items ∪ the true top-k, missing items estimated 0.

Expected values are worked out by hand from the definition in the comments; the end-to-end case checks the
property the metric exists for: a junk list (NDCG 0) cannot score better than a list that finds the top.
"""

from __future__ import annotations

import numpy as np
import pytest

from hybriddp.core.headlist import HeadList
from hybriddp.core.params import BlenderParams
from hybriddp.simulation import scoring as M
from hybriddp.simulation.algorithms import run_algorithm
from logdata import zipf_log


def _truth() -> M.Truth:
    # queries 1 (0.5), 2 (0.3), 3 (0.2); records ⟨1,10⟩ .3, ⟨1,11⟩ .2, ⟨2,20⟩ .3, ⟨3,30⟩ .2
    q = np.array([1] * 5 + [2] * 3 + [3] * 2)
    u = np.array([10, 10, 10, 11, 11, 20, 20, 20, 30, 30])
    return M.Truth.from_records(q, u)


def test_a_list_of_the_true_top_k_scores_its_own_l1() -> None:
    t = _truth()
    # the true top-2 records are ⟨1,10⟩ (.3) and ⟨2,20⟩ (.3); listed with estimates .25 and .35
    hl = HeadList.from_lists([1, 2], [[10], [20]])  # entries ⟨1,10⟩ ⟨1,*⟩ ⟨2,20⟩ ⟨2,*⟩ ⟨*,*⟩
    p_rec = np.array([0.25, 0.0, 0.35, 0.0, 0.4])
    assert M.l1_union_records(hl, p_rec, t) == pytest.approx(0.05 + 0.05)
    assert M.l1_union_records(hl, p_rec, t) == pytest.approx(M.l1_records(hl, p_rec, t))


def test_a_junk_list_pays_the_mass_it_misses() -> None:
    t = _truth()
    # two listed records nobody has (true 0), estimated .01 each: own L1 = .02
    junk = HeadList.from_lists([7, 8], [[70], [80]])
    p_junk = np.array([0.01, 0.0, 0.01, 0.0, 0.98])
    assert M.l1_records(junk, p_junk, t) == pytest.approx(0.02)
    # union: + the true top-2 records, both missing (estimate 0): |0 − .3| + |0 − .3|
    assert M.l1_union_records(junk, p_junk, t) == pytest.approx(0.02 + 0.3 + 0.3)
    # a good list with worse estimates: ⟨1,10⟩ at .2 and ⟨2,20⟩ at .2, own L1 = .2 > the junk's .02 ...
    good = HeadList.from_lists([1, 2], [[10], [20]])
    p_good = np.array([0.2, 0.0, 0.2, 0.0, 0.6])
    assert M.l1_records(good, p_good, t) == pytest.approx(0.2)
    assert M.l1_records(good, p_good, t) > M.l1_records(junk, p_junk, t)
    # ... but the better union L1: .2 against .62
    assert M.l1_union_records(good, p_good, t) == pytest.approx(0.2)
    assert M.l1_union_records(good, p_good, t) < M.l1_union_records(junk, p_junk, t)


def test_ties_at_the_kth_frequency_favour_the_list() -> None:
    t = _truth()
    # k = 1: ⟨1,10⟩ and ⟨2,20⟩ tie at .3; listing either one misses nothing: L1 = |.3 − .3| = 0
    for qid, url in ((1, 10), (2, 20)):
        hl = HeadList.from_lists([qid], [[url]])
        assert M.l1_union_records(hl, np.array([0.3, 0.0, 0.7]), t) == pytest.approx(0.0)
    # listing ⟨1,11⟩ (.2, estimated .2) misses one of the tied .3 records: 0 + .3
    hl = HeadList.from_lists([1], [[11]])
    assert M.l1_union_records(hl, np.array([0.2, 0.0, 0.8]), t) == pytest.approx(0.3)
    # k = 3 over records .3 .3 .2 .2: the third slot is one of the two .2 records; listing ⟨1,10⟩ ⟨2,20⟩ ⟨3,30⟩
    # exactly: 0; listing ⟨1,10⟩ ⟨1,11⟩ ⟨3,30⟩ exactly misses ⟨2,20⟩ only: .3 (the .2 tie is covered by the list)
    exact = HeadList.from_lists([1, 3], [[10, 11], [30]])  # ⟨1,10⟩ ⟨1,11⟩ ⟨1,*⟩ ⟨3,30⟩ ⟨3,*⟩ ⟨*,*⟩
    assert M.l1_union_records(exact, np.array([0.3, 0.2, 0.0, 0.2, 0.0, 0.3]), t) == pytest.approx(0.3)


def test_queries_form() -> None:
    t = _truth()
    # listed queries 3 (.2, estimated .25) and 9 (unseen, estimated .1); true top-2 queries 1 (.5), 2 (.3)
    hl = HeadList.from_lists([3, 9], [[30], [90]])
    got = M.l1_union_queries(hl, np.array([0.25, 0.1, 0.65]), t)
    assert got == pytest.approx(0.05 + 0.1 + 0.5 + 0.3)
    assert M.l1_union(np.array([], dtype=np.int64), np.array([]), t.query_ids, t.query_freq) == 0.0


def test_local_only_without_dictionary_cannot_win_the_union_l1() -> None:
    """At ε = 1 the hashed local-only list finds noise (its NDCG@10 is far below BLENDER's) yet its own-list L1
    can be the smallest, since its records are rare or absent; over the union with the true top 10 it pays the
    mass it missed and loses to BLENDER."""
    log = zipf_log(n_users=30_000, seed=1)
    params = BlenderParams(epsilon=1.0, head_list_size=10, optin_fraction=0.1)
    junk = run_algorithm("local-only-hashed", log, params, seed=2)
    good = run_algorithm("blender", log, params, seed=2)
    assert junk.metrics["ndcg_queries_at_10"] < good.metrics["ndcg_queries_at_10"] - 0.3
    if junk.metrics["mass_outside_head_list"] == 1.0:  # no listed record exists: nothing of the top 10 is listed
        assert junk.metrics["l1_union"] > junk.metrics["l1"] + 0.1  # the top 10 of a Zipf log hold far more
    # the union adds at least the true mass of every true top-10 record the junk list does not hold
    assert junk.metrics["l1_union"] >= junk.metrics["l1"]
    assert junk.metrics["l1_union"] > good.metrics["l1_union"]

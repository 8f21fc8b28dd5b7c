"""Utility metrics (ALGORITHM.md §9), checked against values computed by hand from the definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybriddp.core.headlist import HeadList
from hybriddp.simulation import scoring as M


def _dcg(rels: list[float]) -> float:
    return sum((2.0 ** r - 1.0) / math.log2(i + 2) for i, r in enumerate(rels))


def test_ndcg_by_hand() -> None:
    # truth: a 0.5, b 0.3, c 0.2; estimated order [b, a] (k = 2): rel scaled by 0.5 + 0.3
    got = M.ndcg(np.array([0.3, 0.5]), np.array([0.5, 0.3]))
    want = _dcg([0.3 / 0.8, 0.5 / 0.8]) / _dcg([0.5 / 0.8, 0.3 / 0.8])
    assert got == pytest.approx(want, rel=1e-12)
    assert got < 1.0
    assert M.ndcg(np.array([0.5, 0.3]), np.array([0.5, 0.3])) == pytest.approx(1.0)
    # an item outside the true top-k still counts with its own frequency
    got = M.ndcg(np.array([0.5, 0.2]), np.array([0.5, 0.3]))
    assert got == pytest.approx(_dcg([0.5 / 0.8, 0.2 / 0.8]) / _dcg([0.5 / 0.8, 0.3 / 0.8]))


def _truth() -> M.Truth:
    # queries 1 (0.5), 2 (0.3), 3 (0.2); records (1,10) .3 (1,11) .2 (2,20) .3 (3,30) .2
    q = np.array([1] * 5 + [2] * 3 + [3] * 2)
    u = np.array([10, 10, 10, 11, 11, 20, 20, 20, 30, 30])
    return M.Truth.from_records(q, u)


def test_truth_lookups() -> None:
    t = _truth()
    assert t.of_queries(np.array([1, 2, 3, 4])).tolist() == pytest.approx([0.5, 0.3, 0.2, 0.0])
    assert t.of_records(np.array([1, 1, 2]), np.array([11, 99, 20])).tolist() == pytest.approx([0.2, 0.0, 0.3])
    assert t.top_urls(1, 3).tolist() == pytest.approx([0.3, 0.2, 0.0])
    assert t.top_queries(2).tolist() == pytest.approx([0.5, 0.3])


def test_generalized_ndcg_and_l1_by_hand() -> None:
    t = _truth()
    # head list: query 1 with URLs [11, 10], query 2 with [20]; estimates rank query 2 first
    hl = HeadList.from_lists([1, 2], [[11, 10], [20]])
    # entries: 0 ⟨1,11⟩ 1 ⟨1,10⟩ 2 ⟨1,*⟩ 3 ⟨2,20⟩ 4 ⟨2,*⟩ 5 ⟨*,*⟩
    p_rec = np.array([0.25, 0.2, 0.0, 0.35, 0.0, 0.2])
    p_q = np.array([0.45, 0.35, 0.2])
    # URL NDCG of query 1: estimated [11 (.2), 10 (.3)] vs ideal [.3, .2], rel scaled by .5
    ndcg_q1 = _dcg([0.2 / 0.5, 0.3 / 0.5]) / _dcg([0.3 / 0.5, 0.2 / 0.5])
    assert M.url_ndcgs(hl, p_rec, t).tolist() == pytest.approx([ndcg_q1, 1.0])
    # query order by p_q: [1, 2] -> rel .5/.8, .3/.8
    want = ((2 ** (0.5 / 0.8) - 1) * ndcg_q1 + (2 ** (0.3 / 0.8) - 1) / math.log2(3)) / _dcg([0.5 / 0.8, 0.3 / 0.8])
    assert M.generalized_ndcg(hl, p_q, p_rec, t) == pytest.approx(want, rel=1e-12)
    assert M.generalized_ndcg(hl, p_q, p_rec, t, url_level=False) == pytest.approx(1.0)
    assert M.l1_records(hl, p_rec, t) == pytest.approx(abs(0.25 - 0.2) + abs(0.2 - 0.3) + abs(0.35 - 0.3))
    assert M.l1_queries(hl, p_q, t) == pytest.approx(0.05 + 0.05)
    assert M.query_ndcg(hl, np.array([0.1, 0.9, 0.0]), t) < 1.0


def test_hit_rates() -> None:
    hl = HeadList.from_lists([1, 2], [[11, 10], [20]])
    p_rec = np.array([0.25, 0.2, 0.0, 0.35, 0.0, 0.2])
    q = np.array([1, 1, 2, 9])
    u = np.array([11, 10, 21, 1])
    hit, top = M.hit_rates(hl, p_rec, q, u)
    assert hit == pytest.approx(3 / 4)
    assert top == pytest.approx(1 / 4)  # only ⟨1,11⟩ is the top URL of its query

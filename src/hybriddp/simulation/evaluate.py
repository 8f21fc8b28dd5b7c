"""Scoring any algorithm's head-list estimates against the non-private truth (ALGORITHM.md §9).

Every algorithm (BLENDER and the baselines) ends with a head list, a per-entry estimate vector
and a per-query estimate vector; :func:`score` turns them into the same metrics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hybriddp.core.headlist import HeadList
from hybriddp.core.records import RecordLog, SampledRecords
from hybriddp.simulation import scoring as M


def ground_truth(log: RecordLog, parts: Sequence[SampledRecords]) -> tuple[M.Truth, np.ndarray]:
    """Truth from the sampled records of all users, and the mask of held-out log records.

    The held-out records (not sampled) are the events of the local-search hit rate; when
    sampling took every record, all records are used instead.
    """
    q = np.concatenate([s.query for s in parts])
    u = np.concatenate([s.url for s in parts])
    held = np.ones(log.n_records, dtype=bool)
    for s in parts:
        held[s.rows] = False
    if not held.any():
        held[:] = True
    return M.Truth.from_records(q, u), held


def truth_vectors(hl: HeadList, truth: M.Truth) -> tuple[np.ndarray, np.ndarray]:
    """(p_q per listed query, p_r per entry with 0 for wildcards)."""
    real = ~hl.is_wildcard
    tr = np.zeros(hl.n_entries)
    tr[real] = truth.of_records(hl.query_ids[hl.entry_query[real]], hl.entry_url[real])
    return truth.of_queries(hl.query_ids), tr


def score(hl: HeadList, p_record: np.ndarray, p_query: np.ndarray, truth: M.Truth, log: RecordLog,
          held: np.ndarray, p_rank: np.ndarray | None = None) -> dict[str, float | None]:
    """L1 (over the list, and over the list ∪ the true top-k: ``l1_union``), NDCG (generalized, queries,
    queries@10), hit rates and the mass outside HL (ALGORITHM.md §9). The NDCGs rank queries by ``p_rank`` when
    given (a defended round's guarded ranking score, ALGORITHM.md §7.2), else by ``p_query``."""
    url_level = log.has_urls
    _, tr = truth_vectors(hl, truth)
    hit, top = M.hit_rates(hl, p_record, log.query, log.url, held)
    ranked = p_query if p_rank is None else p_rank
    return {
        "ndcg": M.generalized_ndcg(hl, ranked, p_record, truth, url_level),
        "ndcg_queries": M.query_ndcg(hl, ranked, truth),
        "ndcg_queries_at_10": M.query_ndcg(hl, ranked, truth, 10),
        "l1": M.l1_records(hl, p_record, truth) if url_level else M.l1_queries(hl, p_query, truth),
        "l1_queries": M.l1_queries(hl, p_query, truth),
        "l1_union": (M.l1_union_records(hl, p_record, truth) if url_level
                     else M.l1_union_queries(hl, p_query, truth)),
        "hit_rate": hit,
        "top_url_rate": top if url_level else None,
        "mass_outside_head_list": float(1.0 - tr.sum()),
    }

"""Utility metrics: L1, NDCG, generalized NDCG, local-search hit rate (ALGORITHM.md §9, paper §4).

Ground truth is the empirical distribution of the sampled records of all users (opt-in and
clients together). Wildcards are dropped from every metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hybriddp.core.counting import CountingBackend, default_backend
from hybriddp.core.headlist import HeadList, record_keys


@dataclass
class Truth:
    """Non-private empirical frequencies of queries and records (ALGORITHM.md §9)."""

    query_ids: np.ndarray  # sorted distinct query ids
    query_freq: np.ndarray
    keys: np.ndarray  # sorted distinct record keys
    record_freq: np.ndarray
    n: int
    _top_queries: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)

    @classmethod
    def from_records(cls, query: np.ndarray, url: np.ndarray,
                     backend: CountingBackend | None = None) -> Truth:
        """Count the sampled records of all users."""
        backend = backend or default_backend()
        n = max(len(query), 1)
        qids, qc = backend.count_distinct(np.asarray(query, dtype=np.int64))
        keys, kc = backend.count_distinct(record_keys(query, url))
        return cls(qids, qc / n, keys, kc / n, len(query))

    @staticmethod
    def _lookup(sorted_ids: np.ndarray, values: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if len(sorted_ids) == 0:
            return np.zeros(len(ids))
        i = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
        return np.where(sorted_ids[i] == ids, values[i], 0.0)

    def of_queries(self, qids: np.ndarray) -> np.ndarray:
        """p_q for the given query ids (0 for unseen)."""
        return self._lookup(self.query_ids, self.query_freq, np.asarray(qids, dtype=np.int64))

    def of_records(self, query: np.ndarray, url: np.ndarray) -> np.ndarray:
        """p_⟨q,u⟩ for the given records (0 for unseen)."""
        return self._lookup(self.keys, self.record_freq, record_keys(query, url))

    def top_queries(self, k: int) -> np.ndarray:
        """The k largest query frequencies, descending (zero-padded). The largest k asked so far is kept: the
        metrics ask several times, and each partition of millions of query frequencies costs ~0.4 s at Yandex
        scale."""
        if k > len(self._top_queries):
            self._top_queries = _top(self.query_freq, k)
        return self._top_queries[:k].copy()

    def top_urls(self, qid: int, k: int) -> np.ndarray:
        """The k largest record frequencies among query ``qid``'s URLs, descending."""
        lo, hi = np.searchsorted(self.keys, [np.int64(qid) << 32, np.int64(qid + 1) << 32])
        return _top(self.record_freq[lo:hi], k)


def _top(freq: np.ndarray, k: int) -> np.ndarray:
    """The k largest values of ``freq``, descending, zero-padded to length k."""
    out = np.zeros(k)
    m = min(k, len(freq))
    if m == 0:
        return out
    part = np.partition(freq, len(freq) - m)[len(freq) - m:] if m < len(freq) else freq
    out[:m] = np.sort(part)[::-1]
    return out


def _discount(k: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, k + 2))


def ndcg(true_freq_in_estimated_order: np.ndarray, ideal_top: np.ndarray,
         inner: np.ndarray | None = None) -> float:
    """NDCG_k = DCG_k/IDCG_k with rel = true frequency / Σ of the true top-k (ALGORITHM.md §9).

    Parameters
    ----------
    true_freq_in_estimated_order : true frequency of the i-th item of the estimated list.
    ideal_top : the true top-k frequencies, descending (k = the estimated list's length).
    inner : optional per-position factor (the URL-list NDCG of generalized NDCG).
    """
    k = len(true_freq_in_estimated_order)
    total = float(np.sum(ideal_top))
    if k == 0 or total <= 0:
        return 0.0
    disc = _discount(k)
    gains = np.exp2(np.asarray(true_freq_in_estimated_order) / total) - 1.0
    if inner is not None:
        gains = gains * inner
    ideal = (np.exp2(np.asarray(ideal_top) / total) - 1.0) * disc
    return float((gains * disc).sum() / ideal.sum())


def url_ndcgs(hl: HeadList, p_record: np.ndarray, truth: Truth) -> np.ndarray:
    """NDCG^q of each listed query's URL list, URLs ordered by ``p_record`` (``*`` dropped)."""
    out = np.zeros(hl.n_queries)
    for i in range(hl.n_queries):  # loop over head-list queries, not records
        lo, hi = int(hl.url_offsets[i]), int(hl.url_offsets[i + 1]) - 1
        if hi <= lo:
            continue
        qid = int(hl.query_ids[i])
        urls = hl.entry_url[lo:hi][np.argsort(-p_record[lo:hi], kind="stable")]
        est = truth.of_records(np.full(len(urls), qid), urls)
        out[i] = ndcg(est, truth.top_urls(qid, len(urls)))
    return out


def generalized_ndcg(hl: HeadList, p_query: np.ndarray, p_record: np.ndarray, truth: Truth,
                     url_level: bool = True) -> float:
    """NDCG^Q of the list of lists (ALGORITHM.md §9): queries by p̂_q, each weighted by its URL NDCG."""
    k = hl.n_queries
    if k == 0:
        return 0.0
    order = np.argsort(-p_query[:k], kind="stable")
    inner = url_ndcgs(hl, p_record, truth)[order] if url_level else np.ones(k)
    return ndcg(truth.of_queries(hl.query_ids[order]), truth.top_queries(k), inner)


def query_ndcg(hl: HeadList, p_query: np.ndarray, truth: Truth, k: int | None = None) -> float:
    """Traditional NDCG@k of the query ranking (Fig. 12 uses k = 10)."""
    order = np.argsort(-p_query[:hl.n_queries], kind="stable")
    if k is not None:
        order = order[:k]
    return ndcg(truth.of_queries(hl.query_ids[order]), truth.top_queries(len(order)))


def l1_records(hl: HeadList, p_record: np.ndarray, truth: Truth) -> float:
    """Σ over non-wildcard records of HL of |p̂_r − p_r|."""
    real = ~hl.is_wildcard
    true = truth.of_records(hl.query_ids[hl.entry_query[real]], hl.entry_url[real])
    return float(np.abs(p_record[real] - true).sum())


def l1_queries(hl: HeadList, p_query: np.ndarray, truth: Truth) -> float:
    """Σ over listed queries of |p̂_q − p_q|."""
    k = hl.n_queries
    return float(np.abs(p_query[:k] - truth.of_queries(hl.query_ids)).sum())


def l1_union(listed: np.ndarray, estimate: np.ndarray, truth_ids: np.ndarray, truth_freq: np.ndarray) -> float:
    """Σ over U = (listed items) ∪ (true top-k items), k = the number of listed items, of |p̂ − p|, with p̂ = 0
    for an item of U that is not listed (ALGORITHM.md §9, "union L1").

    Guarantee: a list that misses the truly frequent items pays their whole true frequency, so no list beats the
    true top-k with exact estimates (L1 0) by being junk; on a list that *is* the true top-k it equals the L1 over
    the list. Ties at the k-th true frequency are broken in favour of listed items (the value is then unique).

    Parameters
    ----------
    listed : ids of the listed items (distinct). estimate : p̂ of each listed item.
    truth_ids : sorted distinct ids of every item in the data. truth_freq : p of each, aligned with ``truth_ids``.
    """
    listed = np.asarray(listed, dtype=np.int64)
    estimate = np.asarray(estimate, dtype=np.float64)
    k = len(listed)
    if k == 0:
        return 0.0
    true_of_listed = Truth._lookup(truth_ids, truth_freq, listed)
    total = float(np.abs(estimate - true_of_listed).sum())
    if len(truth_ids) == 0:
        return total
    kth = _top(truth_freq, k)[-1]
    above = truth_freq > kth  # all of these are in the true top-k
    tied = np.flatnonzero(truth_freq == kth) if kth > 0 else np.empty(0, dtype=np.int64)
    is_listed = np.isin(truth_ids, listed)
    missing = float(truth_freq[above & ~is_listed].sum())
    # the top-k takes (k − #above) of the tied items, listed ones first: only the rest of the slots miss
    free = k - int(above.sum())
    unlisted_tied = int((~is_listed[tied]).sum())
    listed_tied = len(tied) - unlisted_tied
    missing += max(0, min(free, len(tied)) - listed_tied) * float(kth)
    return total + missing


def l1_union_records(hl: HeadList, p_record: np.ndarray, truth: Truth) -> float:
    """:func:`l1_union` over records: the non-wildcard records of HL against the true top-k records."""
    real = ~hl.is_wildcard
    keys = record_keys(hl.query_ids[hl.entry_query[real]], hl.entry_url[real])
    return l1_union(keys, p_record[real], truth.keys, truth.record_freq)


def l1_union_queries(hl: HeadList, p_query: np.ndarray, truth: Truth) -> float:
    """:func:`l1_union` over queries: the listed queries against the true top-k queries."""
    k = hl.n_queries
    return l1_union(hl.query_ids, p_query[:k], truth.query_ids, truth.query_freq)


def hit_rates(hl: HeadList, p_record: np.ndarray, query: np.ndarray, url: np.ndarray,
              mask: np.ndarray | None = None, chunk: int = 1 << 23) -> tuple[float, float]:
    """Local search on held-out events (ALGORITHM.md §9): share whose query is in HL, and share whose
    clicked URL is the top URL (by ``p_record``) that HL offers for that query.

    ``mask`` selects the held-out events among ``query``/``url``; work goes in chunks of
    ``chunk`` events through :meth:`HeadList.query_positions`, so memory stays bounded.
    """
    k = hl.n_queries
    top_url = np.full(k + 1, -3, dtype=np.int64)  # −3 matches no URL; position k (``*``) = not listed
    for i in range(k):
        lo, hi = int(hl.url_offsets[i]), int(hl.url_offsets[i + 1]) - 1
        if hi > lo:
            top_url[i] = hl.entry_url[lo + int(np.argmax(p_record[lo:hi]))]
    total = hits = tops = 0
    for start in range(0, len(query), chunk):
        q = query[start:start + chunk]
        u = url[start:start + chunk]
        if mask is not None:
            m = mask[start:start + chunk]
            q, u = q[m], u[m]
        pos = hl.query_positions(q)
        listed = pos < k
        total += len(q)
        hits += int(listed.sum())
        tops += int((top_url[pos] == u).sum())
    if total == 0:
        return 0.0, 0.0
    return hits / total, tops / total

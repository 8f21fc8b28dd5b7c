"""The head list with wildcards, and the JSON shipped to devices (ALGORITHM.md §1, §3, §4).

In memory a :class:`HeadList` is integer-coded. Queries are positions ``0..k−1``; position
``k−1`` is the wildcard query ``*``. Entries (records) are numbered in CSR order: the entries
of query ``i`` are ``url_offsets[i]:url_offsets[i+1]``, its real URLs first and its wildcard
URL ``⟨q,*⟩`` last; the query ``*`` has the single entry ``⟨*,*⟩`` (the last entry).

The device JSON (``format = "hybriddp-headlist"``, ``version = 1``) holds only the lists and
what a device needs to randomize (ε, δ, f_C, m_C), plus a SHA-256 content hash. Wildcards are
implicit there: every query has a ``*`` URL after its listed URLs, and the query list has a
``*`` query after the listed queries. Estimates never go to devices.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.core.errors import HeadListError
from hybriddp.core.jsonfile import read_json
from hybriddp.core.protocol import HEADLIST_FORMAT, HEADLIST_VERSION, DeviceError, content_hash, validate_headlist
from hybriddp.core.records import ArrayVocabulary, Vocabulary

WILDCARD = -2
"""URL id of a wildcard entry ``⟨q,*⟩`` (and query id of ``*``) in integer-coded head lists."""

_URL_MASK = np.int64(0xFFFFFFFF)


def record_keys(query: np.ndarray, url: np.ndarray) -> np.ndarray:
    """One int64 code per record ⟨q,u⟩: ``q << 32 | (u mod 2^32)`` (u may be −1 = no URL)."""
    return (np.asarray(query, dtype=np.int64) << np.int64(32)) | (np.asarray(url, dtype=np.int64) & _URL_MASK)


def split_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`record_keys` (URL −1 comes back as −1)."""
    q = (keys >> np.int64(32)).astype(np.int64)
    u = (keys & _URL_MASK).astype(np.int64)
    u[u == 0xFFFFFFFF] = -1
    return q, u


@dataclass
class HeadList:
    """An integer-coded head list HL with wildcards (ALGORITHM.md §1).

    Attributes
    ----------
    query_ids : int64 array, shape (k−1,)
        Vocabulary ids of the listed queries, in list order (``*`` is implicit, last).
    url_offsets : int64 array, shape (k+1,)
        CSR offsets of each query's entries (``*`` query included).
    entry_url : int64 array, shape (n_entries,)
        URL id of each entry; :data:`WILDCARD` for ``⟨q,*⟩`` and ``⟨*,*⟩``.
    """

    query_ids: np.ndarray
    url_offsets: np.ndarray
    entry_url: np.ndarray

    def __post_init__(self) -> None:
        self.query_ids = np.asarray(self.query_ids, dtype=np.int64)
        self.url_offsets = np.asarray(self.url_offsets, dtype=np.int64)
        self.entry_url = np.asarray(self.entry_url, dtype=np.int64)
        self._lookup: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._dense_tables: dict[str, np.ndarray] = {}

    # ----- construction -------------------------------------------------------------------
    @classmethod
    def from_lists(cls, query_ids: Sequence[int], urls_per_query: Sequence[Sequence[int]]) -> HeadList:
        """Build from listed queries and each one's real URLs; wildcards are added."""
        kq = np.array([len(u) + 1 for u in urls_per_query] + [1], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(kq)])
        entry_url = np.full(int(offsets[-1]), WILDCARD, dtype=np.int64)
        for i, urls in enumerate(urls_per_query):
            entry_url[offsets[i]:offsets[i] + len(urls)] = np.asarray(urls, dtype=np.int64)
        return cls(np.asarray(query_ids, dtype=np.int64), offsets, entry_url)

    @classmethod
    def from_records(cls, query: np.ndarray, url: np.ndarray) -> HeadList:
        """HL_S from kept records (ALGORITHM.md §3): query → its URLs, plus ⟨q,*⟩ and ⟨*,*⟩.

        A record whose URL is −1 (no URL level) puts its query in the list with no real URL.
        Queries are listed by id, URLs by id within a query.
        """
        keys = np.unique(record_keys(query, url))
        q, u = split_keys(keys)
        qids = np.unique(q)
        real = u >= 0
        n_real = np.bincount(np.searchsorted(qids, q[real]), minlength=len(qids))
        kq = np.concatenate([n_real + 1, [1]])
        offsets = np.concatenate([[0], np.cumsum(kq)]).astype(np.int64)
        entry_url = np.full(int(offsets[-1]), WILDCARD, dtype=np.int64)
        qi_real = np.searchsorted(qids, q[real])
        rank_in_query = np.arange(real.sum()) - np.concatenate([[0], np.cumsum(n_real)])[qi_real]
        entry_url[offsets[qi_real] + rank_in_query] = u[real]
        return cls(qids, offsets, entry_url)

    def records(self) -> tuple[np.ndarray, np.ndarray]:
        """The listed records as (query ids, URL ids), wildcards left out; a query listed without a real URL
        (no URL level) comes back as (q, −1). ``from_records(*hl.records())`` rebuilds the list."""
        real = ~self.is_wildcard
        bare = np.flatnonzero(self.kq[:-1] == 1)
        return (np.concatenate([self.query_ids[self.entry_query[real]], self.query_ids[bare]]),
                np.concatenate([self.entry_url[real], np.full(bare.size, -1, dtype=np.int64)]))

    # ----- shape --------------------------------------------------------------------------
    @property
    def k(self) -> int:
        """Number of queries, ``*`` included."""
        return len(self.url_offsets) - 1

    @property
    def kq(self) -> np.ndarray:
        """k_q = |HL[q]| per query position, the ``*`` URL included."""
        return np.diff(self.url_offsets)

    @property
    def n_entries(self) -> int:
        """Number of records in HL, wildcards included."""
        return len(self.entry_url)

    @functools.cached_property
    def entry_query(self) -> np.ndarray:
        """Query position of each entry (computed once)."""
        return np.repeat(np.arange(self.k), self.kq)

    @property
    def wildcard_entry(self) -> np.ndarray:
        """Entry index of ⟨q,*⟩ for each query position (the last one is ⟨*,*⟩)."""
        return self.url_offsets[1:] - 1

    @property
    def is_wildcard(self) -> np.ndarray:
        """True for ⟨q,*⟩ and ⟨*,*⟩ entries."""
        return self.entry_url == WILDCARD

    @property
    def n_records(self) -> int:
        """Non-wildcard records ⟨q,u⟩ in the list."""
        return int((~self.is_wildcard).sum())

    @property
    def n_queries(self) -> int:
        """Listed queries (``*`` excluded)."""
        return self.k - 1

    # ----- mapping records onto the list (ALGORITHM.md §4 first bullet, §5 mapping) --------------
    def map_records(self, query: np.ndarray, url: np.ndarray) -> np.ndarray:
        """Entry index of each record: q ∉ HL → ⟨*,*⟩; u ∉ HL[q] → ⟨q,*⟩; else ⟨q,u⟩."""
        query = np.asarray(query)
        url = np.asarray(url)
        qpos = self.query_positions(query)
        entries = self.wildcard_entry[qpos]
        if self.n_records == 0:
            return entries
        idx = np.flatnonzero(qpos < self.k - 1)  # only listed queries can have a listed URL
        u = url[idx]
        table = self._dense("url", u, self.entry_url[~self.is_wildcard], np.flatnonzero(~self.is_wildcard), -1)
        if table is not None:  # URL id → its entry when the URL is listed under one query only
            cand = table[u]
            hit = (cand >= 0) & (self.entry_query[np.maximum(cand, 0)] == qpos[idx])
            entries[idx[hit]] = cand[hit]
            shared = cand == -2  # listed under several queries: binary search below
            idx, u = idx[shared], u[shared]
        _, _, sorted_keys, key_entry = self._tables()
        keys = record_keys(query[idx], u)
        j = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
        hit = sorted_keys[j] == keys
        entries[idx[hit]] = key_entry[j[hit]]
        return entries

    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Sorted query ids with their positions, sorted record keys with their entries."""
        if self._lookup is None:
            q_order = np.argsort(self.query_ids, kind="stable")
            real = np.flatnonzero(~self.is_wildcard)
            keys = record_keys(self.query_ids[self.entry_query[real]], self.entry_url[real])
            k_order = np.argsort(keys, kind="stable")
            self._lookup = (self.query_ids[q_order], q_order, keys[k_order], real[k_order])
        return self._lookup

    def _dense(self, name: str, ids: np.ndarray, keys: np.ndarray, values: np.ndarray,
               missing: int) -> np.ndarray | None:
        """A cached int32 table ``table[key] = value`` (−2 where a key repeats, ``missing``
        elsewhere), or None when the ids are too large or negative for a dense table."""
        if len(ids) == 0 or ids.min() < 0:
            return None
        top = int(max(ids.max(), keys.max(initial=-1))) + 1
        if top > max(1 << 25, 4 * len(ids)):
            return None
        cached = self._dense_tables.get(name)
        if cached is not None and len(cached) >= top:
            return cached
        table = np.full(top, missing, dtype=np.int32)
        uniq, counts = np.unique(keys, return_counts=True)
        table[keys] = values
        table[uniq[counts > 1]] = -2
        self._dense_tables[name] = table
        return table

    def query_positions(self, query: np.ndarray) -> np.ndarray:
        """Position of each query id in the list; k−1 (the ``*`` query) when not listed."""
        query = np.asarray(query)
        star = self.k - 1
        if len(query) == 0 or star == 0:
            return np.full(len(query), star, dtype=np.int64)
        table = self._dense("query", query, self.query_ids, np.arange(star), star)
        if table is not None:
            return table[query].astype(np.int64)
        sorted_q, q_pos, _, _ = self._tables()
        i = np.minimum(np.searchsorted(sorted_q, query), len(sorted_q) - 1)
        return np.where(sorted_q[i] == query, q_pos[i], star)

    # ----- device JSON --------------------------------------------------------------------
    def to_device_json(
        self, queries: Vocabulary, urls: Vocabulary, *, epsilon: float, delta: float,
        f_c: float, m_c: int, url_level: bool = True,
    ) -> dict[str, Any]:
        """The versioned JSON a device needs (lists + ε, δ, f_C, m_C + content hash)."""
        names = queries.decode(self.query_ids)
        real = ~self.is_wildcard
        entry_names: list[str | None] = [None] * self.n_entries
        if real.any():
            for e, s in zip(np.flatnonzero(real).tolist(), urls.decode(self.entry_url[real]), strict=True):
                entry_names[e] = s
        items = []
        for i, name in enumerate(names):
            lo, hi = int(self.url_offsets[i]), int(self.url_offsets[i + 1]) - 1
            items.append({"query": name, "urls": entry_names[lo:hi]})
        doc: dict[str, Any] = {
            "format": HEADLIST_FORMAT,
            "version": HEADLIST_VERSION,
            "epsilon": float(epsilon),
            "delta": float(delta),
            "f_c": float(f_c),
            "m_c": int(m_c),
            "url_level": bool(url_level),
            "queries": items,
        }
        doc["content_hash"] = content_hash(doc)
        return doc


def validate_device_json(doc: Any, source: str = "head list") -> dict[str, Any]:
    """Check a device head-list document (see :func:`hybriddp.core.protocol.validate_headlist`)."""
    try:
        return validate_headlist(doc, source)
    except DeviceError as exc:
        raise HeadListError(str(exc)) from None


def read_device_json(path: str | Path) -> dict[str, Any]:
    """Read and validate a head-list JSON file."""
    return validate_device_json(read_json(path, "head list", HeadListError), str(path))


def from_device_json(doc: dict[str, Any]) -> tuple[HeadList, ArrayVocabulary, ArrayVocabulary]:
    """Integer-coded head list + vocabularies built from a device JSON (server side)."""
    qnames = [q["query"] for q in doc["queries"]]
    url_names: list[str] = sorted({u for q in doc["queries"] for u in q["urls"]})
    url_index = {u: i for i, u in enumerate(url_names)}
    hl = HeadList.from_lists(range(len(qnames)), [[url_index[u] for u in q["urls"]] for q in doc["queries"]])
    return hl, ArrayVocabulary(qnames), ArrayVocabulary(url_names)

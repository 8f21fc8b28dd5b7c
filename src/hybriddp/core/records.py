"""Records as integer-coded arrays with vocabularies, and per-user sampling (ALGORITHM.md §1).

A :class:`RecordLog` stores every user's records grouped by user (CSR layout): the records
of user ``i`` are ``query[user_offsets[i]:user_offsets[i+1]]`` (and the same slice of
``url``). Queries and URLs are integer ids into :class:`Vocabulary` objects; a log without a
URL level (e.g. Kosarak items) has ``url`` all :data:`NO_URL`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hybriddp.core.errors import DataError

NO_URL = -1
"""URL id of a record from a log that has no URL level (the record is the query alone)."""


class Vocabulary(Protocol):
    """Maps integer ids to strings and back."""

    def __len__(self) -> int: ...

    def decode(self, ids: np.ndarray | Sequence[int]) -> list[str]:
        """Strings of the given ids."""
        ...

    def encode(self, names: Sequence[str]) -> np.ndarray:
        """Ids of the given strings, −1 for strings not in the vocabulary."""
        ...


class ArrayVocabulary:
    """A vocabulary backed by an array of distinct strings (id = position)."""

    def __init__(self, strings: Sequence[str] | np.ndarray) -> None:
        self.strings = np.asarray(strings, dtype=object)
        self._index: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.strings)

    def decode(self, ids: np.ndarray | Sequence[int]) -> list[str]:
        return [str(s) for s in self.strings[np.asarray(ids, dtype=np.int64)]]

    def encode(self, names: Sequence[str]) -> np.ndarray:
        if self._index is None:
            self._index = {s: i for i, s in enumerate(self.strings.tolist())}
        return np.array([self._index.get(n, -1) for n in names], dtype=np.int64)


class SyntheticVocabulary:
    """Names made on demand: ``named[i]`` where given, else ``prefix + str(i)``.

    Lets the synthetic generator hold millions of ids without millions of strings.
    """

    def __init__(self, size: int, prefix: str, named: Sequence[str] = ()) -> None:
        self.size = int(size)
        self.prefix = prefix
        self.named = list(named)
        self._named_index = {s: i for i, s in enumerate(self.named)}

    def __len__(self) -> int:
        return self.size

    def decode(self, ids: np.ndarray | Sequence[int]) -> list[str]:
        n = len(self.named)
        return [self.named[i] if i < n else f"{self.prefix}{i}" for i in np.asarray(ids).tolist()]

    def encode(self, names: Sequence[str]) -> np.ndarray:
        out = np.full(len(names), -1, dtype=np.int64)
        for j, s in enumerate(names):
            if s in self._named_index:
                out[j] = self._named_index[s]
            elif s.startswith(self.prefix) and s[len(self.prefix):].isdigit():
                i = int(s[len(self.prefix):])
                if len(self.named) <= i < self.size:
                    out[j] = i
        return out


@dataclass
class LoadStats:
    """What a loader read and left out, for the user to see."""

    rows_read: int = 0
    rows_without_click: int = 0
    rows_skipped_bad: int = 0
    bad_row_examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "rows_read": self.rows_read,
            "rows_without_click": self.rows_without_click,
            "rows_skipped_bad": self.rows_skipped_bad,
        }


@dataclass
class RecordLog:
    """All users' records, integer-coded and grouped by user (ALGORITHM.md §1).

    Attributes
    ----------
    user_offsets : int64 array, shape (n_users + 1,)
        Records of user ``i`` are rows ``user_offsets[i]:user_offsets[i+1]``.
    query, url : int32 arrays, shape (n_records,)
        Query id and URL id of each record (``url`` is :data:`NO_URL` without a URL level).
    queries, urls : Vocabulary
        Strings of the ids.
    has_urls : bool
        False for single-item logs: a record is then its query alone.
    """

    user_offsets: np.ndarray
    query: np.ndarray
    url: np.ndarray
    queries: Vocabulary
    urls: Vocabulary
    has_urls: bool = True
    stats: LoadStats = field(default_factory=LoadStats)
    user_ids: np.ndarray | None = None  # original user identifiers (index = user), when known
    times: np.ndarray | None = None  # int64 UNIX seconds of each record, when kept (load_aol(times=True))

    def __post_init__(self) -> None:
        self.user_offsets = np.asarray(self.user_offsets, dtype=np.int64)
        if self.query.shape != self.url.shape:
            raise DataError("query and url arrays must have the same length")
        if self.user_offsets[0] != 0 or self.user_offsets[-1] != len(self.query):
            raise DataError("user_offsets must start at 0 and end at the number of records")
        if self.times is not None and np.shape(self.times) != self.query.shape:
            raise DataError("times must hold one time per record")

    @property
    def n_users(self) -> int:
        return len(self.user_offsets) - 1

    @property
    def n_records(self) -> int:
        return len(self.query)

    def records_per_user(self) -> np.ndarray:
        """Number of records of each user."""
        return np.diff(self.user_offsets)

    def record_users(self) -> np.ndarray:
        """The user (code) of each record."""
        return np.repeat(np.arange(self.n_users), self.records_per_user())

    def one_user_per_record(self) -> RecordLog:
        """The same records with every record its own user (for logs with few users)."""
        return RecordLog(np.arange(self.n_records + 1, dtype=np.int64), self.query, self.url, self.queries,
                         self.urls, self.has_urls, self.stats)

    def user_keys(self, users: np.ndarray) -> list[str]:
        """Stable identifiers of the given users: the original ids when known, else the index."""
        users = np.asarray(users, dtype=np.int64)
        if self.user_ids is None:
            return [str(u) for u in users.tolist()]
        return [str(u) for u in self.user_ids[users].tolist()]

    @classmethod
    def from_user_sorted(
        cls, users: np.ndarray, query: np.ndarray, url: np.ndarray,
        queries: Vocabulary, urls: Vocabulary, has_urls: bool = True,
        stats: LoadStats | None = None, user_ids: np.ndarray | None = None, times: np.ndarray | None = None,
    ) -> RecordLog:
        """Build from per-record user codes (any order); records are grouped by user.

        ``users`` are integer codes 0..U-1; users with no record are dropped. ``user_ids[c]`` is
        the original identifier of code ``c`` (kept for the privacy ledger).
        """
        users = np.asarray(users)
        order = np.argsort(users, kind="stable")
        sorted_users = users[order]
        codes, counts = np.unique(sorted_users, return_counts=True)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        ids = np.asarray(user_ids)[codes] if user_ids is not None else None
        return cls(offsets, np.ascontiguousarray(query[order], dtype=np.int32),
                   np.ascontiguousarray(url[order], dtype=np.int32), queries, urls,
                   has_urls, stats or LoadStats(), ids,
                   None if times is None else np.ascontiguousarray(np.asarray(times)[order], dtype=np.int64))

    def select(self, keep: np.ndarray) -> RecordLog:
        """The records where ``keep`` is True (users left with none are dropped; ids and times follow)."""
        keep = np.asarray(keep, dtype=bool)
        users = self.record_users()[keep]
        return RecordLog.from_user_sorted(users, self.query[keep], self.url[keep], self.queries, self.urls,
                                          self.has_urls, LoadStats(rows_read=int(keep.sum())),
                                          None if self.user_ids is None else self.user_ids,
                                          None if self.times is None else self.times[keep])


def sample_per_user(
    user_offsets: np.ndarray, users: np.ndarray, m: int, rng: np.random.Generator
) -> np.ndarray:
    """Row indices of ≤ m records per user, uniformly without replacement (ALGORITHM.md §1).

    m = 1 draws one uniform position per user; m > 1 runs Floyd's subset algorithm for every
    user at once. Costs O(m² · len(users)); no per-record loop.

    Parameters
    ----------
    user_offsets : CSR offsets of the log.
    users : int array of user indices to sample from, in the order the output follows.
    m : records per user.

    Returns
    -------
    int64 array of row indices: user ``users[0]``'s sampled rows first, then the next, ...
    (each user contributes min(m, count) rows).
    """
    users = np.asarray(users, dtype=np.int64)
    start = user_offsets[users]
    count = user_offsets[users + 1] - start
    take = np.minimum(count, m)
    if m == 1:  # fast path: one uniform position per user with a record
        has = count > 0
        pos = (rng.random(len(users)) * count).astype(np.int64)
        return (start + pos)[has]
    # Floyd's algorithm, vectorized over users: for step s, j = count − m + s; draw t
    # uniform in [0, j]; take t unless already taken, then take j. Gives a uniform m-subset.
    sel = np.full((len(users), m), -1, dtype=np.int64)
    big = count > m
    for s in range(m):
        j = count - m + s
        t = (rng.random(len(users)) * (j + 1)).astype(np.int64)
        taken = (sel[:, :s] == t[:, None]).any(axis=1)
        sel[:, s] = np.where(big, np.where(taken, j, t), s)
    mask = np.arange(m)[None, :] < take[:, None]
    return (start[:, None] + sel)[mask]


@dataclass
class SampledRecords:
    """The sampled records D of a group of users (ALGORITHM.md §1): one row per sampled record."""

    query: np.ndarray
    url: np.ndarray
    user: np.ndarray  # index into the log's users (for per-user grouping, e.g. the device path)
    rows: np.ndarray  # row of each sampled record in the log (to find held-out records)

    def __len__(self) -> int:
        return len(self.query)


def sample_records(log: RecordLog, users: np.ndarray, m: int, rng: np.random.Generator) -> SampledRecords:
    """Sample ≤ m records of each user in ``users`` uniformly without replacement (ALGORITHM.md §1)."""
    rows = sample_per_user(log.user_offsets, users, m, rng)
    owner = np.searchsorted(log.user_offsets, rows, side="right") - 1
    return SampledRecords(log.query[rows], log.url[rows], owner, rows)

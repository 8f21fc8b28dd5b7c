"""SQLite: the message ids in ``messages_recent``, held in this process's memory.

``messages_recent`` is an append-only table (``seq INTEGER PRIMARY KEY AUTOINCREMENT``, no index
on the message id): random 16-byte ids in a B-tree would dirty nearly every leaf page of the
index on each commit, appended rows dirty only the last few pages. Deduplication of the ids in
it therefore happens here, against :class:`RecentIds`; ids already settled into ``messages``
are ruled out by :mod:`hybriddp.service.settled` or found by that table's primary key (see
:meth:`hybriddp.service.store.Store.add_reports_many`).

The set is derived state, rebuilt from the table: every write transaction that stores reports
first calls :meth:`RecentIds.catch_up`. It runs under SQLite's write lock (``BEGIN
IMMEDIATE``), so no other connection or process can append meanwhile; it reads the rows
appended since this process last looked (``seq`` above the last one it holds: other ``serve
--workers`` processes, or a restart's fresh start) and notices deleted rows (a settle, or a
round's deletion: the table's smallest ``seq`` is no longer the one it started from), after
which it reads the whole table again. A settle calls it too, inside its own transaction, so
that what it moved is forgotten under the same lock (never by a late call that could wipe ids
another thread caught up on meanwhile).
The transaction appends its own rows with explicit ``seq`` numbers above the largest the table
has ever used (:class:`Appends`), so after its commit :meth:`RecentIds.added` puts them in
without reading them back or asking for ``max(seq)``: per group commit the catch-up costs one
small query (two when other processes appended). The invariant: every committed row with
``seq <= last`` is in the set, and the set holds nothing that was not committed; a rolled-back
transaction adds nothing.

Memory: one Python string per recent message (~110 bytes with the set's slot), so at most
:data:`hybriddp.service.store.SETTLE_ROWS` of them per process, about 110 MB at 1,000,000.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from sqlalchemy.engine import Connection

_SPAN = ("SELECT (SELECT min(seq) FROM messages_recent), (SELECT max(seq) FROM messages_recent), "
         "(SELECT seq FROM sqlite_sequence WHERE name = 'messages_recent')")
"""Three scalar subqueries, each answered from the B-tree's ends (one ``min(seq), max(seq)`` query
would make SQLite scan the table)."""


class Appends:
    """The ``seq`` numbers of one write transaction's rows in ``messages_recent``.

    The rows are appended with explicit ``seq`` values, ``base + 1`` upwards, where ``base`` is the
    largest ``seq`` the table has ever used (its rows' and its AUTOINCREMENT counter's, read under the
    write lock): above every row another process could have written, never reused after a settle, and
    known without reading the rows back. A candidate row that is not inserted (its id was settled
    already) leaves a gap. :attr:`span` ends at the largest seq actually *stored*, never a trailing gap's:
    the next transaction (of any process) numbers its rows from the table's largest seq, so a gap at
    the end is reused, and a process that believed it had seen every row up to the gap would miss them.
    """

    def __init__(self, base: int) -> None:
        self.next = base + 1
        self.span: tuple[int, int] | None = None  # the smallest and largest seq actually stored (None: nothing)

    def take(self, k: int) -> int:
        """Reserve ``k`` consecutive seq numbers; the first."""
        start = self.next
        self.next += k
        return start

    def stored(self, first: int, last: int) -> None:
        """Rows with seq numbers from ``first`` to ``last`` were inserted (gaps in between allowed)."""
        self.span = (first, last) if self.span is None else (min(self.span[0], first), max(self.span[1], last))


class RecentIds:
    """The ids of ``messages_recent`` by round, and the newest ``seq`` this process has seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[int, set[str]] = {}
        self._last = 0  # every committed row with seq <= _last is in _ids
        self._first: int | None = None  # the smallest seq held (None: nothing held)
        self.rows = 0

    def catch_up(self, conn: Connection) -> Appends:
        """Inside a write transaction: take in the rows appended since, forget rows settled meanwhile; the
        seq numbers this transaction's appends take (:class:`Appends`).

        One query for the table's smallest and largest ``seq`` and its AUTOINCREMENT counter (each an
        O(log n) lookup); the rows themselves are read only when another connection appended some."""
        low, high, counter = conn.exec_driver_sql(_SPAN).one()
        with self._lock:
            if self._first is not None and (low is None or low > self._first):  # rows deleted (a settle, a
                self._forget()  # round's deletion) by another connection: start again from the table
            last = self._last
        if high is not None and high > last:
            rows = conn.exec_driver_sql("SELECT seq, round_num, message_id FROM messages_recent WHERE seq > ? "
                                        "ORDER BY seq", (last,)).all()
            if rows:
                by_round: dict[int, list[str]] = {}
                for _, num, mid in rows:
                    by_round.setdefault(int(num), []).append(mid)
                self.added(by_round, int(rows[0][0]), int(rows[-1][0]))
        return Appends(max(high or 0, counter or 0))

    def added(self, by_round: Mapping[int, Iterable[str]], first_seq: int, last_seq: int) -> None:
        """After a commit: these ids are stored in ``messages_recent``, whose rows now span ``first_seq`` to
        ``last_seq`` (every row in between is in the set, or in ``by_round``)."""
        with self._lock:
            for num, ids in by_round.items():
                known = self._ids.setdefault(num, set())
                before = len(known)
                known.update(ids)
                self.rows += len(known) - before
            self._last = max(self._last, last_seq)
            if self._first is None:
                self._first = first_seq

    def known(self, round_num: int) -> set[str]:
        """The recent ids of one round (the caller holds SQLite's write lock; do not modify)."""
        with self._lock:
            return self._ids.get(round_num) or set()

    def snapshot(self) -> dict[int, list[str]]:
        """A copy of the ids held, by round (a settle reads it, under the write lock, just before it moves them)."""
        with self._lock:
            return {num: list(ids) for num, ids in self._ids.items()}

    def _forget(self) -> None:  # and read the whole table again at the next catch-up
        self._ids.clear()
        self._last = 0
        self._first = None
        self.rows = 0

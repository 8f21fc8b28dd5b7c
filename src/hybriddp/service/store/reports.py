"""Device reports in the store: the deduplicating hot path, SQLite's settling, and the counts per entry.

Reports are deduplicated by the database: ``messages`` has the primary key (round, message id) and
a batch is inserted with ``ON CONFLICT DO NOTHING RETURNING message_id`` (PostgreSQL, in sorted order so
that two overlapping batches take their row locks in the same order); only the new messages have their
report entries counted, in ``entry_counts``, in the same transaction. Close counts reports per head-list
entry from there (:meth:`ReportStore.recount` recounts them from the messages, for audits).

On SQLite, device message ids are random, so inserting them straight into the large ``messages``
B-tree would dirty (and make each commit rewrite) nearly every leaf page. New messages go to the small
``messages_recent`` instead, and only when their id is not in ``messages`` (decided inside the same
write transaction: SQLite has one writer at a time, so the check and the insert cannot be separated by
another insert; :mod:`hybriddp.service.settled` rules out most ids without reading that table). Once it
holds ``settle_rows`` rows (:data:`~hybriddp.service.store.engine.SETTLE_ROWS`), :meth:`ReportStore.settle`
moves them to ``messages`` in key order, one transaction that touches each leaf page once; closing a round
settles too. An id is thus in at most one of the two tables, and every read of stored messages reads both.
One server process per database is assumed for the start-up recovery (``Store.unfinished``).
"""

from __future__ import annotations

import itertools
import operator
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from hybriddp.service import schema as s
from hybriddp.service.errors import ConflictError, StoreError
from hybriddp.service.recent import Appends
from hybriddp.service.store.rounds import REPORT_STATES, RoundInfo, RoundStore, now

# The report path's statements, written at the driver level (it runs them for every group commit);
# only integers are formatted into them.
_OPEN_ROUND = ("UPDATE rounds SET state = 'collecting-reports' WHERE num = %d AND state IN "
               f"({', '.join(repr(st) for st in REPORT_STATES)}) RETURNING n_messages")
_ADD_ROUND_COUNTS = ("UPDATE rounds SET n_messages = n_messages + %d, n_reports = n_reports + %d, "
                     "n_duplicates = n_duplicates + %d WHERE num = %d")
_ROWS_PER_INSERT = 8000 if sqlite3.sqlite_version_info >= (3, 32) else 300
"""Rows per SQLite INSERT statement of messages, 3 parameters each (SQLite >= 3.32 binds up to 32,766
parameters, older 999)."""
SQLITE_CACHE_KIB = 2000
"""SQLite's page cache per connection, KiB (its default)."""
SETTLE_CACHE_KIB = 131_072
"""The page cache while settling, KiB: sorting ``messages_recent`` in memory instead of in temporary
files, and keeping the pages of ``messages`` it rewrites (measured: ~20% faster settles at 5 M)."""


@dataclass(frozen=True)
class ReportAck:
    """What one reports request did: every message acknowledged, ``counted`` of them new."""

    acknowledged: int
    counted: int
    reports: int

    @property
    def duplicates(self) -> int:
        return self.acknowledged - self.counted


class ReportStore(RoundStore):
    """Device messages: stored once each (group commit), counted per head-list entry, settled on SQLite."""

    def add_reports(self, info: RoundInfo, items: Sequence[tuple[str, Sequence[int] | float]]) -> ReportAck:
        """Store one request's validated messages (see :meth:`add_reports_many`); raises its error."""
        (result,) = self.add_reports_many([(info, items)])
        if isinstance(result, Exception):
            raise result
        return result

    def add_reports_many(self, requests: Sequence[tuple[RoundInfo, Sequence[tuple[str, Any]]]]
                         ) -> list[ReportAck | ConflictError]:
        """Store the validated messages of several requests in ONE transaction (group commit).

        Each request is ``(round, [(message id, entries or value), ...])``. One commit (one fsync
        with SQLite's synchronous=FULL) acknowledges them all, which is what lets single-message
        requests go faster than the disk's fsync rate. Per round, the state is checked (and the
        round moved to collecting-reports) first; a round that takes no reports gets a
        :class:`ConflictError` for its requests, the others are stored. A message id already
        stored (or earlier in the group) is acknowledged and not counted again: on PostgreSQL the
        primary key decides (``ON CONFLICT DO NOTHING RETURNING``); on SQLite the recent ids held in
        memory, caught up under the write lock, and ``messages``' primary key for the ids that the
        settled-id hashes cannot rule out (:meth:`_append_recent`), so concurrent retries cannot double-count.
        The new messages' reports are added to ``entry_counts`` in the same transaction.
        """
        def run(conn: Connection) -> list[ReportAck | ConflictError]:
            stored.clear()
            appends[:] = [self._recent.catch_up(conn)] if self.dialect == "sqlite" and any(
                items for _, items in requests) else [None]
            open_rounds: dict[int, int] = {}  # round → its stored messages before this group
            for num in sorted({info.num for info, _ in requests}):  # locks the round rows in one order
                if (row := conn.exec_driver_sql(_OPEN_ROUND % int(num)).first()) is not None:
                    open_rounds[num] = int(row[0])
            results: list[ReportAck | ConflictError] = []
            by_round: dict[int, list[tuple[int, Sequence[tuple[str, Any]]]]] = {}  # round → (request, items)
            kinds: dict[int, str] = {}
            for i, (info, items) in enumerate(requests):
                if info.num not in open_rounds:
                    state = self._get(conn, info.id).state
                    results.append(ConflictError(f"reports refused: round {info.id} is {state!r}; reports are taken "
                                                 "while it is 'headlist-published' or 'collecting-reports'"))
                    continue
                results.append(ReportAck(len(items), 0, 0))
                kinds[info.num] = info.kind
                by_round.setdefault(info.num, []).append((i, items))
            counted = [0] * len(requests)
            reports = [0] * len(requests)
            for num, reqs in by_round.items():
                stored[num] = self._store_round_reports(conn, num, kinds[num] == "mean", reqs, counted, reports,
                                                        appends[0], open_rounds[num])
                acked = sum(len(items) for _, items in reqs)
                new = sum(counted[i] for i, _ in reqs)
                n_rep = sum(reports[i] for i, _ in reqs)
                conn.exec_driver_sql(_ADD_ROUND_COUNTS % (int(new), int(n_rep), int(acked - new), int(num)))
            return [r if isinstance(r, ConflictError) else ReportAck(r.acknowledged, counted[i], reports[i])
                    for i, r in enumerate(results)]
        stored: dict[int, list[str]] = {}  # round → ids stored by the transaction that committed (run may be retried)
        appends: list[Appends | None] = [None]  # SQLite: the seq numbers of the transaction that committed
        out = self._write(run)
        done = appends[0]
        if done is not None and done.span is not None:
            self._recent.added(stored, *done.span)
        return out

    def _store_round_reports(self, conn: Connection, num: int, mean: bool,
                             reqs: list[tuple[int, Sequence[tuple[str, Any]]]], counted: list[int],
                             reports: list[int], appends: Appends | None, n_stored: int) -> list[str]:
        """Insert one round's messages of a group; credit each new one to the request that sent it; the new ids.

        Of several messages with one id (stored earlier, or repeated in the group) only the first is
        stored and counted. The work per message is done by C loops (zip, sort, itemgetter, NumPy)
        wherever possible: this is the service's hot path.
        """
        ids: list[str] = []
        payloads: list[Any] = []
        owner: list[int] = []
        for i, items in reqs:
            if items:
                mids, pays = zip(*items, strict=True)
                ids += mids
                payloads += pays
                owner += [i] * len(mids)
        n = len(ids)
        if n == 0:
            return []
        # sorted by id (B-tree locality, one lock order on PostgreSQL); stable: the first of equal ids first
        order = sorted(range(n), key=ids.__getitem__)
        pick = operator.itemgetter(*order) if n > 1 else (lambda seq: (seq[0],))
        firsts = payloads if mean else [p[0] if p else None for p in payloads]
        new = self._insert_messages(conn, num, mean, pick(ids), pick(firsts), appends, n_stored)
        owners = np.asarray(owner, dtype=np.int64)
        lens = np.ones(n, dtype=np.int64) if mean else np.fromiter(map(len, payloads), dtype=np.int64, count=n)
        if len(new) == n:
            is_new = np.ones(n, dtype=bool)
        else:  # duplicates: the first occurrence of each newly stored id is the stored one
            fresh = set(new)
            is_new = np.zeros(n, dtype=bool)
            for k, mid in enumerate(ids):
                if mid in fresh:
                    fresh.discard(mid)
                    is_new[k] = True
        n_req = len(counted)
        for i, (c, r) in enumerate(zip(np.bincount(owners[is_new], minlength=n_req).tolist(),
                                       np.bincount(owners[is_new], weights=lens[is_new], minlength=n_req).tolist(),
                                       strict=True)):
            counted[i] += c
            reports[i] += int(r)
        if mean or not is_new.any():
            return new
        entries = np.fromiter(itertools.chain.from_iterable(payloads), dtype=np.int64, count=int(lens.sum()))
        entries = entries[np.repeat(is_new, lens)]
        if entries.size:
            self._add_counts(conn, num, np.bincount(entries))
        multi = np.flatnonzero(is_new & (lens > 1)).tolist()  # m_C > 1: the 2nd, 3rd, ... reports of new messages
        if multi:  # (an empty list would insert one row of NULLs: only retried messages may have several reports)
            conn.execute(insert(s.extra_entries), [{"round_num": num, "message_id": ids[k], "entry": e}
                                                   for k in multi for e in payloads[k][1:]])
        return new

    def _insert_messages(self, conn: Connection, round_num: int, mean: bool, ids: Sequence[str],
                         values: Sequence[Any], appends: Appends | None, n_stored: int) -> list[str]:
        """Store the messages ``ids`` (sorted; PostgreSQL: ON CONFLICT DO NOTHING RETURNING) with their first
        entries (or, for a mean round, values) ``values``, in that order; the ids that were new.

        Written at the driver level (SQLAlchemy's generic executemany path costs three times as
        much per row, and this is the service's hot path): on SQLite, many rows per VALUES list; on
        PostgreSQL, one statement over two arrays (``unnest``), which binds 2 parameters instead of
        two per row.

        On SQLite (:meth:`_append_recent`) the rows are appended to ``messages_recent``, without
        ``RETURNING``, except those whose id is stored already or repeated in ``ids``.
        """
        num = int(round_num)
        cols = "NULL, v" if mean else "v, NULL"
        if self.dialect == "postgresql":
            sql = (f"INSERT INTO messages (round_num, message_id, entry, value) SELECT {num}, m, {cols} FROM "
                   f"unnest(%s::text[], %s::{'float8' if mean else 'int4'}[]) AS t(m, v) "
                   "ON CONFLICT DO NOTHING RETURNING message_id")
            return list(conn.exec_driver_sql(sql, (list(ids), list(values))).scalars().all())
        assert appends is not None  # caught up in this transaction
        return self._append_recent(conn, num, mean, ids, values, appends, n_stored)

    def _append_recent(self, conn: Connection, num: int, mean: bool, ids: Sequence[str],
                       values: Sequence[Any], appends: Appends, n_stored: int) -> list[str]:
        """SQLite: append the messages whose id is in neither ``messages_recent`` (this process's
        :class:`RecentIds`, caught up in this transaction) nor ``messages`` to ``messages_recent``;
        ``ids`` are sorted, so equal ones are neighbours and the first is kept. ``n_stored``: the
        round's stored messages before this transaction (both tables).

        Only the ids that :class:`SettledIds` cannot rule out (retries, hash collisions) are looked up
        in ``messages``' primary key; the others are appended without that lookup."""
        keep: list[bool] | None = None
        if len(ids) > 1 and any(map(operator.eq, ids[1:], ids[:-1])):  # repeated in the group
            keep = [True, *map(operator.ne, ids[1:], ids[:-1])]
        known = self._recent.known(num)
        if known and not known.isdisjoint(ids):  # retried while recent
            keep = [k and m not in known for k, m in zip(keep or itertools.repeat(True), ids, strict=False)]
        if keep is not None:
            ids = list(itertools.compress(ids, keep))
            values = list(itertools.compress(values, keep))
        if not ids:
            return []
        maybe = self._settled.maybe_settled(conn, num, n_stored - len(known), ids)
        if not maybe.any():  # the common case
            return self._append_rows(conn, num, mean, ids, values, appends, probe=False)
        if maybe.all():
            return self._append_rows(conn, num, mean, ids, values, appends, probe=True)
        sure, unsure = np.flatnonzero(~maybe).tolist(), np.flatnonzero(maybe).tolist()
        return (self._append_rows(conn, num, mean, [ids[i] for i in sure], [values[i] for i in sure], appends,
                                  probe=False)
                + self._append_rows(conn, num, mean, [ids[i] for i in unsure], [values[i] for i in unsure],
                                    appends, probe=True))

    def _append_rows(self, conn: Connection, num: int, mean: bool, ids: Sequence[str], values: Sequence[Any],
                     appends: Appends, *, probe: bool) -> list[str]:
        """Append ``ids`` (none of them recent) to ``messages_recent``; with ``probe``, only those not in
        ``messages`` (its primary key is read), else all of them. The ids appended."""
        pay = "NULL, v.column3" if mean else "v.column3, NULL"
        unsettled = (f" WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.round_num = {num} AND m.message_id = "
                     "v.column2)") if probe else ""
        new: list[str] = []
        for i in range(0, len(ids), _ROWS_PER_INSERT):
            part_ids = ids[i:i + _ROWS_PER_INSERT]
            k = len(part_ids)
            start = appends.take(k)
            flat: list[Any] = [None] * (3 * k)
            flat[0::3] = range(start, start + k)
            flat[1::3] = part_ids
            flat[2::3] = values[i:i + _ROWS_PER_INSERT]
            # Nearly always no id is in ``messages`` (settled) yet: the row count says so, and the ids need
            # not come back. Otherwise the rows this statement inserted are read back by their seq range.
            inserted = int(conn.exec_driver_sql(
                f"INSERT INTO messages_recent (seq, round_num, message_id, entry, value) SELECT v.column1, {num}, "
                f"v.column2, {pay} FROM (VALUES {','.join(['(?,?,?)'] * k)}) AS v{unsettled}", tuple(flat)).rowcount)
            if inserted == k:
                appends.stored(start, start + k - 1)
                new += part_ids
            elif inserted:
                rows = conn.exec_driver_sql("SELECT seq, message_id FROM messages_recent WHERE seq BETWEEN ? AND ? "
                                            "ORDER BY seq", (start, start + k - 1)).all()
                if len(rows) != inserted:
                    raise StoreError(f"round {num}: messages changed during a write transaction; the database is "
                                     "shared with a program that does not take SQLite's write lock")
                appends.stored(int(rows[0][0]), int(rows[-1][0]))
                new += [mid for _, mid in rows]
        return new


    # ----- settling (SQLite) ------------------------------------------------------------------
    def settle_if_due(self) -> int:
        """Settle when ``messages_recent`` held :attr:`settle_rows` rows at this process's last write
        (its :class:`RecentIds`, caught up with other processes' rows then; the report writer calls
        this after each group, and :meth:`settle` counts again before moving anything). Returns the
        rows moved (0: not due, or not SQLite)."""
        due = self.dialect == "sqlite" and self._recent.rows >= self.settle_rows
        return self.settle(self.settle_rows) if due else 0

    def settle(self, min_rows: int = 0) -> int:
        """SQLite: move every row of ``messages_recent`` into ``messages``, in key order, in ONE
        transaction (a crash leaves them all in one table or all in the other), if it holds at
        least ``min_rows``. Returns the rows moved (0 on PostgreSQL)."""
        if self.dialect != "sqlite":
            return 0

        def run(conn: Connection) -> int:
            moving.clear()
            have = int(conn.exec_driver_sql("SELECT count(*) FROM messages_recent").scalar_one())
            moved = 0
            if have and have >= min_rows:
                self._recent.catch_up(conn)  # now it holds every row of the table: the ids about to move
                moving.update(self._recent.snapshot())
                moved = _settle(conn)
            self._recent.catch_up(conn)  # under the write lock: forgets what moved, or what another process moved
            return moved
        moving: dict[int, list[str]] = {}
        generation = self._settled.generation
        moved = self._write(run)
        self._settled.merge(moving, generation)  # committed: their hashes join the settled ones
        return moved

    def _add_counts(self, conn: Connection, round_num: int, counts: np.ndarray) -> None:
        """Add a group's new reports to ``entry_counts`` (one upsert; integers only, written inline)."""
        nz = np.flatnonzero(counts)  # ascending: one lock order (PostgreSQL)
        rows = ",".join(f"({int(round_num)},{e},{n})" for e, n in zip(nz.tolist(), counts[nz].tolist(), strict=True))
        conn.exec_driver_sql(f"INSERT INTO entry_counts (round_num, entry, n) VALUES {rows} ON CONFLICT (round_num, "
                             "entry) DO UPDATE SET n = entry_counts.n + excluded.n")

    # ----- close ------------------------------------------------------------------------------
    def start_close(self, round_id: str) -> RoundInfo:
        """headlist-published/collecting-reports → closed (one closer wins; reports are refused from now).

        On SQLite the same transaction settles ``messages_recent`` (every round's rows), so a
        closed round's messages are all in ``messages``.
        """
        def run(conn: Connection) -> RoundInfo:
            info = self._get(conn, round_id)
            have = info.reports if info.kind == "blender" else info.messages
            if info.state in REPORT_STATES and have == 0:
                raise ConflictError(f"cannot close round {round_id}: no reports yet, so there is nothing to estimate "
                                    "from the clients; close it once devices have reported")
            out = self._transition(conn, round_id, REPORT_STATES, "closed", "close", closed=now())
            if self.dialect == "sqlite":
                _settle(conn)
                self._recent.catch_up(conn)  # under the write lock: forgets the ids moved
            return out
        out = self._write(run)
        self.scrub()  # the round's private token key, set to NULL by the transition, leaves the files
        return out

    def entry_counts(self, round_num: int, n_entries: int) -> np.ndarray:
        """Reports per head-list entry, as kept in ``entry_counts``."""
        ec = s.entry_counts.c
        rows = self._read(lambda conn: conn.execute(select(ec.entry, ec.n).where(ec.round_num == round_num)).all())
        return _dense(rows, n_entries, round_num)

    def _message_tables(self) -> tuple[Any, ...]:
        """The tables that hold stored messages: both on SQLite (until settled), ``messages`` on PostgreSQL."""
        return (s.messages, s.messages_recent) if self.dialect == "sqlite" else (s.messages,)

    def recount(self, round_num: int, n_entries: int) -> np.ndarray:
        """Reports per entry counted again from the stored messages (GROUP BY): an audit of entry_counts."""
        x = s.extra_entries.c

        def run(conn: Connection) -> list[Any]:
            rows = []
            for t in self._message_tables():
                m = t.c
                rows += conn.execute(select(m.entry, func.count()).where(m.round_num == round_num,
                                                                         m.entry.is_not(None)).group_by(m.entry)).all()
            rows += conn.execute(select(x.entry, func.count()).where(x.round_num == round_num).group_by(x.entry)).all()
            return rows
        return _dense(self._read(run), n_entries, round_num)

    def report_values(self, round_num: int) -> tuple[int, float]:
        """(number, sum) of a mean round's randomized values."""
        def run(conn: Connection) -> tuple[int, float]:
            n, total = 0, 0.0
            for t in self._message_tables():
                m = t.c
                k, v = conn.execute(select(func.count(m.value), func.sum(m.value))
                                    .where(m.round_num == round_num)).one()
                n, total = n + int(k), total + float(v or 0.0)
            return n, total
        return self._read(run)


def _settle(conn: Connection) -> int:
    """Move every row of ``messages_recent`` into ``messages`` in key order (inside the caller's write
    transaction); the rows moved. A plain INSERT: an id in both tables would be a bug, and fails loudly."""
    conn.exec_driver_sql(f"PRAGMA cache_size = -{SETTLE_CACHE_KIB}")  # the sort, and the big table's pages
    try:
        moved = conn.exec_driver_sql("INSERT INTO messages (round_num, message_id, entry, value) SELECT round_num, "
                                     "message_id, entry, value FROM messages_recent "
                                     "ORDER BY round_num, message_id").rowcount
        conn.exec_driver_sql("DELETE FROM messages_recent")
    finally:
        conn.exec_driver_sql(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
    return int(moved)


def _dense(rows: Sequence[Any], n_entries: int, round_num: int) -> np.ndarray:
    """(entry, count) rows → a count per entry; an entry out of range means a damaged database."""
    counts = np.zeros(n_entries, dtype=np.int64)
    if rows:
        idx = np.array([r[0] for r in rows], dtype=np.int64)
        if idx.min() < 0 or idx.max() >= n_entries:
            raise StoreError(f"round {round_num}: stored report entries outside 0..{n_entries - 1}; the database "
                             "is damaged")
        np.add.at(counts, idx, np.array([r[1] for r in rows], dtype=np.int64))
    return counts

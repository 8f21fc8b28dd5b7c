"""The round state machine in the store: create, read, move between states, end, purge raw opt-in data.

States and their transitions are those of :data:`hybriddp.service.schema.ROUND_STATES` (PRIVACY.md, "The raw
opt-in data's lifecycle"). Every transition is a conditional ``UPDATE ... WHERE state IN (...)``
(:meth:`RoundStore._transition`), so two requests racing for the same transition cannot both win. Every
way out of collecting-optin and building-headlist deletes the raw opt-in data in the same transaction and
then scrubs them from the database files (:meth:`RoundStore.scrub`).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from hybriddp.core.errors import parameter_error
from hybriddp.core.protocol import ID_REGEX
from hybriddp.core.rng import SEED_WARNING
from hybriddp.service import schema as s
from hybriddp.service.errors import ConflictError, NotFoundError, StoreError
from hybriddp.service.store.engine import SQLITE_BUSY_TIMEOUT_MS, StoreBase, describe_url

DEFAULT_RETENTION_HOURS = 168.0
"""Hours after its creation at which a round's raw opt-in data are purged whatever its state (one week)."""
MAX_RETENTION_HOURS = 24.0 * 366
PURGE_LOCK_WAIT_MS = 2_000
"""How long one purge transaction waits for the round it purges (SQLite: the write lock; PostgreSQL: the round's
row and tables) before it leaves the round in :attr:`RoundStore.purge_pending` for a retry after a short backoff."""
SCRUB_WAIT_MS = 5_000
"""How long a scrub waits for readers that hold a snapshot older than the deletion (then it is left pending):
SQLite's WAL checkpoint, PostgreSQL's wait before ``VACUUM FULL``."""
_OLDER_SNAPSHOTS = """
SELECT (SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND xact_start < %(since)s)
     + (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database() AND prepared < %(since)s)
     + (SELECT count(*) FROM pg_replication_slots WHERE xmin IS NOT NULL)"""
"""PostgreSQL: what holds back the horizon below which deleted rows may be dropped: other sessions of this database
in a transaction that began before the scrub and holds a snapshot or a transaction id, prepared transactions of
before it, and replication slots that keep an xmin (a standby with hot_standby_feedback). ``VACUUM FULL`` copies
the rows such a holder may still see ("recently dead") into the new files. Transactions begun later cannot see
them."""
ENDED_STATES = ("headlist-empty", "aborted", "deleted")
"""States a round never leaves."""
REPORT_STATES = ("headlist-published", "collecting-reports")
"""States in which a round takes device reports."""
ROUND_ID = ID_REGEX
"""A round id: 16 random bytes in URL-safe base64 without padding (:func:`new_round_id`)."""

T = TypeVar("T")


def now() -> str:
    """UTC time, ISO 8601 to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_round_id() -> str:
    """16 random bytes from the OS, URL-safe base64 without padding (22 characters), drawn again while
    it starts with ``-`` (a command line would take such an id for an option: ``hybriddp round close
    -Lx...``). That leaves 127.9 of the 128 bits of randomness."""
    while True:
        rid = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode("ascii")
        if not rid.startswith("-"):
            return rid


@dataclass(frozen=True)
class RoundInfo:
    """A round's row without its large documents (what ``GET /rounds/{id}`` shows)."""

    num: int
    id: str
    kind: str
    name: str | None
    state: str
    params: dict[str, Any]
    created: str
    headlist_hash: str | None
    closed: str | None
    optin_users: int
    optin_records: int
    messages: int
    reports: int
    duplicates: int
    retention_deadline: str | None = None
    purged: str | None = None
    series: str | None = None  # the id of the series the round is a period of (docs/SERIES.md)
    period: int | None = None  # its period there, from 0

    @property
    def non_private(self) -> bool:
        """A seeded (experiment) round: anyone who knows the seed can regenerate its noise."""
        return self.params.get("seed") is not None

    @property
    def charge(self) -> tuple[float, float]:
        """The (ε, δ) the build charges each opt-in user: a BLENDER round's, or a mean round's ε with δ = 0."""
        return float(self.params["epsilon"]), float(self.params["delta"]) if self.kind == "blender" else 0.0

    def to_json(self, *, admin: bool = False) -> dict[str, Any]:
        """The round as the API shows it. The public view (``admin=False``) leaves out what the mechanisms do
        not release: the live opt-in counts (polling them would tell what each upload carried) and a seed."""
        params = dict(self.params)
        if not admin:
            params.pop("seed", None)
        out: dict[str, Any] = {
            "id": self.id, "kind": self.kind, "name": self.name, "state": self.state, "params": params,
            "created": self.created, "headlist_hash": self.headlist_hash,
            "counts": {"optin_users": self.optin_users if admin else None,
                       "optin_records": self.optin_records if admin else None,
                       "messages": self.messages, "reports": self.reports},
            "non_private": self.non_private, "retention_deadline": self.retention_deadline,
            "raw_data_purged": self.purged}
        if self.series is not None:
            out["series"] = {"id": self.series, "period": None if self.period is None else self.period + 1}
        if self.non_private:
            out["warning"] = SEED_WARNING
        return out


@dataclass(frozen=True)
class RoundDocuments:
    """A round's published documents and stored results (JSON text as stored; None until made)."""

    info: RoundInfo
    headlist: str | None
    estimates: str | None
    report_counts: str | None
    results: str | None


_INFO_COLUMNS = (s.rounds.c.num, s.rounds.c.id, s.rounds.c.kind, s.rounds.c.name, s.rounds.c.state,
                 s.rounds.c.params, s.rounds.c.created, s.rounds.c.headlist_hash, s.rounds.c.closed,
                 s.rounds.c.optin_users, s.rounds.c.optin_records, s.rounds.c.n_messages, s.rounds.c.n_reports,
                 s.rounds.c.n_duplicates, s.rounds.c.retention_deadline, s.rounds.c.purged, s.rounds.c.period,
                 select(s.series.c.id).where(s.series.c.num == s.rounds.c.series_num).scalar_subquery()
                 .label("series_id"))


def _info(row: Any) -> RoundInfo:
    return RoundInfo(int(row.num), row.id, row.kind, row.name, row.state, json.loads(row.params), row.created,
                     row.headlist_hash, row.closed, int(row.optin_users), int(row.optin_records),
                     int(row.n_messages), int(row.n_reports), int(row.n_duplicates), row.retention_deadline,
                     row.purged, row.series_id, None if row.period is None else int(row.period))


def _json(doc: Any) -> str:
    """A document as stored: strict JSON (no NaN), UTF-8 text."""
    return json.dumps(doc, allow_nan=False, ensure_ascii=False)


class RoundStore(StoreBase):
    """Rounds: create and read them, move them between states, end them, purge their raw opt-in data."""

    purge_pending: tuple[str, ...] = ()
    """Ids of the rounds due for the purge whose last :meth:`purge_expired` pass found them locked by another
    transaction; the service retries them after a short backoff (:func:`hybriddp.service.app._periodically`)."""

    def create_round(self, kind: str, name: str | None, params: dict[str, Any], *,
                     retention_hours: float = DEFAULT_RETENTION_HOURS) -> RoundInfo:
        """A new round in state collecting-optin, whose raw opt-in data are purged ``retention_hours`` after
        its creation at the latest (:meth:`purge_expired`)."""
        if (isinstance(retention_hours, bool) or not isinstance(retention_hours, (int, float))
                or not 0 < retention_hours <= MAX_RETENTION_HOURS):
            raise parameter_error("retention_hours (--retention-hours)", retention_hours,
                                  f"a number of hours in (0, {MAX_RETENTION_HOURS:g}]",
                                  f"The default, {DEFAULT_RETENTION_HOURS:g} h, purges raw opt-in data after a week.")
        rid = new_round_id()
        created = datetime.now(timezone.utc)
        deadline = (created + timedelta(hours=float(retention_hours))).isoformat(timespec="seconds")

        def run(conn: Connection) -> None:
            conn.execute(insert(s.rounds).values(id=rid, kind=kind, name=name, state="collecting-optin",
                                                 params=json.dumps(params, allow_nan=False),
                                                 created=created.isoformat(timespec="seconds"),
                                                 retention_deadline=deadline))
        self._write(run)
        return self.round(rid)

    def _get(self, conn: Connection, round_id: str) -> RoundInfo:
        row = None
        if ROUND_ID.fullmatch(round_id):  # anything else cannot be a round (and never reaches the database)
            row = conn.execute(select(*_INFO_COLUMNS).where(s.rounds.c.id == round_id)).first()
        if row is None:
            raise NotFoundError(f"round {round_id[:40]!r} does not exist (a round id is 22 characters of URL-safe "
                                "base64); list the rounds with GET /api/v1/rounds (administrator)")
        return _info(row)

    def round(self, round_id: str) -> RoundInfo:
        """The round with this id, or :class:`NotFoundError`."""
        return self._read(lambda conn: self._get(conn, round_id))

    def rounds(self) -> list[RoundInfo]:
        """Every round, oldest first."""
        return self._read(lambda conn: [_info(r) for r in conn.execute(
            select(*_INFO_COLUMNS).order_by(s.rounds.c.num)).all()])

    def newest_round(self, kind: str, states: Iterable[str]) -> RoundInfo | None:
        """The newest round of ``kind`` in one of ``states``, or None: read newest first (primary key order), so it
        stops at the first match instead of reading every round."""
        return self._read(lambda conn: next((_info(r) for r in conn.execute(
            select(*_INFO_COLUMNS).where(s.rounds.c.kind == kind, s.rounds.c.state.in_(list(states)))
            .order_by(s.rounds.c.num.desc()).limit(1)).all()), None))

    def documents(self, round_id: str) -> RoundDocuments:
        """The round with its documents and results."""
        def run(conn: Connection) -> RoundDocuments:
            info = self._get(conn, round_id)
            row = conn.execute(select(s.rounds.c.headlist, s.rounds.c.estimates, s.rounds.c.report_counts,
                                      s.rounds.c.results).where(s.rounds.c.num == info.num)).one()
            return RoundDocuments(info, row.headlist, row.estimates, row.report_counts, row.results)
        return self._read(run)

    def state_counts(self) -> dict[str, int]:
        """Rounds per state."""
        return self._read(lambda conn: {st: int(n) for st, n in conn.execute(
            select(s.rounds.c.state, func.count()).group_by(s.rounds.c.state)).all()})

    def unfinished(self) -> list[RoundInfo]:
        """Rounds left mid-step by a stopped server: building-headlist or closed (see closing.recover)."""
        return self._read(lambda conn: [_info(r) for r in conn.execute(select(*_INFO_COLUMNS).where(
            s.rounds.c.state.in_(["building-headlist", "closed"])).order_by(s.rounds.c.num)).all()])

    def table_counts(self, round_num: int) -> dict[str, int]:
        """Rows per table for one round (tests and operators: raw opt-in data must be 0 once published)."""
        def run(conn: Connection) -> dict[str, int]:
            out = {}
            for t in (s.optin_records, s.optin_values, s.optin_tokens, s.messages, s.messages_recent,
                      s.extra_entries, s.entry_counts):
                out[t.name] = int(conn.execute(select(func.count()).select_from(t)
                                               .where(t.c.round_num == round_num)).scalar_one())
            return out
        return self._read(run)

    # ----- transitions ------------------------------------------------------------------------
    def _transition(self, conn: Connection, round_id: str, from_states: Sequence[str], to_state: str,
                    action: str, **values: Any) -> RoundInfo:
        """Conditional UPDATE of the state; ConflictError (naming the state) when the round is elsewhere."""
        res = conn.execute(update(s.rounds).where(s.rounds.c.id == round_id, s.rounds.c.state.in_(from_states))
                           .values(state=to_state, **values))
        info = self._get(conn, round_id)
        if res.rowcount != 1:
            raise ConflictError(f"cannot {action}: round {round_id} is {info.state!r}, it must be "
                                f"{' or '.join(repr(x) for x in from_states)}")
        if to_state not in REPORT_STATES:  # no more reports, so no more report tokens: the private key goes
            conn.execute(update(s.round_keys).where(s.round_keys.c.round_num == info.num,
                                                     s.round_keys.c.private_key.is_not(None)).values(private_key=None))
        return info

    def finish_build(self, info: RoundInfo, outcome: str, headlist: dict[str, Any] | None = None,
                     estimates: dict[str, Any] | None = None, results: dict[str, Any] | None = None,
                     round_key: Any = None) -> RoundInfo:
        """building-headlist → ``outcome`` (headlist-published, headlist-empty or aborted), storing the
        documents — and ``round_key``, the report-token key the head list commits to (an RSA private key) — and
        deleting the raw opt-in data in the same transaction (then scrubbed from the files)."""
        def run(conn: Connection) -> RoundInfo:
            if round_key is not None:
                from hybriddp.core import tokens
                spki = tokens.round_key(info.id, round_key).spki
                conn.execute(self._insert(s.round_keys).values(
                    round_num=info.num, public_key=base64.b64encode(spki).decode(),
                    private_key=base64.b64encode(tokens.private_der(round_key)).decode()
                ).on_conflict_do_nothing(index_elements=["round_num"]))
            values: dict[str, Any] = {}
            if headlist is not None:
                values.update(headlist=_json(headlist), headlist_hash=headlist["content_hash"])
            if estimates is not None:
                values["estimates"] = _json(estimates)
            if results is not None:
                values["results"] = _json(results)
            self._transition(conn, info.id, ["building-headlist"], outcome, f"end the build as {outcome}", **values)
            self._purge_raw(conn, info.num)
            return self._get(conn, info.id)
        out = self._write(run)
        self.scrub()
        return out

    def finish_close(self, info: RoundInfo, results: dict[str, Any], counts: list[int] | None,
                     held: bool = False) -> RoundInfo:
        """Store the results; closed → results-published, or results-held (``held``: the anchor check flagged
        them and an administrator decides, :meth:`publish_held`)."""
        def run(conn: Connection) -> RoundInfo:
            return self._transition(conn, info.id, ["closed"], "results-held" if held else "results-published",
                                    "store results", results=_json(results),
                                    report_counts=None if counts is None else json.dumps(counts))
        self._write(run)
        return self.round(info.id)

    def publish_held(self, round_id: str, results: dict[str, Any]) -> RoundInfo:
        """results-held → results-published, with the results an administrator chose (ALGORITHM.md §7.2)."""
        self._write(lambda conn: self._transition(conn, round_id, ["results-held"], "results-published",
                                                  "publish held results", results=_json(results)))
        return self.round(round_id)

    # ----- ends and raw data ------------------------------------------------------------------
    def abort(self, round_id: str) -> RoundInfo:
        """collecting-optin → aborted: the round ends before its head list is built; its raw opt-in data are
        deleted (and scrubbed from the files). Nothing was released, so nothing is charged."""
        out = self._write(lambda conn: self._end(conn, round_id, ["collecting-optin"], "aborted", "abort"))
        self.scrub()
        return out

    def delete_round(self, round_id: str) -> RoundInfo:
        """Any state but building-headlist → deleted: raw opt-in data, tokens, device messages, documents and
        results are deleted; the round's id, parameters and ledger charges stay (the charges are spent)."""
        def run(conn: Connection) -> RoundInfo:
            states = [st for st in s.ROUND_STATES if st not in ("building-headlist", "deleted")]
            info = self._end(conn, round_id, states, "deleted", "delete", headlist=None, headlist_hash=None,
                             estimates=None, report_counts=None, results=None)
            for t in (s.messages, s.messages_recent, s.extra_entries, s.entry_counts):
                conn.execute(delete(t).where(t.c.round_num == info.num))
            if self.dialect == "sqlite":
                self._recent.catch_up(conn)  # under the write lock: forgets the deleted ids
            return info
        out = self._write(run)
        self.scrub()
        return out

    def _end(self, conn: Connection, round_id: str, from_states: Sequence[str], to_state: str, action: str,
             **values: Any) -> RoundInfo:
        info = self._transition(conn, round_id, from_states, to_state, action, **values)
        self._purge_raw(conn, info.num)
        return self._get(conn, round_id)

    def purge_expired(self, at: str | None = None) -> list[str]:
        """Purge the raw opt-in data of every round whose retention deadline is at or before ``at`` (default:
        now): a round still collecting-optin is aborted. The ids of the rounds purged.

        Each round is purged in a transaction of its own that waits at most :data:`PURGE_LOCK_WAIT_MS` for the
        round (SQLite: the database's write lock; PostgreSQL: the round's row, ``lock_timeout``), so a long
        transaction holding one round neither delays the others nor makes the pass wait for it: a round not
        purged for that is named in :attr:`purge_pending`, and the service retries it after a short backoff until
        it is gone (:func:`hybriddp.service.app._periodically`; PRIVACY.md, "The raw opt-in data's lifecycle").
        Then the files are scrubbed (:meth:`scrub`) if a round was purged, or if a scrub is pending and no round
        is (a scrub retried at the backoff's pace would hold up every writer while a long transaction runs).
        """
        when = at or now()
        due = self._read(lambda conn: conn.execute(select(s.rounds.c.num, s.rounds.c.id).where(*_due(when))
                                                   .order_by(s.rounds.c.num)).all())
        purged: list[str] = []
        pending: list[str] = []
        for num, rid in due:
            try:
                if self._bounded_write(lambda conn, n=int(num), i=str(rid): self._purge_if_due(conn, n, i, when)):
                    purged.append(str(rid))
            except _LockBusy:
                pending.append(str(rid))
        self.purge_pending = tuple(pending)
        if purged or (self.scrub_pending and not pending):
            self.scrub()
        return purged

    def _purge_if_due(self, conn: Connection, round_num: int, round_id: str, when: str) -> bool:
        """Inside :meth:`_bounded_write`: lock the round's row and, if it is still due (not purged meanwhile, nor
        moved to building-headlist, whose end purges it), purge it. Whether it did."""
        state = conn.execute(select(s.rounds.c.state).where(s.rounds.c.num == round_num, *_due(when))
                             .with_for_update()).scalar()
        if state is None:
            return False
        if state == "collecting-optin":
            self._transition(conn, round_id, ["collecting-optin"], "aborted", "abort at the retention deadline")
        self._purge_raw(conn, round_num)
        return True

    def _bounded_write(self, fn: Callable[[Connection], T]) -> T:
        """``fn`` in one write transaction whose lock waits last at most :data:`PURGE_LOCK_WAIT_MS`: SQLite's busy
        timeout on this connection for its ``BEGIN IMMEDIATE`` (the usual one is put back after), PostgreSQL's
        ``SET LOCAL lock_timeout`` (every table and row lock the transaction takes). A wait that runs out is
        :class:`_LockBusy`, other database failures :class:`StoreError`. No ``statement_timeout``: it would also
        cut short the deletion of a large round, which waits on no other transaction."""
        wait = int(PURGE_LOCK_WAIT_MS)
        try:
            with self.engine.connect() as conn:
                raw = conn.connection.driver_connection if self.dialect == "sqlite" else None
                usual = raw.execute("PRAGMA busy_timeout").fetchone()[0] if raw is not None else 0
                if raw is not None:
                    raw.execute(f"PRAGMA busy_timeout = {wait}")
                try:
                    conn = conn.execution_options(hybriddp_write=True)
                    with conn.begin():  # SQLite: BEGIN IMMEDIATE, which waits for the write lock
                        if raw is None:
                            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {wait}")
                        return fn(conn)
                finally:
                    if raw is not None:
                        raw.execute(f"PRAGMA busy_timeout = {int(usual)}")
        except DBAPIError as exc:
            if _lock_busy(exc):
                raise _LockBusy() from None
            why = " ".join(str(exc.orig).split())[:300]
            raise StoreError(f"database {describe_url(self.url)}: purge: {type(exc.orig).__name__}: {why}; check "
                             "that the database is reachable and writable") from None

    def _purge_raw(self, conn: Connection, round_num: int) -> None:
        """Delete a round's raw opt-in data: records, values, upload keys and tokens (inside the caller's
        transaction); the round records when."""
        for t in (s.optin_records, s.optin_values, s.optin_uploads, s.optin_tokens):
            conn.execute(delete(t).where(t.c.round_num == round_num))
        conn.execute(update(s.rounds).where(s.rounds.c.num == round_num, s.rounds.c.purged.is_(None))
                     .values(purged=now()))

    def scrub(self) -> bool:
        """Remove deleted rows from the database files, not only from the tables.

        SQLite: ``secure_delete`` (set on every connection) zeroes the freed space of the pages in the
        WAL; ``wal_checkpoint(TRUNCATE)`` then copies them over the main file and empties the WAL, whose
        older frames still held the rows. It waits up to :data:`SCRUB_WAIT_MS` for readers that hold an
        old snapshot; False if it could not finish (:attr:`scrub_pending`: the next :meth:`purge_expired`
        pass, run periodically, scrubs again). PostgreSQL: ``VACUUM FULL`` of the opt-in tables and the
        token keys rewrites them into new files (the old ones are unlinked); the server's WAL
        (``pg_wal``) and base backups keep the rows until they are recycled (docs: PRIVACY.md). A session whose
        snapshot is older than the deletion would make it copy the deleted rows into the new files, so it first
        waits up to :data:`SCRUB_WAIT_MS` for such sessions to end, and as long for the tables' locks, and is left
        pending (False) if one remains.
        """
        if self.dialect == "sqlite":
            with self.engine.connect() as conn:  # the checkpoint waits for readers up to the busy timeout
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {SCRUB_WAIT_MS}")
                try:
                    busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").first()
                finally:
                    conn.exec_driver_sql(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            self.scrub_pending = busy is not None and int(busy[0]) != 0
            return not self.scrub_pending
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            since = conn.exec_driver_sql("SELECT now()").scalar_one()
            deadline = time.monotonic() + SCRUB_WAIT_MS / 1000.0
            while ((older := int(conn.exec_driver_sql(_OLDER_SNAPSHOTS, {"since": since}).scalar_one()))
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            conn.exec_driver_sql(f"SET lock_timeout = {SCRUB_WAIT_MS}")  # a reader's lock: pending, not a hang
            try:
                conn.exec_driver_sql("VACUUM FULL optin_records, optin_values, optin_uploads, optin_tokens, "
                                     "round_keys")
                locked = False
            except OperationalError:
                locked = True
            finally:
                conn.exec_driver_sql("RESET lock_timeout")
        self.scrub_pending = older > 0 or locked
        return not self.scrub_pending


class _LockBusy(Exception):
    """A purge transaction's lock wait ran out (:meth:`RoundStore._bounded_write`)."""


def _lock_busy(exc: DBAPIError) -> bool:
    """SQLite's "database is locked", PostgreSQL's lock timeout (55P03), deadlock or serialization failure."""
    return (getattr(exc.orig, "sqlstate", None) in ("55P03", "40P01", "40001")
            or "database is locked" in str(exc.orig))


def _due(when: str) -> tuple[Any, ...]:
    """WHERE terms of a round whose raw opt-in data are due for the purge at ``when``: past its retention deadline,
    not purged, and not building its head list (the build's end purges them)."""
    r = s.rounds.c
    return (r.purged.is_(None), r.retention_deadline.is_not(None), r.retention_deadline <= when,
            r.state != "building-headlist")


def takes_optin(at: str | None = None) -> Any:
    """WHERE term of a round that takes opt-in data (enrolments, uploads, the build's start) at ``at`` (default:
    now): collecting-optin and before its retention deadline, whether or not the purge has run yet."""
    r = s.rounds.c
    return and_(r.state == "collecting-optin",
                or_(r.retention_deadline.is_(None), r.retention_deadline > (at or now())))


def refuse_past_deadline(info: RoundInfo, action: str, at: str | None = None) -> None:
    """:class:`ConflictError` if ``info`` is collecting-optin but past its retention deadline (its purge is due):
    ``action`` (e.g. "upload opt-in data") is refused, naming the deadline."""
    if (info.state == "collecting-optin" and info.retention_deadline is not None
            and info.retention_deadline <= (at or now())):
        raise ConflictError(f"cannot {action}: round {info.id} passed its retention deadline "
                            f"({info.retention_deadline} UTC), so it takes no more opt-in data and its raw opt-in "
                            "data are being purged; create a new round (a longer retention_hours keeps the next one "
                            "open longer)")

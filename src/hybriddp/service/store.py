"""The service's storage: every SQL statement of the service, on SQLite or PostgreSQL (SQLAlchemy Core).

:class:`Store` opens the database, brings its schema to the newest migration (Alembic ``upgrade
head``, :func:`migrate`) and offers one method per operation of a round. Each method is one
transaction; state changes are conditional ``UPDATE ... WHERE state = ...`` statements, so two
requests racing for the same transition cannot both win.

* **SQLite** (the embedded default): WAL journal, ``synchronous=FULL`` (an acknowledged write
  survives a power cut), a busy timeout, and write transactions started with ``BEGIN
  IMMEDIATE`` (writers queue for the lock instead of failing on upgrade).
* **PostgreSQL** (``postgresql+psycopg://``): READ COMMITTED; the ledger charge and the
  migration take transaction-level advisory locks. A batch's message ids are inserted in sorted
  order so that two overlapping batches take their row locks in the same order (no deadlock).

Reports are deduplicated by the database: ``messages`` has the primary key (round, message id)
and a batch is inserted with ``ON CONFLICT DO NOTHING RETURNING message_id``; only the returned
(new) messages have their report entries inserted and counted. Close counts reports per
head-list entry with one ``GROUP BY``. One server process per database is assumed for the
start-up recovery (:meth:`Store.unfinished`).

On SQLite, device message ids are random, so inserting them straight into the large
``messages`` B-tree would dirty (and make each commit rewrite) nearly every leaf page. New
messages go to the small ``messages_recent`` instead, and only when their id is not in
``messages`` (decided inside the same write transaction: SQLite has one writer at a time, so the
check and the insert cannot be separated by another insert; :mod:`hybriddp.service.settled`
rules out most ids without reading that table). Once it
holds :data:`SETTLE_ROWS` rows, :meth:`Store.settle` moves them to ``messages`` in key order,
one transaction that touches each leaf page once; closing a round settles too. An id is thus in
at most one of the two tables, and every read of stored messages reads both.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import math
import operator
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import create_engine, delete, event, func, insert, inspect, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from hybriddp.errors import DataError, parameter_error
from hybriddp.ledger import BudgetExceededError, Charge, LedgerError
from hybriddp.rng import SEED_WARNING
from hybriddp.service import schema as s
from hybriddp.service.errors import ConflictError, NotFoundError, QuotaError, StoreError
from hybriddp.service.recent import Appends, RecentIds
from hybriddp.service.settled import SettledIds

DEFAULT_LIFETIME_EPSILON = 16.0
"""Lifetime ε of every opt-in user in a new database (``hybriddp serve --lifetime-epsilon``)."""
DEFAULT_LIFETIME_DELTA = 1e-4
"""Lifetime δ of every opt-in user in a new database (``--lifetime-delta``)."""
DEFAULT_RETENTION_HOURS = 168.0
"""Hours after its creation at which a round's raw opt-in data are purged whatever its state (one week)."""
MAX_RETENTION_HOURS = 24.0 * 366
DEFAULT_OPTIN_MAX_RECORDS = 10_000
"""Records (or values) one opt-in token may upload in its round (``hybriddp serve --optin-max-records``)."""
DEFAULT_OPTIN_MAX_BYTES = 16 << 20
"""Request bytes one opt-in token may upload in its round (``hybriddp serve --optin-max-bytes``)."""
ENDED_STATES = ("headlist-empty", "aborted", "deleted")
"""States a round never leaves."""

SQLITE_BUSY_TIMEOUT_MS = 30_000
ADVISORY_MIGRATE = 0x68796264_0001  # PostgreSQL advisory lock keys ("hybd")
ADVISORY_LEDGER = 0x68796264_0002
RETRIES = 5
IN_CHUNK = 500  # parameters per IN (...) list

REPORT_STATES = ("headlist-published", "collecting-reports")
# The report path's statements, written at the driver level (it runs them for every group commit);
# only integers are formatted into them.
_OPEN_ROUND = ("UPDATE rounds SET state = 'collecting-reports' WHERE num = %d AND state IN "
               f"({', '.join(repr(st) for st in REPORT_STATES)}) RETURNING n_messages")
_ROWS_PER_INSERT = 8000 if sqlite3.sqlite_version_info >= (3, 32) else 300
"""Rows per SQLite INSERT statement of messages, 3 parameters each (SQLite >= 3.32 binds up to 32,766
parameters, older 999)."""
SETTLE_ROWS = 1_000_000
"""SQLite: rows in ``messages_recent`` at which the writer moves them to ``messages`` (:meth:`Store.settle`).
Their ids are held in memory meanwhile (:mod:`hybriddp.service.recent`, ~110 bytes each)."""
SQLITE_CACHE_KIB = 2000
"""SQLite's page cache per connection, KiB (its default)."""
SETTLE_CACHE_KIB = 131_072
"""The page cache while settling, KiB: sorting ``messages_recent`` in memory instead of in temporary
files, and keeping the pages of ``messages`` it rewrites (measured: ~20% faster settles at 5 M)."""
_ADD_ROUND_COUNTS = ("UPDATE rounds SET n_messages = n_messages + %d, n_reports = n_reports + %d, "
                     "n_duplicates = n_duplicates + %d WHERE num = %d")
ROUND_ID = re.compile(r"[A-Za-z0-9_-]{22}")
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


def token_hash(token: str) -> str:
    """SHA-256 (hex) of an opt-in token: what the database keeps instead of the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


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

    @property
    def non_private(self) -> bool:
        """A seeded (experiment) round: anyone who knows the seed can regenerate its noise."""
        return self.params.get("seed") is not None

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


@dataclass(frozen=True)
class OptinUpload:
    """One opt-in user's upload: their user code, records (query, url) or values, idempotency key
    (:meth:`Store.upload_key`) and the request bytes it is charged to the token's quota."""

    user: int
    items: Sequence[Any]
    key: str
    nbytes: int


@dataclass(frozen=True)
class UploadAck:
    """What an opt-in request did: records (or values) stored, and those of uploads stored before (repeats)."""

    accepted: int
    duplicates: int


@dataclass(frozen=True)
class ReportAck:
    """What one reports request did: every message acknowledged, ``counted`` of them new."""

    acknowledged: int
    counted: int
    reports: int

    @property
    def duplicates(self) -> int:
        return self.acknowledged - self.counted


_INFO_COLUMNS = (s.rounds.c.num, s.rounds.c.id, s.rounds.c.kind, s.rounds.c.name, s.rounds.c.state,
                 s.rounds.c.params, s.rounds.c.created, s.rounds.c.headlist_hash, s.rounds.c.closed,
                 s.rounds.c.optin_users, s.rounds.c.optin_records, s.rounds.c.n_messages, s.rounds.c.n_reports,
                 s.rounds.c.n_duplicates, s.rounds.c.retention_deadline, s.rounds.c.purged)


def _info(row: Any) -> RoundInfo:
    return RoundInfo(int(row.num), row.id, row.kind, row.name, row.state, json.loads(row.params), row.created,
                     row.headlist_hash, row.closed, int(row.optin_users), int(row.optin_records),
                     int(row.n_messages), int(row.n_reports), int(row.n_duplicates), row.retention_deadline,
                     row.purged)


# ----- engine ---------------------------------------------------------------------------------
DATABASE_URLS = "sqlite:///path/to/hybriddp.db or postgresql+psycopg://user@host:port/database"


def describe_url(url: str) -> str:
    """The URL as it may be printed: the password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url[:80]




def database_url(url: str, field: str = "database URL (--db)") -> URL:
    """``url`` checked: an SQLite file, or PostgreSQL with the psycopg 3 driver (``postgresql://`` gets it)."""
    try:
        u = make_url(url)
    except ArgumentError:
        raise parameter_error(field, describe_url(url), DATABASE_URLS) from None
    backend = u.get_backend_name()
    if backend == "sqlite":
        if not u.database or u.database == ":memory:" or u.database.startswith("file:"):
            raise parameter_error(field, url, "an SQLite file: " + DATABASE_URLS,
                                  "An in-memory database holds no service's rounds or reports.")
        return u
    if backend == "postgresql":
        return u.set(drivername="postgresql+psycopg") if u.drivername == "postgresql" else u
    raise parameter_error(field, describe_url(url), DATABASE_URLS)


def make_engine(url: str) -> Engine:
    """An engine for ``sqlite:///path`` or ``postgresql+psycopg://...``, set up for the service."""
    u = database_url(url)
    if u.get_backend_name() == "sqlite":
        parent = Path(u.database).expanduser().resolve().parent
        if not parent.is_dir():
            raise StoreError(f"database {u.database}: the directory {parent} does not exist; create it first "
                             "(hybriddp serve --data-dir creates its data directory)")
        with contextlib.suppress(FileExistsError):  # a new database file is private (0600): it holds raw opt-in data
            os.close(os.open(Path(u.database).expanduser(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        engine = create_engine(u, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
                               pool_size=8, max_overflow=8)
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    try:
        return create_engine(u, pool_pre_ping=True, pool_size=8, max_overflow=8)
    except (NoSuchModuleError, ImportError):
        raise StoreError(PSYCOPG_NEEDED) from None


PSYCOPG_NEEDED = "PostgreSQL needs psycopg 3: pip install 'hybriddp[postgres]', and use a URL postgresql+psycopg://..."


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # transactions are begun by _sqlite_begin, not by the driver
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = FULL")
    cur.execute("PRAGMA secure_delete = ON")  # deleted raw opt-in data are overwritten with zeros, not left free
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    write = conn.get_execution_options().get("hybriddp_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def migrate(conn: Connection) -> None:
    """Alembic ``upgrade head`` on ``conn`` (inside the caller's transaction)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


def _retryable(exc: DBAPIError) -> bool:
    """A lock timeout (SQLite), deadlock or serialization failure (PostgreSQL): retry the transaction."""
    code = getattr(exc.orig, "sqlstate", None)
    return code in ("40001", "40P01") or "database is locked" in str(exc.orig)


# ----- the store ------------------------------------------------------------------------------
class Store:
    """Every database operation of the collection service.

    Parameters
    ----------
    url : ``sqlite:///path`` or ``postgresql+psycopg://...``.
    lifetime_epsilon, lifetime_delta : the opt-in users' lifetime budget. A new database stores it;
        an existing one keeps its own, and a different value given here is refused (None: keep).
    """

    def __init__(self, url: str, *, lifetime_epsilon: float | None = None,
                 lifetime_delta: float | None = None, optin_max_records: int = DEFAULT_OPTIN_MAX_RECORDS,
                 optin_max_bytes: int = DEFAULT_OPTIN_MAX_BYTES) -> None:
        for name, value, allowed in (("lifetime_epsilon (--lifetime-epsilon)", lifetime_epsilon, "a finite number > 0"),
                                     ("lifetime_delta (--lifetime-delta)", lifetime_delta, "a number in (0, 1)")):
            ok = value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value
                                   and (value < 1 if "delta" in name else math.isfinite(value)))
            if not ok:
                raise parameter_error(name, value, allowed)
        for name, value in (("optin_max_records (--optin-max-records)", optin_max_records),
                            ("optin_max_bytes (--optin-max-bytes)", optin_max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise parameter_error(name, value, "a whole number >= 1")
        self.optin_max_records = optin_max_records
        self.optin_max_bytes = optin_max_bytes
        self.url = url
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self.settle_rows = SETTLE_ROWS
        """SQLite: :meth:`settle_if_due` settles once ``messages_recent`` holds this many rows (tests make it small)."""
        self._recent = RecentIds()
        """SQLite: the ids in ``messages_recent`` (that table has no index on them; :mod:`hybriddp.service.recent`)."""
        self._settled = SettledIds()
        """SQLite: hashes of the ids in ``messages``; new ids skip its probe (:mod:`hybriddp.service.settled`)."""
        try:
            self._setup(lifetime_epsilon, lifetime_delta)
            if self.dialect == "sqlite":
                self._read(self._recent.catch_up)
        except BaseException:
            self.engine.dispose()
            raise

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    # ----- transactions ---------------------------------------------------------------------
    def _run(self, fn: Callable[[Connection], T], *, write: bool) -> T:
        """Run ``fn`` in one transaction; retry on lock timeouts/deadlocks; database failures → StoreError."""
        for attempt in range(RETRIES):
            try:
                with self.engine.connect() as conn:
                    if write:
                        conn = conn.execution_options(hybriddp_write=True)
                    with conn.begin():
                        return fn(conn)
            except DBAPIError as exc:
                if attempt + 1 < RETRIES and _retryable(exc):
                    time.sleep(0.01 * 2 ** attempt)
                    continue
                why = " ".join(str(exc.orig).split())[:300]  # one line
                raise StoreError(f"database {describe_url(self.url)}: {type(exc.orig).__name__}: {why}; check that "
                                 "the database is reachable and writable") from None
            except SQLAlchemyError as exc:
                raise StoreError(f"database {describe_url(self.url)}: {exc}") from None
        raise AssertionError("unreachable")

    def _write(self, fn: Callable[[Connection], T]) -> T:
        return self._run(fn, write=True)

    def _read(self, fn: Callable[[Connection], T]) -> T:
        return self._run(fn, write=False)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run the read-only ``fn(connection)`` in one transaction (e.g. :mod:`hybriddp.service.ledger_view`)."""
        return self._read(fn)

    def _insert(self, table: Any) -> Any:
        return (sqlite.insert(table) if self.dialect == "sqlite" else postgresql.insert(table))

    # ----- schema and ledger metadata ---------------------------------------------------------
    def _setup(self, lifetime_epsilon: float | None, lifetime_delta: float | None) -> None:
        def run(conn: Connection) -> tuple[bytes, float, float]:
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_MIGRATE})
            tables = set(inspect(conn).get_table_names())
            if tables and "alembic_version" not in tables:
                raise StoreError(f"database {describe_url(self.url)} holds other tables "
                                 f"({', '.join(sorted(tables)[:6])}) and is not a hybriddp service database; give a "
                                 "new or empty database (--db)")
            migrate(conn)
            meta = dict(conn.execute(select(s.ledger_meta.c.key, s.ledger_meta.c.value)).all())
            if not meta:
                meta = {"salt": secrets.token_hex(32),
                        "lifetime_epsilon": repr(float(lifetime_epsilon or DEFAULT_LIFETIME_EPSILON)),
                        "lifetime_delta": repr(float(lifetime_delta or DEFAULT_LIFETIME_DELTA))}
                conn.execute(insert(s.ledger_meta), [{"key": k, "value": v} for k, v in meta.items()])
            return bytes.fromhex(meta["salt"]), float(meta["lifetime_epsilon"]), float(meta["lifetime_delta"])

        try:
            self._salt, self.lifetime_epsilon, self.lifetime_delta = self._write(run)
        except (KeyError, ValueError) as exc:
            raise StoreError(f"database {describe_url(self.url)}: the ledger metadata is damaged ({exc}); restore "
                             "the database from a backup") from None
        for name, given, have in (("epsilon", lifetime_epsilon, self.lifetime_epsilon),
                                  ("delta", lifetime_delta, self.lifetime_delta)):
            if given is not None and float(given) != have:
                raise LedgerError(f"database {describe_url(self.url)} has lifetime {name} {have!r}, not {given!r}: "
                                  "the opt-in users' budget is fixed when the database is created (leave out "
                                  f"--lifetime-{name})")

    def pseudonym(self, user: str) -> str:
        """HMAC-SHA256(per-database salt, user), hex, 128 bits: the ledger never names a user."""
        return hmac.new(self._salt, user.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]

    # ----- rounds ---------------------------------------------------------------------------
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

    def _transition(self, conn: Connection, round_id: str, from_states: Sequence[str], to_state: str,
                    action: str, **values: Any) -> RoundInfo:
        """Conditional UPDATE of the state; ConflictError (naming the state) when the round is elsewhere."""
        res = conn.execute(update(s.rounds).where(s.rounds.c.id == round_id, s.rounds.c.state.in_(from_states))
                           .values(state=to_state, **values))
        info = self._get(conn, round_id)
        if res.rowcount != 1:
            raise ConflictError(f"cannot {action}: round {round_id} is {info.state!r}, it must be "
                                f"{' or '.join(repr(x) for x in from_states)}")
        return info

    # ----- opt-in ---------------------------------------------------------------------------
    def enrol(self, round_id: str, user: str) -> str:
        """A new opt-in token for ``user`` in this round (only its hash is stored)."""
        return self.enrol_many(round_id, [user])[0]

    def enrol_many(self, round_id: str, users: Sequence[str]) -> list[str]:
        """New opt-in tokens for ``users``, in order (their order is the curator's user order).

        All or nothing: a user enrolled before (or twice in the list) refuses the whole request.
        """
        pseuds = [self.pseudonym(u) for u in users]
        seen: set[str] = set()
        for user, p in zip(users, pseuds, strict=True):
            if p in seen:
                raise DataError(f"user {user[:60]!r} appears twice in the request; a user gets one token per round")
            seen.add(p)
        tokens = [secrets.token_urlsafe(32) for _ in users]
        ot = s.optin_tokens.c

        def run(conn: Connection) -> None:
            info = self._get(conn, round_id)
            if info.state != "collecting-optin":
                raise ConflictError(f"cannot enrol: round {round_id} is {info.state!r}; opt-in users enrol while it "
                                    "is 'collecting-optin'")
            for i in range(0, len(pseuds), IN_CHUNK):
                taken = conn.execute(select(ot.user_pseudonym).where(
                    ot.round_num == info.num, ot.user_pseudonym.in_(pseuds[i:i + IN_CHUNK]))).scalars().first()
                if taken is not None:
                    user = users[pseuds.index(taken)]
                    raise ConflictError(f"user {user[:60]!r} is already enrolled in round {round_id}; a user gets one "
                                        "token per round (use the token issued before); nobody in this request was "
                                        "enrolled")
            last = conn.execute(update(s.rounds).where(s.rounds.c.num == info.num,
                                                       s.rounds.c.state == "collecting-optin")
                                .values(optin_users=s.rounds.c.optin_users + len(users))
                                .returning(s.rounds.c.optin_users)).scalar_one()
            first = last - len(users) + 1
            conn.execute(insert(s.optin_tokens), [
                {"token_hash": token_hash(tok), "round_num": info.num, "user_pseudonym": p, "seq": first + i}
                for i, (tok, p) in enumerate(zip(tokens, pseuds, strict=True))])
        try:
            self._write(run)
        except StoreError:
            if any(self._enrolled(round_id, p) for p in pseuds[:IN_CHUNK]):  # lost a race with another request
                raise ConflictError(f"a user of this request is already enrolled in round {round_id}") from None
            raise
        return tokens

    def optin_users(self, round_id: str, tokens: Sequence[str]) -> tuple[RoundInfo, list[int | None]]:
        """(round, each token's user code or None when it is not an opt-in token of this round)."""
        hashes = [token_hash(t) for t in tokens]
        ot = s.optin_tokens.c

        def run(conn: Connection) -> tuple[RoundInfo, list[int | None]]:
            info = self._get(conn, round_id)
            found: dict[str, int] = {}
            unique = sorted(set(hashes))
            for i in range(0, len(unique), IN_CHUNK):
                found.update({h: int(q) for h, q in conn.execute(select(ot.token_hash, ot.seq).where(
                    ot.round_num == info.num, ot.token_hash.in_(unique[i:i + IN_CHUNK]))).all()})
            return info, [found.get(h) for h in hashes]
        return self._read(run)

    def upload_key(self, upload_id: str | None, items: Sequence[Any]) -> str:
        """The key that makes an upload idempotent: HMAC-SHA256(salt, the uploader's id, or else the batch's
        content), hex. Keyed, so that the stored key says nothing about the raw records of the batch."""
        payload = "id:" + upload_id if upload_id is not None else "batch:" + json.dumps(list(items))
        return hmac.new(self._salt, payload.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def add_optin_batch(self, info: RoundInfo, uploads: Sequence[OptinUpload]) -> UploadAck:
        """Store several opt-in users' uploads in one transaction, or none of them.

        An upload whose key the same token stored before is acknowledged and not stored again; an
        upload that would take its token past :attr:`optin_max_records` or :attr:`optin_max_bytes`
        refuses the whole request (:class:`QuotaError`).
        """
        def run(conn: Connection) -> UploadAck:
            res = conn.execute(update(s.rounds).where(s.rounds.c.num == info.num,
                                                      s.rounds.c.state == "collecting-optin")
                               .values(optin_records=s.rounds.c.optin_records))  # takes the row lock, checks state
            if res.rowcount != 1:
                state = self._get(conn, info.id).state
                raise ConflictError(f"cannot upload opt-in data: round {info.id} is {state!r}; uploads are taken "
                                    "while it is 'collecting-optin' (raw data are deleted when the head list is "
                                    "published, the round is aborted or deleted, or its retention deadline passes)")
            accepted = duplicates = 0
            rows: list[dict[str, Any]] = []
            ot = s.optin_tokens.c
            for up in uploads:
                new = conn.execute(self._insert(s.optin_uploads).values(
                    round_num=info.num, user_seq=up.user, upload_key=up.key, n_records=len(up.items))
                    .on_conflict_do_nothing().returning(s.optin_uploads.c.user_seq)).first()
                if new is None:
                    duplicates += len(up.items)
                    continue
                have, nbytes = conn.execute(select(ot.n_records, ot.n_bytes).where(
                    ot.round_num == info.num, ot.seq == up.user)).one()
                if have + len(up.items) > self.optin_max_records or nbytes + up.nbytes > self.optin_max_bytes:
                    raise QuotaError(
                        f"opt-in upload refused: it would take a token of round {info.id} to "
                        f"{have + len(up.items):,} records and {nbytes + up.nbytes:,} bytes, over this server's quota "
                        f"of {self.optin_max_records:,} records and {self.optin_max_bytes:,} bytes per token "
                        "(hybriddp serve --optin-max-records/--optin-max-bytes); nothing of this request was stored")
                conn.execute(update(s.optin_tokens).where(ot.round_num == info.num, ot.seq == up.user).values(
                    n_records=ot.n_records + len(up.items), n_bytes=ot.n_bytes + up.nbytes))
                accepted += len(up.items)
                if info.kind == "mean":
                    rows += [{"round_num": info.num, "user_seq": up.user, "value": float(v)} for v in up.items]
                else:
                    rows += [{"round_num": info.num, "user_seq": up.user, "query": r[0], "url": r[1]}
                             for r in up.items]
            if rows:
                conn.execute(insert(s.optin_values if info.kind == "mean" else s.optin_records), rows)
                conn.execute(update(s.rounds).where(s.rounds.c.num == info.num)
                             .values(optin_records=s.rounds.c.optin_records + len(rows)))
            return UploadAck(accepted, duplicates)
        return self._write(run)

    def start_build(self, round_id: str, epsilon: float, delta: float, *, private: bool) -> RoundInfo:
        """collecting-optin → building-headlist, charging every opt-in user with data (ε, δ) in the SAME
        transaction, before the curator's mechanism runs.

        Every run of the mechanism is thus charged whatever it outputs (an empty head list included), and
        a round never returns to collecting-optin, so no retry can draw fresh noise uncharged
        (docs/ALGORITHM.md §3.4). Refused with nothing charged when the round has no opt-in data, or when a
        user would exceed the lifetime budget (:class:`BudgetExceededError`; the round stays
        collecting-optin, its raw data kept until :meth:`abort` or the retention deadline).
        ``private=False`` (a seeded round) records the charges as non-private (they give no guarantee
        and count against no budget).
        """
        def run(conn: Connection) -> RoundInfo:
            info = self._transition(conn, round_id, ["collecting-optin"], "building-headlist",
                                    "publish the head list")
            table = s.optin_values if info.kind == "mean" else s.optin_records
            ot = s.optin_tokens.c
            users = conn.execute(select(ot.user_pseudonym).where(ot.round_num == info.num, ot.seq.in_(
                select(table.c.user_seq).where(table.c.round_num == info.num).distinct()))).scalars().all()
            if not users:
                what = "values" if info.kind == "mean" else "records"
                raise DataError(f"round {round_id} has no opt-in {what}; opt-in users upload them with their token "
                                "(POST /api/v1/rounds/{id}/optin/records) before the head list is built. Nothing "
                                "was run or charged")
            self._charge_rows(conn, info, {u: ("optin", float(epsilon), float(delta)) for u in users}, private,
                              kept=self._kept_message(info))
            return info
        return self._write(run)

    def _kept_message(self, info: RoundInfo) -> str:
        return (f"Nothing was run or charged. The round's raw opt-in data stay until its retention deadline "
                f"({info.retention_deadline} UTC) or until an administrator aborts it (hybriddp round abort "
                f"{info.id}), which deletes them")

    def finish_build(self, info: RoundInfo, outcome: str, headlist: dict[str, Any] | None = None,
                     estimates: dict[str, Any] | None = None, results: dict[str, Any] | None = None) -> RoundInfo:
        """building-headlist → ``outcome`` (headlist-published, headlist-empty or aborted), storing the
        documents, and deleting the raw opt-in data in the same transaction (then scrubbed from the files)."""
        def run(conn: Connection) -> RoundInfo:
            values: dict[str, Any] = {}
            if headlist is not None:
                values.update(headlist=json.dumps(headlist, allow_nan=False, ensure_ascii=False),
                              headlist_hash=headlist["content_hash"])
            if estimates is not None:
                values["estimates"] = json.dumps(estimates, allow_nan=False, ensure_ascii=False)
            if results is not None:
                values["results"] = json.dumps(results, allow_nan=False, ensure_ascii=False)
            self._transition(conn, info.id, ["building-headlist"], outcome, f"end the build as {outcome}", **values)
            self._purge_raw(conn, info.num)
            return self._get(conn, info.id)
        out = self._write(run)
        self.scrub()
        return out

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
        now): a round still collecting-optin is aborted. The ids of the rounds purged."""
        when = at or now()

        def run(conn: Connection) -> list[str]:
            r = s.rounds.c
            due = conn.execute(select(r.num, r.id, r.state).where(
                r.purged.is_(None), r.retention_deadline.is_not(None), r.retention_deadline <= when,
                r.state != "building-headlist")).all()
            for num, rid, state in due:
                if state == "collecting-optin":
                    self._transition(conn, rid, ["collecting-optin"], "aborted", "abort at the retention deadline")
                self._purge_raw(conn, int(num))
            return [rid for _, rid, _ in due]
        purged = self._write(run)
        if purged:
            self.scrub()
        return purged

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
        older frames still held the rows. Retried while readers hold an old snapshot; False if it could
        not finish (:meth:`purge_expired`, run periodically, scrubs again). PostgreSQL: ``VACUUM FULL``
        of the opt-in tables rewrites them into new files (the old ones are unlinked); the server's WAL
        (``pg_wal``) and base backups keep the rows until they are recycled (docs: PRIVACY.md).
        """
        if self.dialect == "sqlite":
            for attempt in range(50):
                with self.engine.connect() as conn:
                    busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").first()
                if busy is None or int(busy[0]) == 0:
                    return True
                time.sleep(0.01 * min(2 ** attempt, 20))
            return False
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("VACUUM FULL optin_records, optin_values, optin_uploads, optin_tokens")
        return True
    def optin_records(self, round_num: int) -> tuple[list[int], list[str], list[str | None], dict[int, str]]:
        """(user code per record, query, url, pseudonym per user code), records in upload order."""
        def run(conn: Connection) -> tuple[list[int], list[str], list[str | None], dict[int, str]]:
            rows = conn.execute(select(s.optin_records.c.user_seq, s.optin_records.c.query, s.optin_records.c.url)
                                .where(s.optin_records.c.round_num == round_num).order_by(s.optin_records.c.id)).all()
            users, queries, urls = (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [])
            return users, queries, urls, self._pseudonyms(conn, round_num)
        return self._read(run)

    def optin_values(self, round_num: int) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
        """(user code per value, value, pseudonym per user code), values in upload order."""
        def run(conn: Connection) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
            rows = conn.execute(select(s.optin_values.c.user_seq, s.optin_values.c.value)
                                .where(s.optin_values.c.round_num == round_num).order_by(s.optin_values.c.id)).all()
            users = np.array([r[0] for r in rows], dtype=np.int64)
            values = np.array([r[1] for r in rows], dtype=np.float64)
            return users, values, self._pseudonyms(conn, round_num)
        return self._read(run)

    def _pseudonyms(self, conn: Connection, round_num: int) -> dict[int, str]:
        return {int(q): p for q, p in conn.execute(select(s.optin_tokens.c.seq, s.optin_tokens.c.user_pseudonym)
                                                   .where(s.optin_tokens.c.round_num == round_num)).all()}

    # ----- the privacy ledger ---------------------------------------------------------------
    def charge(self, info: RoundInfo, charges: Sequence[Charge], *, private: bool = True) -> None:
        """Record the round's charges, or refuse all of them (:class:`BudgetExceededError`).

        Users are the pseudonyms of :meth:`pseudonym`. Basic composition (Σε, Σδ) of the private
        charges against the database's lifetime budget, like :class:`hybriddp.ledger.PrivacyLedger`.
        """
        rows: dict[str, tuple[str, float, float]] = {}
        for c in charges:
            for user in c.users:
                if user in rows:
                    raise LedgerError(f"a user appears twice in round {info.id} (groups {rows[user][0]!r} and "
                                      f"{c.group!r})")
                rows[user] = (c.group, float(c.epsilon), float(c.delta))
        self._write(lambda conn: self._charge_rows(conn, info, rows, private, kept="Nothing was published or "
                                                                                 "charged"))

    def _charge_rows(self, conn: Connection, info: RoundInfo, rows: dict[str, tuple[str, float, float]],
                     private: bool, *, kept: str) -> None:
        """Insert the charges ``rows`` (pseudonym → group, ε, δ), or raise BudgetExceededError (``kept`` says
        what became of the round). Non-private charges are recorded and count against no budget."""
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_LEDGER})
        if private:
            users = sorted(rows)
            spent: dict[str, tuple[float, float]] = {}
            lc = s.ledger_charges.c
            for i in range(0, len(users), IN_CHUNK):
                chunk = users[i:i + IN_CHUNK]
                spent.update({u: (float(e), float(d)) for u, e, d in conn.execute(
                    select(lc.user_pseudonym, func.sum(lc.epsilon), func.sum(lc.delta))
                    .where(lc.user_pseudonym.in_(chunk), lc.private.is_(True)).group_by(lc.user_pseudonym)).all()})
            over = []
            for u, (_, e, d) in rows.items():
                pe, pd = spent.get(u, (0.0, 0.0))
                if pe + e > self.lifetime_epsilon * (1 + 1e-12) or pd + d > self.lifetime_delta * (1 + 1e-12):
                    over.append((pe + e, pd + d))
            if over:
                e, d = max(over)
                raise BudgetExceededError(
                    f"round {info.id} refused: {len(over):,} opt-in user(s) would exceed the lifetime budget "
                    f"(epsilon {self.lifetime_epsilon:g}, delta {self.lifetime_delta:g}); the worst would reach "
                    f"epsilon {e:.4g}, delta {d:.3g}. {kept}. Create the round with a smaller epsilon or delta")
        if rows:
            conn.execute(insert(s.ledger_charges), [
                {"user_pseudonym": u, "round_num": info.num, "grp": g, "epsilon": e, "delta": d, "private": private}
                for u, (g, e, d) in rows.items()])

    def spent(self, user: str) -> tuple[float, float]:
        """(Σε, Σδ) charged to ``user`` so far."""
        lc = s.ledger_charges.c
        row = self._read(lambda conn: conn.execute(select(func.sum(lc.epsilon), func.sum(lc.delta)).where(
            lc.user_pseudonym == self.pseudonym(user))).one())
        return float(row[0] or 0.0), float(row[1] or 0.0)

    # ----- reports ----------------------------------------------------------------------------
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
        return self._write(run)

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

    def finish_close(self, info: RoundInfo, results: dict[str, Any], counts: list[int] | None) -> RoundInfo:
        """Store the results; closed → results-published."""
        def run(conn: Connection) -> RoundInfo:
            return self._transition(conn, info.id, ["closed"], "results-published", "publish results",
                                    results=json.dumps(results, allow_nan=False, ensure_ascii=False),
                                    report_counts=None if counts is None else json.dumps(counts))
        self._write(run)
        return self.round(info.id)

    def unfinished(self) -> list[RoundInfo]:
        """Rounds left mid-step by a stopped server: building-headlist or closed (see rounds.recover)."""
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


@contextlib.contextmanager
def open_store(url: str, **kw: Any) -> Iterator[Store]:
    """A :class:`Store`, closed on exit."""
    store = Store(url, **kw)
    try:
        yield store
    finally:
        store.close()


__all__ = ["DEFAULT_LIFETIME_DELTA", "DEFAULT_LIFETIME_EPSILON", "SETTLE_ROWS", "ReportAck", "RoundDocuments",
           "RoundInfo", "Store", "open_store"]

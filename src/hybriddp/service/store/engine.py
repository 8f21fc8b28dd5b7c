"""The store's database: engine, pragmas, migrations and transactions (SQLAlchemy Core, SQLite or PostgreSQL).

* **SQLite** (the embedded default): WAL journal, ``synchronous=FULL`` (an acknowledged write
  survives a power cut), ``secure_delete`` (deleted raw opt-in data are overwritten, PRIVACY.md "The raw
  opt-in data's lifecycle"), a busy timeout, and write transactions started with ``BEGIN IMMEDIATE``
  (writers queue for the lock instead of failing on upgrade).
* **PostgreSQL** (``postgresql+psycopg://``): READ COMMITTED; the ledger charge and the migration take
  transaction-level advisory locks.

:class:`StoreBase` opens the database, brings its schema to the newest migration (Alembic ``upgrade
head``, :func:`migrate`), reads or creates the ledger metadata (salt and lifetime budget), and runs each
operation of the other store modules as one transaction, retried on lock timeouts and deadlocks.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, event, insert, inspect, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from hybriddp.core.errors import parameter_error
from hybriddp.privacy.ledger import LedgerError
from hybriddp.service import schema as s
from hybriddp.service.errors import StoreError
from hybriddp.service.recent import RecentIds
from hybriddp.service.settled import SettledIds

DEFAULT_LIFETIME_EPSILON = 16.0
"""Lifetime ε of every opt-in user in a new database (``hybriddp serve --lifetime-epsilon``)."""
DEFAULT_LIFETIME_DELTA = 1e-4
"""Lifetime δ of every opt-in user in a new database (``--lifetime-delta``)."""
DEFAULT_OPTIN_MAX_RECORDS = 10_000
"""Records (or values) one opt-in token may upload in its round (``hybriddp serve --optin-max-records``)."""
DEFAULT_OPTIN_MAX_BYTES = 16 << 20
"""Request bytes one opt-in token may upload in its round (``hybriddp serve --optin-max-bytes``)."""

SQLITE_BUSY_TIMEOUT_MS = 30_000
ADVISORY_MIGRATE = 0x68796264_0001  # PostgreSQL advisory lock keys ("hybd")
ADVISORY_LEDGER = 0x68796264_0002
ADVISORY_SERIES = 0x68796264_0003
RETRIES = 5
IN_CHUNK = 500  # parameters per IN (...) list
SETTLE_ROWS = 1_000_000
"""SQLite: rows in ``messages_recent`` at which the writer moves them to ``messages`` (``Store.settle``).
Their ids are held in memory meanwhile (:mod:`hybriddp.service.recent`, ~110 bytes each)."""
MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"
"""The Alembic scripts (``hybriddp/service/migrations``)."""
DATABASE_URLS = "sqlite:///path/to/hybriddp.db or postgresql+psycopg://user@host:port/database"
PSYCOPG_NEEDED = "PostgreSQL needs psycopg 3: pip install 'hybriddp[postgres]', and use a URL postgresql+psycopg://..."

T = TypeVar("T")


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
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


def _retryable(exc: DBAPIError) -> bool:
    """A lock timeout (SQLite), deadlock or serialization failure (PostgreSQL): retry the transaction."""
    code = getattr(exc.orig, "sqlstate", None)
    return code in ("40001", "40P01") or "database is locked" in str(exc.orig)


def _check_settings(lifetime_epsilon: float | None, lifetime_delta: float | None, optin_max_records: int,
                    optin_max_bytes: int) -> None:
    """ParameterError naming the option when a lifetime budget or an upload quota is out of range."""
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


class StoreBase:
    """The database of the collection service and its transactions (the other store modules add the operations).

    Parameters
    ----------
    url : ``sqlite:///path`` or ``postgresql+psycopg://...``.
    lifetime_epsilon, lifetime_delta : the opt-in users' lifetime budget. A new database stores it;
        an existing one keeps its own, and a different value given here is refused (None: keep).
    optin_max_records, optin_max_bytes : each opt-in token's upload quota in its round.
    """

    def __init__(self, url: str, *, lifetime_epsilon: float | None = None,
                 lifetime_delta: float | None = None, optin_max_records: int = DEFAULT_OPTIN_MAX_RECORDS,
                 optin_max_bytes: int = DEFAULT_OPTIN_MAX_BYTES) -> None:
        _check_settings(lifetime_epsilon, lifetime_delta, optin_max_records, optin_max_bytes)
        self.optin_max_records = optin_max_records
        self.optin_max_bytes = optin_max_bytes
        self.url = url
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self.settle_rows = SETTLE_ROWS
        self.scrub_pending = False
        """A purge whose scrub of the files could not finish (readers held old snapshots): the next purge pass
        (:meth:`~hybriddp.service.store.rounds.RoundStore.purge_expired`) scrubs again."""
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
        """Migrate the schema; read the ledger's salt and lifetime budget, or store them in a new database."""
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

"""The privacy ledger: what every user has spent, round by round (PRIVACY.md).

Each BLENDER round releases something about each participating user: opt-in users in S and T
and clients each spend (ε, δ) once per round (ALGORITHM.md §2). Over many rounds the guarantees
compose. The ledger records, per user and round, the (ε, δ) of that user's release, prints
per-round and cumulative guarantees under basic and advanced composition, and **refuses** a
round that would take any user over the configured lifetime budget — before anything is
released. The budget is enforced under basic composition (Σε, Σδ), which is conservative: the one
rule of :mod:`hybriddp.privacy.budget`.

Storage is an SQLite file. User identifiers are never stored: a user is recorded as
HMAC-SHA256(salt, id) with a random per-ledger salt (:func:`hybriddp.privacy.pseudonyms.pseudonym`), so the
ledger shows how much was spent without naming who.

**Non-private releases.** A seeded release (``--seed``) is reproducible by anyone who knows the
seed and gives no privacy. Its charges (``Charge.private = False``) are recorded and reported, but
the (ε, δ) sums — the budget check, the cumulative guarantees, the remaining budget — count
private releases only: a stated (ε, δ) means nothing for a release that has no guarantee, and
adding it would suggest one. Instead the report flags every such round and, per user, the number
of non-private releases: a user in any of them has **no privacy guarantee at all**.
Ledgers written before this column existed are read as all-private and gain the column (default
private) the first time a round is charged to them.

Advanced composition (Dwork, Rothblum, Vadhan 2010; Kairouz et al. 2015 form for
heterogeneous releases): k releases (ε_i, δ_i) are (ε', Σδ_i + δ')-DP with
ε' = sqrt(2 ln(1/δ') Σ ε_i²) + Σ ε_i (e^{ε_i} − 1). The report shows min(basic, advanced).
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hybriddp.core.atomic import atomic_path
from hybriddp.core.errors import HybridDPError, parameter_error
from hybriddp.privacy.budget import LifetimeBudget
from hybriddp.privacy.pseudonyms import pseudonym


class BudgetExceededError(HybridDPError):
    """A round would take a user over the lifetime privacy budget; nothing was recorded."""


class LedgerError(HybridDPError):
    """The ledger file is missing, damaged, or used inconsistently."""


@dataclass(frozen=True)
class Charge:
    """One group of users charged (ε, δ) in a round (e.g. "optin-S", "optin-T", "clients").

    ``private=False``: the release was seeded and gives no privacy; recorded, but not counted in the
    (ε, δ) sums (module docstring).
    """

    group: str
    users: Sequence[str]
    epsilon: float
    delta: float
    private: bool = True


def basic_composition(eps: Sequence[float], deltas: Sequence[float]) -> tuple[float, float]:
    """(Σε_i, Σδ_i)."""
    return float(sum(eps)), float(sum(deltas))


def advanced_composition(eps: Sequence[float], deltas: Sequence[float], delta_prime: float) -> tuple[float, float]:
    """(sqrt(2 ln(1/δ') Σε_i²) + Σε_i(e^{ε_i} − 1), Σδ_i + δ')."""
    e = math.sqrt(2.0 * math.log(1.0 / delta_prime) * sum(x * x for x in eps)) + sum(
        x * math.expm1(x) if x < 700.0 else math.inf for x in eps)  # e^ε overflows a float beyond ~709.8
    return e, float(sum(deltas)) + delta_prime


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, created TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    user TEXT NOT NULL, round INTEGER NOT NULL REFERENCES rounds(id), grp TEXT NOT NULL,
    epsilon REAL NOT NULL, delta REAL NOT NULL, private INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (user, round));
CREATE INDEX IF NOT EXISTS charges_round ON charges(round);
"""
# Constant SQL used next to other code, kept here: SQLite keywords and names are case-insensitive, so the
# mutation tool's upper/lower-case mutants of it would be equivalent (docs/TESTING.md)
_SQL_META_INSERT = "INSERT INTO meta VALUES (?, ?)"
_SQL_META = "SELECT key, value FROM meta"
_SQL_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
_SQL_FORMAT = "SELECT value FROM meta WHERE key = 'format'"
_SQL_ROUND_EXISTS = "SELECT 1 FROM rounds WHERE name = ?"
_SQL_PENDING_INSERT = "INSERT INTO pending VALUES (?, ?, ?, ?, ?)"
_SQL_ADD_PRIVATE = "ALTER TABLE charges ADD COLUMN private INTEGER NOT NULL DEFAULT 1"
_SQL_ROUND_INSERT = "INSERT INTO rounds (name, created) VALUES (?, ?)"
_SQL_ROUNDS = "SELECT id, name, created FROM rounds ORDER BY id"
_FORMAT = "hybriddp-ledger-1"
_COLUMNS = {"meta": {"key", "value"}, "rounds": {"id", "name", "created"},
            "charges": {"user", "round", "grp", "epsilon", "delta"}}
"""The columns a ledger must have; ``charges.private`` is added to older ledgers when they are next charged."""
_SQLITE_MAGIC = b"SQLite format 3\x00"
_RESTORE = ("restore it from a backup; do not start a new ledger in its place, since that would forget what every "
            "user has spent")


SERVICE_TABLES = frozenset({"alembic_version", "ledger_charges"})
"""The tables of the collection service's database (its ledger: :mod:`hybriddp.service.ledger_view`)."""


def is_service_database(path: str | Path) -> bool:
    """True if ``path`` is an SQLite file with the collection service's tables; it is opened read-only."""
    try:
        with open(path, "rb") as fh:
            if fh.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
                return False
        conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
    except (OSError, sqlite3.Error):
        return False
    try:
        return SERVICE_TABLES <= {name for (name,) in conn.execute(_SQL_TABLES)}
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def _check_lifetime(epsilon: float | None, delta: float | None) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < math.inf:  # None too
        raise parameter_error("lifetime_epsilon (--lifetime-epsilon)", epsilon, "a finite number > 0")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise parameter_error("lifetime_delta (--lifetime-delta)", delta, "in (0, 1)")


def _create(path: Path, epsilon: float, delta: float) -> None:
    """Write a new, empty ledger with its lifetime budget; atomically, so a failure leaves no file."""
    with atomic_path(path) as tmp:
        conn = sqlite3.connect(tmp)
        try:
            conn.executescript(_SCHEMA)
            with conn:
                conn.executemany(_SQL_META_INSERT, [
                    ("lifetime_epsilon", repr(float(epsilon))), ("lifetime_delta", repr(float(delta))),
                    ("salt", os.urandom(32).hex()), ("format", _FORMAT)])  # a 256-bit salt from the OS CSPRNG
        finally:
            conn.close()


def _connect(path: Path) -> sqlite3.Connection:
    """Open an existing ledger after checking, without writing anything, that it is one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise LedgerError(f"cannot read ledger {path}: {exc.strerror or exc}") from None
    if not head:
        raise LedgerError(
            f"ledger {path} is an empty file (0 bytes), not a hybriddp ledger. If you meant to create a new ledger, "
            "delete the empty file (or give a path that does not exist) and pass --lifetime-epsilon and "
            f"--lifetime-delta; if it was a ledger in use, it was truncated: {_RESTORE}")
    if head != _SQLITE_MAGIC:
        raise LedgerError(f"{path} is not a hybriddp ledger: it is not an SQLite database (it starts with "
                          f"{head!r}). Check the --ledger path; a new ledger is created at a path that does "
                          "not exist yet")
    conn = sqlite3.connect(path)
    try:
        tables = {name for (name,) in conn.execute(_SQL_TABLES)}
        missing = [t for t in _COLUMNS if t not in tables or not _COLUMNS[t] <= {
            row[1] for row in conn.execute(f"PRAGMA table_info({t})")}]
        fmt = None if missing else conn.execute(_SQL_FORMAT).fetchone()
    except sqlite3.Error as exc:
        conn.close()
        raise LedgerError(f"{path} is damaged (SQLite: {exc}); {_RESTORE}") from None
    if missing or fmt is None or fmt[0] != _FORMAT:
        conn.close()
        found = ", ".join(sorted(tables)[:8]) or "none"
        raise LedgerError(f"{path} is an SQLite database but not a hybriddp ledger (its tables: {found}; a ledger "
                          f"has meta, rounds and charges, format {_FORMAT!r}). Check the --ledger path; hybriddp "
                          "does not write into other databases")
    return conn


class PrivacyLedger:
    """Per-user accounting of (ε, δ) across rounds, with a lifetime budget.

    Use :meth:`open`; charge a round with :meth:`charge` *before* releasing its output.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        try:
            meta = dict(conn.execute(_SQL_META))
            self.lifetime_epsilon = float(meta["lifetime_epsilon"])
            self.lifetime_delta = float(meta["lifetime_delta"])
            self._salt = bytes.fromhex(meta["salt"])
        except KeyError as exc:
            raise LedgerError(f"{path}: ledger metadata is missing {exc}; {_RESTORE}") from None
        except (sqlite3.Error, TypeError, ValueError) as exc:
            raise LedgerError(f"{path}: ledger metadata is damaged ({exc}); {_RESTORE}") from None
        if not (0 < self.lifetime_epsilon < math.inf and 0 < self.lifetime_delta < 1 and self._salt):
            raise LedgerError(f"{path}: ledger metadata is damaged (lifetime epsilon {self.lifetime_epsilon!r}, "
                              f"delta {self.lifetime_delta!r}, salt of {len(self._salt)} bytes); {_RESTORE}")
        self._has_private = "private" in {row[1] for row in conn.execute("PRAGMA table_info(charges)")}

    @property
    def _private(self) -> str:
        """The SQL of a charge's private flag: the column, or 1 in a ledger written before it existed."""
        return "private" if self._has_private else "1"

    @classmethod
    def open(cls, path: str | Path, *, lifetime_epsilon: float | None = None,
             lifetime_delta: float | None = None) -> PrivacyLedger:
        """Open a ledger; a new one needs its lifetime budget (ε, δ).

        An existing file is checked to be a hybriddp ledger before anything is written to it; a new
        ledger is created atomically. Raises :class:`LedgerError` (or ``ParameterError`` for a bad
        budget) naming the file and the fix.
        """
        p = Path(path)
        if p.is_dir():
            raise LedgerError(f"ledger {p} is a directory; give a file name such as {p / 'privacy.db'}")
        if not p.exists():
            if lifetime_epsilon is None or lifetime_delta is None:
                raise LedgerError(f"ledger {p} does not exist; to create it give --lifetime-epsilon and "
                                  "--lifetime-delta")
            _check_lifetime(lifetime_epsilon, lifetime_delta)
            parent = p.parent  # Path("x").parent is Path(".")
            if not parent.is_dir():
                raise LedgerError(f"cannot create ledger {p}: the directory {parent} does not exist; create it first")
            try:
                _create(p, lifetime_epsilon, lifetime_delta)
            except (OSError, sqlite3.Error) as exc:
                raise LedgerError(f"cannot create ledger {p}: {exc}") from None
        conn = _connect(p)
        try:
            ledger = cls(conn, p)
        except LedgerError:
            conn.close()
            raise
        for name, given, have in (("epsilon", lifetime_epsilon, ledger.lifetime_epsilon),
                                  ("delta", lifetime_delta, ledger.lifetime_delta)):
            if given is not None and float(given) != have:
                ledger.close()
                raise LedgerError(f"{p} has lifetime {name} {have}, not {given}; a ledger's budget is fixed when "
                                  f"it is created (leave out --lifetime-{name})")
        return ledger

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PrivacyLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pseudonym(self, user: str) -> str:
        """HMAC-SHA256(salt, user), hex, truncated to 128 bits (:func:`hybriddp.privacy.pseudonyms.pseudonym`)."""
        return pseudonym(self._salt, user)

    # ----- charging -------------------------------------------------------------------------
    def charge(self, round_name: str, charges: Sequence[Charge]) -> int:
        """Record a round atomically; refuse it if any user would exceed the lifetime budget.

        A user may be charged at most once per round (one release per user per round).
        Non-private charges (``Charge.private = False``) are recorded but count against no budget.
        Returns the round id.
        """
        if self.conn.execute(_SQL_ROUND_EXISTS, (round_name,)).fetchone():
            raise LedgerError(f"round {round_name!r} is already in the ledger {self.path}; a user may be charged "
                              "once per round — use a new round name")
        rows: dict[str, tuple[str, float, float, int]] = {}
        for c in charges:
            for user in c.users:
                key = self.pseudonym(str(user))
                if key in rows:
                    raise LedgerError(f"user {user!r} appears twice in round {round_name!r} "
                                      f"(groups {rows[key][0]!r} and {c.group!r})")
                rows[key] = (c.group, float(c.epsilon), float(c.delta), int(bool(c.private)))
        try:
            return self._charge(round_name, rows)
        except sqlite3.Error as exc:
            hint = ("another hybriddp command is using it; retry when that finishes" if "locked" in str(exc)
                    else "check the file system, or " + _RESTORE)
            raise LedgerError(f"ledger {self.path}: cannot record round {round_name!r} (SQLite: {exc}); nothing "
                              f"was recorded: {hint}") from None

    def _charge(self, round_name: str, rows: dict[str, tuple[str, float, float, int]]) -> int:
        with self.conn:  # one transaction: all or nothing
            if not self._has_private:  # a ledger written before the column: its charges were all private
                self.conn.execute(_SQL_ADD_PRIVATE)
                self._has_private = True
            self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS pending (user TEXT PRIMARY KEY, grp TEXT, "
                              "epsilon REAL, delta REAL, private INTEGER)")
            self.conn.execute("DELETE FROM pending")
            self.conn.executemany(_SQL_PENDING_INSERT,
                                  ((k, g, e, d, pr) for k, (g, e, d, pr) in rows.items()))
            # the budget counts private releases only (module docstring)
            spent = {u: (float(e), float(d)) for u, e, d in self.conn.execute("""
                SELECT p.user, SUM(c.epsilon), SUM(c.delta) FROM pending p
                JOIN charges c ON c.user = p.user AND c.private = 1 WHERE p.private = 1 GROUP BY p.user""")}
            private = {k: (e, d) for k, (_, e, d, pr) in rows.items() if pr}
            over = LifetimeBudget(self.lifetime_epsilon, self.lifetime_delta).overrun(private, spent)
            if over is not None:
                raise BudgetExceededError(
                    f"round {round_name!r} refused: {len(over.users):,} user(s) would exceed the lifetime budget "
                    f"(epsilon {self.lifetime_epsilon}, delta {self.lifetime_delta}); the worst would reach "
                    f"epsilon {over.epsilon:.4g}, delta {over.delta:.3g}. Use a smaller --epsilon, leave those "
                    "users out of this round, or start a new budget period with a new ledger.")
            cur = self.conn.execute(_SQL_ROUND_INSERT,
                                    (round_name, datetime.now(timezone.utc).isoformat(timespec="seconds")))
            rid = int(cur.lastrowid)
            self.conn.execute("INSERT INTO charges (user, round, grp, epsilon, delta, private) "
                              "SELECT user, ?, grp, epsilon, delta, private FROM pending", (rid,))
            self.conn.execute("DELETE FROM pending")
        return rid

    # ----- reporting ------------------------------------------------------------------------
    def user_history(self, user: str) -> list[tuple[str, str, float, float]]:
        """(round, group, ε, δ) of one user, oldest first (:meth:`non_private_rounds` names the seeded ones)."""
        return self.conn.execute("""SELECT r.name, c.grp, c.epsilon, c.delta FROM charges c
                                    JOIN rounds r ON r.id = c.round WHERE c.user = ? ORDER BY r.id""",
                                 (self.pseudonym(str(user)),)).fetchall()

    def non_private_rounds(self) -> list[str]:
        """The rounds charged as non-private (seeded releases, which give no privacy), oldest first."""
        return [name for (name,) in self.conn.execute(
            f"SELECT name FROM rounds WHERE id IN (SELECT round FROM charges WHERE {self._private} = 0) ORDER BY id")]

    def report(self, delta_prime: float = 1e-6) -> dict[str, Any]:
        """Per-round groups and, per user, cumulative guarantees (basic and advanced).

        Rounds say whether they were ``private``; per charge history, ``non_private_releases`` counts
        the seeded releases, whose users have no guarantee (``best`` is then null); the (ε, δ) sums
        count private releases only (module docstring).
        """
        try:
            return self._report(delta_prime)
        except (sqlite3.Error, ValueError) as exc:
            raise LedgerError(f"ledger {self.path} cannot be read ({exc}); {_RESTORE}") from None

    def _report(self, delta_prime: float) -> dict[str, Any]:
        pv = self._private
        rounds = []
        for rid, name, created in self.conn.execute(_SQL_ROUNDS):
            rows = self.conn.execute(f"SELECT grp, COUNT(*), MAX(epsilon), MAX(delta), MIN({pv}) FROM charges "
                                     "WHERE round = ? GROUP BY grp ORDER BY grp", (rid,)).fetchall()
            groups = [{"group": g, "users": n, "epsilon": e, "delta": d} for g, n, e, d, _ in rows]
            rounds.append({"round": name, "created": created, "private": all(bool(p) for *_, p in rows),
                           "groups": groups})
        # users with the same history share a guarantee: aggregate by history inside SQLite. A history
        # is the list of its charges' kinds (distinct (round, group, ε, δ, private), numbered by DENSE_RANK
        # in the same order as the query below that reads their ε and δ as floats): SQLite's REAL-to-text
        # conversion keeps 15 digits only (1/3 → 0.333333333333333), so values never pass through text.
        kinds = [(float(e), float(d), bool(p)) for e, d, p, _, _ in self.conn.execute(
            f"SELECT DISTINCT epsilon, delta, {pv} AS pv, round, grp FROM charges "
            "ORDER BY round, grp, epsilon, delta, pv")]
        histories: dict[tuple[tuple[float, float, bool], ...], int] = {}
        n_users = 0
        for h, n in self.conn.execute(f"""
                SELECT h, COUNT(*) FROM (
                    SELECT user, group_concat(kind, ',') AS h
                    FROM (SELECT user, round,
                                 DENSE_RANK() OVER (ORDER BY round, grp, epsilon, delta, {pv}) AS kind
                          FROM charges ORDER BY user, round, kind) GROUP BY user)
                GROUP BY h"""):
            key = tuple(kinds[int(k) - 1] for k in h.split(","))
            histories[key] = histories.get(key, 0) + n
            n_users += n
        cumulative = []
        for h, n in sorted(histories.items(), key=lambda kv: (-sum(e for e, _, p in kv[0] if p),
                                                                -sum(not p for *_, p in kv[0]))):
            eps, dl = [e for e, _, p in h if p], [d for _, d, p in h if p]
            n_np = sum(not p for *_, p in h)
            be, bd = basic_composition(eps, dl)
            ae, ad = advanced_composition(eps, dl, delta_prime)
            cumulative.append({"users": n, "releases": len(h), "non_private_releases": n_np,
                               "charges": [{"epsilon": e, "delta": d, "private": p} for e, d, p in h],
                               "basic": {"epsilon": be, "delta": bd},
                               "advanced": {"epsilon": ae, "delta": ad},
                               "best": None if n_np else {"epsilon": min(be, ae), "delta": bd if be <= ae else ad}})
        worst = max((c["basic"]["epsilon"] for c in cumulative), default=0.0)
        exposed = sum(c["users"] for c in cumulative if c["non_private_releases"])
        out = {"ledger": str(self.path), "lifetime": {"epsilon": self.lifetime_epsilon, "delta": self.lifetime_delta},
               "delta_prime": delta_prime, "rounds": rounds, "cumulative": cumulative,
               "users": n_users, "worst_basic_epsilon": worst,
               "remaining_epsilon": max(0.0, self.lifetime_epsilon - worst),
               "users_without_guarantee": exposed}
        if exposed:
            out["warning"] = non_private_warning(exposed)
        return out


def non_private_warning(users: int) -> str:
    """The report's warning when users were charged in non-private (seeded) releases."""
    return (f"{users:,} user(s) took part in non-private (seeded) releases: anyone who knows the seed can "
            "reproduce the noise, so these users have NO privacy guarantee at all; the (ε, δ) sums count "
            "private releases only")

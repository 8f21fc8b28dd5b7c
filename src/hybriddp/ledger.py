"""The privacy ledger: what every user has spent, round by round (issue: privacy assurance).

Each BLENDER round releases something about each participating user: opt-in users in S and T
and clients each spend (ε, δ) once per round (ALGORITHM.md §2). Over many rounds the guarantees
compose. The ledger records, per user and round, the (ε, δ) of that user's release, prints
per-round and cumulative guarantees under basic and advanced composition, and **refuses** a
round that would take any user over the configured lifetime budget — before anything is
released. The budget is enforced under basic composition (Σε, Σδ), which is conservative.

Storage is an SQLite file. User identifiers are never stored: a user is recorded as
HMAC-SHA256(salt, id) with a random per-ledger salt, so the ledger shows how much was spent
without naming who.

Advanced composition (Dwork, Rothblum, Vadhan 2010; Kairouz et al. 2015 form for
heterogeneous releases): k releases (ε_i, δ_i) are (ε', Σδ_i + δ')-DP with
ε' = sqrt(2 ln(1/δ') Σ ε_i²) + Σ ε_i (e^{ε_i} − 1). The report shows min(basic, advanced).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hybriddp.errors import HybridDPError, parameter_error


class BudgetExceededError(HybridDPError):
    """A round would take a user over the lifetime privacy budget; nothing was recorded."""


class LedgerError(HybridDPError):
    """The ledger file is missing, damaged, or used inconsistently."""


@dataclass(frozen=True)
class Charge:
    """One group of users charged (ε, δ) in a round (e.g. "optin-S", "optin-T", "clients")."""

    group: str
    users: Sequence[str]
    epsilon: float
    delta: float


def basic_composition(eps: Sequence[float], deltas: Sequence[float]) -> tuple[float, float]:
    """(Σε_i, Σδ_i)."""
    return float(sum(eps)), float(sum(deltas))


def advanced_composition(eps: Sequence[float], deltas: Sequence[float], delta_prime: float) -> tuple[float, float]:
    """(sqrt(2 ln(1/δ') Σε_i²) + Σε_i(e^{ε_i} − 1), Σδ_i + δ')."""
    e = math.sqrt(2.0 * math.log(1.0 / delta_prime) * sum(x * x for x in eps)) + sum(x * math.expm1(x) for x in eps)
    return e, float(sum(deltas)) + delta_prime


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, created TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    user TEXT NOT NULL, round INTEGER NOT NULL REFERENCES rounds(id), grp TEXT NOT NULL,
    epsilon REAL NOT NULL, delta REAL NOT NULL, PRIMARY KEY (user, round));
CREATE INDEX IF NOT EXISTS charges_round ON charges(round);
"""


class PrivacyLedger:
    """Per-user accounting of (ε, δ) across rounds, with a lifetime budget.

    Use :meth:`open`; charge a round with :meth:`charge` *before* releasing its output.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        self.lifetime_epsilon = float(meta["lifetime_epsilon"])
        self.lifetime_delta = float(meta["lifetime_delta"])
        self._salt = bytes.fromhex(meta["salt"])

    @classmethod
    def open(cls, path: str | Path, *, lifetime_epsilon: float | None = None,
             lifetime_delta: float | None = None) -> PrivacyLedger:
        """Open a ledger; a new one needs its lifetime budget (ε, δ)."""
        p = Path(path)
        new = not p.exists()
        if new and (lifetime_epsilon is None or lifetime_delta is None):
            raise LedgerError(f"ledger {p} does not exist; to create it give --lifetime-epsilon and --lifetime-delta")
        try:
            conn = sqlite3.connect(p)
            conn.executescript(_SCHEMA)
            if new:
                if not (lifetime_epsilon and lifetime_epsilon > 0 and math.isfinite(lifetime_epsilon)):
                    raise parameter_error("lifetime_epsilon (--lifetime-epsilon)", lifetime_epsilon, "> 0")
                if not (lifetime_delta is not None and 0 < lifetime_delta < 1):
                    raise parameter_error("lifetime_delta (--lifetime-delta)", lifetime_delta, "in (0, 1)")
                with conn:
                    conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                        ("lifetime_epsilon", repr(float(lifetime_epsilon))),
                        ("lifetime_delta", repr(float(lifetime_delta))),
                        ("salt", secrets.token_hex(32)), ("format", "hybriddp-ledger-1")])
            ledger = cls(conn, p)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{p}: not a hybriddp ledger ({exc})") from None
        except KeyError as exc:
            raise LedgerError(f"{p}: ledger metadata is missing {exc}") from None
        if not new and lifetime_epsilon is not None and float(lifetime_epsilon) != ledger.lifetime_epsilon:
            raise LedgerError(f"{p} has lifetime epsilon {ledger.lifetime_epsilon}, not {lifetime_epsilon}; "
                              "a ledger's budget is fixed when it is created")
        return ledger

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PrivacyLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pseudonym(self, user: str) -> str:
        """HMAC-SHA256(salt, user), hex, truncated to 128 bits."""
        return hmac.new(self._salt, user.encode("utf-8"), hashlib.sha256).hexdigest()[:32]

    # ----- charging -------------------------------------------------------------------------
    def charge(self, round_name: str, charges: Sequence[Charge]) -> int:
        """Record a round atomically; refuse it if any user would exceed the lifetime budget.

        A user may be charged at most once per round (one release per user per round).
        Returns the round id.
        """
        if self.conn.execute("SELECT 1 FROM rounds WHERE name = ?", (round_name,)).fetchone():
            raise LedgerError(f"round {round_name!r} is already in the ledger {self.path}; a user may be charged "
                              "once per round — use a new round name")
        rows: dict[str, tuple[str, float, float]] = {}
        for c in charges:
            for user in c.users:
                key = self.pseudonym(str(user))
                if key in rows:
                    raise LedgerError(f"user {user!r} appears twice in round {round_name!r} "
                                      f"(groups {rows[key][0]!r} and {c.group!r})")
                rows[key] = (c.group, float(c.epsilon), float(c.delta))
        with self.conn:  # one transaction: all or nothing
            self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS pending (user TEXT PRIMARY KEY, grp TEXT, "
                              "epsilon REAL, delta REAL)")
            self.conn.execute("DELETE FROM pending")
            self.conn.executemany("INSERT INTO pending VALUES (?, ?, ?, ?)",
                                  ((k, g, e, d) for k, (g, e, d) in rows.items()))
            worst = self.conn.execute("""
                SELECT p.user, p.epsilon + COALESCE(SUM(c.epsilon), 0) AS e, p.delta + COALESCE(SUM(c.delta), 0) AS d
                FROM pending p LEFT JOIN charges c ON c.user = p.user GROUP BY p.user
                ORDER BY e DESC, d DESC""").fetchall()
            over = [(e, d) for _, e, d in worst
                    if e > self.lifetime_epsilon * (1 + 1e-12) or d > self.lifetime_delta * (1 + 1e-12)]
            if over:
                e, d = max(over)
                raise BudgetExceededError(
                    f"round {round_name!r} refused: {len(over):,} user(s) would exceed the lifetime budget "
                    f"(epsilon {self.lifetime_epsilon}, delta {self.lifetime_delta}); the worst would reach "
                    f"epsilon {e:.4g}, delta {d:.3g}. Use a smaller --epsilon, leave those users out of this "
                    "round, or start a new budget period with a new ledger.")
            cur = self.conn.execute("INSERT INTO rounds (name, created) VALUES (?, ?)",
                                    (round_name, datetime.now(timezone.utc).isoformat(timespec="seconds")))
            rid = int(cur.lastrowid)
            self.conn.execute("INSERT INTO charges SELECT user, ?, grp, epsilon, delta FROM pending", (rid,))
            self.conn.execute("DELETE FROM pending")
        return rid

    # ----- reporting ------------------------------------------------------------------------
    def user_history(self, user: str) -> list[tuple[str, str, float, float]]:
        """(round, group, ε, δ) of one user, oldest first."""
        return self.conn.execute("""SELECT r.name, c.grp, c.epsilon, c.delta FROM charges c
                                    JOIN rounds r ON r.id = c.round WHERE c.user = ? ORDER BY r.id""",
                                 (self.pseudonym(str(user)),)).fetchall()

    def report(self, delta_prime: float = 1e-6) -> dict[str, Any]:
        """Per-round groups and, per user, cumulative guarantees (basic and advanced)."""
        rounds = []
        for rid, name, created in self.conn.execute("SELECT id, name, created FROM rounds ORDER BY id"):
            groups = [{"group": g, "users": n, "epsilon": e, "delta": d} for g, n, e, d in self.conn.execute(
                "SELECT grp, COUNT(*), MAX(epsilon), MAX(delta) FROM charges WHERE round = ? GROUP BY grp "
                "ORDER BY grp", (rid,))]
            rounds.append({"round": name, "created": created, "groups": groups})
        # users with the same history share a guarantee: aggregate by history inside SQLite
        histories: dict[tuple[tuple[float, float], ...], int] = {}
        n_users = 0
        for h, n in self.conn.execute("""
                SELECT h, COUNT(*) FROM (
                    SELECT user, group_concat(epsilon || ':' || delta, ',') AS h
                    FROM (SELECT user, epsilon, delta FROM charges ORDER BY user, round) GROUP BY user)
                GROUP BY h"""):
            key = tuple((float(e), float(d)) for e, d in (x.split(":") for x in h.split(",")))
            histories[key] = histories.get(key, 0) + n
            n_users += n
        cumulative = []
        for h, n in sorted(histories.items(), key=lambda kv: -sum(e for e, _ in kv[0])):
            eps, dl = [e for e, _ in h], [d for _, d in h]
            be, bd = basic_composition(eps, dl)
            ae, ad = advanced_composition(eps, dl, delta_prime)
            cumulative.append({"users": n, "releases": len(h), "basic": {"epsilon": be, "delta": bd},
                               "advanced": {"epsilon": ae, "delta": ad},
                               "best": {"epsilon": min(be, ae), "delta": bd if be <= ae else ad}})
        worst = max((c["basic"]["epsilon"] for c in cumulative), default=0.0)
        return {"ledger": str(self.path), "lifetime": {"epsilon": self.lifetime_epsilon, "delta": self.lifetime_delta},
                "delta_prime": delta_prime, "rounds": rounds, "cumulative": cumulative,
                "users": n_users, "worst_basic_epsilon": worst,
                "remaining_epsilon": max(0.0, self.lifetime_epsilon - worst)}

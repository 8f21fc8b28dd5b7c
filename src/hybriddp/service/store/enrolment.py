"""Opt-in users' enrolment in the store: one token per user and round, stored only as its SHA-256 (:func:`token_hash`),
each user only as their ledger pseudonym; the lifetime budget checked at enrolment; large requests checked whole,
then stored in bounded transactions (PRIVACY.md, "The raw opt-in data's lifecycle"). The enrolment half of
:class:`hybriddp.service.store.optin.OptinStore`.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.engine import Connection

from hybriddp.core.errors import DataError
from hybriddp.privacy.budget import LifetimeBudget
from hybriddp.privacy.ledger import BudgetExceededError
from hybriddp.service import schema as s
from hybriddp.service.errors import ConflictError, StoreError
from hybriddp.service.store.engine import IN_CHUNK
from hybriddp.service.store.ledger import LedgerStore
from hybriddp.service.store.pgstats import GrowthStatistics
from hybriddp.service.store.rounds import RoundInfo, RoundStore, refuse_past_deadline, takes_optin

OPTIN_CHUNK = 2_000
"""Opt-in users one transaction of an upload or enrolment request stores at most (:attr:`OptinStore.optin_chunk`):
on SQLite with 1-5 records a user such a transaction holds the write lock for well under 0.1 s (benchmarks/
bench_optin.py), so purges, reports and other uploads get in between the chunks of a large request."""


CHECKED_ROUNDS = 256
"""Rounds :meth:`EnrolmentStore.checked_round` remembers (the oldest forgotten first)."""


def token_hash(token: str) -> str:
    """SHA-256 (hex) of an opt-in token: what the database keeps instead of the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class EnrolmentStore(RoundStore, LedgerStore):
    """Enrolment and the token check of opt-in users (module docstring)."""

    optin_chunk: int = OPTIN_CHUNK
    """Users per transaction of an enrolment or upload request (:data:`OPTIN_CHUNK`; tests make it small)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._growth = GrowthStatistics()
        self._checked_rounds: dict[str, RoundInfo] = {}
        self._checked_lock = threading.Lock()
        super().__init__(*args, **kw)

    def checked_round(self, round_id: str) -> RoundInfo | None:
        """The round as read by the last :meth:`optin_users` that found one of its tokens, or None: its id, number,
        kind and parameters, which never change (its state may have: whoever stores checks it again). Lets a user's
        own upload skip a read (:class:`~hybriddp.service.writer.OptinWriter`)."""
        return self._checked_rounds.get(round_id)

    def _grew(self, rows: int) -> None:
        """PostgreSQL: ``ANALYZE`` the opt-in tables when this process's additions doubled them (:mod:`pgstats`)."""
        if self.dialect == "postgresql" and self._growth.due(rows):
            self._write(lambda conn: conn.execute(text(GrowthStatistics.statement())))

    def enrol(self, round_id: str, user: str) -> str:
        """A new opt-in token for ``user`` in this round (only its hash is stored)."""
        return self.enrol_many(round_id, [user])[0]

    def enrol_many(self, round_id: str, users: Sequence[str]) -> list[str]:
        """New opt-in tokens for ``users``, in order (their order is the curator's user order).

        All or nothing: a user enrolled before (or twice in the list), or one over the lifetime budget, refuses
        the whole request. A list longer than :attr:`optin_chunk` is checked whole first, then stored in
        transactions of :attr:`optin_chunk` users; if one of them fails (a race), those stored before are
        deleted again (module docstring).
        """
        pseuds = [self.pseudonym(u) for u in users]
        seen: set[str] = set()
        for user, p in zip(users, pseuds, strict=True):
            if p in seen:
                raise DataError(f"user {user[:60]!r} appears twice in the request; a user gets one token per round")
            seen.add(p)
        tokens = [secrets.token_urlsafe(32) for _ in users]
        n, step = len(users), self.optin_chunk
        if n > step:
            self._read(lambda conn: self._enrol_checks(conn, self._get(conn, round_id), users, pseuds))
        done = 0
        try:
            for i in range(0, n, step):
                self._enrol_chunk(round_id, users[i:i + step], pseuds[i:i + step], tokens[i:i + step])
                done = min(n, i + step)
        except BaseException:
            if done:
                self._unenrol(round_id, tokens[:done])
            raise
        self._grew(n)
        return tokens

    def _enrol_chunk(self, round_id: str, users: Sequence[str], pseuds: Sequence[str], tokens: Sequence[str]) -> None:
        """One transaction of :meth:`enrol_many`; a lost race with another request is a :class:`ConflictError`."""
        try:
            self._write(lambda conn: self._enrol_rows(conn, round_id, users, pseuds, tokens))
        except StoreError:
            if any(self._enrolled(round_id, p) for p in pseuds[:IN_CHUNK]):  # lost a race with another request
                raise ConflictError(f"a user of this request is already enrolled in round {round_id}; nobody in "
                                    "this request was enrolled") from None
            raise

    def _unenrol(self, round_id: str, tokens: Sequence[str]) -> None:
        """Delete the tokens a failed :meth:`enrol_many` stored (nobody has seen them), a transaction per chunk."""
        ot = s.optin_tokens.c
        hashes = [token_hash(t) for t in tokens]

        def run(conn: Connection, part: Sequence[str]) -> None:
            num = self._get(conn, round_id).num
            gone = sum(conn.execute(delete(s.optin_tokens).where(ot.round_num == num, ot.token_hash.in_(
                part[j:j + IN_CHUNK]))).rowcount for j in range(0, len(part), IN_CHUNK))
            conn.execute(update(s.rounds).where(s.rounds.c.num == num)
                         .values(optin_users=s.rounds.c.optin_users - gone))
        for i in range(0, len(hashes), self.optin_chunk):
            self._write(lambda conn, part=hashes[i:i + self.optin_chunk]: run(conn, part))  # type: ignore[misc]

    def _enrol_checks(self, conn: Connection, info: RoundInfo, users: Sequence[str], pseuds: Sequence[str]) -> None:
        """Refuse (nothing stored) when the round is not collecting opt-in users, a user already holds a token
        of it (:class:`ConflictError`) or would go over the lifetime budget (:class:`BudgetExceededError`)."""
        ot = s.optin_tokens.c
        refuse_past_deadline(info, "enrol")
        if info.state != "collecting-optin":
            raise ConflictError(f"cannot enrol: round {info.id} is {info.state!r}; opt-in users enrol while it "
                                "is 'collecting-optin'")
        self._refuse_spent(conn, info, users, pseuds)
        for i in range(0, len(pseuds), IN_CHUNK):
            taken = conn.execute(select(ot.user_pseudonym).where(
                ot.round_num == info.num, ot.user_pseudonym.in_(pseuds[i:i + IN_CHUNK]))).scalars().first()
            if taken is not None:
                user = users[pseuds.index(taken)]
                raise ConflictError(f"user {user[:60]!r} is already enrolled in round {info.id}; a user gets one "
                                    "token per round (use the token issued before); nobody in this request was "
                                    "enrolled")

    def _enrol_rows(self, conn: Connection, round_id: str, users: Sequence[str], pseuds: Sequence[str],
                    tokens: Sequence[str]) -> None:
        """Store the tokens of ``users`` (pseudonyms ``pseuds``), numbered in order after those enrolled before."""
        ot = s.optin_tokens.c
        info = self._get(conn, round_id)
        self._enrol_checks(conn, info, users, pseuds)
        res = conn.execute(update(s.rounds).where(s.rounds.c.num == info.num, takes_optin())
                           .values(optin_users=s.rounds.c.optin_users + len(users)))  # takes the round's row lock
        if res.rowcount != 1:  # a purge or build ended collecting-optin meanwhile, or the deadline passed
            current = self._get(conn, info.id)
            refuse_past_deadline(current, "enrol")
            raise ConflictError(f"cannot enrol: round {info.id} is {current.state!r}; opt-in users enrol while it "
                                "is 'collecting-optin'")
        first = (conn.execute(select(func.max(ot.seq)).where(ot.round_num == info.num)).scalar() or 0) + 1
        conn.execute(insert(s.optin_tokens), [
            {"token_hash": token_hash(tok), "round_num": info.num, "user_pseudonym": p, "seq": first + i}
            for i, (tok, p) in enumerate(zip(tokens, pseuds, strict=True))])

    def _refuse_spent(self, conn: Connection, info: RoundInfo, users: Sequence[str], pseuds: Sequence[str]) -> None:
        """Refuse (:class:`BudgetExceededError`, nobody enrolled) a user whose spend so far plus this round's (ε, δ)
        would exceed the lifetime budget: the build would refuse the whole round for that user (in a series, a
        user who spent the budget in earlier periods simply sits the later ones out). Seeded rounds spend nothing."""
        if info.non_private or "epsilon" not in info.params:  # (rounds the service validated always have one)
            return
        charge = info.charge
        budget = LifetimeBudget(self.lifetime_epsilon, self.lifetime_delta)
        charges = dict.fromkeys(pseuds, charge)
        over = budget.overrun(charges, self._spent_by(conn, sorted(set(pseuds))), self.tighter(conn, info, charges))
        if over is not None:
            user = users[list(pseuds).index(over.users[0])]
            more = f" (and {len(over.users) - 1:,} more)" if len(over.users) > 1 else ""
            raise BudgetExceededError(
                f"cannot enrol user {user[:60]!r}{more} in round {info.id}: this round's "
                f"charge (epsilon {charge[0]:g}, delta {charge[1]:g}) would take them to epsilon {over.epsilon:.4g}, "
                f"delta {over.delta:.3g} by basic composition, past the lifetime budget (epsilon {budget.epsilon:g}, "
                f"delta {budget.delta:g}), which privacy-loss-distribution accounting does not admit either; nobody "
                "in this request was enrolled. Enrol the others without them")

    def _enrolled(self, round_id: str, pseud: str) -> bool:
        """True if the user with pseudonym ``pseud`` holds a token of the round."""
        return self._read(lambda conn: conn.execute(
            select(s.optin_tokens.c.seq).join(s.rounds, s.rounds.c.num == s.optin_tokens.c.round_num)
            .where(s.rounds.c.id == round_id, s.optin_tokens.c.user_pseudonym == pseud)).first() is not None)

    def optin_users(self, round_id: str, tokens: Sequence[str]) -> tuple[RoundInfo, list[int | None]]:
        """(round, each token's user code or None when it is not an opt-in token of this round)."""
        hashes = [token_hash(t) for t in tokens]
        ot = s.optin_tokens.c

        def run(conn: Connection) -> tuple[RoundInfo, list[int | None]]:
            info = self._get(conn, round_id)
            found: dict[str, int] = {}
            unique = sorted(set(hashes))
            for i in range(0, len(unique), IN_CHUNK):
                found.update({h: int(q) for h, q, num in conn.execute(  # by the primary key alone: with the
                    select(ot.token_hash, ot.seq, ot.round_num).where(  # round too, SQLite reads the round's tokens
                        ot.token_hash.in_(unique[i:i + IN_CHUNK]))).all() if num == info.num})
            return info, [found.get(h) for h in hashes]
        info, users = self._read(run)
        if any(u is not None for u in users) and round_id not in self._checked_rounds:
            with self._checked_lock:
                if len(self._checked_rounds) >= CHECKED_ROUNDS:
                    self._checked_rounds.pop(next(iter(self._checked_rounds)))
                self._checked_rounds[round_id] = info
        return info, users

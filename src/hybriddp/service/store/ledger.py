"""The privacy ledger in the service's database: one row per user charged in a round (PRIVACY.md, "Outputs appear
only with their charge"; ALGORITHM.md §3.4).

Users are their HMAC pseudonyms (:func:`hybriddp.privacy.pseudonyms.pseudonym` with the database's salt).
Whether a charge fits the lifetime budget is decided by the one rule of :mod:`hybriddp.privacy.budget`;
the store reads what each user spent, applies the rule and records the charges in the caller's transaction,
under an advisory lock on PostgreSQL so that two rounds charging the same user are serialized.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Connection

from hybriddp.core.errors import HybridDPError
from hybriddp.privacy.budget import LifetimeBudget, Spend
from hybriddp.privacy.ledger import BudgetExceededError, Charge, LedgerError
from hybriddp.privacy.pseudonyms import pseudonym
from hybriddp.service import schema as s
from hybriddp.service.store.engine import ADVISORY_LEDGER, IN_CHUNK, StoreBase
from hybriddp.service.store.rounds import RoundInfo

logger = logging.getLogger(__name__)


class LedgerStore(StoreBase):
    """The opt-in users' charges, checked against the database's lifetime budget."""

    def pseudonym(self, user: str) -> str:
        """HMAC-SHA256(per-database salt, user), hex, 128 bits: the ledger never names a user."""
        return pseudonym(self._salt, user)

    def charge(self, info: RoundInfo, charges: Sequence[Charge], *, private: bool = True) -> None:
        """Record the round's charges, or refuse all of them (:class:`BudgetExceededError`).

        Users are the pseudonyms of :meth:`pseudonym`. Basic composition (Σε, Σδ) of the private
        charges against the database's lifetime budget (:mod:`hybriddp.privacy.budget`), as the file ledger
        :class:`hybriddp.privacy.ledger.PrivacyLedger` does, or privacy-loss-distribution accounting where it is
        tighter (:meth:`tighter`).
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
            budget = LifetimeBudget(self.lifetime_epsilon, self.lifetime_delta)
            charges = {u: (e, d) for u, (_, e, d) in rows.items()}
            over = budget.overrun(charges, self._spent_by(conn, sorted(rows)), self.tighter(conn, info, charges))
            if over is not None:
                raise BudgetExceededError(
                    f"round {info.id} refused: {len(over.users):,} opt-in user(s) would exceed the lifetime budget "
                    f"(epsilon {budget.epsilon:g}, delta {budget.delta:g}): the worst would reach epsilon "
                    f"{over.epsilon:.4g}, delta {over.delta:.3g} by basic composition, and privacy-loss-distribution "
                    f"accounting does not admit them either. {kept}. Create the round with a smaller epsilon or delta")
        if rows:
            conn.execute(insert(s.ledger_charges), [
                {"user_pseudonym": u, "round_num": info.num, "grp": g, "epsilon": e, "delta": d, "private": private}
                for u, (g, e, d) in rows.items()])

    def tighter(self, conn: Connection, info: RoundInfo,
                charges: Mapping[str, Spend]) -> Callable[[Sequence[str]], set[str]]:
        """The tighter accountant the budget rule consults for the users basic composition would refuse
        (:meth:`LifetimeBudget.overrun`): each user's private charges so far and this round's, as the mechanisms
        they were (:func:`hybriddp.audit.pld.round_mechanism`: a BLENDER round with discrete noise exactly, any other
        by its (ε, δ)), composed by privacy-loss-distribution accounting at the lifetime δ (ALGORITHM.md §14). A user
        whose total ε there is within the lifetime ε passes. If the accountant fails, nobody passes (basic rules).
        ``charges``: this round's (ε, δ) per user."""
        def admitted(users: Sequence[str]) -> set[str]:
            from hybriddp.audit.pld import round_mechanism, within_lifetime
            lc, r = s.ledger_charges.c, s.rounds.c
            try:
                history: dict[str, list[Any]] = {u: [round_mechanism(info.kind, info.params, charges[u])]
                                                 for u in users}
                for i in range(0, len(users), IN_CHUNK):
                    for user, kind, params, eps, delta in conn.execute(
                            select(lc.user_pseudonym, r.kind, r.params, lc.epsilon, lc.delta)
                            .join(s.rounds, r.num == lc.round_num)
                            .where(lc.user_pseudonym.in_(list(users[i:i + IN_CHUNK])), lc.private.is_(True))).all():
                        history[user].append(round_mechanism(kind, json.loads(params), (float(eps), float(delta))))
                return {u for u, h in history.items()
                        if within_lifetime(h, self.lifetime_epsilon, self.lifetime_delta)}
            except (HybridDPError, ValueError, KeyError, ArithmeticError) as exc:
                logger.warning("PLD accounting failed for round %s (%s); basic composition decides", info.id, exc)
                return set()
        return admitted

    @staticmethod
    def _spent_by(conn: Connection, users: Sequence[str]) -> dict[str, Spend]:
        """(Σε, Σδ) of the private charges of each of ``users`` (pseudonyms) that has any."""
        spent: dict[str, Spend] = {}
        lc = s.ledger_charges.c
        for i in range(0, len(users), IN_CHUNK):
            chunk = users[i:i + IN_CHUNK]
            spent.update({u: (float(e), float(d)) for u, e, d in conn.execute(
                select(lc.user_pseudonym, func.sum(lc.epsilon), func.sum(lc.delta))
                .where(lc.user_pseudonym.in_(chunk), lc.private.is_(True)).group_by(lc.user_pseudonym)).all()})
        return spent

    def spent(self, user: str) -> tuple[float, float]:
        """(Σε, Σδ) charged to ``user`` so far."""
        lc = s.ledger_charges.c
        row = self._read(lambda conn: conn.execute(select(func.sum(lc.epsilon), func.sum(lc.delta)).where(
            lc.user_pseudonym == self.pseudonym(user))).one())
        return float(row[0] or 0.0), float(row[1] or 0.0)

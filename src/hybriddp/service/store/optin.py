"""Opt-in users in the store: enrolment and tokens, idempotent uploads within quotas, the records the curator
reads, and the charge that starts a head-list build (PRIVACY.md, "The raw opt-in data's lifecycle";
ALGORITHM.md §3.4).

A token is stored only as its SHA-256 (:func:`token_hash`); a user only as their ledger pseudonym. An
upload's idempotency key is keyed with the database's salt (:meth:`OptinStore.upload_key`), so a stored
key says nothing about the records it covered.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from hybriddp.core.errors import DataError
from hybriddp.privacy.budget import LifetimeBudget
from hybriddp.privacy.ledger import BudgetExceededError
from hybriddp.privacy.pseudonyms import keyed_digest
from hybriddp.service import schema as s
from hybriddp.service.errors import ConflictError, QuotaError, StoreError
from hybriddp.service.store.engine import IN_CHUNK
from hybriddp.service.store.ledger import LedgerStore
from hybriddp.service.store.rounds import RoundInfo, RoundStore


def token_hash(token: str) -> str:
    """SHA-256 (hex) of an opt-in token: what the database keeps instead of the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class OptinUpload:
    """One opt-in user's upload: their user code, records (query, url) or values, idempotency key
    (:meth:`OptinStore.upload_key`) and the request bytes it is charged to the token's quota."""

    user: int
    items: Sequence[Any]
    key: str
    nbytes: int


@dataclass(frozen=True)
class UploadAck:
    """What an opt-in request did: records (or values) stored, and those of uploads stored before (repeats)."""

    accepted: int
    duplicates: int


class OptinStore(RoundStore, LedgerStore):
    """Enrolment, opt-in uploads and their reading by the curator; the build's charge."""

    # ----- enrolment ----------------------------------------------------------------------------
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
        try:
            self._write(lambda conn: self._enrol_rows(conn, round_id, users, pseuds, tokens))
        except StoreError:
            if any(self._enrolled(round_id, p) for p in pseuds[:IN_CHUNK]):  # lost a race with another request
                raise ConflictError(f"a user of this request is already enrolled in round {round_id}") from None
            raise
        return tokens

    def _enrol_rows(self, conn: Connection, round_id: str, users: Sequence[str], pseuds: Sequence[str],
                    tokens: Sequence[str]) -> None:
        """Store the tokens of ``users`` (pseudonyms ``pseuds``), numbered in order after those enrolled before."""
        ot = s.optin_tokens.c
        info = self._get(conn, round_id)
        if info.state != "collecting-optin":
            raise ConflictError(f"cannot enrol: round {round_id} is {info.state!r}; opt-in users enrol while it "
                                "is 'collecting-optin'")
        self._refuse_spent(conn, info, users, pseuds)
        for i in range(0, len(pseuds), IN_CHUNK):
            taken = conn.execute(select(ot.user_pseudonym).where(
                ot.round_num == info.num, ot.user_pseudonym.in_(pseuds[i:i + IN_CHUNK]))).scalars().first()
            if taken is not None:
                user = users[pseuds.index(taken)]
                raise ConflictError(f"user {user[:60]!r} is already enrolled in round {round_id}; a user gets one "
                                    "token per round (use the token issued before); nobody in this request was "
                                    "enrolled")
        last = conn.execute(update(s.rounds).where(s.rounds.c.num == info.num, s.rounds.c.state == "collecting-optin")
                            .values(optin_users=s.rounds.c.optin_users + len(users))
                            .returning(s.rounds.c.optin_users)).scalar_one()
        first = last - len(users) + 1
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
                found.update({h: int(q) for h, q in conn.execute(select(ot.token_hash, ot.seq).where(
                    ot.round_num == info.num, ot.token_hash.in_(unique[i:i + IN_CHUNK]))).all()})
            return info, [found.get(h) for h in hashes]
        return self._read(run)

    # ----- uploads ------------------------------------------------------------------------------
    def upload_key(self, upload_id: str | None, items: Sequence[Any]) -> str:
        """The key that makes an upload idempotent: HMAC-SHA256(salt, the uploader's id, or else the batch's
        content), hex. Keyed, so that the stored key says nothing about the raw records of the batch."""
        return keyed_digest(self._salt, "id:" + upload_id if upload_id is not None
                            else "batch:" + json.dumps(list(items)))

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
            for up in uploads:
                if self._take_upload(conn, info, up):
                    accepted += len(up.items)
                    rows += _item_rows(info, up)
                else:
                    duplicates += len(up.items)
            if rows:
                conn.execute(insert(s.optin_values if info.kind == "mean" else s.optin_records), rows)
                conn.execute(update(s.rounds).where(s.rounds.c.num == info.num)
                             .values(optin_records=s.rounds.c.optin_records + len(rows)))
            return UploadAck(accepted, duplicates)
        return self._write(run)

    def _take_upload(self, conn: Connection, info: RoundInfo, up: OptinUpload) -> bool:
        """Record ``up``'s key and charge it to its token's quota; False if its key was stored before (a repeat).
        :class:`QuotaError` if it would take the token past the quota."""
        new = conn.execute(self._insert(s.optin_uploads).values(
            round_num=info.num, user_seq=up.user, upload_key=up.key, n_records=len(up.items))
            .on_conflict_do_nothing().returning(s.optin_uploads.c.user_seq)).first()
        if new is None:
            return False
        ot = s.optin_tokens.c
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
        return True

    # ----- the curator's side -------------------------------------------------------------------
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
                              kept=_kept_message(info))
            return info
        return self._write(run)

    def optin_records(self, round_num: int) -> tuple[list[int], list[str], list[str | None], dict[int, str]]:
        """(user code per record, query, url, pseudonym per user code), records in upload order."""
        def run(conn: Connection) -> tuple[list[int], list[str], list[str | None], dict[int, str]]:
            rows = conn.execute(select(s.optin_records.c.user_seq, s.optin_records.c.query, s.optin_records.c.url)
                                .where(s.optin_records.c.round_num == round_num).order_by(s.optin_records.c.id)).all()
            users, queries, urls = (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [])
            return users, queries, urls, self._pseudonyms(conn, round_num)
        return self._read(run)

    def optin_values(self, round_num: int) -> tuple[np.ndarray, np.ndarray]:
        """(user code per value, value), values in upload order."""
        def run(conn: Connection) -> tuple[np.ndarray, np.ndarray]:
            rows = conn.execute(select(s.optin_values.c.user_seq, s.optin_values.c.value)
                                .where(s.optin_values.c.round_num == round_num).order_by(s.optin_values.c.id)).all()
            users = np.array([r[0] for r in rows], dtype=np.int64)
            values = np.array([r[1] for r in rows], dtype=np.float64)
            return users, values
        return self._read(run)

    def _pseudonyms(self, conn: Connection, round_num: int) -> dict[int, str]:
        return {int(q): p for q, p in conn.execute(select(s.optin_tokens.c.seq, s.optin_tokens.c.user_pseudonym)
                                                   .where(s.optin_tokens.c.round_num == round_num)).all()}


def _item_rows(info: RoundInfo, up: OptinUpload) -> list[dict[str, Any]]:
    """The rows of ``up``'s values (a mean round) or records (query, url)."""
    if info.kind == "mean":
        return [{"round_num": info.num, "user_seq": up.user, "value": float(v)} for v in up.items]
    return [{"round_num": info.num, "user_seq": up.user, "query": r[0], "url": r[1]} for r in up.items]


def _kept_message(info: RoundInfo) -> str:
    """What became of a round whose build was refused by the budget."""
    return (f"Nothing was run or charged. The round's raw opt-in data stay until its retention deadline "
            f"({info.retention_deadline} UTC) or until an administrator aborts it (hybriddp round abort "
            f"{info.id}), which deletes them")

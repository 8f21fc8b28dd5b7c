"""Opt-in users in the store: enrolment and tokens, idempotent uploads within quotas, the records the curator
reads, and the charge that starts a head-list build (PRIVACY.md, "The raw opt-in data's lifecycle";
ALGORITHM.md §3.4).

A token is stored only as its SHA-256 (:func:`~hybriddp.service.store.enrolment.token_hash`); a user only as
their ledger pseudonym (enrolment: :mod:`hybriddp.service.store.enrolment`). An
upload's idempotency key is keyed with the database's salt (:meth:`OptinStore.upload_key`), so a stored
key says nothing about the records it covered.

**Cost and transactions** (issue 39). Every lookup of a request is by an index of its whole key (token hash; round
and user code, migration 0011; round and pseudonym; the upload keys), read or written for many users at once (an
``IN`` list, a multi-row insert, an executemany update), so a request costs O(1) per user. A request of at most
:attr:`OptinStore.optin_chunk` users (:data:`~hybriddp.service.store.enrolment.OPTIN_CHUNK`) is one transaction;
small upload requests (a user's own upload) arriving together share one (a group commit, each request in a savepoint
of its own). A larger request is stored in transactions of that many users, so no request holds the write lock
(SQLite) or the round's row lock (PostgreSQL) for long, and purges, reports and other uploads get in between. What
that keeps:

* **Refusals store nothing.** A large request is checked whole before its first chunk: the round takes uploads
  (enrolments), every token within its quota (records and bytes, counting the uploads stored before), every user
  not yet enrolled and within the lifetime budget.
* **Quotas** (``optin_max_records``, ``optin_max_bytes`` per token) hold always: each chunk checks its tokens again
  under the round's row lock, so a race refuses that chunk rather than exceeding a quota.
* **Idempotency.** An upload key stored before is a duplicate, acknowledged and not stored again, in any chunk.
* **A failure mid-way** (a race that refuses a chunk, a database failure, a crash): an upload request keeps the
  chunks stored before it, and its error says how many; sending the whole request again stores exactly the rest
  (the stored uploads come back as duplicates). An enrolment deletes the tokens its earlier chunks stored (nobody
  has seen them), so a refused enrolment enrolled nobody; only a crash of the server mid-way leaves users of the
  earlier chunks enrolled with tokens nobody received (enrolling them again is refused as a conflict).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.engine import Connection

from hybriddp.core.errors import DataError, HybridDPError
from hybriddp.privacy.pseudonyms import keyed_digest
from hybriddp.service import schema as s
from hybriddp.service.errors import ConflictError, QuotaError, StoreError
from hybriddp.service.store.engine import IN_CHUNK
from hybriddp.service.store.enrolment import EnrolmentStore
from hybriddp.service.store.rounds import RoundInfo, refuse_past_deadline, takes_optin

GROUP_UPLOADS = 64
"""Upload requests of at most this many users (a user's own JSON upload has one) are stored by a group commit with
the others arriving meanwhile: one transaction and one fsync for many requests, each answered after the commit."""


@dataclass(frozen=True)
class OptinUpload:
    """One opt-in user's upload: their user code, records (query, url) or values, idempotency key
    (:meth:`OptinStore.upload_key`) and the request bytes it is charged to the token's quota."""

    user: int
    items: Sequence[Any]
    key: str
    nbytes: int


@dataclass(frozen=True)
class TokenUpload:
    """One opt-in user's own upload before its token is resolved: the token's hash
    (:func:`~hybriddp.service.store.enrolment.token_hash`) in place of the user code
    (:meth:`OptinStore.add_token_uploads`)."""

    token_hash: str
    items: Sequence[Any]
    key: str
    nbytes: int


@dataclass(frozen=True)
class UploadAck:
    """What an opt-in request did: records (or values) stored, and those of uploads stored before (repeats)."""

    accepted: int
    duplicates: int


class OptinStore(EnrolmentStore):
    """Opt-in uploads and their reading by the curator, the build's charge; enrolment is :class:`EnrolmentStore`."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._pending: list[_Pending] = []
        self._pending_lock = threading.Lock()
        self._committing = False
        super().__init__(*args, **kw)

    # ----- uploads ------------------------------------------------------------------------------
    def upload_key(self, upload_id: str | None, items: Sequence[Any]) -> str:
        """The key that makes an upload idempotent: HMAC-SHA256(salt, the uploader's id, or else the batch's
        content), hex. Keyed, so that the stored key says nothing about the raw records of the batch."""
        return keyed_digest(self._salt, "id:" + upload_id if upload_id is not None
                            else "batch:" + json.dumps(list(items)))

    def add_optin_batch(self, info: RoundInfo, uploads: Sequence[OptinUpload]) -> UploadAck:
        """Store several opt-in users' uploads: all of them, or (refused) none, but for a failure mid-way.

        An upload whose key the same token stored before (or an earlier line of the request gave) is
        acknowledged as a duplicate and not stored again; uploads that would take a token past
        :attr:`optin_max_records` or :attr:`optin_max_bytes` refuse the whole request (:class:`QuotaError`).
        Up to :attr:`optin_chunk` uploads are one transaction. A longer request is checked whole first (round,
        quotas against the stored counts), then stored in transactions of :attr:`optin_chunk` uploads; a chunk
        that fails (a race with another request, a database failure) leaves the chunks before it stored, and
        its error says how many uploads were stored and that sending the whole request again stores exactly the
        rest (module docstring).
        """
        ack = self._store_batch(info, uploads)
        self._grew(ack.accepted)
        return ack

    def _store_batch(self, info: RoundInfo, uploads: Sequence[OptinUpload]) -> UploadAck:
        """:meth:`add_optin_batch`'s storing: a group commit of a small request, chunks of a large one."""
        step = self.optin_chunk
        if len(uploads) <= min(GROUP_UPLOADS, step):
            return self._grouped(_Pending(info, uploads))
        if len(uploads) > step:
            self._read(lambda conn: self._check_quotas(conn, info, uploads))
        accepted = duplicates = 0
        for i in range(0, len(uploads), step):
            try:
                ack = self._write(lambda conn, part=uploads[i:i + step]: _ack(part, self._store_uploads(conn, info,
                                                                                                  part)))
            except (QuotaError, ConflictError, StoreError) as exc:
                if i == 0:
                    raise
                raise type(exc)(f"{str(exc).rstrip('.')}. The first {i:,} uploads of this request (lines 1 to {i:,} "
                                "of an NDJSON body) were stored before this failure; send the whole request again "
                                "once the cause is fixed: those are acknowledged as duplicates and exactly the rest "
                                "is stored") from None
            accepted += ack.accepted
            duplicates += ack.duplicates
        return UploadAck(accepted, duplicates)

    def add_token_uploads(self, batch: Sequence[tuple[RoundInfo, Sequence[TokenUpload]]]
                          ) -> list[UploadAck | BaseException | None]:
        """Opt-in users' own uploads, several requests in one transaction (the group commit of
        :class:`~hybriddp.service.writer.OptinWriter`): every token of the group looked up at once (by hash), each
        request stored in the group's transaction as :meth:`add_optin_batch` stores a small one (refused alone if
        refused, in a savepoint). A request answers with its acknowledgement, its refusal, or None when one of its
        tokens is not an opt-in token of its round (nothing of it stored; the caller says why)."""
        def run(conn: Connection) -> list[UploadAck | BaseException | None]:
            ot = s.optin_tokens.c
            wanted = sorted({u.token_hash for _, ups in batch for u in ups})
            found: dict[str, tuple[int, int]] = {}
            for i in range(0, len(wanted), IN_CHUNK):
                found.update({h: (int(num), int(q)) for h, q, num in conn.execute(
                    select(ot.token_hash, ot.seq, ot.round_num).where(ot.token_hash.in_(wanted[i:i + IN_CHUNK])))})
            pending: list[_Pending | None] = []
            for info, ups in batch:
                users = [found.get(u.token_hash, (None, None)) for u in ups]
                pending.append(None if any(num != info.num for num, _ in users) else _Pending(
                    info, [OptinUpload(q, u.items, u.key, u.nbytes) for (_, q), u in zip(users, ups, strict=True)]))
            todo = [p for p in pending if p is not None]
            answers = iter(self._store_group(conn, todo) if todo else [])
            return [None if p is None else next(answers) for p in pending]
        out = self._write(run)
        self._grew(sum(a.accepted for a in out if isinstance(a, UploadAck)))
        return out

    def _grouped(self, mine: _Pending) -> UploadAck:
        """Group commit of small upload requests: a thread that finds no commit under way stores the requests
        queued first (its own among them, or before it), up to :attr:`optin_chunk` uploads a transaction, each in
        a savepoint of its own (one refused request does not refuse the others), answers them after the commit
        and wakes the next waiting thread to store the next group."""
        with self._pending_lock:
            self._pending.append(mine)
        while True:
            with self._pending_lock:
                if mine.finished:
                    break
                group: list[_Pending] = []
                if not self._committing:
                    self._committing = True
                    while self._pending and (not group or sum(len(p.uploads) for p in group)
                                             + len(self._pending[0].uploads) <= self.optin_chunk):
                        group.append(self._pending.pop(0))
            if not group:
                mine.wake.wait()
                mine.wake.clear()
                continue
            try:
                outcomes = self._write(lambda conn, g=group: self._store_group(conn, g))
            except BaseException as exc:  # the transaction failed: every request of the group with it
                outcomes = [exc] * len(group)
            with self._pending_lock:
                for p, outcome in zip(group, outcomes, strict=True):
                    p.outcome, p.finished = outcome, True
                    p.wake.set()
                self._committing = False
                if self._pending:
                    self._pending[0].wake.set()
        if isinstance(mine.outcome, BaseException):
            raise mine.outcome
        assert mine.outcome is not None
        return mine.outcome

    def _store_group(self, conn: Connection, group: Sequence[_Pending]) -> list[UploadAck | BaseException]:
        """The requests of ``group`` stored together (one set of statements per round); if that is refused, each
        in a savepoint of its own, so that only the refused requests are refused."""
        try:
            with conn.begin_nested():
                by_round: dict[int, list[_Pending]] = {}
                for p in group:
                    by_round.setdefault(p.info.num, []).append(p)
                acks: dict[int, UploadAck | BaseException] = {}
                for ps in by_round.values():
                    new = self._store_uploads(conn, ps[0].info, [u for p in ps for u in p.uploads])
                    for p in ps:
                        acks[id(p)] = _ack(p.uploads, new)
                return [acks[id(p)] for p in group]
        except HybridDPError:
            return [self._savepoint(conn, p) for p in group]

    def _savepoint(self, conn: Connection, p: _Pending) -> UploadAck | BaseException:
        """``p`` stored in a savepoint of the group's transaction; its refusal (rolled back) if refused."""
        nested = conn.begin_nested()
        try:
            ack = _ack(p.uploads, self._store_uploads(conn, p.info, p.uploads))
        except HybridDPError as exc:  # a refusal of this request alone (ServiceError, DataError ...)
            nested.rollback()
            return exc
        nested.commit()
        return ack

    def _store_uploads(self, conn: Connection, info: RoundInfo, uploads: Sequence[OptinUpload]) -> set[tuple[int, str]]:
        """One transaction of :meth:`add_optin_batch`: the round's row lock, the new upload keys inserted at once,
        the quotas of their tokens read with one ``IN`` query per :data:`IN_CHUNK` users and checked, the
        counters and the records written in bulk. Returns the (user, key) of the uploads stored (:func:`_ack`)."""
        res = conn.execute(update(s.rounds).where(s.rounds.c.num == info.num, takes_optin())
                           .values(optin_records=s.rounds.c.optin_records))  # row lock; state and deadline checked
        if res.rowcount != 1:
            current = self._get(conn, info.id)
            refuse_past_deadline(current, "upload opt-in data")
            _refuse_state(current)
        fresh = _fresh(uploads)
        ou = s.optin_uploads.c
        new: set[tuple[int, str]] = set()
        if fresh:
            new = {(int(q), k) for q, k in conn.execute(
                self._insert(s.optin_uploads).on_conflict_do_nothing().returning(ou.user_seq, ou.upload_key),
                [{"round_num": info.num, "user_seq": up.user, "upload_key": up.key, "n_records": len(up.items)}
                 for up in fresh]).all()}
        taken = [up for up in fresh if (up.user, up.key) in new]
        adds = _totals(taken)
        self._refuse_over(info, adds, self._counts(conn, info, list(adds)), "nothing of this request was stored")
        rows = [row for up in taken for row in _item_rows(info, up)]
        if adds:
            ot = s.optin_tokens.c
            conn.execute(update(s.optin_tokens).where(ot.round_num == bindparam("r"), ot.seq == bindparam("q"))
                         .values(n_records=ot.n_records + bindparam("dr"), n_bytes=ot.n_bytes + bindparam("db")),
                         [{"r": info.num, "q": q, "dr": r, "db": b} for q, (r, b) in adds.items()])
        if rows:
            conn.execute(insert(s.optin_values if info.kind == "mean" else s.optin_records), rows)
            conn.execute(update(s.rounds).where(s.rounds.c.num == info.num)
                         .values(optin_records=s.rounds.c.optin_records + len(rows)))
        return new

    def _check_quotas(self, conn: Connection, info: RoundInfo, uploads: Sequence[OptinUpload]) -> None:
        """Before a request of several chunks stores anything: the round takes uploads, and its uploads not
        stored before keep every token within its quota (:class:`QuotaError` otherwise)."""
        current = self._get(conn, info.id)
        refuse_past_deadline(current, "upload opt-in data")
        if current.state != "collecting-optin":
            _refuse_state(current)
        fresh = _fresh(uploads)
        users = sorted({up.user for up in fresh})
        ou = s.optin_uploads.c
        stored: set[tuple[int, str]] = set()
        for i in range(0, len(users), IN_CHUNK):
            stored.update((int(q), k) for q, k in conn.execute(select(ou.user_seq, ou.upload_key).where(
                ou.round_num == info.num, ou.user_seq.in_(users[i:i + IN_CHUNK]))).all())
        adds = _totals([up for up in fresh if (up.user, up.key) not in stored])
        self._refuse_over(info, adds, self._counts(conn, info, list(adds)), "nothing of this request was stored")

    @staticmethod
    def _counts(conn: Connection, info: RoundInfo, users: Sequence[int]) -> dict[int, tuple[int, int]]:
        """(records, bytes) uploaded so far by each of the tokens ``users`` (codes), by the (round, seq) index."""
        ot = s.optin_tokens.c
        have: dict[int, tuple[int, int]] = {}
        for i in range(0, len(users), IN_CHUNK):
            have.update({int(q): (int(r), int(b)) for q, r, b in conn.execute(
                select(ot.seq, ot.n_records, ot.n_bytes).where(
                    ot.round_num == info.num, ot.seq.in_(users[i:i + IN_CHUNK]))).all()})
        return have

    def _refuse_over(self, info: RoundInfo, adds: dict[int, tuple[int, int]], have: dict[int, tuple[int, int]],
                     kept: str) -> None:
        """:class:`QuotaError` if ``adds`` (records, bytes per token) take a token past this server's quota."""
        for user, (r, b) in adds.items():
            n, nbytes = have.get(user, (0, 0))
            if n + r > self.optin_max_records or nbytes + b > self.optin_max_bytes:
                raise QuotaError(
                    f"opt-in upload refused: it would take a token of round {info.id} to {n + r:,} records and "
                    f"{nbytes + b:,} bytes, over this server's quota of {self.optin_max_records:,} records and "
                    f"{self.optin_max_bytes:,} bytes per token (hybriddp serve --optin-max-records/"
                    f"--optin-max-bytes); {kept}")

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
            refuse_past_deadline(self._get(conn, round_id), "build the head list")
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


@dataclass
class _Pending:
    """A small upload request waiting for the group commit (:meth:`OptinStore._grouped`)."""

    info: RoundInfo
    uploads: Sequence[OptinUpload]
    wake: threading.Event = field(default_factory=threading.Event)
    outcome: UploadAck | BaseException | None = None
    finished: bool = False


def _refuse_state(info: RoundInfo) -> None:
    """The :class:`ConflictError` of an upload to a round that no longer takes them."""
    raise ConflictError(f"cannot upload opt-in data: round {info.id} is {info.state!r}; uploads are taken while it is "
                        "'collecting-optin' (raw data are deleted when the head list is published, the round is "
                        "aborted or deleted, or its retention deadline passes)")


def _fresh(uploads: Sequence[OptinUpload]) -> list[OptinUpload]:
    """``uploads`` without the repeats of an earlier one (same token, same key)."""
    seen: set[tuple[int, str]] = set()
    out = []
    for up in uploads:
        if (up.user, up.key) not in seen:
            seen.add((up.user, up.key))
            out.append(up)
    return out


def _ack(uploads: Sequence[OptinUpload], new: set[tuple[int, str]]) -> UploadAck:
    """What storing ``uploads`` did, ``new`` the (user, key) stored (each claimed by its first upload, in order, of
    ``uploads`` and of the requests stored with them): records accepted, and repeats (stored before)."""
    accepted = total = 0
    for up in uploads:
        total += len(up.items)
        if (up.user, up.key) in new:
            new.discard((up.user, up.key))
            accepted += len(up.items)
    return UploadAck(accepted, total - accepted)


def _totals(uploads: Sequence[OptinUpload]) -> dict[int, tuple[int, int]]:
    """(records, bytes) of ``uploads`` per token."""
    adds: dict[int, tuple[int, int]] = {}
    for up in uploads:
        r, b = adds.get(up.user, (0, 0))
        adds[up.user] = (r + len(up.items), b + up.nbytes)
    return adds


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

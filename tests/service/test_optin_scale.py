"""Opt-in ingestion at scale (issue 39): indexed lookups, and requests larger than a transaction's chunk.

An upload or enrolment request of more than :attr:`Store.optin_chunk` users is checked whole, then stored in
transactions of that many users, so other writers get in between; quotas and idempotency hold across the chunks,
and a failure mid-way leaves the earlier chunks of an upload stored (a retry stores exactly the rest) and no
token of an enrolment (store/optin.py, store/enrolment.py, PRIVACY.md "The raw opt-in data's lifecycle").
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from hybriddp.service.errors import ConflictError, QuotaError
from hybriddp.service.store import OptinUpload, RoundInfo, Store

PARAMS = {"epsilon": 4.0, "delta": 1e-5, "head_list_size": 10, "m_o": 1, "m_c": 1}
CHUNK = 5


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    st = Store(store_url, optin_max_records=4)
    st.optin_chunk = CHUNK
    yield st
    st.close()


def uploads(store: Store, info: RoundInfo, tokens: list[str], tag: str = "") -> list[OptinUpload]:
    """One upload of two records per token, keyed by its content."""
    _, users = store.optin_users(info.id, tokens)
    out = []
    for i, user in enumerate(users):
        assert user is not None
        items = [(f"q{i}{tag}", f"https://s{i}.example/"), (f"q{i}{tag}", f"https://t{i}.example/")]
        out.append(OptinUpload(user, items, store.upload_key(None, items), 100))
    return out


def record_users(store: Store, info: RoundInfo) -> list[int]:
    return store.optin_records(info.num)[0]


def between_chunks(store: Store, action: Callable[[int], None]) -> Callable[[], None]:
    """Run ``action(k)`` each time ``store`` takes a connection from its pool (once per transaction of a request,
    after the first): a writer of its own connection that needs the write lock (SQLite) or the round's row lock
    (PostgreSQL), so it gets through only if the request's previous transaction ended. Returns the remover."""
    calls = [0]

    def checkout(*_: Any) -> None:
        calls[0] += 1
        if calls[0] > 1:
            action(calls[0])
    event.listen(store.engine, "checkout", checkout)
    return lambda: event.remove(store.engine, "checkout", checkout)


def test_the_upload_and_enrolment_lookups_use_an_index_of_the_key() -> None:
    """EXPLAIN QUERY PLAN of every statement that enrolment, the token check and a chunked upload run on
    ``optin_tokens`` and ``optin_uploads``: each searches an index by its whole key (the round and a user's code,
    pseudonym, token hash or upload key), never the round's rows. Before migration 0011 the quota reads and
    updates by (round, seq) searched the round's tokens (``(round_num=?)``): O(n) each, O(n²) a batch."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        st = Store(f"sqlite:///{Path(tmp) / 'plans.db'}")
        try:
            st.optin_chunk = 3
            info = st.create_round("blender", None, PARAMS)
            seen: list[tuple[str, Any]] = []

            def capture(_c: Any, _cur: Any, stmt: str, params: Any, _ctx: Any, many: bool) -> None:
                if re.search(r"\boptin_(tokens|uploads)\b", stmt) and not stmt.lstrip().upper().startswith("INSERT"):
                    seen.append((stmt, params[0] if many else params))
            event.listen(st.engine, "before_cursor_execute", capture)
            tokens = st.enrol_many(info.id, [f"u{i}" for i in range(7)])
            st.add_optin_batch(info, uploads(st, info, tokens))
            event.remove(st.engine, "before_cursor_execute", capture)
            raw = st.engine.raw_connection()
            try:
                plans = {stmt: [r[-1] for r in raw.cursor().execute("EXPLAIN QUERY PLAN " + stmt, p)]
                         for stmt, p in seen}
            finally:
                raw.close()
        finally:
            st.close()
    assert any("optin_tokens.seq IN" in stmt for stmt in plans) and any("UPDATE optin_tokens" in s for s in plans)
    for stmt, lines in plans.items():
        if "max(optin_tokens.seq)" in stmt:  # the last code of the round: SQLite's min/max reads one index entry
            assert lines == ["SEARCH optin_tokens USING COVERING INDEX optin_tokens_round_seq (round_num=?)"], lines
            continue
        for line in lines:
            assert not line.startswith("SCAN"), (stmt, line)
            assert not line.endswith("(round_num=?)"), (stmt, line)  # the round's rows, not one user's


def test_a_large_upload_is_stored_in_chunks_that_let_other_writers_in(store: Store, store_url: str) -> None:
    info = store.create_round("blender", None, PARAMS)
    tokens = store.enrol_many(info.id, [f"u{i}" for i in range(12)])
    other = Store(store_url)
    try:
        extra = other.enrol_many(info.id, ["a", "b", "c"])
        theirs = uploads(other, info, extra, tag="-other")
        batch = uploads(store, info, tokens)
        writes: list[int] = []
        event.listen(store.engine, "commit", lambda conn: writes.append(1)
                     if conn.get_execution_options().get("hybriddp_write") else None)
        remove = between_chunks(store, lambda k: other.add_optin_batch(info, [theirs[(k - 2) % 3]]))
        ack = store.add_optin_batch(info, batch)
        remove()
    finally:
        other.close()
    assert (ack.accepted, ack.duplicates) == (24, 0)
    assert len(writes) == 3  # 12 uploads in transactions of 5
    order = record_users(store, info)
    mine = {up.user for up in batch}
    runs = [u in mine for u in order]
    assert sum(a != b for a, b in itertools.pairwise(runs)) >= 2  # another writer's records in between
    again = store.add_optin_batch(info, batch)  # the same request again: every upload a duplicate
    assert (again.accepted, again.duplicates) == (0, 24)
    assert len(record_users(store, info)) == 24 + 2 * len(set(order) - mine)


def test_quotas_hold_across_chunks_and_an_overrun_stores_nothing(store: Store) -> None:
    info = store.create_round("blender", None, PARAMS)
    tokens = store.enrol_many(info.id, [f"u{i}" for i in range(12)])
    batch = uploads(store, info, tokens)
    over = [*batch, *uploads(store, info, tokens[11:], tag="-more"), *uploads(store, info, tokens[11:], tag="-x")]
    with pytest.raises(QuotaError, match=r"to 6 records.*nothing of this request was stored"):
        store.add_optin_batch(info, over)  # the last token's third upload: 6 records > 4, in the last chunk
    assert record_users(store, info) == [] and store.round(info.id).optin_records == 0
    assert store.add_optin_batch(info, batch).accepted == 24
    with pytest.raises(QuotaError, match="nothing of this request was stored"):  # against the stored counts
        store.add_optin_batch(info, uploads(store, info, tokens, tag="-again") + uploads(store, info, tokens, "-3"))
    assert len(record_users(store, info)) == 24


def test_a_failure_mid_way_keeps_the_chunks_stored_and_a_retry_stores_exactly_the_rest(store: Store,
                                                                                        store_url: str) -> None:
    """Another request takes a token of the third chunk to its quota after the whole request was checked: the third
    chunk is refused, the first two stay, the error says so, and the same request again (once the quota allows)
    acknowledges them as duplicates and stores the rest."""
    info = store.create_round("blender", None, PARAMS)
    tokens = store.enrol_many(info.id, [f"u{i}" for i in range(12)])
    batch = uploads(store, info, tokens)
    other = Store(store_url, optin_max_records=4)
    try:
        race = uploads(other, info, tokens[11:], tag="-race") + uploads(other, info, tokens[11:], tag="-race2")
        remove = between_chunks(store, lambda k: other.add_optin_batch(info, race) if k == 3 else None)
        with pytest.raises(QuotaError, match=r"The first 10 uploads of this request .* were stored before "
                                             r"this failure; send the whole request again"):
            store.add_optin_batch(info, batch)
        remove()
    finally:
        other.close()
    assert len(record_users(store, info)) == 20 + 4
    roomy = Store(store_url, optin_max_records=6)
    try:
        ack = roomy.add_optin_batch(info, batch)
    finally:
        roomy.close()
    assert (ack.accepted, ack.duplicates) == (4, 20)
    assert len(record_users(store, info)) == 24 + 4


def test_a_large_enrolment_is_chunked_and_a_race_mid_way_enrols_nobody(store: Store, store_url: str) -> None:
    info = store.create_round("blender", None, PARAMS)
    other = Store(store_url)
    try:
        remove = between_chunks(store, lambda k: other.enrol(info.id, f"between-{k}") if k == 3 else None)
        tokens = store.enrol_many(info.id, [f"u{i}" for i in range(12)])
        remove()
        _, codes = store.optin_users(info.id, tokens)
        assert codes == sorted(codes) and len(set(codes)) == 12  # the request's order, with a code between chunks
        assert codes[-1] - codes[0] == 12
        with pytest.raises(ConflictError, match="'u3' is already enrolled"):
            store.enrol_many(info.id, [*(f"v{i}" for i in range(7)), "u3"])  # checked whole: nothing stored
        remove = between_chunks(store, lambda k: other.enrol(info.id, "w8") if k == 3 else None)
        with pytest.raises(ConflictError, match="already enrolled"):
            store.enrol_many(info.id, [f"w{i}" for i in range(12)])  # "w8" enrolled by another after the check
        remove()
    finally:
        other.close()
    with store.engine.connect() as conn:
        enrolled = conn.execute(sa.text("SELECT COUNT(*) FROM optin_tokens")).scalar_one()
    assert enrolled == 12 + 1 + 1 == store.round(info.id).optin_users  # the failed request's chunks deleted
    assert len(store.enrol_many(info.id, [f"w{i}" for i in range(12) if i != 8])) == 11


def test_small_uploads_arriving_together_share_a_transaction_and_a_refusal_stays_their_own(store: Store) -> None:
    """Single-user uploads of concurrent requests queued while a transaction runs are stored by one group commit;
    one of them over its token's quota is refused alone (its savepoint rolled back), the others are stored."""
    info = store.create_round("blender", None, PARAMS)
    tokens = store.enrol_many(info.id, [f"u{i}" for i in range(4)])
    first = uploads(store, info, tokens)
    store.add_optin_batch(info, first[3:])  # the last token holds 2 records of its 4
    batch = [*first[:3], *uploads(store, info, tokens[3:], "-x"), *uploads(store, info, tokens[3:], "-y")]
    writes: list[int] = []
    event.listen(store.engine, "commit", lambda conn: writes.append(1)
                 if conn.get_execution_options().get("hybriddp_write") else None)
    queued = threading.Event()
    event.listen(store.engine, "checkout", lambda *_: queued.wait(20))  # the first writer waits for the others
    answers: dict[int, Any] = {}

    def send(i: int) -> None:
        try:
            answers[i] = store.add_optin_batch(info, [batch[i]])
        except QuotaError as exc:
            answers[i] = exc
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(batch))]
    for t in threads:
        t.start()
    while len(store._pending) < len(batch) - 1:  # the others queued behind the first (white box: the queue)
        threading.Event().wait(0.01)
    queued.set()
    for t in threads:
        t.join(30)
    assert len(writes) == 2  # the first request's transaction, then one for the four queued meanwhile
    ok = sorted(i for i, a in answers.items() if not isinstance(a, Exception))
    assert len(ok) == 4 and all(answers[i].accepted == 2 for i in ok)  # one of the two of token 3 refused
    assert sum(isinstance(a, QuotaError) for a in answers.values()) == 1
    assert len(record_users(store, info)) == 2 + 4 * 2


def test_postgresql_statistics_follow_a_growing_round(pg_cluster: Any) -> None:
    """A round's opt-in tables grow faster than autovacuum analyzes them; planned on the statistics of a nearly empty
    ``optin_tokens``, the "already enrolled" check scanned the table whole for every lookup, and enrolment slowed
    ~10× from a round of 10,000 users to one of 100,000 (docs/RESULTS.md "Issue 39"). The store analyzes the opt-in
    tables whenever its additions double them: the planner's row count of ``optin_tokens`` (``reltuples``, -1 while
    never analyzed) is never less than half the rows there are, at once, with no autovacuum pass."""
    st = Store(pg_cluster.create_database())
    try:
        info = st.create_round("blender", None, PARAMS)
        seen = []
        for start, n in ((0, 600), (600, 900), (1_500, 3_500), (5_000, 2_000)):
            st.enrol_many(info.id, [f"user-{i}" for i in range(start, start + n)])
            with st.engine.connect() as conn:
                seen.append(conn.execute(sa.text("SELECT reltuples FROM pg_class WHERE relname = 'optin_tokens'"))
                            .scalar())
        assert seen[0] <= 0  # 600 rows: under the first threshold, not analyzed yet
        assert seen[1] >= 1_500 and seen[2] >= 5_000 and seen[3] >= 7_000 / 2, seen
    finally:
        st.close()

"""SQLite's settled-id hashes (service/settled.py): new ids skip the lookup in ``messages`` only
when the hashes provably hold every settled id; otherwise they are loaded again, or every id is
looked up. Each test counts retries of settled ids, which a wrong "certainly new" would count twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from test_settle import published_round

import hybriddp.service.settled as settled_module
from hybriddp.core.protocol import new_message_id
from hybriddp.service.store import Store


def ids(n: int) -> list[str]:
    return [new_message_id() for _ in range(n)]


def stored_ids(store: Store) -> list[str]:
    with store.engine.connect() as conn:
        return [r[0] for t in ("messages", "messages_recent")
                for r in conn.execute(sa.text(f"SELECT message_id FROM {t}"))]


def test_a_settle_of_this_process_joins_the_hashes_without_loading_them_again(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        rnd = published_round(store)
        first = ids(40)
        assert store.add_reports(rnd, [(m, [0]) for m in first]).counted == 40  # loads the (empty) hashes
        loads = store._settled.generation
        assert store.settle() == 40
        ack = store.add_reports(rnd, [(m, [1]) for m in first[:10] + ids(5)])
        assert (ack.counted, ack.duplicates) == (5, 10)
        assert store._settled.generation == loads  # the settle's ids were merged, not read from the table
        assert store.settle() == 5
        assert store.add_reports(rnd, [(m, [1]) for m in first]).counted == 0
        assert store._settled.generation == loads
        assert sorted(stored_ids(store)) == sorted(set(stored_ids(store)))
    finally:
        store.close()


def test_a_settle_by_another_process_makes_the_hashes_load_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    a, b = Store(url), Store(url)
    try:
        rnd = published_round(a)
        assert b.add_reports(rnd, [(m, [0]) for m in ids(3)]).counted == 3  # b's hashes: nothing settled
        theirs = ids(20)
        assert a.add_reports(rnd, [(m, [0]) for m in theirs]).counted == 20
        assert a.settle() == 23  # b did not see these move
        before = b._settled.generation
        ack = b.add_reports(rnd, [(m, [2]) for m in theirs + ids(4)])
        assert (ack.counted, ack.duplicates) == (4, 20)
        assert b._settled.generation == before + 1
        assert len(stored_ids(a)) == len(set(stored_ids(a))) == 27
        assert b.recount(rnd.num, 8).tolist() == [23, 0, 4, 0, 0, 0, 0, 0]
    finally:
        a.close()
        b.close()


def test_a_restarted_process_loads_the_settled_ids(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(url)
    rnd = published_round(store)
    old = ids(30)
    store.add_reports(rnd, [(m, [0]) for m in old])
    store.settle()
    store.close()
    again = Store(url)
    try:
        ack = again.add_reports(rnd, [(m, [0]) for m in old + ids(2)])
        assert (ack.counted, ack.duplicates) == (2, 30)
    finally:
        again.close()


def test_colliding_hashes_only_cost_a_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every id hashes alike: each one "may be settled", and the lookup in messages decides."""
    monkeypatch.setattr(settled_module, "id_hashes", lambda it, n: np.zeros(n, dtype=np.int64))
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        rnd = published_round(store)
        old = ids(10)
        assert store.add_reports(rnd, [(m, [0]) for m in old]).counted == 10
        store.settle()
        ack = store.add_reports(rnd, [(m, [1]) for m in old[::2] + ids(7)])
        assert (ack.counted, ack.duplicates) == (7, 5)
        assert store.recount(rnd.num, 8).tolist() == [10, 7, 0, 0, 0, 0, 0, 0]
    finally:
        store.close()


def test_hashes_mark_exactly_the_settled_ids(tmp_path: Path) -> None:
    """Straight from the class: loaded hashes find every settled id and (64-bit hashes) no new one."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        rnd = published_round(store)
        old = ids(500)
        store.add_reports(rnd, [(m, [0]) for m in old])
        store.settle()
        fresh = ids(500)
        with store.engine.begin() as conn:
            marks = store._settled.maybe_settled(conn, rnd.num, 500, old + fresh)
            assert marks[:500].all() and not marks[500:].any()
            assert store._settled.maybe_settled(conn, rnd.num, 499, fresh).all()  # counts disagree: look up all
    finally:
        store.close()

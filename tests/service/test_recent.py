"""SQLite's recent message ids (service/recent.py) against a plain model: a set of every id stored.

Two :class:`Store` objects on one file stand for two ``serve --workers`` processes (each with its
own :class:`RecentIds`). A seeded random sequence of operations (groups of new ids, retries of
recent ids, retries of settled ids, ids repeated within a group, settles by either store, statements
cut into chunks of a few rows so that a chunk can meet a settled id and leave gaps in ``seq``) must
count exactly the ids the model has not seen, and leave every id in exactly one table.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_settle import published_round, rows

import hybriddp.service.store.reports as store_reports
from hybriddp.core.protocol import new_message_id
from hybriddp.service.recent import Appends
from hybriddp.service.store import Store


def test_appends_take_consecutive_seqs_above_the_base_and_remember_what_was_stored() -> None:
    a = Appends(41)
    assert (a.take(3), a.take(2), a.span) == (42, 45, None)
    a.stored(45, 45)  # 46 taken but not stored: a trailing gap is not "last"
    a.stored(42, 43)
    assert a.span == (42, 45)


@pytest.mark.parametrize("seed", range(1, 13))
def test_two_stores_on_one_file_count_each_id_once_whatever_the_interleaving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(store_reports, "_ROWS_PER_INSERT", 5)  # many chunks per group: gaps and mixed chunks
    url = f"sqlite:///{tmp_path / 'recent.db'}"
    stores = [Store(url), Store(url)]
    try:
        rnd = published_round(stores[0])
        rng = random.Random(seed)
        seen: set[str] = set()  # the model: every id stored so far
        order: list[str] = []  # ... in the order first stored
        for step in range(60):
            store = stores[rng.randrange(2)]
            op = rng.random()
            if op < 0.15:
                store.settle()
                continue
            group = [new_message_id() for _ in range(rng.randrange(0, 12))]
            if order:  # retries of anything stored before: recent (either store's) or settled
                group += rng.choices(order, k=rng.randrange(0, 8))
            if group and rng.random() < 0.3:
                group.append(rng.choice(group))  # repeated within the request
            rng.shuffle(group)
            want = len(set(group) - seen)
            ack = store.add_reports(rnd, [(m, [step % 8]) for m in group])
            assert (ack.acknowledged, ack.counted, ack.duplicates) == (len(group), want, len(group) - want), step
            for m in group:
                if m not in seen:
                    seen.add(m)
                    order.append(m)
        with stores[0].engine.connect() as conn:
            stored = [r[0] for t in ("messages", "messages_recent")
                      for r in conn.execute(sa.text(f"SELECT message_id FROM {t}"))]
        assert len(stored) == len(set(stored)) == len(seen) and set(stored) == seen
        assert sum(rows(stores[1])) == len(seen) == stores[1].round(rnd.id).messages
    finally:
        for s in stores:
            s.close()


def test_a_chunk_that_meets_a_settled_id_stores_the_others_and_the_next_group_sees_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slow path of an append (row count short): the rows are read back by their seq range."""
    monkeypatch.setattr(store_reports, "_ROWS_PER_INSERT", 4)
    store = Store(f"sqlite:///{tmp_path / 'gap.db'}")
    try:
        rnd = published_round(store)
        # the group is appended in id order: the settled ids sit between new ones (never only at the ends, where
        # skipping them would leave no gap inside the stored seq range; random ids did that 4 times in 84)
        ids = sorted(new_message_id() for _ in range(9))
        old = [ids[1], ids[4], ids[7]]
        new = [m for m in ids if m not in old]
        assert store.add_reports(rnd, [(m, [0]) for m in old]).counted == 3
        assert store.settle() == 3
        with store.engine.begin() as conn:  # counts that disagree with the table: every id is looked up in
            conn.execute(sa.text("UPDATE rounds SET n_messages = n_messages + 1"))  # messages (service.settled)
        ack = store.add_reports(rnd, [(m, [1]) for m in [*new[:2], *old, *new[2:]]])
        assert (ack.counted, ack.duplicates) == (6, 3)
        with store.engine.connect() as conn:
            seqs = [r[0] for r in conn.execute(sa.text("SELECT seq FROM messages_recent ORDER BY seq"))]
        assert len(seqs) == 6 and seqs[-1] - seqs[0] >= 6  # three candidates left gaps
        assert store.add_reports(rnd, [(m, [2]) for m in new + old]).counted == 0
        assert store.recount(rnd.num, 8).tolist() == [3, 6, 0, 0, 0, 0, 0, 0]
    finally:
        store.close()

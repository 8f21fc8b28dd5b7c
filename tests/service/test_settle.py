"""SQLite's two-level message store: ``messages_recent`` settled into ``messages`` (store.py, Store.settle).

A message id must be counted once whichever table holds it: retries of settled ids and of ids
still in ``messages_recent``, a settle in the middle of a concurrent stream, the close (which
settles), the migration's downgrade (which settles), and a ``kill -9`` while a settle runs (one
transaction: all rows in one table or all in the other, never lost, never in both).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import storehelpers
from asyncrun import run_async
from hybriddp.core.protocol import new_message_id
from hybriddp.service.store import RoundInfo, Store
from hybriddp.service.store.engine import MIGRATIONS
from hybriddp.service.writer import ReportWriter

N_ENTRIES = 8


def published_round(store: Store, kind: str = "blender") -> RoundInfo:
    return storehelpers.published_round(store, kind)


def rows(store: Store, round_num: int | None = None) -> tuple[int, int]:
    """(rows in messages, rows in messages_recent), of one round or of all."""
    where = "" if round_num is None else f" WHERE round_num = {int(round_num)}"
    with store.engine.connect() as conn:
        return tuple(int(conn.execute(sa.text(f"SELECT count(*) FROM {t}{where}")).scalar_one())  # type: ignore
                     for t in ("messages", "messages_recent"))


def expected_counts(msgs: dict[str, list[int]]) -> list[int]:
    """Reports per entry of the distinct messages, counted here from what was sent."""
    c = Counter(e for entries in msgs.values() for e in entries)
    return [c[e] for e in range(N_ENTRIES)]


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    store = Store(f"sqlite:///{tmp_path / 'settle.db'}")
    yield store
    store.close()


# ----- retries of settled and of recent ids -----------------------------------------------------
def test_retries_of_settled_and_of_recent_ids_are_not_counted_again(sqlite_store: Store) -> None:
    store = sqlite_store
    a = published_round(store)
    settled = {new_message_id(): [i % N_ENTRIES, (i + 3) % N_ENTRIES] for i in range(40)}
    assert store.add_reports(a, list(settled.items())).counted == 40
    assert rows(store) == (0, 40)
    assert store.settle() == 40
    assert rows(store) == (40, 0)
    recent = {new_message_id(): [i % N_ENTRIES] for i in range(25)}
    assert store.add_reports(a, list(recent.items())).counted == 25
    assert rows(store) == (40, 25)

    # every id again, with other entries (a retry must not change what was stored), plus 5 new ones, one of them
    # twice in the request: only the 5 new ones count, each once, with the entries of its first occurrence
    fresh = {new_message_id(): [7] for _ in range(5)}
    first_fresh = next(iter(fresh))
    retry = [(m, [6, 6]) for m in settled] + [(m, [6]) for m in recent] + list(fresh.items()) + [(first_fresh, [0])]
    random.Random(1).shuffle(retry)
    retry.remove((first_fresh, [0]))
    retry.append((first_fresh, [0]))  # after its first occurrence
    ack = store.add_reports(a, retry)
    assert (ack.acknowledged, ack.counted, ack.reports, ack.duplicates) == (71, 5, 5, 66)
    assert rows(store) == (40, 30)
    info = store.round(a.id)
    assert (info.messages, info.reports, info.duplicates) == (70, 80 + 25 + 5, 66)
    want = expected_counts({**settled, **recent, **fresh})
    assert store.entry_counts(a.num, N_ENTRIES).tolist() == want == store.recount(a.num, N_ENTRIES).tolist()

    # the other way round: ids first sent now, settled, then retried
    assert store.settle() == 30
    assert store.add_reports(a, [(m, [1]) for m in fresh]).counted == 0
    assert store.recount(a.num, N_ENTRIES).tolist() == want and rows(store) == (70, 0)


def test_the_first_of_equal_ids_in_one_group_is_the_one_stored(sqlite_store: Store) -> None:
    """Equal ids sorted next to each other, across the statement's row chunks: the first occurrence wins."""
    store = sqlite_store
    a = published_round(store)
    ids = [new_message_id() for _ in range(3000)]
    first = [(m, [i % 2] if i < 1500 else [2 + i % 2]) for i, m in enumerate(ids)]
    again = [(m, [4 + i % 4]) for i, m in enumerate(ids)]  # entries 4..7: must never be stored nor counted
    results = store.add_reports_many([(a, first), (a, again)])
    assert [r.counted for r in results] == [3000, 0]
    want = [750, 750, 750, 750, 0, 0, 0, 0]
    assert store.recount(a.num, N_ENTRIES).tolist() == want == store.entry_counts(a.num, N_ENTRIES).tolist()
    store.start_close(a.id)
    assert rows(store, a.num) == (3000, 0) and store.recount(a.num, N_ENTRIES).tolist() == want


# ----- a settle in the middle of a concurrent stream -----------------------------------------------
def test_settles_in_the_middle_of_a_concurrent_stream_lose_and_double_count_nothing(sqlite_store: Store) -> None:
    store = sqlite_store
    store.settle_rows = 37  # tiny: the writer settles again and again while requests arrive
    a, b = published_round(store), published_round(store)
    rng = random.Random(5)
    sent: dict[int, dict[str, list[int]]] = {a.num: {}, b.num: {}}
    for info in (a, b):
        for _ in range(1500):
            sent[info.num][new_message_id()] = [rng.randrange(N_ENTRIES) for _ in range(rng.randint(0, 3))]
    moved: list[int] = []
    settle = store.settle

    def counting_settle(min_rows: int = 0) -> int:
        moved.append(settle(min_rows))
        return moved[-1]
    store.settle = counting_settle  # type: ignore[method-assign]

    writer = ReportWriter(store, max_group_messages=60)
    acks: list[Any] = []
    acked_ids: dict[int, set[str]] = {a.num: set(), b.num: set()}
    lock = threading.Lock()

    async def requests(seed: int) -> None:
        r = random.Random(seed)
        infos = {a.num: a, b.num: b}
        for _ in range(150):
            num = r.choice([a.num, b.num])
            pool = list(sent[num].items())
            batch = [pool[r.randrange(len(pool))] for _ in range(r.randint(1, 30))]  # retries overlap freely
            ack = await asyncio.wait_for(writer.submit(infos[num], batch), 60)
            with lock:
                acks.append((num, len(batch), ack))
                acked_ids[num].update(m for m, _ in batch)

    def client(seed: int) -> None:  # each thread its own event loop: the writer answers each loop's requests
        asyncio.run(requests(seed))

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    assert len(acks) == 600 and all(ack.acknowledged == n for _, n, ack in acks)
    assert sum(1 for m in moved if m) >= 10, moved  # settled many times mid-stream

    for info in (a, b):
        got = store.round(info.id)
        stored = rows(store, info.num)
        counted = sum(ack.counted for num, _, ack in acks if num == info.num)
        acked = sum(n for num, n, _ in acks if num == info.num)
        assert got.messages == counted == sum(stored)
        assert got.duplicates == acked - counted
        with store.engine.connect() as conn:
            ids = set(conn.execute(sa.text("SELECT message_id FROM messages WHERE round_num = :n UNION ALL "
                                           "SELECT message_id FROM messages_recent WHERE round_num = :n"),
                                   {"n": info.num}).scalars())
        assert len(ids) == sum(stored)  # no id in both tables
        assert ids == acked_ids[info.num]  # every acknowledged id is stored, nothing else
        want = expected_counts({m: sent[info.num][m] for m in ids})
        assert sum(want) == got.reports
        assert store.entry_counts(info.num, N_ENTRIES).tolist() == want == store.recount(info.num, N_ENTRIES).tolist()
    store.start_close(a.id)
    assert rows(store) == (sum(rows(store, n)[0] for n in (a.num, b.num)), 0)  # the close settled every round


def test_a_cancelled_request_neither_stops_the_writer_nor_loses_its_neighbours(sqlite_store: Store) -> None:
    """A request whose wait is cancelled (the server stopping) is still stored once; the writer thread
    goes on answering the others (answering a cancelled future must not raise in the writer)."""
    store = sqlite_store
    a = published_round(store)
    writer = ReportWriter(store)
    ids = [new_message_id() for _ in range(3)]

    async def main() -> list[Any]:
        gone = writer.submit(a, [(ids[0], [0])])
        gone.cancel()
        kept = [writer.submit(a, [(ids[1], [1])]), writer.submit(a, [(ids[2], [1]), (ids[0], [0])])]
        return list(await asyncio.wait_for(asyncio.gather(*kept), 30))

    async def retry(info: RoundInfo, mid: str) -> Any:
        return await asyncio.wait_for(writer.submit(info, [(mid, [1])]), 30)
    try:
        acks = run_async(main())
        later = run_async(retry(a, ids[1]))  # another event loop, later
    finally:
        writer.close()
    assert [(k.acknowledged, k.counted) for k in acks] in ([(1, 1), (2, 1)], [(1, 1), (2, 2)])
    assert (later.acknowledged, later.counted) == (1, 0)
    assert store.recount(a.num, N_ENTRIES).tolist()[:2] == [1, 2]  # each id once: entry 0 once, entry 1 twice


def test_a_mean_round_reads_its_values_from_both_tables(sqlite_store: Store) -> None:
    store = sqlite_store
    m = published_round(store, "mean")
    values = {new_message_id(): float(i) / 4 for i in range(30)}
    items = list(values.items())
    store.add_reports(m, items[:20])
    store.settle()
    # 10 settled ids again, 10 new ones, a settled one with another value, a new one twice
    ack = store.add_reports(m, [*items[10:], (items[0][0], 100.0), (items[25][0], 100.0)])
    assert (ack.counted, ack.duplicates) == (10, 12)
    assert rows(store, m.num) == (20, 10)
    assert store.report_values(m.num) == (30, sum(values.values()))
    store.start_close(m.id)
    assert rows(store, m.num) == (30, 0) and store.report_values(m.num) == (30, sum(values.values()))


def test_settle_if_due_waits_for_settle_rows_and_counts_again_before_moving(sqlite_store: Store,
                                                                           tmp_path: Path) -> None:
    store = sqlite_store
    store.settle_rows = 50
    a = published_round(store)
    store.add_reports(a, [(new_message_id(), [1]) for _ in range(49)])
    assert store.settle_if_due() == 0 and rows(store) == (0, 49)
    other = Store(store.url)  # a second server process on the same file: it stores 30 more
    try:
        assert other.add_reports(a, [(new_message_id(), [2]) for _ in range(30)]).counted == 30
    finally:
        other.close()
    store.add_reports(a, [(new_message_id(), [3])])
    assert store.settle_if_due() == 80 and rows(store) == (80, 0)
    restarted = Store(store.url)  # a new process counts what is there at start-up
    try:
        restarted.settle_rows = 50
        restarted.add_reports(a, [(new_message_id(), [1]) for _ in range(20)])
        assert restarted.settle_if_due() == 0
        store.add_reports(a, [(new_message_id(), [1]) for _ in range(40)])  # it reads the other's 20 first: 60
        assert store.settle_if_due() == 60 and rows(store) == (140, 0)
        restarted.add_reports(a, [(new_message_id(), [1]) for _ in range(30)])  # it notices the settle: 30 < 50
        assert restarted.settle_if_due() == 0 and rows(store) == (140, 30)
        assert restarted.settle(min_rows=1) == 30 and store.settle(min_rows=1) == 0 and rows(store) == (170, 0)
    finally:
        restarted.close()
    assert store.recount(a.num, N_ENTRIES).tolist() == store.entry_counts(a.num, N_ENTRIES).tolist()
    assert sum(store.entry_counts(a.num, N_ENTRIES).tolist()) == 170


# ----- the migration --------------------------------------------------------------------------
def test_the_downgrade_keeps_the_recent_messages(store_url: str) -> None:
    from alembic import command
    from alembic.config import Config

    store = Store(store_url)
    try:
        a = published_round(store)
        store.add_reports(a, [(new_message_id(), [i % N_ENTRIES]) for i in range(20)])
        store.settle()
        store.add_reports(a, [(new_message_id(), [i % N_ENTRIES]) for i in range(7)])
        before = store.recount(a.num, N_ENTRIES).tolist()
        assert sum(before) == 27
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with store.engine.connect() as conn:
            with conn.execution_options(hybriddp_write=True).begin():
                cfg.attributes["connection"] = conn
                command.downgrade(cfg, "0001")
            assert "messages_recent" not in sa.inspect(conn).get_table_names()
            assert conn.execute(sa.text("SELECT count(*) FROM messages")).scalar_one() == 27
    finally:
        store.close()
    store = Store(store_url)  # upgraded again at start-up
    try:
        assert rows(store) == (27, 0) and store.recount(a.num, N_ENTRIES).tolist() == before
    finally:
        store.close()


# ----- kill -9 during and after a settle ------------------------------------------------------
SETTLER = textwrap.dedent("""
    import sys, time
    from hybriddp.service.store import Store
    store = Store(sys.argv[1])
    print("go", flush=True)
    t0 = time.perf_counter()
    moved = store.settle()
    print("done", moved, time.perf_counter() - t0, flush=True)
    time.sleep(60)  # killed here in the 'after' trial
""")


def _settle_in_child(db: Path, kill_after: float | None) -> tuple[bool, float]:
    """Run a settle in a child process; SIGKILL it ``kill_after`` s after it starts settling (None: after it
    says done). Returns (done was printed, settle seconds or the delay)."""
    proc = subprocess.Popen([sys.executable, "-c", SETTLER, f"sqlite:///{db}"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "go"
        if kill_after is not None:
            time.sleep(kill_after)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            out = proc.stdout.read()
            return out.startswith("done"), kill_after
        line = proc.stdout.readline().split()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return line[0] == "done", float(line[2])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kill_9_during_or_after_a_settle_leaves_every_message_in_exactly_one_table(tmp_path: Path) -> None:
    src = tmp_path / "src.db"
    store = Store(f"sqlite:///{src}")
    n_old, n_new = 150_000, 150_000
    try:
        a = published_round(store)
        rng = random.Random(3)
        for part in range(0, n_old + n_new, 50_000):
            store.add_reports(a, [(new_message_id(), [rng.randrange(N_ENTRIES)]) for _ in range(50_000)])
            if part + 50_000 == n_old:
                store.settle()
        want = store.entry_counts(a.num, N_ENTRIES).tolist()
        assert rows(store) == (n_old, n_new) and sum(want) == n_old + n_new
    finally:
        store.close()  # the last connection checkpoints: the database is one file

    def check(db: Path) -> tuple[int, int]:
        st = Store(f"sqlite:///{db}")
        try:
            got = rows(st)
            with st.engine.connect() as conn:
                both = conn.execute(sa.text("SELECT count(*) FROM messages m JOIN messages_recent r ON "
                                            "r.round_num = m.round_num AND r.message_id = m.message_id")).scalar_one()
            assert both == 0
            assert st.recount(a.num, N_ENTRIES).tolist() == want == st.entry_counts(a.num, N_ENTRIES).tolist()
            return got
        finally:
            st.close()

    trial = tmp_path / "trial.db"
    trial.write_bytes(src.read_bytes())
    done, seconds = _settle_in_child(trial, None)  # killed right after the settle committed: it stays done
    assert done and check(trial) == (n_old + n_new, 0)
    killed_mid = 0
    for share in (0.1, 0.4, 0.7):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{trial}{suffix}").unlink(missing_ok=True)
        trial.write_bytes(src.read_bytes())
        done, _ = _settle_in_child(trial, share * seconds)
        got = check(trial)
        assert got in ([(n_old + n_new, 0)] if done else [(n_old, n_new), (n_old + n_new, 0)])  # all or nothing
        killed_mid += got == (n_old, n_new)
    assert killed_mid >= 1, f"no kill landed inside the settle ({seconds:.2f} s)"


def test_a_retried_multi_report_message_next_to_new_single_report_ones(store_url: str) -> None:
    """Only the retried message has a 2nd report: nothing goes to extra_entries (no row of NULLs, no error)."""
    store = Store(store_url)
    try:
        a = published_round(store)
        old = new_message_id()
        assert store.add_reports(a, [(old, [1, 2])]).counted == 1
        ack = store.add_reports(a, [(old, [3, 4]), (new_message_id(), [5]), (new_message_id(), [])])
        assert (ack.counted, ack.reports, ack.duplicates) == (2, 1, 1)
        assert store.recount(a.num, N_ENTRIES).tolist() == [0, 1, 1, 0, 0, 1, 0, 0]
        assert store.table_counts(a.num)["extra_entries"] == 1
    finally:
        store.close()

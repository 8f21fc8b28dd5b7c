"""Retention always wins: raw opt-in data are gone soon after their round's retention deadline even while other
transactions hold the database, and nothing is taken for a round past its deadline (PRIVACY.md, "The raw opt-in
data's lifecycle").

Each test is a defect an operator met: the purge logged "database is locked" and gave up until its next pass, one
locked round held back the purge of every other, and a round past its deadline took uploads until the purge ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from test_privacy_soundness import ADMIN, API, AUTH, canaries, canary_hits, create, upload_all

import hybriddp.service.app as service_app
import hybriddp.service.store.rounds as store_rounds
from hybriddp.service import create_app
from hybriddp.service import schema as s
from hybriddp.service.store import Store
from uvicornhelpers import served

LOCK_WAIT_MS = 200  # one purge transaction's lock wait (PURGE_LOCK_WAIT_MS, 2 s in service)
PATIENCE_S = 30.0  # generous ceiling of every wait below; the service's regular pass would come after an hour


@pytest.fixture(autouse=True)
def quick_purge(monkeypatch: pytest.MonkeyPatch) -> None:
    """No regular purge pass during a test (only the first, at start-up, and the retries), short lock waits."""
    monkeypatch.setattr(service_app, "PURGE_INTERVAL_S", 3600.0)
    monkeypatch.setattr(store_rounds, "PURGE_LOCK_WAIT_MS", LOCK_WAIT_MS)
    monkeypatch.setattr(store_rounds, "SCRUB_WAIT_MS", 300)


def expire(store: Store, *round_ids: str) -> None:
    """Move the rounds' retention deadline one second into the past (the purge has not run)."""
    past = (datetime.now(timezone.utc) - timedelta(seconds=1)).isoformat(timespec="seconds")
    with store.engine.begin() as conn:
        conn.execute(sa.update(s.rounds).where(s.rounds.c.id.in_(round_ids)).values(retention_deadline=past))


def rounds_with_canaries(url: str, n: int) -> list[str]:
    """``n`` rounds, each with 20 canary records uploaded, their deadline passed; the server stopped again."""
    with TestClient(create_app(url, ADMIN, open_admission=True)) as c:
        rids = [create(c) for _ in range(n)]
        for i, rid in enumerate(rids):
            upload_all(c, rid, canaries(20), prefix=f"r{i}")
        expire(c.app.state.store, *rids)  # type: ignore[attr-defined]
    return rids


class Holder:
    """Another connection in a long write transaction: SQLite's ``BEGIN IMMEDIATE`` (the database's write lock);
    PostgreSQL: the lock an opt-in upload takes on its round's row (``UPDATE rounds ...``)."""

    def __init__(self, url: str, round_id: str) -> None:
        if url.startswith("sqlite"):
            import sqlite3
            self.conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            import psycopg
            self.conn = psycopg.connect(sa.make_url(url).set(drivername="postgresql")
                                        .render_as_string(hide_password=False))
            self.conn.execute("UPDATE rounds SET optin_records = optin_records WHERE id = %s", (round_id,))
        self.held = True

    def release(self) -> None:
        if self.held:
            self.conn.rollback()
            self.conn.close()
            self.held = False


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        h.release()


def wait_for(check: Any, what: str) -> float:
    """Poll ``check()`` until true; the seconds it took (a failure after :data:`PATIENCE_S`)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < PATIENCE_S, f"{what}: not within {PATIENCE_S} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_purge_that_finds_the_round_locked_retries_until_it_wins(store_url: str, holders: list[Holder]) -> None:
    """The defect: the purge met the write lock of a long transaction, logged "database is locked" and gave up until
    its next pass a minute later (and the pass after, while the transaction went on). Now the pass leaves the round
    pending and the service retries it after a short backoff: once the transaction ends, the raw data are gone from
    the tables and from the database files long before the next regular pass (an hour away here)."""
    (rid,) = rounds_with_canaries(store_url, 1)
    app = create_app(store_url, ADMIN, open_admission=True, recover=False)  # the first pass is the served app's
    store: Store = app.state.store
    holders.append(holder := Holder(store_url, rid))
    with served(app) as base:
        wait_for(lambda: store.purge_pending == (rid,), "the first pass finds the round locked")
        time.sleep(1.0)  # several retries meet the lock too
        info = store.round(rid)
        assert info.state == "collecting-optin" and info.purged is None
        assert store.table_counts(info.num)["optin_records"] == 20
        assert canary_hits(store) > 0 or store.dialect == "postgresql"  # (PostgreSQL's files: after the scrub)
        holder.release()
        took = wait_for(lambda: store.round(rid).purged is not None and not store.scrub_pending,
                        "the purge after the transaction ended")
        assert took < PATIENCE_S
        assert store.purge_pending == ()
        shown = httpx.get(f"{base}{API}/rounds/{rid}", headers=AUTH).json()
        assert shown["state"] == "aborted" and shown["raw_data_purged"] is not None
        assert sum(store.table_counts(info.num)[t] for t in ("optin_records", "optin_tokens")) == 0
        assert canary_hits(store) == 0


def test_a_purge_pass_never_waits_out_a_long_transaction_nor_lets_it_hold_back_other_rounds(
        store_url: str, holders: list[Holder]) -> None:
    """The defect: one transaction purged every due round, waiting without bound (PostgreSQL) or for the 30 s busy
    timeout five times over (SQLite) for the one a long transaction held, and every other due round waited with it.
    Now a pass waits at most PURGE_LOCK_WAIT_MS per round, purges what it can lock, and names the rest pending."""
    locked, free = rounds_with_canaries(store_url, 2)
    store = Store(store_url)
    try:
        holders.append(holder := Holder(store_url, locked))
        out: list[list[str]] = []
        purge = threading.Thread(target=lambda: out.append(store.purge_expired()), daemon=True)
        purge.start()
        purge.join(PATIENCE_S)
        assert not purge.is_alive(), "the purge pass waited on the long transaction"
        if store.dialect == "postgresql":  # the row of one round is locked: the other is purged now
            assert out == [[free]] and store.purge_pending == (locked,)
        else:  # the database's write lock: both wait for the retry
            assert out == [[]] and store.purge_pending == (locked, free)
        holder.release()
        assert sorted(store.purge_expired()) == sorted([locked] if store.dialect == "postgresql" else [locked, free])
        assert store.purge_pending == () and not store.scrub_pending
        assert {store.round(r).state for r in (locked, free)} == {"aborted"}
        assert canary_hits(store) == 0
    finally:
        store.close()


def test_a_round_past_its_deadline_takes_no_opt_in_data_before_the_purge_runs(store_url: str) -> None:
    """The defect: until the purge ran, a round past its retention deadline still enrolled users, stored their
    uploads and could start its build on them. Now all three are refused at the deadline, and nothing is stored or
    charged."""
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as c:
        store: Store = c.app.state.store  # type: ignore[attr-defined]
        ledger_before = c.get(f"{API}/ledger", headers=AUTH).json()
        rid = create(c)
        (token,) = upload_all(c, rid, canaries(1))
        expire(store, rid)
        upload = c.post(f"{API}/rounds/{rid}/optin/records", json={"records": [{"query": "q", "url": "u"}]},
                        headers={"Authorization": f"Bearer {token}"})
        assert upload.status_code == 409 and "retention deadline" in upload.text, upload.text
        enrol = c.post(f"{API}/rounds/{rid}/optin/enrol", json={"user": "v"}, headers=AUTH)
        assert enrol.status_code == 409 and "retention deadline" in enrol.text, enrol.text
        build = c.post(f"{API}/rounds/{rid}/headlist", headers=AUTH)
        assert build.status_code == 409 and "retention deadline" in build.text, build.text
        info = store.round(rid)
        assert info.state == "collecting-optin" and (info.optin_users, info.optin_records) == (1, 1)
        assert store.table_counts(info.num)["optin_records"] == 1
        assert c.get(f"{API}/ledger", headers=AUTH).json() == ledger_before
        assert store.purge_expired() == [rid]

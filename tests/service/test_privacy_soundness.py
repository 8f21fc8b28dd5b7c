"""The service against its own operator and its callers: every run of the curator charged, no seeded
production round, raw opt-in data gone from the database files, idempotent and bounded uploads, and
public endpoints that publish only what the mechanisms release (PRIVACY.md, "Threat model").

Each test is an attack that succeeded before the defence it checks."""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from hybriddp.service import create_app
from hybriddp.service import rounds as service_rounds
from hybriddp.service.store import Store

ADMIN = "admin-token-of-the-tests-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
COMMON = [("weather", "https://w.example/a")] * 40  # forty users share one record: it makes the head list
CANARY = b"CANARY-"


def canaries(n: int) -> list[tuple[str, str]]:
    """n unique records (each one user's private record), easy to find in a file's bytes."""
    return [(f"CANARY-{secrets.token_hex(8)}", f"https://canary.example/{secrets.token_hex(8)}") for _ in range(n)]


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as c:
        yield c


def create(client: TestClient, params: dict[str, Any] | None = None, **extra: Any) -> str:
    body = {"kind": "blender", "params": params or {"epsilon": 4.0, "delta": 1e-5, "head_list_size": 10}, **extra}
    resp = client.post(f"{API}/rounds", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def upload_all(client: TestClient, rid: str, records: list[tuple[str, str]], prefix: str = "user") -> list[str]:
    """Enrol one user per record and upload it with the user's token; the tokens."""
    users = [f"{prefix}-{i}" for i in range(len(records))]
    resp = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"users": users}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    tokens = resp.json()["tokens"]
    lines = "\n".join(json.dumps({"token": t, "records": [{"query": q, "url": u}]})
                      for t, (q, u) in zip(tokens, records, strict=True))
    resp = client.post(f"{API}/rounds/{rid}/optin/records", content=lines.encode(),
                       headers={"Content-Type": "application/x-ndjson"})
    assert resp.status_code == 200, resp.text
    return list(tokens)


def ledger_rows(store: Store) -> list[tuple[str, int, float, float, bool]]:
    return store.read(lambda conn: [tuple(r) for r in conn.execute(sa.text(
        "SELECT user_pseudonym, round_num, epsilon, delta, private FROM ledger_charges ORDER BY id")).all()])


def database_files(url: str) -> list[Path]:
    """The SQLite database's files: main, WAL, shared memory, rollback journal (those that exist)."""
    main = Path(url.removeprefix("sqlite:///"))
    return [p for p in (main, Path(f"{main}-wal"), Path(f"{main}-shm"), Path(f"{main}-journal")) if p.exists()]


def canary_hits(store: Store) -> int:
    """Occurrences of a canary record's bytes in the database files (SQLite) or in the files of the
    database's tables and indexes (PostgreSQL, read through the server's data directory)."""
    if store.dialect == "sqlite":
        return sum(p.read_bytes().count(CANARY) for p in database_files(store.url))
    paths = store.read(lambda conn: [
        conn.execute(sa.text("SELECT current_setting('data_directory')")).scalar_one(),
        conn.execute(sa.text("SELECT oid FROM pg_database WHERE datname = current_database()")).scalar_one()])
    base = Path(paths[0]) / "base" / str(paths[1])
    return sum(p.read_bytes().count(CANARY) for p in base.iterdir() if p.is_file())


# ----- every run of the curator is charged ------------------------------------------------------
def test_retry_attack_an_empty_head_list_is_a_charged_release_that_ends_the_round(client: TestClient) -> None:
    """The attack: publish until fresh noise lets one user's unique record through, each failure uncharged.
    Now the first run is charged (ε to every opt-in user), the empty outcome ends the round, and a retry
    is refused. δ = 1e-7 keeps a unique record out with probability ≥ 1 − 20·δ/2 (Theorem 1)."""
    rid = create(client, {"epsilon": 4.0, "delta": 1e-7, "head_list_size": 10})
    upload_all(client, rid, canaries(20))
    first = client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH)
    assert first.status_code == 200, first.text
    assert first.json()["state"] == "headlist-empty"
    for _ in range(3):
        retry = client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH)
        assert retry.status_code == 409 and "headlist-empty" in retry.text
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    charged = ledger_rows(store)
    assert len(charged) == 20 and {(e, d, p) for _, _, e, d, p in charged} == {(4.0, 1e-7, True)}
    results = client.get(f"{API}/rounds/{rid}/results")
    assert results.status_code == 409 and "kept no record" in results.text and "charged" in results.text
    # the advice applies to a service round: enrol more opt-in users (as many as the forecast says), not the
    # simulation's --optin-fraction or a smaller --m-o (issue 42)
    assert "--optin-fraction" not in results.text and "--m-o" not in results.text
    assert re.search(r"enrol about [0-9,]+ opt-in users in the next round", results.text), results.text
    assert client.get(f"{API}/rounds/{rid}/headlist").status_code == 409
    info = store.round(rid)
    assert info.purged is not None and store.table_counts(info.num)["optin_records"] == 0


def test_a_build_interrupted_by_a_crash_is_aborted_on_recovery_not_run_again(store_url: str) -> None:
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as c:
        rid = create(c)
        upload_all(c, rid, COMMON)
        store: Store = c.app.state.store  # type: ignore[attr-defined]
        store.start_build(rid, 4.0, 1e-5, private=True)  # the server stops here, mid-build
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as c:
        store = c.app.state.store  # type: ignore[attr-defined]
        info = store.round(rid)
        assert info.state == "aborted" and info.purged is not None
        assert len(ledger_rows(store)) == len(COMMON)  # the run was charged when it started
        assert c.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 409
        assert store.table_counts(info.num)["optin_records"] == 0


def over_budget_round(client: TestClient, records: list[tuple[str, str]]) -> str:
    """A round whose build the lifetime budget (ε 16) refuses: its users enrolled in it and in another round of
    ε = 10 before either was built (enrolment refuses anyone who cannot afford the round *now*), then the other
    round was built, charging them 10."""
    first, second = (create(client, {"epsilon": 10.0, "delta": 1e-5, "head_list_size": 10}) for _ in range(2))
    upload_all(client, first, COMMON)
    upload_all(client, second, records)  # the same users first (user-0, user-1, …)
    assert client.post(f"{API}/rounds/{first}/headlist", headers=AUTH).status_code == 200
    return second


def test_a_round_over_the_budget_runs_nothing_and_says_where_its_raw_data_go(client: TestClient) -> None:
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    over = create(client, {"epsilon": 17.0, "delta": 1e-5, "head_list_size": 10})  # over the lifetime ε of 16
    resp = client.post(f"{API}/rounds/{over}/optin/enrol", json={"users": ["someone"]}, headers=AUTH)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "budget_exceeded"  # refused at enrolment
    rid = over_budget_round(client, COMMON)
    charged = ledger_rows(store)
    resp = client.post(f"{API}/rounds/{rid}/headlist", headers=AUTH)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "budget_exceeded"
    message = resp.json()["error"]["message"]
    assert "Nothing was run or charged" in message and "round abort" in message and "retention deadline" in message
    assert ledger_rows(store) == charged and store.round(rid).state == "collecting-optin"


# ----- seeds never reach production ---------------------------------------------------------------
def test_a_production_server_refuses_seeded_rounds(client: TestClient) -> None:
    resp = client.post(f"{API}/rounds", json={"kind": "blender", "params": {"seed": 7}}, headers=AUTH)
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "seeded_round_refused" and "--insecure-testing-seeds" in resp.text
    resp = client.post(f"{API}/rounds", json={"kind": "mean", "params": {"epsilon": 1.0, "lower": 0, "upper": 1,
                                                                          "seed": 7}}, headers=AUTH)
    assert resp.status_code == 403


def test_a_seeded_test_round_is_non_private_everywhere_and_its_seed_is_never_published(store_url: str) -> None:
    """The attack: read the seed from the public round or estimates, regenerate the noise, recover S's
    counts. With --insecure-testing-seeds the round runs, but no public document carries the seed, every
    public view says non-private, and the ledger records the charges as non-private."""
    seed = 918_273_645_546
    with TestClient(create_app(store_url, ADMIN, open_admission=True, allow_seeds=True)) as c:
        rid = create(c, {"epsilon": 4.0, "delta": 1e-5, "head_list_size": 10, "seed": seed})
        upload_all(c, rid, COMMON)
        assert c.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).json()["state"] == "headlist-published"
        hl = c.get(f"{API}/rounds/{rid}/headlist").json()
        from hybriddp.core.protocol import validate_headlist
        from hybriddp.device.localalg import randomize_records
        msg = randomize_records(validate_headlist(hl), [("weather", "https://w.example/a")])
        assert c.post(f"{API}/rounds/{rid}/reports", json=msg).status_code == 200
        assert c.post(f"{API}/rounds/{rid}/close", headers=AUTH, json={"flagged": "publish"}).status_code == 200
        public = {path: c.get(f"{API}/rounds/{rid}{path}").text
                  for path in ("", "/headlist", "/release", "/results", "/local-search")}
        for path, text in public.items():
            assert str(seed) not in text, path
        rnd = json.loads(public[""])
        assert rnd["non_private"] is True and "no privacy" in rnd["warning"].lower()
        assert json.loads(public["/results"])["non_private"] is True
        assert json.loads(public["/release"])["estimates"]["seed"] is None
        assert c.get(f"{API}/rounds/{rid}", headers=AUTH).json()["params"]["seed"] == seed  # administrators only
        page = c.get(f"/rounds/{rid}")
        assert page.status_code == 200
        store: Store = c.app.state.store  # type: ignore[attr-defined]
        assert {p for *_, p in ledger_rows(store)} == {False}


# ----- raw opt-in data gone from the files --------------------------------------------------------
def _published(c: TestClient) -> str:
    rid = create(c)
    upload_all(c, rid, COMMON + canaries(30))
    assert c.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).json()["state"] == "headlist-published"
    return rid


def _empty(c: TestClient) -> str:
    rid = create(c, {"epsilon": 4.0, "delta": 1e-7, "head_list_size": 10})
    upload_all(c, rid, canaries(30))
    assert c.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).json()["state"] == "headlist-empty"
    return rid


def _aborted(c: TestClient) -> str:
    rid = create(c)
    upload_all(c, rid, canaries(30))
    assert c.post(f"{API}/rounds/{rid}/abort", headers=AUTH).json()["state"] == "aborted"
    return rid


def _deleted(c: TestClient) -> str:
    rid = create(c)
    upload_all(c, rid, canaries(30))
    assert c.delete(f"{API}/rounds/{rid}", headers=AUTH).json()["state"] == "deleted"
    return rid


def _refused_then_aborted(c: TestClient) -> str:
    rid = over_budget_round(c, COMMON + canaries(30))
    assert c.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 409
    assert c.post(f"{API}/rounds/{rid}/abort", headers=AUTH).status_code == 200
    return rid


def _expired(c: TestClient) -> str:
    rid = create(c, retention_hours=0.001)  # 3.6 seconds
    upload_all(c, rid, canaries(30))
    store: Store = c.app.state.store  # type: ignore[attr-defined]
    assert store.purge_expired(at="9999-01-01T00:00:00+00:00") == [rid]
    assert store.round(rid).state == "aborted"
    return rid


def _failed_build(c: TestClient) -> str:
    rid = create(c)
    upload_all(c, rid, canaries(30))
    original = service_rounds._curate_blender

    def broken(*args: Any) -> Any:
        raise RuntimeError("the curator crashed")
    service_rounds._curate_blender = broken  # type: ignore[assignment]
    try:
        with pytest.raises(RuntimeError):
            c.post(f"{API}/rounds/{rid}/headlist", headers=AUTH)
    finally:
        service_rounds._curate_blender = original  # type: ignore[assignment]
    return rid


EXITS = {"published": _published, "empty head list": _empty, "aborted": _aborted, "deleted": _deleted,
         "refused, then aborted": _refused_then_aborted, "retention deadline": _expired, "failed build": _failed_build}


@pytest.mark.parametrize("exit_path", list(EXITS))
def test_canary_records_are_gone_from_the_database_files_after_every_exit(store_url: str, exit_path: str) -> None:
    """Canary records are uploaded, the round leaves through one exit, and the database files are read
    byte for byte: no canary is left (SQLite: main file, WAL, shared memory, journal; PostgreSQL: the
    files of every table and index of the database)."""
    with TestClient(create_app(store_url, ADMIN, open_admission=True), raise_server_exceptions=True) as c:
        store: Store = c.app.state.store  # type: ignore[attr-defined]
        probe = create(c)  # the files hold canaries while a round collects them: the scan can see them
        upload_all(c, probe, canaries(5), prefix="probe")
        assert canary_hits(store) > 0 or store.dialect == "postgresql"
        c.post(f"{API}/rounds/{probe}/abort", headers=AUTH)
        rid = EXITS[exit_path](c)
        info = store.round(rid)
        assert info.purged is not None
        assert sum(store.table_counts(info.num)[t] for t in ("optin_records", "optin_tokens")) == 0
        assert canary_hits(store) == 0


def _hold_snapshot(store_url: str, hold: str) -> Any:
    """Another connection whose transaction began now and holds the deleted rows back: a snapshot (SQLite: a WAL
    read lock; PostgreSQL: a REPEATABLE READ transaction that has read the opt-in table), or, on PostgreSQL, a
    transaction id with no snapshot (an idle READ COMMITTED transaction that got one). Close it to end it."""
    if store_url.startswith("sqlite"):
        import sqlite3
        raw: Any = sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)
        raw.execute("BEGIN")
        raw.execute("SELECT count(*) FROM optin_records").fetchone()
        return raw
    import psycopg
    raw = psycopg.connect(sa.make_url(store_url).set(drivername="postgresql").render_as_string(hide_password=False))
    if hold == "snapshot":
        raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        raw.execute("SELECT count(*) FROM optin_records").fetchone()
    else:
        raw.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        raw.execute("SELECT txid_current()").fetchone()
    return raw


@pytest.mark.parametrize("hold", ["snapshot", "transaction id"])
def test_a_reader_holding_an_older_snapshot_leaves_the_scrub_pending_until_it_ends(
        store_url: str, hold: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: a session whose snapshot (or transaction id) predates the deletion can still see the deleted rows,
    so the file rewrite (PostgreSQL's VACUUM FULL, SQLite's checkpoint) keeps them. The scrub waits for it, then is
    left pending rather than reporting clean files; the next purge pass, once the reader is gone, removes them."""
    from hybriddp.service.store import rounds as store_rounds
    monkeypatch.setattr(store_rounds, "SCRUB_WAIT_MS", 300)
    with TestClient(create_app(store_url, ADMIN, open_admission=True), raise_server_exceptions=True) as c:
        store: Store = c.app.state.store  # type: ignore[attr-defined]
        rid = create(c)
        upload_all(c, rid, canaries(30))
        reader = _hold_snapshot(store_url, hold)
        try:
            assert c.post(f"{API}/rounds/{rid}/abort", headers=AUTH).status_code == 200
            assert store.scrub_pending  # not reported clean while the reader may still see the rows
        finally:
            reader.close()
        store.purge_expired()
        assert not store.scrub_pending
        assert canary_hits(store) == 0


# ----- uploads: idempotent and bounded ----------------------------------------------------------
def test_a_repeated_upload_is_acknowledged_not_appended(client: TestClient) -> None:
    rid = create(client)
    token = client.post(f"{API}/rounds/{rid}/optin/enrol", json={"user": "u"}, headers=AUTH).json()["token"]
    body = {"records": [{"query": "q", "url": "u"}, {"query": "r", "url": "v"}]}
    hdr = {"Authorization": f"Bearer {token}"}
    assert client.post(f"{API}/rounds/{rid}/optin/records", json=body, headers=hdr).json() == {
        "accepted": 2, "duplicates": 0}
    assert client.post(f"{API}/rounds/{rid}/optin/records", json=body, headers=hdr).json() == {
        "accepted": 0, "duplicates": 2}
    with_id = {**body, "upload_id": "batch-1"}
    assert client.post(f"{API}/rounds/{rid}/optin/records", json=with_id, headers=hdr).json()["accepted"] == 2
    assert client.post(f"{API}/rounds/{rid}/optin/records", json={"records": [{"query": "x", "url": "y"}],
                                                                    "upload_id": "batch-1"}, headers=hdr).json() == {
        "accepted": 0, "duplicates": 1}
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    assert store.table_counts(store.round(rid).num)["optin_records"] == 4
    assert client.get(f"{API}/rounds/{rid}", headers=AUTH).json()["counts"]["optin_records"] == 4


def test_per_token_quotas_refuse_the_whole_request(store_url: str) -> None:
    with TestClient(create_app(store_url, ADMIN, open_admission=True, optin_max_records=3, optin_max_bytes=2048)) as c:
        rid = create(c)
        token = c.post(f"{API}/rounds/{rid}/optin/enrol", json={"user": "u"}, headers=AUTH).json()["token"]
        hdr = {"Authorization": f"Bearer {token}"}

        def send(n: int, size: int = 5) -> Any:
            recs = [{"query": f"q{i}-{secrets.token_hex(4)}-" + "x" * size, "url": "u"} for i in range(n)]
            return c.post(f"{API}/rounds/{rid}/optin/records", json={"records": recs}, headers=hdr)
        assert send(2).status_code == 200
        over = send(2)
        assert over.status_code == 413 and over.json()["error"]["code"] == "quota_exceeded"
        assert "3 records" in over.text and "--optin-max-records" in over.text
        big = send(1, size=3000)
        assert big.status_code == 413
        store: Store = c.app.state.store  # type: ignore[attr-defined]
        assert store.table_counts(store.round(rid).num)["optin_records"] == 2


# ----- public endpoints publish only what the mechanisms release ------------------------------------
def test_live_opt_in_counts_are_for_administrators_only(client: TestClient) -> None:
    rid = create(client)
    upload_all(client, rid, COMMON[:3])
    public = client.get(f"{API}/rounds/{rid}").json()
    assert public["counts"]["optin_users"] is None and public["counts"]["optin_records"] is None
    admin = client.get(f"{API}/rounds/{rid}", headers=AUTH).json()
    assert admin["counts"]["optin_users"] == 3 and admin["counts"]["optin_records"] == 3
    wrong = client.get(f"{API}/rounds/{rid}", headers={"Authorization": "Bearer not-the-token-0123456789"}).json()
    assert wrong["counts"]["optin_users"] is None


def test_abort_and_delete_refuse_what_they_cannot_do(client: TestClient) -> None:
    rid = _published(client)
    resp = client.post(f"{API}/rounds/{rid}/abort", headers=AUTH)
    assert resp.status_code == 409 and "collecting-optin" in resp.text
    assert client.post(f"{API}/rounds/{rid}/abort").status_code == 401
    assert client.delete(f"{API}/rounds/{rid}").status_code == 401
    assert client.delete(f"{API}/rounds/{rid}", headers=AUTH).json()["state"] == "deleted"
    assert client.delete(f"{API}/rounds/{rid}", headers=AUTH).status_code == 409
    assert client.get(f"{API}/rounds/{rid}/headlist").status_code == 409
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    assert len(ledger_rows(store)) == len(COMMON) + 30  # what was released stays spent


# ----- the service's ledger can be read ------------------------------------------------------------
def test_the_ledger_is_served_to_administrators_without_identities(client: TestClient) -> None:
    rid = _published(client)
    assert client.get(f"{API}/ledger").status_code == 401
    ledger = client.get(f"{API}/ledger", headers=AUTH).json()
    text = json.dumps(ledger)
    assert rid in text and "user-0" not in text  # pseudonyms only
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    salt = store.read(lambda conn: conn.execute(sa.text("SELECT value FROM ledger_meta WHERE key = 'salt'"))
                      .scalar_one())
    assert salt not in text


# ----- mean rounds: a fake extreme value is refused ------------------------------------------------
def test_mean_reports_outside_what_an_honest_device_sends_are_refused() -> None:
    """The attack: 20 fake values of 1000.999 among 5,000 honest ones moved a published mean of a [0, 1]
    attribute from 0.29 to 1.05. A value farther than ln(1e9) noise scales from [lower, upper] is refused
    (an honest device sends one with probability 1e-9: P[|Laplace(b)| > t·b] = e^-t), and honest values are
    all taken."""
    from hybriddp.core.errors import DataError
    from hybriddp.device.localalg import SeededSource
    from hybriddp.device.mean import randomize_value
    from hybriddp.service.rounds import MeanReports

    checker = MeanReports("r" * 22, {"lower": 0.0, "upper": 1.0, "epsilon": 1.0})
    reach = math.log(1e9)  # noise scales b = Δ/ε = 1
    for value in (1000.999, 1.0 + reach + 1e-6, -reach - 1e-6):
        with pytest.raises(DataError, match="value"):
            checker.check({"id": "A" * 22, "round": "r" * 22, "value": value}, 0)
    assert checker.check({"id": "A" * 22, "round": "r" * 22, "value": 1.0 + reach - 1e-6}, 0)[1] == 1.0 + reach - 1e-6
    src = SeededSource(20261127)
    honest = [randomize_value(0.29, lower=0.0, upper=1.0, epsilon=1.0, source=src) for _ in range(100_000)]
    for i, v in enumerate(honest):
        checker.check({"id": "A" * 22, "round": "r" * 22, "value": v}, i)


def test_a_scrub_blocked_by_a_reader_is_finished_by_the_next_purge_pass(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader holding an old snapshot stops the WAL checkpoint, so an abort leaves the canaries in the WAL;
    the periodic purge pass (nothing new to purge) scrubs again once the reader is gone."""
    import sqlite3

    import hybriddp.service.store.rounds as store_rounds

    monkeypatch.setattr(store_rounds, "SCRUB_WAIT_MS", 50)  # the checkpoint gives up on the reader quickly
    url = f"sqlite:///{tmp_path / 'hybriddp.db'}"
    with TestClient(create_app(url, ADMIN, open_admission=True)) as c:
        store: Store = c.app.state.store  # type: ignore[attr-defined]
        rid = create(c)
        upload_all(c, rid, canaries(20))
        reader = sqlite3.connect(str(tmp_path / "hybriddp.db"))
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM rounds").fetchone()  # holds its snapshot of the WAL
        assert c.post(f"{API}/rounds/{rid}/abort", headers=AUTH).json()["state"] == "aborted"
        assert store.scrub_pending and canary_hits(store) > 0
        reader.rollback()
        reader.close()
        assert store.purge_expired() == []  # nothing new to purge, but the pending scrub runs
        assert not store.scrub_pending and canary_hits(store) == 0

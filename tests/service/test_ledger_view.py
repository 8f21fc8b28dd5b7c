"""The collection service's privacy ledger, read-only: :mod:`hybriddp.service.ledger_view` and
``hybriddp privacy report`` on a service database (a path or a URL), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from clihelpers import assert_clean_error, invoke
from hybriddp.privacy.ledger import Charge, LedgerError
from hybriddp.service.ledger_view import open_service_ledger, service_ledger
from hybriddp.service.store import Store

USERS = ["alice@example.org", "bob@example.org", "carol@example.org", "dave@example.org"]


@pytest.fixture
def ledger_db(store_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A service database with three charged rounds — private (S and T), seeded, and one whose charges say
    non-private — and one round never charged; yields (URL, round ids by name)."""
    store = Store(store_url, lifetime_epsilon=10.0, lifetime_delta=1e-4)
    try:
        p = [store.pseudonym(u) for u in USERS]
        rounds = {}
        for name, params in (("first", {"epsilon": 4.0, "delta": 1e-5, "seed": None}),
                             ("seeded", {"epsilon": 2.0, "delta": 1e-6, "seed": 7}),
                             ("flagged", {"epsilon": 1.0, "delta": 0.0}),
                             ("uncharged", {"epsilon": 1.0, "delta": 1e-6})):
            rounds[name] = store.create_round("blender" if name != "flagged" else "mean", name, params)
        store.charge(rounds["first"], [Charge("optin-S", p[:3], 4.0, 1e-5), Charge("optin-T", p[3:], 4.0, 0.0)])
        store.charge(rounds["seeded"], [Charge("optin-S", p[:1], 2.0, 1e-6)])
        store.charge(rounds["flagged"], [Charge("optin", p[1:2], 1.0, 0.0)])
        with store.engine.begin() as conn:  # as the service records a non-private round's charges
            conn.execute(sa.text("UPDATE ledger_charges SET private = false WHERE round_num = :n"),
                         {"n": rounds["flagged"].num})
        yield store_url, {k: v.id for k, v in rounds.items()}
    finally:
        store.close()


def _salt(url: str) -> str:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT value FROM ledger_meta WHERE key = 'salt'")).scalar_one()
    finally:
        engine.dispose()


def test_the_view_lists_rounds_and_pseudonyms_without_identities_or_salt(ledger_db) -> None:
    url, ids = ledger_db
    rep = open_service_ledger(url)
    assert rep["source"] == "service" and rep["lifetime"] == {"epsilon": 10.0, "delta": 1e-4}
    by_name = {r["name"]: r for r in rep["rounds"]}
    assert set(by_name) == {"first", "seeded", "flagged"}  # a round never charged is not in the ledger
    first, seeded, flagged = by_name["first"], by_name["seeded"], by_name["flagged"]
    assert first == {"round": ids["first"], "name": "first", "kind": "blender", "state": "collecting-optin",
                     "created": first["created"], "private": True, "epsilon": 4.0, "delta": 1e-5, "users": 4,
                     "groups": [{"group": "optin-S", "users": 3, "epsilon": 4.0, "delta": 1e-5},
                                {"group": "optin-T", "users": 1, "epsilon": 4.0, "delta": 0.0}]}
    assert seeded["private"] is False  # its parameters hold a seed
    assert flagged["private"] is False and flagged["kind"] == "mean"  # its charges say so
    rows = {(p["epsilon"], p["delta"], p["rounds"], p["non_private_releases"]) for p in rep["pseudonyms"]}
    assert rows == {(4.0, 1e-5, 2, 1), (4.0, 1e-5, 1, 0), (4.0, 0.0, 1, 0)}  # sums over private charges only
    assert sorted(p["rounds"] for p in rep["pseudonyms"]) == [1, 1, 2, 2]
    assert rep["users"] == rep["pseudonyms_total"] == 4 and rep["users_without_guarantee"] == 2
    assert rep["worst_basic_epsilon"] == 4.0 and rep["remaining_epsilon"] == 6.0
    assert "NO privacy guarantee" in rep["warning"]
    text = json.dumps(rep)
    assert _salt(url) not in text and "salt" not in text
    assert not any(u in text or u.split("@")[0] in text for u in USERS)
    assert all(len(p["pseudonym"]) == 32 for p in rep["pseudonyms"])
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            assert service_ledger(conn) == {k: v for k, v in rep.items() if k != "database"}
        assert service_ledger(engine, limit=1)["pseudonyms"] == rep["pseudonyms"][:1]
    finally:
        engine.dispose()


def test_the_view_neither_migrates_nor_writes(ledger_db) -> None:
    """A database of an older schema (no ``private`` column, an older revision) is read as it is: seeded
    rounds still count as non-private, the rest as private, and nothing is changed."""
    url, _ = ledger_db
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE ledger_charges DROP COLUMN private"))
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '0003'"))

        def state() -> tuple[object, ...]:
            with engine.connect() as conn:
                cols = [c["name"] for c in sa.inspect(conn).get_columns("ledger_charges")]
                version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
                n = conn.execute(sa.text("SELECT COUNT(*) FROM ledger_charges")).scalar_one()
                return cols, version, n

        before = state()
        rep = open_service_ledger(url)
        assert state() == before and "private" not in before[0]
    finally:
        engine.dispose()
    by_name = {r["name"]: r["private"] for r in rep["rounds"]}
    assert by_name == {"first": True, "seeded": False, "flagged": True}
    assert rep["users_without_guarantee"] == 1


def test_privacy_report_reads_a_service_database_by_url_and_by_path(ledger_db) -> None:
    url, ids = ledger_db
    rep = json.loads(invoke("privacy", "report", url, "--json").stdout)
    assert rep == open_service_ledger(url)
    text = invoke("privacy", "report", url).stdout
    flat = " ".join(text.split())
    assert "NO (seeded)" in flat and "NO privacy guarantee at all" in flat and ids["first"][:10] in flat
    assert _salt(url) not in text
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        by_path = json.loads(invoke("privacy", "report", path, "--json").stdout)
        assert {k: v for k, v in by_path.items() if k != "database"} == {k: v for k, v in rep.items()
                                                                       if k != "database"}


def test_what_is_not_a_service_ledger_is_refused_in_one_line(tmp_path: Path) -> None:
    assert_clean_error(invoke("privacy", "report", f"sqlite:///{tmp_path / 'missing.db'}", ok=False),
                       "service database not found")
    assert not (tmp_path / "missing.db").exists()  # nothing is created
    assert_clean_error(invoke("privacy", "report", "mysql://h/db", ok=False), "ledger", "postgresql+psycopg://")
    other = tmp_path / "other.db"
    engine = sa.create_engine(f"sqlite:///{other}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num TEXT)"))
        conn.execute(sa.text("CREATE TABLE ledger_charges (x INTEGER)"))
    engine.dispose()
    assert_clean_error(invoke("privacy", "report", other, ok=False), "no rounds, ledger_meta table(s)",
                       "not a hybriddp service database")
    with pytest.raises(LedgerError, match="not a hybriddp service database"):
        open_service_ledger(f"sqlite:///{other}")

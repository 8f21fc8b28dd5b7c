"""The users' privacy ledger (privacy/ledger.py) at its edges: the lifetime budget of a new ledger, files that are
not ledgers, damaged metadata, charging with its 1e-12 float slack and UTC timestamps, and the report worked out by
hand (when basic and when advanced composition is the better bound, and their exact tie).

Messages are part of the behaviour (they name the value, the allowed range and the fix), so they are
compared whole. Expected numbers are worked out by hand in the docstrings.
"""

from __future__ import annotations

import math
import re
import sqlite3
from pathlib import Path

import pytest

from clihelpers import exact_message
from hybriddp.core.errors import ParameterError
from hybriddp.privacy import ledger as ledger_mod
from hybriddp.privacy.ledger import BudgetExceededError, Charge, LedgerError, PrivacyLedger, advanced_composition

RESTORE = ("restore it from a backup; do not start a new ledger in its place, since that would forget what every "
           "user has spent")


# ----- the lifetime budget of a new ledger --------------------------------------------------------------------

@pytest.mark.parametrize("eps", [0, 0.0, -1.0, math.inf, math.nan, True, "1"])
def test_lifetime_epsilon_out_of_range_is_refused_with_its_message(tmp_path: Path, eps: object) -> None:
    with pytest.raises(ParameterError, match=exact_message(
            f"lifetime_epsilon (--lifetime-epsilon) = {eps!r} is not allowed: it must be a finite number > 0.")):
        PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=eps, lifetime_delta=1e-5)
    assert not (tmp_path / "l.db").exists()


@pytest.mark.parametrize("delta", [0, 0.0, -1e-9, 1, 1.0, 1.5, True, "0.5"])
def test_lifetime_delta_out_of_range_is_refused_with_its_message(tmp_path: Path, delta: object) -> None:
    with pytest.raises(ParameterError, match=exact_message(
            f"lifetime_delta (--lifetime-delta) = {delta!r} is not allowed: it must be in (0, 1).")):
        PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=1.0, lifetime_delta=delta)


@pytest.mark.parametrize(("eps", "delta"), [(5e-324, 5e-324), (1, 0.5), (1e308, math.nextafter(1.0, 0.0))])
def test_lifetime_budget_at_the_edges_is_accepted(tmp_path: Path, eps: float, delta: float) -> None:
    with PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=eps, lifetime_delta=delta) as led:
        assert (led.lifetime_epsilon, led.lifetime_delta) == (float(eps), float(delta))
        assert led.path == tmp_path / "l.db"


def test_open_messages(tmp_path: Path) -> None:
    """A directory, a missing ledger with half a budget, a missing parent, a budget that differs."""
    with pytest.raises(LedgerError, match=exact_message(
            f"ledger {tmp_path} is a directory; give a file name such as {tmp_path / 'privacy.db'}")):
        PrivacyLedger.open(tmp_path)
    p = tmp_path / "l.db"
    missing = f"ledger {p} does not exist; to create it give --lifetime-epsilon and --lifetime-delta"
    for kwargs in ({}, {"lifetime_epsilon": 1.0}, {"lifetime_delta": 1e-5}):
        with pytest.raises(LedgerError, match=exact_message(missing)):
            PrivacyLedger.open(p, **kwargs)
    q = tmp_path / "nope" / "l.db"
    with pytest.raises(LedgerError, match=exact_message(
            f"cannot create ledger {q}: the directory {q.parent} does not exist; create it first")):
        PrivacyLedger.open(q, lifetime_epsilon=1.0, lifetime_delta=1e-5)
    PrivacyLedger.open(p, lifetime_epsilon=2.0, lifetime_delta=1e-5).close()
    with pytest.raises(LedgerError, match=exact_message(
            f"{p} has lifetime epsilon 2.0, not 3.0; a ledger's budget is fixed when it is created "
            "(leave out --lifetime-epsilon)")):
        PrivacyLedger.open(p, lifetime_epsilon=3.0)
    with pytest.raises(LedgerError, match=exact_message(
            f"{p} has lifetime delta 1e-05, not 0.001; a ledger's budget is fixed when it is created "
            "(leave out --lifetime-delta)")):
        PrivacyLedger.open(p, lifetime_delta=1e-3)
    with PrivacyLedger.open(p, lifetime_epsilon=2, lifetime_delta=1e-5) as led:  # the same budget: fine
        assert led.path == p and led.lifetime_epsilon == 2.0


def test_relative_path_is_created_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with PrivacyLedger.open("rel.db", lifetime_epsilon=1.0, lifetime_delta=1e-5) as led:
        assert led.path == Path("rel.db")
    assert (tmp_path / "rel.db").is_file()


# ----- files that are not ledgers -----------------------------------------------------------------------------

def test_unreadable_empty_and_foreign_files(tmp_path: Path) -> None:
    nowhere = tmp_path / "no" / "x.db"
    with pytest.raises(LedgerError, match=exact_message(f"cannot read ledger {nowhere}: No such file or directory")):
        ledger_mod._connect(nowhere)
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(LedgerError, match=exact_message(
            f"ledger {empty} is an empty file (0 bytes), not a hybriddp ledger. If you meant to create a new ledger, "
            "delete the empty file (or give a path that does not exist) and pass --lifetime-epsilon and "
            f"--lifetime-delta; if it was a ledger in use, it was truncated: {RESTORE}")):
        PrivacyLedger.open(empty)
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello, this is not SQLite at all")
    with pytest.raises(LedgerError, match=exact_message(
            f"{text} is not a hybriddp ledger: it is not an SQLite database (it starts with "
            "b'hello, this is n'). Check the --ledger path; a new ledger is created at a path that does "
            "not exist yet")):
        PrivacyLedger.open(text)


def _sqlite(path: Path, script: str) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.commit()
    conn.close()
    return path


def _not_a_ledger(path: Path, found: str) -> str:
    return (f"{path} is an SQLite database but not a hybriddp ledger (its tables: {found}; a ledger has meta, "
            "rounds and charges, format 'hybriddp-ledger-1'). Check the --ledger path; hybriddp does not write "
            "into other databases")


GOOD_TABLES = """
CREATE TABLE rounds (id INTEGER PRIMARY KEY, name TEXT, created TEXT);
CREATE TABLE charges (user TEXT, round INTEGER, grp TEXT, epsilon REAL, delta REAL);
"""


@pytest.mark.parametrize(("script", "found"), [
    ("CREATE TABLE t (x); DROP TABLE t;", "none"),
    ("".join(f"CREATE TABLE t{i} (x);" for i in range(10)), "t0, t1, t2, t3, t4, t5, t6, t7"),
    # meta with a column missing (the others right): missing, not "damaged"
    ("CREATE TABLE meta (key TEXT, val TEXT);" + GOOD_TABLES, "charges, meta, rounds"),
    # every table right but no format row
    ("CREATE TABLE meta (key TEXT, value TEXT);" + GOOD_TABLES, "charges, meta, rounds"),
    # a format row of another format
    ("CREATE TABLE meta (key TEXT, value TEXT); INSERT INTO meta VALUES ('format', 'other');" + GOOD_TABLES,
     "charges, meta, rounds"),
])
def test_foreign_sqlite_databases_are_refused_with_their_tables(tmp_path: Path, script: str, found: str) -> None:
    db = _sqlite(tmp_path / "other.db", script)
    with pytest.raises(LedgerError, match=exact_message(_not_a_ledger(db, found))):
        PrivacyLedger.open(db)


# ----- damaged metadata ---------------------------------------------------------------------------------------

def _tamper(path: Path, sql: str, *args: object) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql, args)
    conn.close()


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("lifetime_epsilon", "0.0", "lifetime epsilon 0.0, delta 1e-05, salt of 32 bytes"),
    ("lifetime_epsilon", "inf", "lifetime epsilon inf, delta 1e-05, salt of 32 bytes"),
    ("lifetime_delta", "0.0", "lifetime epsilon 1.0, delta 0.0, salt of 32 bytes"),
    ("lifetime_delta", "1.0", "lifetime epsilon 1.0, delta 1.0, salt of 32 bytes"),
    ("lifetime_delta", "1.5", "lifetime epsilon 1.0, delta 1.5, salt of 32 bytes"),
    ("salt", "", "lifetime epsilon 1.0, delta 1e-05, salt of 0 bytes"),
])
def test_damaged_metadata_is_refused(tmp_path: Path, key: str, value: str, shown: str) -> None:
    p = tmp_path / "l.db"
    PrivacyLedger.open(p, lifetime_epsilon=1.0, lifetime_delta=1e-5).close()
    _tamper(p, "UPDATE meta SET value = ? WHERE key = ?", value, key)
    with pytest.raises(LedgerError, match=exact_message(f"{p}: ledger metadata is damaged ({shown}); {RESTORE}")):
        PrivacyLedger.open(p)


def test_missing_or_unparsable_metadata_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "l.db"
    PrivacyLedger.open(p, lifetime_epsilon=1.0, lifetime_delta=1e-5).close()
    _tamper(p, "UPDATE meta SET value = 'zz' WHERE key = 'salt'")
    with pytest.raises(LedgerError, match=exact_message(
            f"{p}: ledger metadata is damaged (non-hexadecimal number found in fromhex() arg at position 0); "
            f"{RESTORE}")):
        PrivacyLedger.open(p)
    _tamper(p, "DELETE FROM meta WHERE key = 'salt'")
    with pytest.raises(LedgerError, match=exact_message(f"{p}: ledger metadata is missing 'salt'; {RESTORE}")):
        PrivacyLedger.open(p)


def test_a_new_ledger_has_a_32_byte_random_salt(tmp_path: Path) -> None:
    salts = set()
    for i in range(2):
        with PrivacyLedger.open(tmp_path / f"{i}.db", lifetime_epsilon=1.0, lifetime_delta=1e-5) as led:
            assert len(led._salt) == 32
            salts.add(led._salt)
            assert re.fullmatch("[0-9a-f]{32}", led.pseudonym("alice"))
    assert len(salts) == 2


# ----- charging: messages, the 1e-12 slack, the timestamp ------------------------------------------------------

def test_charge_messages(tmp_path: Path) -> None:
    p = tmp_path / "l.db"
    with PrivacyLedger.open(p, lifetime_epsilon=1.0, lifetime_delta=1e-5) as led:
        led.charge("r1", [Charge("clients", ["a"], 0.5, 1e-6)])
        with pytest.raises(LedgerError, match=exact_message(
                f"round 'r1' is already in the ledger {p}; a user may be charged once per round — use a new "
                "round name")):
            led.charge("r1", [Charge("clients", ["b"], 0.1, 1e-6)])
        with pytest.raises(LedgerError, match=exact_message(
                "user 'x' appears twice in round 'r2' (groups 'optin-S' and 'clients')")):
            led.charge("r2", [Charge("optin-S", ["x", "y"], 0.1, 1e-6), Charge("clients", ["z", "x"], 0.1, 1e-6)])
        with pytest.raises(BudgetExceededError, match=exact_message(
                "round 'r3' refused: 1 user(s) would exceed the lifetime budget (epsilon 1.0, delta 1e-05); the "
                "worst would reach epsilon 1.1, delta 2e-06. Use a smaller --epsilon, leave those users out of "
                "this round, or start a new budget period with a new ledger.")):
            led.charge("r3", [Charge("clients", ["a", "b", "c"], 0.6, 1e-6)])
        assert led.report()["users"] == 1


def test_budget_slack_is_relative_1e_12_on_both_sides(tmp_path: Path) -> None:
    """A total within the float slack L·(1 + 1e-12) is accepted, including exactly at it; a bit above is not.
    Δ below 1e-12 relative is accepted; 1e-11 relative above is refused."""
    eps_life, delta_life = 3.0, 3e-5
    with PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=eps_life, lifetime_delta=delta_life) as led:
        at_eps = eps_life * (1 + 1e-12)  # exactly the bound as the ledger computes it
        at_delta = delta_life * (1 + 1e-12)
        led.charge("eps-at-bound", [Charge("g", ["a"], at_eps, 0.0)])
        led.charge("delta-at-bound", [Charge("g", ["b"], 0.0, at_delta)])
        led.charge("eps-just-within", [Charge("g", ["c"], eps_life * (1 + 5e-13), 0.0)])
        led.charge("delta-just-within", [Charge("g", ["d"], 0.0, delta_life * (1 + 5e-13))])
        for name, e, d in [("e-over", eps_life * (1 + 1e-11), 0.0), ("d-over", 0.0, delta_life * (1 + 1e-11)),
                           ("d-half-over", 0.0, 1.5 * delta_life), ("e-just-below", eps_life * (1 - 1e-13), 0.0)]:
            if name == "e-just-below":
                led.charge(name, [Charge("g", ["e"], e, d)])
            else:
                with pytest.raises(BudgetExceededError):
                    led.charge(name, [Charge("g", ["f"], e, d)])


def test_round_timestamp_is_utc(tmp_path: Path) -> None:
    with PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=1.0, lifetime_delta=1e-5) as led:
        led.charge("r", [Charge("g", ["a"], 0.1, 0.0)])
        created = led.report()["rounds"][0]["created"]
    assert created.endswith("+00:00") and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", created)


@pytest.mark.parametrize(("error", "hint"), [
    ("database is locked", "another hybriddp command is using it; retry when that finishes"),
    ("disk I/O error", "check the file system, or " + RESTORE),
])
def test_sqlite_failure_while_charging_says_nothing_was_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 error: str, hint: str) -> None:
    p = tmp_path / "l.db"
    with PrivacyLedger.open(p, lifetime_epsilon=1.0, lifetime_delta=1e-5) as led:
        def fail(round_name: str, rows: dict) -> int:
            raise sqlite3.OperationalError(error)

        monkeypatch.setattr(led, "_charge", fail)
        with pytest.raises(LedgerError, match=exact_message(
                f"ledger {p}: cannot record round 'r' (SQLite: {error}); nothing was recorded: {hint}")):
            led.charge("r", [Charge("g", ["a"], 0.1, 0.0)])


# ----- the report ---------------------------------------------------------------------------------------------

def test_advanced_composition_by_hand() -> None:
    """ε = (1, 1), δ' = e⁻¹: sqrt(2·1·2) + 2(e − 1) = 2 + 2e − 2 = 2e; δ = Σδ + δ'."""
    e, d = advanced_composition([1.0, 1.0], [1e-6, 2e-6], math.exp(-1))
    assert e == pytest.approx(2 * math.e, rel=1e-14)
    assert d == pytest.approx(3e-6 + math.exp(-1), rel=1e-14)


def test_report_of_an_empty_ledger(tmp_path: Path) -> None:
    p = tmp_path / "l.db"
    with PrivacyLedger.open(p, lifetime_epsilon=0.5, lifetime_delta=1e-5) as led:
        assert led.report() == {"ledger": str(p), "lifetime": {"epsilon": 0.5, "delta": 1e-5}, "delta_prime": 1e-6,
                                "rounds": [], "cumulative": [], "users": 0, "worst_basic_epsilon": 0.0,
                                "remaining_epsilon": 0.5, "users_without_guarantee": 0}


def test_report_whole_by_hand(tmp_path: Path) -> None:
    """δ' = e^{−1/8}, so sqrt(2 ln(1/δ')·Σε²) = sqrt(Σε²/4) = (Σε²)^½/2. User a: one release (2, 1e-6):
    advanced 1 + 2(e² − 1) = 13.78 > 2, so best = basic (2, 1e-6). User c: 40 releases of 0.01 (δ = 0): basic
    0.4; advanced sqrt(0.004)/2 + 0.4(e^0.01 − 1) = 0.0316 + 0.00402 < 0.4, so best = advanced with δ = δ'.
    User b: one release 0.01: advanced 0.005 + 0.01(e^0.01 − 1) < 0.01. Lifetime 3: remaining 3 − 2 = 1."""
    p = tmp_path / "l.db"
    dp = math.exp(-1 / 8)
    with PrivacyLedger.open(p, lifetime_epsilon=3.0, lifetime_delta=0.5) as led:
        led.charge("first", [Charge("optin-S", ["a"], 2.0, 1e-6), Charge("clients", ["b", "c"], 0.01, 0.0)])
        for i in range(39):
            led.charge(f"more{i}", [Charge("clients", ["c"], 0.01, 0.0)])
        rep = led.report(dp)
    assert rep["ledger"] == str(p) and rep["lifetime"] == {"epsilon": 3.0, "delta": 0.5}
    assert rep["delta_prime"] == dp and rep["users"] == 3
    assert rep["rounds"][0]["groups"] == [{"group": "clients", "users": 2, "epsilon": 0.01, "delta": 0.0},
                                          {"group": "optin-S", "users": 1, "epsilon": 2.0, "delta": 1e-6}]
    assert rep["rounds"][1]["groups"] == [{"group": "clients", "users": 1, "epsilon": 0.01, "delta": 0.0}]
    assert [r["round"] for r in rep["rounds"]] == ["first"] + [f"more{i}" for i in range(39)]
    a, c, b = rep["cumulative"]  # sorted by total ε, largest first
    assert a == {"users": 1, "releases": 1, "non_private_releases": 0,
                 "charges": [{"epsilon": 2.0, "delta": 1e-6, "private": True}],
                 "basic": {"epsilon": 2.0, "delta": 1e-6},
                 "advanced": {"epsilon": pytest.approx(1 + 2 * (math.e**2 - 1), rel=1e-12),
                              "delta": pytest.approx(1e-6 + dp, rel=1e-12)},
                 "best": {"epsilon": 2.0, "delta": 1e-6}}
    adv = math.sqrt(0.004) / 2 + 0.4 * math.expm1(0.01)
    assert c["users"] == 1 and c["releases"] == 40 and c["non_private_releases"] == 0
    assert c["charges"] == [{"epsilon": 0.01, "delta": 0.0, "private": True}] * 40
    assert c["basic"] == {"epsilon": pytest.approx(0.4, rel=1e-12), "delta": 0.0}
    assert c["advanced"] == {"epsilon": pytest.approx(adv, rel=1e-12), "delta": dp}
    assert c["best"] == {"epsilon": pytest.approx(adv, rel=1e-12), "delta": dp}
    assert b["users"] == 1 and b["releases"] == 1
    assert b["best"] == {"epsilon": pytest.approx(0.005 + 0.01 * math.expm1(0.01), rel=1e-12), "delta": dp}
    assert rep["worst_basic_epsilon"] == 2.0
    assert rep["remaining_epsilon"] == pytest.approx(1.0, rel=1e-12)


def test_report_of_an_unreadable_history(tmp_path: Path) -> None:
    p = tmp_path / "l.db"
    with PrivacyLedger.open(p, lifetime_epsilon=1.0, lifetime_delta=1e-5) as led:
        led.charge("r", [Charge("g", ["a"], 0.1, 0.0)])
    _tamper(p, "UPDATE charges SET epsilon = 'x'")
    with PrivacyLedger.open(p) as led, pytest.raises(LedgerError, match=exact_message(
            f"ledger {p} cannot be read (could not convert string to float: 'x'); {RESTORE}")):
        led.report()


def test_a_ledger_that_cannot_be_written_is_not_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(path: Path, epsilon: float, delta: float) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(ledger_mod, "_create", fail)
    p = tmp_path / "l.db"
    with pytest.raises(LedgerError, match=exact_message(f"cannot create ledger {p}: No space left on device")):
        PrivacyLedger.open(p, lifetime_epsilon=1.0, lifetime_delta=1e-5)


def test_report_tie_of_basic_and_advanced_takes_the_smaller_delta(tmp_path: Path) -> None:
    """A user charged only ε = 0 (here a δ-only release) has basic ε = 0 and advanced ε = sqrt(2 ln(1/δ')·0) +
    0·(e⁰ − 1) = 0: exactly equal. The best guarantee is then (0, Σδ) from basic composition, not (0, Σδ + δ')."""
    p = tmp_path / "l.db"
    with PrivacyLedger.open(p, lifetime_epsilon=1.0, lifetime_delta=1e-3) as led:
        led.charge("r1", [Charge("g", ["z"], 0.0, 1e-5)])
        led.charge("r2", [Charge("g", ["z"], 0.0, 2e-5)])
        (z,) = led.report(1e-6)["cumulative"]
    assert z["basic"] == {"epsilon": 0.0, "delta": pytest.approx(3e-5, rel=1e-12)}
    assert z["advanced"] == {"epsilon": 0.0, "delta": pytest.approx(3e-5 + 1e-6, rel=1e-12)}
    assert z["best"] == {"epsilon": 0.0, "delta": z["basic"]["delta"]}


def test_new_ledger_salt_is_256_random_bits(tmp_path: Path) -> None:
    salts = []
    for name in ("a.db", "b.db"):
        with PrivacyLedger.open(tmp_path / name, lifetime_epsilon=1.0, lifetime_delta=1e-5):
            pass
        conn = sqlite3.connect(tmp_path / name)
        (salt,) = conn.execute("SELECT value FROM meta WHERE key = 'salt'").fetchone()
        conn.close()
        assert len(salt) == 64 and int(salt, 16) >= 0  # 32 bytes in hex
        salts.append(salt)
    assert salts[0] != salts[1]


# ----- the advanced bound of a huge ε, the service's database, the non-private warning ---------------------------

def test_advanced_composition_of_a_huge_epsilon_is_infinite_not_an_error() -> None:
    """ε = 750: ε(e^ε − 1) > e^750 is beyond the largest float (≈ e^709.8), so the advanced bound is +inf (basic
    composition, 750, is then the better one), not an OverflowError."""
    e, d = advanced_composition([750.0, 1.0], [0.0, 1e-6], 1e-6)
    assert e == math.inf and d == pytest.approx(2e-6, rel=1e-14)


def test_is_service_database_needs_both_service_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An SQLite file with alembic_version and ledger_charges (alone or among others) is the service's database;
    with one of them, a hybriddp ledger, another file or no file it is not."""
    monkeypatch.chdir(tmp_path)
    both = _sqlite(tmp_path / "svc.db", "CREATE TABLE alembic_version (v TEXT); CREATE TABLE ledger_charges (x);")
    more = _sqlite(tmp_path / "more.db", "CREATE TABLE alembic_version (v TEXT); CREATE TABLE ledger_charges (x);"
                                         "CREATE TABLE other (y);")
    one = _sqlite(tmp_path / "one.db", "CREATE TABLE ledger_charges (x);")
    PrivacyLedger.open(tmp_path / "ours.db", lifetime_epsilon=1.0, lifetime_delta=1e-6).close()
    text = tmp_path / "text.db"
    text.write_bytes(b"alembic_version ledger_charges, not SQLite at all")
    assert ledger_mod.is_service_database(both) and ledger_mod.is_service_database(str(more))
    assert not any(ledger_mod.is_service_database(p) for p in (one, tmp_path / "ours.db", text, tmp_path / "none.db",
                                                               tmp_path))


def test_is_service_database_opens_the_file_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection it opens refuses writes (SQLite's mode=ro): looking at a file never changes it."""
    monkeypatch.chdir(tmp_path)
    db = _sqlite(tmp_path / "svc.db", "CREATE TABLE alembic_version (v TEXT); CREATE TABLE ledger_charges (x);")
    before = db.read_bytes()
    real = sqlite3.connect
    tried: list[str] = []

    def spy(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = real(*args, **kwargs)  # type: ignore[arg-type]
        try:
            conn.execute("CREATE TABLE probe (x)")
            conn.commit()
            tried.append("written")
        except sqlite3.OperationalError as exc:
            tried.append(str(exc))
        return conn

    monkeypatch.setattr(sqlite3, "connect", spy)
    assert ledger_mod.is_service_database(db)
    assert tried == ["attempt to write a readonly database"] and db.read_bytes() == before


def test_non_private_warning_names_the_users_and_what_the_sums_count() -> None:
    """The warning gives the number of users (with thousands separators), says they have no guarantee at all, and
    that the (ε, δ) sums count private releases only."""
    assert ledger_mod.non_private_warning(12345) == (
        "12,345 user(s) took part in non-private (seeded) releases: anyone who knows the seed can reproduce the "
        "noise, so these users have NO privacy guarantee at all; the (ε, δ) sums count private releases only")


def test_is_service_database_of_a_damaged_sqlite_file_is_false(tmp_path: Path) -> None:
    """A file that starts like SQLite but is not a readable database is not the service's database (no error)."""
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    conn = sqlite3.connect(damaged)
    try:
        with pytest.raises(sqlite3.DatabaseError):  # SQLite itself cannot read it
            conn.execute("SELECT name FROM sqlite_master").fetchall()
    finally:
        conn.close()
    assert ledger_mod.is_service_database(damaged) is False

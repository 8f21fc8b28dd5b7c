"""The privacy ledger: per-user accounting, refusal over budget, composition, device ledger."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import sqlite3

import pytest
from click.testing import CliRunner

from hybriddp.cli import cli
from hybriddp.core.protocol import DeviceError
from hybriddp.device.ledger import DeviceLedger
from hybriddp.device.localalg import DeviceHeadList, randomize_records
from hybriddp.privacy.budget import TOLERANCE, LifetimeBudget, compose
from hybriddp.privacy.ledger import (
    BudgetExceededError,
    Charge,
    LedgerError,
    PrivacyLedger,
    advanced_composition,
    basic_composition,
)
from hybriddp.privacy.pseudonyms import keyed_digest, pseudonym
from logdata import write_aol, zipf_log


def test_composition_formulas() -> None:
    assert basic_composition([1.0, 2.0], [1e-6, 2e-6]) == (3.0, pytest.approx(3e-6))
    e, d = advanced_composition([0.1] * 100, [0.0] * 100, 1e-6)
    assert e == pytest.approx(math.sqrt(2 * math.log(1e6) * 100 * 0.01) + 100 * 0.1 * math.expm1(0.1))
    assert d == pytest.approx(1e-6)
    assert e < 10.0  # advanced beats basic (Σε = 10) for many small releases


def test_charge_refuse_and_report(tmp_path) -> None:
    path = tmp_path / "l.db"
    with pytest.raises(LedgerError, match="--lifetime-epsilon"):
        PrivacyLedger.open(path)
    led = PrivacyLedger.open(path, lifetime_epsilon=10.0, lifetime_delta=1e-4)
    users = [f"user{i}" for i in range(100)]
    led.charge("r1", [Charge("optin-S", users[:10], 4.0, 1e-5), Charge("clients", users[10:], 4.0, 1e-5)])
    led.charge("r2", [Charge("clients", users[:5], 4.0, 1e-5)])
    with pytest.raises(BudgetExceededError, match="5 user") as info:  # 12 > 10 for users 0-4
        led.charge("r3", [Charge("clients", users[:20], 4.0, 1e-5)])
    assert "epsilon 12" in str(info.value)
    # refused means nothing was recorded: users 5-19 were not charged for r3 either
    assert [r[0] for r in led.user_history("user7")] == ["r1"]
    with pytest.raises(LedgerError, match="twice"):
        led.charge("r4", [Charge("a", ["x"], 1, 0), Charge("b", ["x"], 1, 0)])
    with pytest.raises(LedgerError, match="already"):
        led.charge("r1", [Charge("a", ["new"], 1, 0)])
    rep = led.report(1e-6)
    assert rep["users"] == 100 and [r["round"] for r in rep["rounds"]] == ["r1", "r2"]
    top = rep["cumulative"][0]
    assert top["users"] == 5 and top["releases"] == 2
    assert top["basic"] == {"epsilon": 8.0, "delta": pytest.approx(2e-5)}
    assert top["best"]["epsilon"] == 8.0
    assert rep["remaining_epsilon"] == pytest.approx(2.0)
    led.close()
    # user identifiers are not stored, only keyed pseudonyms
    raw = sqlite3.connect(path).execute("SELECT user FROM charges").fetchall()
    assert all(not u.startswith("user") and len(u) == 32 for (u,) in raw)
    with pytest.raises(LedgerError, match="fixed"):
        PrivacyLedger.open(path, lifetime_epsilon=20.0, lifetime_delta=1e-4)


def test_device_ledger_once_per_round_and_budget(tmp_path) -> None:
    doc = {"format": "hybriddp-headlist", "version": 1, "epsilon": 4.0, "delta": 1e-5, "f_c": 0.85, "m_c": 1,
           "url_level": True, "queries": [{"query": "google", "urls": ["http://google.com"]}]}
    from hybriddp.core.protocol import content_hash
    doc["content_hash"] = content_hash(doc)
    hl = DeviceHeadList.from_json(doc)
    path = str(tmp_path / "device.json")
    with pytest.raises(DeviceError, match="lifetime"):
        DeviceLedger(path)
    led = DeviceLedger(path, lifetime_epsilon=6.0, lifetime_delta=1e-3)
    msg = randomize_records(hl, [("google", "http://google.com")], ledger=led)
    assert len(msg["reports"]) == 1
    with pytest.raises(DeviceError, match="once per round"):
        randomize_records(hl, [("google", "http://google.com")], ledger=DeviceLedger(path))
    doc2 = dict(doc, epsilon=3.0)
    doc2["content_hash"] = content_hash(doc2)
    with pytest.raises(DeviceError, match="lifetime budget"):  # 4 + 3 > 6
        randomize_records(DeviceHeadList.from_json(doc2), [("bing", "http://bing.com")], ledger=DeviceLedger(path))
    shape = {"kq": [2, 1], "f_c": doc["f_c"], "m_c": 1}  # google's URL and ⟨google,*⟩; ⟨*,*⟩: for PLD accounting
    with open(path, encoding="utf-8") as fh:
        assert json.load(fh)["rounds"] == {doc["content_hash"]: {"epsilon": 4.0, "delta": 1e-5, "shape": shape}}


def test_cli_headlist_ledger_refuses_second_round_before_release(tmp_path) -> None:
    log = tmp_path / "log.tsv"
    write_aol(zipf_log(n_users=4000, seed=1), log)
    base = ["headlist", "--input", str(log), "-M", "10", "--ledger", str(tmp_path / "l.db")]
    r = CliRunner().invoke(cli, [*base, "--lifetime-epsilon", "6", "--lifetime-delta", "1e-4", "--out-headlist",
                                 str(tmp_path / "a.json"), "--out-estimates", str(tmp_path / "ae.json")])
    assert r.exit_code == 0, r.output + r.stderr
    assert "charged round" in r.stdout
    r = CliRunner().invoke(cli, [*base, "--epsilon", "3", "--out-headlist", str(tmp_path / "b.json"),
                                 "--out-estimates", str(tmp_path / "be.json")])
    assert r.exit_code == 2 and "refused" in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "be.json").exists()
    r = CliRunner().invoke(cli, ["privacy", "report", str(tmp_path / "l.db"), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    groups = {g["group"]: g for g in rep["rounds"][0]["groups"]}
    assert groups["optin-S"]["users"] + groups["optin-T"]["users"] == 4000
    assert groups["optin-T"]["delta"] == 0.0  # T's release is (ε, 0)-DP (Theorem 2)
    r = CliRunner().invoke(cli, ["privacy", "report", str(tmp_path / "l.db")])
    assert "Cumulative per user" in r.stdout and "advanced" in r.stdout
    r = CliRunner().invoke(cli, ["privacy", "report", str(tmp_path / "missing.db")])
    assert r.exit_code == 2 and "not found" in r.stderr


# ----- files that are not ledgers, damaged ledgers, atomic writes ---------------------------------


def test_empty_ledger_file_says_what_it_is_and_is_left_alone(tmp_path) -> None:
    path = tmp_path / "l.db"
    path.write_bytes(b"")
    for budget in ({}, {"lifetime_epsilon": 10.0, "lifetime_delta": 1e-4}):
        with pytest.raises(LedgerError) as info:
            PrivacyLedger.open(path, **budget)
        message = str(info.value)
        assert "empty file (0 bytes)" in message and "delete the empty file" in message
        assert "restore it from a backup" in message and "metadata" not in message
    assert path.read_bytes() == b""


def test_other_sqlite_database_is_refused_and_not_written(tmp_path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (a, b)")
    conn.execute("INSERT INTO meta VALUES (1, 2)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=r"SQLite database but not a hybriddp ledger \(its tables: meta;"):
        PrivacyLedger.open(path, lifetime_epsilon=10.0, lifetime_delta=1e-4)
    assert path.read_bytes() == before  # before the fix, the ledger's tables were added to it


@pytest.mark.parametrize(("data", "needle"), [
    (b"not a database at all" * 10, "not an SQLite database"),
    (b"SQLite format 3\x00" + b"\x07" * 200, "is damaged"),
])
def test_random_bytes_are_not_a_ledger(tmp_path, data: bytes, needle: str) -> None:
    path = tmp_path / "l.db"
    path.write_bytes(data)
    with pytest.raises(LedgerError, match=needle):
        PrivacyLedger.open(path)
    assert path.read_bytes() == data


def test_bad_budget_or_place_leaves_no_ledger_behind(tmp_path) -> None:
    from hybriddp.core.errors import ParameterError

    path = tmp_path / "l.db"
    with pytest.raises(ParameterError, match="lifetime_epsilon"):
        PrivacyLedger.open(path, lifetime_epsilon=float("nan"), lifetime_delta=1e-4)
    with pytest.raises(ParameterError, match="lifetime_delta"):
        PrivacyLedger.open(path, lifetime_epsilon=1.0, lifetime_delta=2.0)
    assert list(tmp_path.iterdir()) == []  # before the fix an empty, metadata-less file stayed
    with pytest.raises(LedgerError, match=r"directory .* does not exist"):
        PrivacyLedger.open(tmp_path / "no" / "l.db", lifetime_epsilon=1.0, lifetime_delta=1e-4)
    with pytest.raises(LedgerError, match="is a directory"):
        PrivacyLedger.open(tmp_path, lifetime_epsilon=1.0, lifetime_delta=1e-4)
    PrivacyLedger.open(path, lifetime_epsilon=1.0, lifetime_delta=1e-4).close()
    with pytest.raises(LedgerError, match="lifetime delta"):
        PrivacyLedger.open(path, lifetime_delta=1e-3)


def _write_device_state(path, text: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(text)


@pytest.mark.parametrize(("data", "needles"), [
    (b"", ["is empty", "something else truncated it", "do not delete it"]),
    (b"[]", ["expected a JSON object", "found a list []", "Restore it from a backup"]),
    (b"{}", ["expected a JSON object", "found an object with no fields"]),
    (b'{"lifetime": {"epsilon": NaN, "delta": 0.001}, "rounds": {}}', ["lifetime.epsilon = nan is not allowed"]),
    (b'{"lifetime": {"epsilon": "6", "delta": 0.001}, "rounds": {}}', ["lifetime.epsilon = '6' is a string"]),
    (b'{"lifetime": {"epsilon": 6, "delta": 0.001}, "rounds": {"h": 4}}', ["round 'h' = 4"]),
    (b'\xff{"lifetime"', ["is not UTF-8 text (byte 0 is 0xff)"]),
    (b'{"lifetime": {"epsilon": 6', ["is not valid JSON"]),
])
def test_damaged_device_ledger_is_refused_with_the_fix(tmp_path, data: bytes, needles: list[str]) -> None:
    path = tmp_path / "device.json"
    _write_device_state(path, data)
    with pytest.raises(DeviceError) as info:
        DeviceLedger(path, lifetime_epsilon=6.0, lifetime_delta=1e-3)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    for needle in needles:
        assert needle in message, message
    assert path.read_bytes() == data


def test_device_ledger_new_budget_checked_and_fixed(tmp_path) -> None:
    path = tmp_path / "device.json"
    with pytest.raises(DeviceError, match=r"lifetime epsilon .* = inf is not allowed"):
        DeviceLedger(path, lifetime_epsilon=float("inf"), lifetime_delta=1e-3)
    led = DeviceLedger(path, lifetime_epsilon=6.0, lifetime_delta=1e-3)
    led.record("sha256:aa", 1.0, 1e-6)
    with pytest.raises(DeviceError, match=r"has lifetime epsilon 6\.0, not 7\.0"):
        DeviceLedger(path, lifetime_epsilon=7.0)
    assert DeviceLedger(path, lifetime_epsilon=6.0).spent() == (1.0, 1e-6)


def test_device_ledger_is_never_half_written(tmp_path, monkeypatch) -> None:
    from hybriddp.core import atomic

    path = tmp_path / "device.json"
    led = DeviceLedger(path, lifetime_epsilon=6.0, lifetime_delta=1e-3)
    led.record("sha256:aa", 1.0, 1e-6)
    before = path.read_bytes()

    def crash(src, dst):  # the rename never happens, as if the device died while writing
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(DeviceError, match=r"cannot write device ledger .* nothing was charged, so nothing may be"):
        led.record("sha256:bb", 1.0, 1e-6)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["device.json"]  # no stray temporary file
    assert "sha256:bb" not in led.state["rounds"]
    monkeypatch.undo()
    led.record("sha256:bb", 1.0, 1e-6)
    assert set(json.loads(path.read_text())["rounds"]) == {"sha256:aa", "sha256:bb"}


def _url_level_doc(url_level: bool) -> dict:
    from hybriddp.core.protocol import content_hash

    doc = {"format": "hybriddp-headlist", "version": 1, "epsilon": 4.0, "delta": 1e-5, "f_c": 0.85, "m_c": 2,
           "url_level": url_level, "queries": [{"query": "google", "urls": ["http://google.com"] if url_level else []}]}
    doc["content_hash"] = content_hash(doc)
    return doc


def test_device_without_urls_refused_by_a_url_level_head_list(tmp_path) -> None:
    path = tmp_path / "device.json"
    records = [("google", None), ("bing", None)]
    with pytest.raises(DeviceError) as info:
        randomize_records(_url_level_doc(True), records,
                          ledger=DeviceLedger(path, lifetime_epsilon=6.0, lifetime_delta=1e-3))
    message = str(info.value)
    assert "have no URL" in message and "url_level" in message and "--url-col" in message
    assert not path.exists()  # refused before the ledger was charged
    # a query-level head list takes such records; a device with some URLs is fine for a URL-level one
    assert len(randomize_records(_url_level_doc(False), records)["reports"]) == 2
    assert len(randomize_records(_url_level_doc(True), [("google", None), ("google", "http://x")])["reports"]) == 2
    with pytest.raises(DeviceError, match=r"record 1 = \('google',\) is not a \(query, url\) pair"):
        randomize_records(_url_level_doc(True), [("google", "u"), ("google",)])


def test_report_keeps_every_bit_of_the_charged_values(tmp_path) -> None:
    """SQLite writes a REAL as text with 15 digits (1/3 → 0.333333333333333): the report must not
    rebuild the charges from such text. Values that need 17 digits come back exactly, and users with
    the same charges still share one history."""
    eps, delta = 0.1 + 0.2, 1e-6 / 3  # 0.30000000000000004, 3.333333333333333e-07
    led = PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=10.0, lifetime_delta=1e-4)
    led.charge("r1", [Charge("clients", ["a", "b", "c"], eps, delta), Charge("optin-S", ["d"], 1 / 3, 1e-7)])
    led.charge("r2", [Charge("clients", ["a", "b"], 2 / 3, delta)])
    rep = led.report()
    led.close()
    assert sorted(c["users"] for c in rep["cumulative"]) == [1, 1, 2]
    two = next(c for c in rep["cumulative"] if c["users"] == 2)
    assert two["charges"] == [{"epsilon": eps, "delta": delta, "private": True},
                              {"epsilon": 2 / 3, "delta": delta, "private": True}]
    assert two["basic"]["epsilon"] == eps + 2 / 3
    ones = sorted((c["charges"][0]["epsilon"], c["charges"][0]["delta"]) for c in rep["cumulative"]
                  if c["users"] == 1)
    assert ones == sorted([(eps, delta), (1 / 3, 1e-7)])
    assert rep["users"] == 4


# ----- non-private (seeded) releases --------------------------------------------------------------------------


def test_non_private_charges_are_recorded_flagged_and_not_summed(tmp_path) -> None:
    """A seeded release has no guarantee: its charges are kept and flagged, the (ε, δ) sums and the budget
    count private releases only, and the report says its users have no guarantee (best = none)."""
    led = PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=5.0, lifetime_delta=1e-4)
    led.charge("private", [Charge("optin-S", ["a", "b"], 4.0, 1e-5)])
    led.charge("seeded", [Charge("optin-S", ["a"], 4.0, 1e-5, private=False)])  # 8 > 5, but not summed
    with pytest.raises(BudgetExceededError):
        led.charge("again", [Charge("optin-S", ["a"], 4.0, 1e-5)])  # 4 + 4 private > 5
    assert led.non_private_rounds() == ["seeded"]
    assert [r[0] for r in led.user_history("a")] == ["private", "seeded"]
    rep = led.report()
    led.close()
    assert [(r["round"], r["private"]) for r in rep["rounds"]] == [("private", True), ("seeded", False)]
    a, b = rep["cumulative"]
    assert a["users"] == 1 and a["releases"] == 2 and a["non_private_releases"] == 1 and a["best"] is None
    assert a["charges"][1] == {"epsilon": 4.0, "delta": 1e-5, "private": False}
    assert a["basic"] == {"epsilon": 4.0, "delta": 1e-5}  # the private release only
    assert b["non_private_releases"] == 0 and b["best"] == {"epsilon": 4.0, "delta": 1e-5}
    assert rep["worst_basic_epsilon"] == 4.0 and rep["users_without_guarantee"] == 1
    assert "NO privacy guarantee" in rep["warning"]


def test_a_ledger_written_before_the_private_column_reads_as_private_and_is_migrated_when_charged(tmp_path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE rounds (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, created TEXT NOT NULL);
        CREATE TABLE charges (user TEXT NOT NULL, round INTEGER NOT NULL REFERENCES rounds(id), grp TEXT NOT NULL,
            epsilon REAL NOT NULL, delta REAL NOT NULL, PRIMARY KEY (user, round));
        INSERT INTO meta VALUES ('lifetime_epsilon', '10.0'), ('lifetime_delta', '0.0001'),
            ('salt', '00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'),
            ('format', 'hybriddp-ledger-1');
        INSERT INTO rounds VALUES (1, 'old', '2024-01-01T00:00:00+00:00');
        INSERT INTO charges VALUES ('u1', 1, 'optin-S', 4.0, 1e-05);
    """)
    conn.commit()
    conn.close()
    before = path.read_bytes()
    r = CliRunner().invoke(cli, ["privacy", "report", str(path), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["rounds"][0]["private"] and rep["cumulative"][0]["basic"]["epsilon"] == 4.0
    assert path.read_bytes() == before  # reading does not migrate
    with PrivacyLedger.open(path) as led:
        led.charge("new", [Charge("optin-S", ["x"], 1.0, 0.0, private=False)])
        assert led.non_private_rounds() == ["new"]
        assert [r["private"] for r in led.report()["rounds"]] == [True, False]
    cols = [row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(charges)")]
    assert cols[-1] == "private"


def test_seeded_headlist_is_charged_as_non_private_and_the_report_says_so(tmp_path) -> None:
    log = tmp_path / "log.tsv"
    write_aol(zipf_log(n_users=4000, seed=1), log)
    ledger = tmp_path / "l.db"
    r = CliRunner().invoke(cli, ["headlist", "--input", str(log), "-M", "10", "--seed", "4", "--ledger", str(ledger),
                                 "--lifetime-epsilon", "6", "--lifetime-delta", "1e-4", "--out-headlist",
                                 str(tmp_path / "h.json"), "--out-estimates", str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output + r.stderr
    assert "as non-private (seeded: no privacy guarantee)" in " ".join(r.stdout.split())  # Rich wraps lines
    assert json.loads((tmp_path / "h.json").read_text())["non_private"] is True
    assert json.loads((tmp_path / "e.json").read_text())["non_private"] is True
    rep = json.loads(CliRunner().invoke(cli, ["privacy", "report", str(ledger), "--json"]).stdout)
    assert rep["rounds"][0]["private"] is False and rep["users_without_guarantee"] == 4000
    assert all(c["best"] is None and c["non_private_releases"] == 1 for c in rep["cumulative"])
    text = " ".join(CliRunner().invoke(cli, ["privacy", "report", str(ledger)]).stdout.split())
    assert "NO (seeded)" in text and "non-private" in text and "NO privacy guarantee at all" in text


def test_run_with_a_seed_charges_every_user_as_non_private(tmp_path) -> None:
    log = tmp_path / "log.tsv"
    write_aol(zipf_log(n_users=3000, seed=2), log)
    ledger = tmp_path / "l.db"
    for seed in ("5", None):
        args = ["run", "--input", str(log), "-M", "10", "--ledger", str(ledger), "--round", f"seed-{seed}",
                "--lifetime-epsilon", "20", "--lifetime-delta", "1e-3", *(("--seed", seed) if seed else ())]
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 0, r.output + r.stderr
    rep = json.loads(CliRunner().invoke(cli, ["privacy", "report", str(ledger), "--json"]).stdout)
    assert [(x["round"], x["private"]) for x in rep["rounds"]] == [("seed-5", False), ("seed-None", True)]
    assert {g["group"] for g in rep["rounds"][0]["groups"]} == {"optin-S", "optin-T", "clients"}
    assert rep["users_without_guarantee"] == rep["users"] == 3000
    assert rep["worst_basic_epsilon"] == 4.0  # the private round only


# ----- the one budget rule and the one pseudonym ------------------------------------------------
def test_the_budget_rule_composes_basically_and_allows_a_relative_tolerance() -> None:
    budget = LifetimeBudget(2.0, 1e-4)
    assert compose((1.5, 4e-5), (0.5, 6e-5)) == (2.0, 1e-4)
    assert not budget.exceeded_by(2.0, 1e-4)  # exactly the budget
    assert not budget.exceeded_by(2.0 * (1 + TOLERANCE), 1e-4 * (1 + TOLERANCE))  # its float rounding
    assert budget.exceeded_by(2.0 * (1 + 4 * TOLERANCE), 0.0)
    assert budget.exceeded_by(0.0, 1e-4 * (1 + 4 * TOLERANCE))
    assert not budget.exceeded_by(0.1 + 0.2 + 1.7, 0.0)  # 2.0000000000000004: summed floats still fit


def test_the_budget_rule_names_who_would_pass_and_the_worst_totals() -> None:
    budget = LifetimeBudget(4.0, 1e-5)
    spent = {"a": (3.0, 1e-6), "b": (1.0, 9e-6), "c": (3.5, 0.0)}
    charges = {"c": (1.0, 0.0), "a": (1.0, 1e-6), "b": (1.0, 2e-6), "d": (4.0, 1e-5)}
    over = budget.overrun(charges, spent)
    assert over is not None and over.users == ("c", "b")  # in the order given; "a" and "d" reach the budget exactly
    assert (over.epsilon, over.delta) == (4.5, 0.0)  # the largest Σε, then Σδ
    assert budget.overrun({"a": (1.0, 0.0)}, spent) is None
    assert budget.overrun({}, spent) is None


def test_the_three_ledgers_apply_the_same_budget_rule(tmp_path) -> None:
    """The file ledger, the service's store and the device ledger refuse the same charge of a sequence."""
    pytest.importorskip("sqlalchemy")
    from hybriddp.service.store import Store

    charges = [(0.7, 1e-6), (0.1, 0.0), (0.2, 2e-6), (1.0, 0.0), (1e-13, 0.0), (1e-9, 0.0)]
    lifetime = (2.0, 1e-5)
    refused: dict[str, list[int]] = {"file": [], "store": [], "device": []}
    led = PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=lifetime[0], lifetime_delta=lifetime[1])
    store = Store(f"sqlite:///{tmp_path / 's.db'}", lifetime_epsilon=lifetime[0], lifetime_delta=lifetime[1])
    device = DeviceLedger(tmp_path / "d.json", lifetime_epsilon=lifetime[0], lifetime_delta=lifetime[1])
    try:
        for i, (e, d) in enumerate(charges):
            with contextlib.suppress(BudgetExceededError):
                led.charge(f"r{i}", [Charge("optin", ["alice"], e, d)])
                continue
            refused["file"].append(i)
        for i, (e, d) in enumerate(charges):
            info = store.create_round("blender", None, {})
            with contextlib.suppress(BudgetExceededError):
                store.charge(info, [Charge("optin", [store.pseudonym("alice")], e, d)])
                continue
            refused["store"].append(i)
        for i, (e, d) in enumerate(charges):
            with contextlib.suppress(DeviceError):
                device.record(f"sha256:{i:02d}", e, d)
                continue
            refused["device"].append(i)
    finally:
        led.close()
        store.close()
    assert refused == {"file": [5], "store": [5], "device": [5]}  # 2.0 + 1e-13 fits the tolerance, + 1e-9 not


def test_both_ledgers_name_a_user_by_the_one_pseudonym(tmp_path) -> None:
    pytest.importorskip("sqlalchemy")
    from hybriddp.service.store import Store

    salt = bytes(range(32))
    assert keyed_digest(salt, "alice") == hmac.new(salt, b"alice", hashlib.sha256).hexdigest()
    assert pseudonym(salt, "alice") == keyed_digest(salt, "alice")[:32]
    assert pseudonym(salt, "\udfff") == keyed_digest(salt, "\udfff")[:32]  # a lone surrogate has one too
    with PrivacyLedger.open(tmp_path / "l.db", lifetime_epsilon=1.0, lifetime_delta=1e-5) as led:
        assert led.pseudonym("ålice") == pseudonym(led._salt, "ålice")
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        assert store.pseudonym("ålice") == pseudonym(store._salt, "ålice")
    finally:
        store.close()

"""The device's own ledger (device/ledger.py): where the default one lives, its permissions, its default budget,
the one-line refusal, charges from several objects or threads on one file, the lifetime budget of a new ledger
and of a ledger file at its edges, every refusal of a damaged file whole, and the 1e-12 float slack of its budget
(no server; the service tests run `participate` and DeviceClient against a real one)."""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import threading
from pathlib import Path

import pytest

from clihelpers import exact_message
from hybriddp.core.protocol import DeviceError
from hybriddp.device.ledger import (
    DEVICE_LIFETIME_DELTA,
    DEVICE_LIFETIME_EPSILON,
    DeviceLedger,
    DeviceLedgerRefusal,
    data_home,
    default_device_ledger_path,
    open_device_ledger,
)

H1, H2, H3 = ("sha256:" + c * 64 for c in "123")


# ----- where the default ledger lives ------------------------------------------------------------------------
def test_data_home_follows_hybriddp_data_home_then_xdg_then_the_home_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDDP_DATA_HOME", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_home() == tmp_path / "mine"
    assert default_device_ledger_path() == tmp_path / "mine" / "device-ledger.json"
    monkeypatch.delenv("HYBRIDDP_DATA_HOME")
    assert default_device_ledger_path() == tmp_path / "xdg" / "hybriddp" / "device-ledger.json"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")  # the XDG specification: a relative path is ignored
    assert data_home() == tmp_path / "home" / ".local" / "share" / "hybriddp"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert data_home() == tmp_path / "home" / ".local" / "share" / "hybriddp"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert data_home() == tmp_path / "home" / "Library" / "Application Support" / "hybriddp"


def test_the_test_suite_never_uses_the_real_home_directory() -> None:
    assert not default_device_ledger_path().is_relative_to(Path.home() / ".local")
    assert "data-home-" in os.environ["HYBRIDDP_DATA_HOME"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_default_ledger_directory_0700_file_0600_budget_16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "a" / "b"
    monkeypatch.setenv("HYBRIDDP_DATA_HOME", str(home))
    led = open_device_ledger()
    assert Path(led.path) == home / "device-ledger.json" and stat.S_IMODE(home.stat().st_mode) == 0o700
    assert not Path(led.path).exists()  # written at the first charge, not before
    assert led.state["lifetime"] == {"epsilon": DEVICE_LIFETIME_EPSILON, "delta": DEVICE_LIFETIME_DELTA} \
        == {"epsilon": 16.0, "delta": 1e-4}
    led.record(H1, 4.0, 1e-5)
    assert stat.S_IMODE(Path(led.path).stat().st_mode) == 0o600
    led.record(H2, 4.0, 1e-5)  # rewritten: still 0600
    assert stat.S_IMODE(Path(led.path).stat().st_mode) == 0o600
    assert open_device_ledger().spent() == (8.0, 2e-5)


def test_an_explicit_ledger_gets_the_budget_given_or_the_default(tmp_path: Path) -> None:
    assert open_device_ledger(tmp_path / "d.json").state["lifetime"] == {"epsilon": 16.0, "delta": 1e-4}
    led = open_device_ledger(tmp_path / "e.json", lifetime_epsilon=5, lifetime_delta=1e-6)
    led.record(H1, 1.0, 0.0)
    assert open_device_ledger(tmp_path / "e.json").state["lifetime"] == {"epsilon": 5.0, "delta": 1e-6}
    with pytest.raises(DeviceError, match=r"lifetime epsilon 5\.0, not 6: a device.s lifetime budget is fixed"):
        open_device_ledger(tmp_path / "e.json", lifetime_epsilon=6)
    with pytest.raises(DeviceError, match="lifetime"):  # DeviceLedger itself still needs a budget for a new file
        DeviceLedger(tmp_path / "f.json")


def test_an_unusable_data_home_is_refused_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "plain"
    afile.write_text("x")
    monkeypatch.setenv("HYBRIDDP_DATA_HOME", str(afile / "sub"))
    with pytest.raises(DeviceError, match=r"cannot create hybriddp.s data directory .*HYBRIDDP_DATA_HOME"):
        open_device_ledger()


# ----- the refusal -----------------------------------------------------------------------------------------------
def test_a_refusal_names_the_round_what_was_spent_the_budget_and_the_way_out(tmp_path: Path) -> None:
    led = open_device_ledger(tmp_path / "d.json")
    led.record(H1, 8.0, 1e-5)
    with pytest.raises(DeviceLedgerRefusal) as info:
        led.record(H1, 8.0, 1e-5)
    exc = info.value
    assert (exc.already, exc.head_list, exc.charge, exc.spent, exc.lifetime) == (
        True, H1, (8.0, 1e-5), (8.0, 1e-5), (16.0, 1e-4))
    line = str(exc.explained("pass --no-device-ledger only for tests and simulations", "R1"))
    assert line == (f"this device already reported in round R1 (head list {H1[:19]}…); a second report would spend "
                    f"ε = 8 again (spent so far ε = 8, δ = 1e-05 of its lifetime ε = 16, δ = 0.0001; device ledger "
                    f"{tmp_path / 'd.json'}). No report was sent; pass --no-device-ledger only for tests and "
                    "simulations")
    led.record(H2, 7.0, 1e-5)
    with pytest.raises(DeviceLedgerRefusal) as info:
        led.record(H3, 2.0, 1e-5)
    over = info.value.explained("WAY OUT")
    assert not over.already and over.charge == (2.0, 1e-5) and over.spent == (15.0, 2e-5)
    assert str(over) == (f"head list {H3[:19]}…: reporting would spend ε = 2, δ = 1e-05 more and pass this device's "
                         f"lifetime ε = 16, δ = 0.0001 (spent so far ε = 15, δ = 2e-05; device ledger "
                         f"{tmp_path / 'd.json'}). No report was sent; WAY OUT")
    assert "\n" not in str(over) and set(json.loads((tmp_path / "d.json").read_text())["rounds"]) == {H1, H2}


# ----- several ledgers on one file ----------------------------------------------------------------------------
def test_two_ledgers_on_one_file_see_each_others_charges(tmp_path: Path) -> None:
    """Both opened before either charged (two DeviceClients, two processes): the second still refuses the round
    the first reported in, and neither loses the other's charges."""
    path = tmp_path / "d.json"
    a, b = open_device_ledger(path), open_device_ledger(path)
    a.record(H1, 4.0, 1e-5)
    with pytest.raises(DeviceLedgerRefusal, match="once per round"):
        b.record(H1, 4.0, 1e-5)
    b.record(H2, 4.0, 1e-5)
    a.record(H3, 4.0, 1e-5)
    assert set(json.loads(path.read_text())["rounds"]) == {H1, H2, H3}
    assert open_device_ledger(path).spent() == pytest.approx((12.0, 3e-5))


def test_concurrent_charges_are_serialized(tmp_path: Path) -> None:
    """Threads charging at once, each through its own ledger object: every distinct round is kept, and of
    threads charging the same round exactly one succeeds."""
    path = tmp_path / "d.json"
    open_device_ledger(path, lifetime_epsilon=1000, lifetime_delta=0.5).record("sha256:first", 1.0, 0.0)
    n = 16
    ledgers = [open_device_ledger(path) for _ in range(2 * n)]
    start = threading.Barrier(2 * n)
    refused: list[int] = []

    def charge(i: int) -> None:
        start.wait()
        try:
            ledgers[i].record(f"sha256:{i}" if i < n else "sha256:same", 1.0, 0.0)
        except DeviceLedgerRefusal:
            refused.append(i)

    threads = [threading.Thread(target=charge, args=(i,)) for i in range(2 * n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rounds = json.loads(path.read_text())["rounds"]
    assert set(rounds) == {"sha256:first", "sha256:same", *(f"sha256:{i}" for i in range(n))}
    assert len(refused) == n - 1 and all(i >= n for i in refused)


# ----- a new ledger's lifetime budget -------------------------------------------------------------------------
FIX = ("Restore it from a backup; do not delete it, since a new ledger would forget the budget this device has "
       "already spent.")


def _ledger_file(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "dev.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def _good(**rounds: dict) -> dict:
    return {"lifetime": {"epsilon": 8.0, "delta": 1e-4}, "rounds": dict(rounds)}


@pytest.mark.parametrize(("eps", "delta", "message"), [
    (0.0, 1e-5, "lifetime epsilon (--lifetime-epsilon) = 0.0 is not allowed: it must be a finite number > 0. "),
    (math.inf, 1e-5, "lifetime epsilon (--lifetime-epsilon) = inf is not allowed: it must be a finite number > 0. "),
    (1.0, 0.0, "lifetime delta (--lifetime-delta) = 0.0 is not allowed: it must be a number in (0, 1). "),
    (1.0, 1.0, "lifetime delta (--lifetime-delta) = 1.0 is not allowed: it must be a number in (0, 1). "),
    (1.0, 1.5, "lifetime delta (--lifetime-delta) = 1.5 is not allowed: it must be a number in (0, 1). "),
])
def test_new_ledger_budget_edges(tmp_path: Path, eps: float, delta: float, message: str) -> None:
    with pytest.raises(DeviceError, match=exact_message(message)):
        DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=eps, lifetime_delta=delta)


def test_new_ledger_needs_both_halves_of_the_budget(tmp_path: Path) -> None:
    p = tmp_path / "dev.json"
    for kwargs in ({}, {"lifetime_epsilon": 1.0}, {"lifetime_delta": 1e-5}):
        with pytest.raises(DeviceError, match=exact_message(
                f"device ledger {p} does not exist; to create it give the device's lifetime budget "
                "(--lifetime-epsilon and --lifetime-delta)")):
            DeviceLedger(p, **kwargs)
    led = DeviceLedger(p, lifetime_epsilon=5e-324, lifetime_delta=math.nextafter(1.0, 0.0))
    assert led.state == {"lifetime": {"epsilon": 5e-324, "delta": math.nextafter(1.0, 0.0)}, "rounds": {}}
    assert not p.exists()  # nothing written before a report


def test_an_integer_beyond_the_float_range_is_not_finite(tmp_path: Path) -> None:
    """10^400 compares below math.inf as a Python int; as a number it is infinite and so refused."""
    shown = "1" + "0" * 56 + "..."
    with pytest.raises(DeviceError, match=exact_message(
            f"lifetime epsilon (--lifetime-epsilon) = {shown} is not allowed: it must be a finite number > 0. ")):
        DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=10**400, lifetime_delta=1e-5)
    p = tmp_path / "huge.json"
    p.write_text('{"lifetime": {"epsilon": 1' + "0" * 400 + ', "delta": 0.5}, "rounds": {}}', encoding="utf-8")
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p}: field lifetime.epsilon = {shown} is not allowed: it must be a finite number > 0. "
            f"{FIX}")):
        DeviceLedger(p)


def test_device_ledger_path_and_budget_messages(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match=exact_message(f"device ledger {tmp_path} is a directory; give a file name")):
        DeviceLedger(tmp_path)
    afile = tmp_path / "plain"
    afile.write_text("x")
    with pytest.raises(DeviceError,
                       match=exact_message(f"cannot read device ledger {afile / 'dev.json'}: Not a directory")):
        DeviceLedger(afile / "dev.json")
    p = tmp_path / "dev.json"
    DeviceLedger(p, lifetime_epsilon=2.0, lifetime_delta=1e-5).record("r", 1.0, 1e-6)
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p} has lifetime delta 1e-05, not 0.001: a device's lifetime budget is fixed when its "
            "ledger is created; leave out --lifetime-delta")):
        DeviceLedger(p, lifetime_delta=1e-3)
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p} has lifetime epsilon 2.0, not 3: a device's lifetime budget is fixed when its "
            "ledger is created; leave out --lifetime-epsilon")):
        DeviceLedger(p, lifetime_epsilon=3)
    assert DeviceLedger(p, lifetime_epsilon=2, lifetime_delta=1e-5).spent() == (1.0, 1e-6)


# ----- reading a ledger file: every refusal whole -------------------------------------------------------------
@pytest.mark.parametrize(("lifetime", "message"), [
    ({"epsilon": 0, "delta": 0.5}, "field lifetime.epsilon = 0 is not allowed: it must be a finite number > 0."),
    (None, None),
    ({"epsilon": 1.0, "delta": 0}, "field lifetime.delta = 0 is not allowed: it must be a number in (0, 1)."),
    ({"epsilon": 1.0, "delta": 1}, "field lifetime.delta = 1 is not allowed: it must be a number in (0, 1)."),
    ({"epsilon": 1.0, "delta": 1.5}, "field lifetime.delta = 1.5 is not allowed: it must be a number in (0, 1)."),
    ({"delta": 0.5}, "field 'lifetime' has no 'epsilon'."),
    ({"epsilon": 1.0}, "field 'lifetime' has no 'delta'."),
])
def test_ledger_file_lifetime_edges(tmp_path: Path, lifetime: dict | None, message: str | None) -> None:
    if lifetime is None:  # an epsilon that parses to inf (json.dumps would write Infinity)
        p = tmp_path / "dev.json"
        p.write_text('{"lifetime": {"epsilon": 1e999, "delta": 0.5}, "rounds": {}}', encoding="utf-8")
        message = "field lifetime.epsilon = inf is not allowed: it must be a finite number > 0."
    else:
        p = _ledger_file(tmp_path, {"lifetime": lifetime, "rounds": {}})
    with pytest.raises(DeviceError, match=exact_message(f"device ledger {p}: {message} {FIX}")):
        DeviceLedger(p)


def test_ledger_file_lifetime_at_the_edges_is_read(tmp_path: Path) -> None:
    p = _ledger_file(tmp_path, {"lifetime": {"epsilon": 5e-324, "delta": 5e-324}, "rounds": {}})
    assert DeviceLedger(p).state["lifetime"] == {"epsilon": 5e-324, "delta": 5e-324}
    p = _ledger_file(tmp_path, {"lifetime": {"epsilon": 1e308, "delta": math.nextafter(1.0, 0.0)},
                                "rounds": {"h": {"epsilon": 0, "delta": 0}, "g": {"epsilon": 1e300, "delta": 1}}})
    assert DeviceLedger(p).spent() == (1e300, 1.0)


@pytest.mark.parametrize(("charge", "field", "shown", "allowed"), [
    ({"epsilon": -1e-9, "delta": 0}, "epsilon", "-1e-09", "a finite number >= 0"),
    ({"epsilon": math.inf, "delta": 0}, "epsilon", "inf", "a finite number >= 0"),
    ({"epsilon": 1, "delta": -1e-9}, "delta", "-1e-09", "a number in [0, 1]"),
    ({"epsilon": 1, "delta": 1.5}, "delta", "1.5", "a number in [0, 1]"),
])
def test_ledger_file_round_charge_edges(tmp_path: Path, charge: dict, field: str, shown: str, allowed: str) -> None:
    p = tmp_path / "dev.json"
    text = json.dumps(_good(**{"sha256:abc": {"epsilon": 0.0, "delta": 0.0}}))
    p.write_text(text.replace('{"epsilon": 0.0, "delta": 0.0}', json.dumps(charge).replace("Infinity", "1e999")),
                 encoding="utf-8")
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p}: rounds['sha256:abc'].{field} = {shown} is not allowed: it must be {allowed}. {FIX}")):
        DeviceLedger(p)


def test_ledger_file_round_not_an_object(tmp_path: Path) -> None:
    long_key = "sha256:" + "f" * 64
    p = _ledger_file(tmp_path, _good(**{long_key: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]}))
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p}: round 'sha256:fffffffffffffffffff... = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1...; "
            'it must be an object {"epsilon": e, "delta": d}. ' + FIX)):
        DeviceLedger(p)
    p = _ledger_file(tmp_path, _good(h={"epsilon": 1.0}))
    with pytest.raises(DeviceError, match=re.escape("round 'h' = {'epsilon': 1.0}; it must be an object")):
        DeviceLedger(p)


def test_ledger_file_of_another_shape(tmp_path: Path) -> None:
    cases = [
        ({}, "an object with no fields"),
        ({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6},
         "an object with 'a', 'b', 'c', 'd', 'e'"),
        ({"lifetime": {}, "a_very_long_field_name_indeed": 1},
         "an object with 'lifetime', 'a_very_long_fiel..."),
        ([1, 2], "a list [1, 2]"),
    ]
    for doc, found in cases:
        _assert_shape_refused(tmp_path, doc, found)


def _assert_shape_refused(tmp_path: Path, doc: object, found: str) -> None:
    """A ledger file holding ``doc`` is refused, the message saying it found ``found``."""
    shape = '{"lifetime": {"epsilon": E, "delta": D}, "rounds": {...}}'
    p = _ledger_file(tmp_path, doc)
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p}: expected a JSON object {shape}, found {found}; it is damaged or not a device "
            f"ledger. {FIX}")):
        DeviceLedger(p)


def test_ledger_file_messages_show_long_values_cut(tmp_path: Path) -> None:
    key = "sha256:" + "0123456789" * 7
    p = _ledger_file(tmp_path, _good(**{key: {"epsilon": -1, "delta": 0}}))
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p}: rounds['sha256:0123456789012345678...].epsilon = -1 is not allowed: it must be a "
            f"finite number >= 0. {FIX}")):
        DeviceLedger(p)
    p = _ledger_file(tmp_path, _good(**{key: {"epsilon": 0, "delta": 2}}))
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p}: rounds['sha256:0123456789012345678...].delta = 2 is not allowed: it must be a "
            f"number in [0, 1]. {FIX}")):
        DeviceLedger(p)
    for doc, found in [(list(range(30)), "a list [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11..."), (None, "null None")]:
        _assert_shape_refused(tmp_path, doc, found)


# ----- charging: the 1e-12 float slack, refused charges, a ledger that cannot be saved ------------------------
def test_device_budget_slack_and_messages(tmp_path: Path) -> None:
    p = tmp_path / "dev.json"
    led = DeviceLedger(p, lifetime_epsilon=3.0, lifetime_delta=3e-5)
    led.record("sha256:" + "a" * 64, 3.0 * (1 + 5e-13), 0.0)  # within the 1e-12 float slack
    with pytest.raises(DeviceError, match=exact_message(
            "this device already reported for head list sha256:aaaaaaaaaaaa…; a device reports at most once per "
            "round")):
        led.check("sha256:" + "a" * 64, 0.0, 0.0)
    led2 = DeviceLedger(tmp_path / "d2.json", lifetime_epsilon=3.0, lifetime_delta=3e-5)
    led2.check("r1", 3.0 * (1 + 1e-12), 3e-5 * (1 + 1e-12))  # exactly at the bound: allowed
    led2.check("r1", 3.0, 3e-5 * (1 + 5e-13))
    for e, d in [(3.0 * (1 + 1e-11), 0.0), (0.0, 3e-5 * (1 + 1e-11)), (0.0, 4.5e-5)]:
        with pytest.raises(DeviceError, match=exact_message(
                "reporting would exceed this device's lifetime budget (epsilon 3.0, delta 3e-05; spent 0, 0); "
                "not reporting")):
            led2.check("r1", e, d)
    assert json.loads(p.read_text()) == {"lifetime": {"epsilon": 3.0, "delta": 3e-5},
                                         "rounds": {"sha256:" + "a" * 64: {"epsilon": 3.0 * (1 + 5e-13),
                                                                           "delta": 0.0}}}


def test_a_ledger_that_cannot_be_saved_charges_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hybriddp.device.ledger as device_mod

    p = tmp_path / "dev.json"
    led = DeviceLedger(p, lifetime_epsilon=2.0, lifetime_delta=1e-5)

    def fail(path: str, text: str) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(device_mod, "write_text", fail)
    with pytest.raises(DeviceError, match=exact_message(
            f"cannot write device ledger {p} (Read-only file system); nothing was charged, so nothing may be "
            "reported")):
        led.record("r", 1.0, 0.0)
    assert led.state["rounds"] == {} and not p.exists()


@pytest.mark.parametrize("epsilon, delta", [(float("nan"), 0.0), (float("inf"), 0.0), (-1.0, 0.0), (1.0, float("nan")),
                                            (1.0, -1e-9)])
def test_device_ledger_refuses_a_non_finite_or_negative_charge_and_stays_usable(
        tmp_path: Path, epsilon: float, delta: float) -> None:
    """A NaN charge passed the budget comparison (NaN compares False) and then broke the save."""
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=10.0, lifetime_delta=1e-6)
    with pytest.raises(DeviceError, match=r"the round's (epsilon|delta) = .* must be a finite number >= 0"):
        ledger.record("sha256:" + "a" * 64, epsilon, delta)
    ledger.record("sha256:" + "b" * 64, 1.0, 0.0)  # the refused round left nothing behind
    assert ledger.spent() == (1.0, 0.0)


@pytest.mark.parametrize(("epsilon", "delta", "what"), [
    (float("nan"), 0.0, "epsilon = nan is not allowed: it must be a finite number >= 0."),
    (1.0, -1e-9, "delta = -1e-09 is not allowed: it must be a finite number >= 0."),
    ("1", 0.0, "epsilon = '1' is a string, not a number (numbers are written without quotes); it must be a finite "
               "number >= 0."),
    (1.0, None, "delta = None is null, not a number; it must be a finite number >= 0."),
])
def test_device_ledger_round_charge_messages_whole(tmp_path: Path, epsilon: object, delta: object, what: str) -> None:
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=10.0, lifetime_delta=1e-6)
    with pytest.raises(DeviceError, match=exact_message(
            f"the round's {what} The head list is damaged or not from a hybriddp server; not reporting.")):
        ledger.check("sha256:" + "a" * 64, epsilon, delta)  # type: ignore[arg-type]
    ledger.check("sha256:" + "a" * 64, 0.0, 0.0)  # zero is a charge like any other

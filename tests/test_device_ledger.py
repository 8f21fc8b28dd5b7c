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
from collections.abc import Callable
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


def _unwritable(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make every write of the device ledger fail as on a read-only file system; returns the undo."""
    import hybriddp.device.ledger as device_mod

    def fail(path: str, text: str) -> None:
        raise OSError(30, "Read-only file system")

    real = device_mod.write_text
    monkeypatch.setattr(device_mod, "write_text", fail)
    return lambda: monkeypatch.setattr(device_mod, "write_text", real)


def test_a_ledger_that_cannot_be_saved_charges_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "dev.json"
    led = DeviceLedger(p, lifetime_epsilon=2.0, lifetime_delta=1e-5)
    _unwritable(monkeypatch)
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


# ----- participation "one period in every" (DeviceLedger.takes_part) ------------------------------------------
class _Draws:
    """A ``draw`` that returns the given slots in turn and notes every n it was asked for."""

    def __init__(self, *slots: object) -> None:
        self.slots: list[object] = list(slots)
        self.asked: list[int] = []

    def __call__(self, n: int) -> int:
        self.asked.append(n)
        return self.slots.pop(0)  # type: ignore[return-value]


def test_takes_part_every_period_when_every_is_one_without_drawing_or_writing(tmp_path: Path) -> None:
    """"One period in 1" is every period: always True, no slot drawn and nothing written to the ledger."""
    p = tmp_path / "dev.json"
    led = DeviceLedger(p, lifetime_epsilon=2.0, lifetime_delta=1e-5)
    draws = _Draws()
    assert all(led.takes_part("s", period, 1, draw=draws) for period in range(5))
    assert draws.asked == [] and not p.exists() and "slots" not in led.state


def test_takes_part_reports_in_exactly_the_drawn_period_of_each_block(tmp_path: Path) -> None:
    """Blocks of 3 periods: periods 0-2 are block 0, 3-5 block 1. The slot is drawn once per block, from [0, 3),
    the first time the block is asked about; the device takes part in period 3·b + slot only."""
    led = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=2.0, lifetime_delta=1e-5)
    draws = _Draws(1, 0, 2)
    assert [led.takes_part("s", period, 3, draw=draws) for period in range(9)] == [
        False, True, False,  # block 0, slot 1
        True, False, False,  # block 1, slot 0
        False, False, True]  # block 2, slot 2
    assert draws.asked == [3, 3, 3]
    again = [led.takes_part("s", period, 3, draw=draws) for period in range(9)]  # asked again: the slots are kept
    assert again == [False, True, False, True, False, False, False, False, True] and draws.asked == [3, 3, 3]


def test_takes_part_keeps_one_slot_per_series_policy_and_block(tmp_path: Path) -> None:
    """Another series, another ``every`` or another block each draw their own slot; the same block of the same
    series and policy never draws again, even from a new ledger object on the same file (the slot is in the file)."""
    p = tmp_path / "dev.json"
    led = DeviceLedger(p, lifetime_epsilon=2.0, lifetime_delta=1e-5)
    draws = _Draws(1, 0, 3, 0)
    assert led.takes_part("a", 1, 2, draw=draws) is True  # series a, every 2, block 0: slot 1
    assert led.takes_part("a", 0, 2, draw=draws) is False
    assert led.takes_part("b", 1, 2, draw=draws) is False  # series b: its own slot 0
    assert led.takes_part("a", 3, 4, draw=draws) is True  # series a, every 4: its own slot 3
    assert led.takes_part("a", 2, 2, draw=draws) is True  # series a, every 2, block 1: slot 0
    assert draws.asked == [2, 2, 4, 2]
    other = DeviceLedger(p)
    assert [other.takes_part("a", period, 2, draw=_Draws()) for period in range(4)] == [False, True, True, False]
    assert other.takes_part("b", 0, 2, draw=_Draws()) is True


def test_takes_part_sees_a_slot_drawn_by_another_object_on_the_same_file(tmp_path: Path) -> None:
    """Two ledger objects opened before either asked (two processes): the second reads the first's slot under the
    lock rather than drawing its own, so the device still reports in one period of the block."""
    p = tmp_path / "dev.json"
    DeviceLedger(p, lifetime_epsilon=2.0, lifetime_delta=1e-5).record("sha256:x", 1.0, 0.0)
    a, b = DeviceLedger(p), DeviceLedger(p)
    assert a.takes_part("s", 0, 2, draw=_Draws(0)) is True
    assert b.takes_part("s", 1, 2, draw=_Draws(1)) is False


def test_takes_part_with_the_default_draw_reports_once_per_block(tmp_path: Path) -> None:
    """Without ``draw`` the OS's generator picks the slot: whatever it picks, asked about every period of a block of 5
    the device takes part in exactly one, and the same one when asked again."""
    led = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=2.0, lifetime_delta=1e-5)
    answers = [led.takes_part("s", period, 5) for period in range(10)]
    assert sum(answers[:5]) == 1 and sum(answers[5:]) == 1
    assert [led.takes_part("s", period, 5) for period in range(10)] == answers


@pytest.mark.parametrize("every", [0, -1, True, 2.0, "2"])
def test_takes_part_refuses_a_policy_that_is_not_an_integer_of_at_least_one(tmp_path: Path, every: object) -> None:
    """``every`` must be an int >= 1 (a bool is not a count of periods); the message shows the value given."""
    led = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=2.0, lifetime_delta=1e-5)
    with pytest.raises(DeviceError, match=exact_message(f"participation: one period in {every!r}? give an integer "
                                                        ">= 1")):
        led.takes_part("s", 0, every, draw=_Draws(0, 0))  # type: ignore[arg-type]


@pytest.mark.parametrize("period", [-1, True, 1.0, "1"])
def test_takes_part_refuses_a_period_that_is_not_an_integer_of_at_least_zero(tmp_path: Path, period: object) -> None:
    """Periods count from 0; a negative, boolean or non-integer period is refused with its value, for every policy."""
    led = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=2.0, lifetime_delta=1e-5)
    for every in (1, 2):
        with pytest.raises(DeviceError, match=exact_message(f"the round's period {period!r} is not an integer >= 0; "
                                                            "not reporting")):
            led.takes_part("s", period, every, draw=_Draws(0))  # type: ignore[arg-type]
    assert led.takes_part("s", 0, 1) is True  # period 0 is the first period


@pytest.mark.parametrize("slot", [-1, 3, True, 1.0, None])
def test_takes_part_refuses_a_drawn_slot_outside_the_block(tmp_path: Path, slot: object) -> None:
    """A draw must give an int in [0, every); anything else is refused, naming it, and nothing is kept."""
    p = tmp_path / "dev.json"
    led = DeviceLedger(p, lifetime_epsilon=2.0, lifetime_delta=1e-5)
    with pytest.raises(DeviceError, match=exact_message(f"participation slot {slot!r} is not in [0, 3)")):
        led.takes_part("s", 0, 3, draw=_Draws(slot))
    assert not p.exists()


def test_takes_part_accepts_both_end_slots_of_the_block(tmp_path: Path) -> None:
    """Slots 0 and every − 1 are the first and last period of a block: both are valid draws."""
    led = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=2.0, lifetime_delta=1e-5)
    assert led.takes_part("s", 0, 3, draw=_Draws(0)) is True
    assert led.takes_part("s", 5, 3, draw=_Draws(2)) is True


@pytest.mark.parametrize("slots", [[], {"s/2/0": "1"}, {"s/2/0": None}])
def test_takes_part_refuses_a_damaged_slots_field(tmp_path: Path, slots: object) -> None:
    """A ledger file whose ``slots`` is not an object of integers is refused with the fix (restore, do not delete),
    before anything is drawn."""
    p = _ledger_file(tmp_path, {**_good(), "slots": slots})
    led = DeviceLedger(p)
    draws = _Draws(0)
    with pytest.raises(DeviceError, match=exact_message(f"device ledger {p}: field 'slots' is damaged. {FIX}")):
        led.takes_part("s", 0, 2, draw=draws)
    assert draws.asked == []


def test_takes_part_draws_again_after_a_slot_that_could_not_be_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot that cannot be written is forgotten (the device does not report on it): the next question about the
    block draws afresh once the ledger can be written."""
    import hybriddp.device.ledger as device_mod

    p = tmp_path / "dev.json"
    led = DeviceLedger(p, lifetime_epsilon=2.0, lifetime_delta=1e-5)

    def fail(path: str, text: str) -> None:
        raise OSError(28, "No space left on device")

    real = device_mod.write_text
    monkeypatch.setattr(device_mod, "write_text", fail)
    draws = _Draws(1, 0)
    with pytest.raises(DeviceError, match=exact_message(
            f"cannot write device ledger {p} (No space left on device); not reporting")):
        led.takes_part("s", 1, 2, draw=draws)
    assert led.state.get("slots") == {}
    monkeypatch.setattr(device_mod, "write_text", real)
    assert led.takes_part("s", 1, 2, draw=draws) is False and draws.asked == [2, 2]  # the new draw: slot 0
    assert led.takes_part("s", 0, 2, draw=draws) is True


# ----- where the default ledger lives on Windows, and without a home directory -----------------------------------
def test_data_home_on_windows_is_localappdata_and_only_on_windows(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """%LOCALAPPDATA%\\hybriddp on Windows; elsewhere LOCALAPPDATA means nothing (~/.local/share/hybriddp), and on
    Windows without it the home directory's place is used."""
    monkeypatch.delenv("HYBRIDDP_DATA_HOME")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    monkeypatch.setattr(sys, "platform", "win32")
    assert data_home() == tmp_path / "local" / "hybriddp"
    monkeypatch.setattr(sys, "platform", "linux")
    assert data_home() == tmp_path / "home" / ".local" / "share" / "hybriddp"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.delenv("LOCALAPPDATA")
    assert data_home() == tmp_path / "home" / ".local" / "share" / "hybriddp"


def test_data_home_without_a_home_directory_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """No HYBRIDDP_DATA_HOME, no XDG_DATA_HOME and no home directory: a DeviceError saying what to set."""
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("HYBRIDDP_DATA_HOME")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    with pytest.raises(DeviceError, match=exact_message(
            "cannot find this user's home directory for hybriddp's data (the device ledger); set HYBRIDDP_DATA_HOME "
            "to a private directory")):
        data_home()


def test_an_unusable_data_home_message_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The data directory under a plain file cannot be made: the message names it, the OS's reason and both fixes."""
    afile = tmp_path / "plain"
    afile.write_text("x")
    monkeypatch.setenv("HYBRIDDP_DATA_HOME", str(afile / "sub"))
    with pytest.raises(DeviceError, match=exact_message(
            f"cannot create hybriddp's data directory {afile / 'sub'} for the device ledger (Not a directory); set "
            "HYBRIDDP_DATA_HOME to a writable private directory, or give the ledger's path (--device-ledger)")):
        open_device_ledger()


# ----- the refusal's fields survive explained() ---------------------------------------------------------------
def test_explained_keeps_every_field_of_the_refusal(tmp_path: Path) -> None:
    """The explained refusal is the same refusal: head list, kind, charge, spent, lifetime, path and tighter ε are
    kept; its round is the one given, else the refusal's own."""
    refusal = DeviceLedgerRefusal("x", head_list=H1, already=False, charge=(2.0, 1e-5), spent=(15.0, 2e-5),
                                  lifetime=(16.0, 1e-4), path=str(tmp_path / "d.json"), round_id="R7", tighter=9.5)
    for given, rid in ((None, "R7"), ("R8", "R8")):
        out = refusal.explained("WAY OUT", given)
        assert (out.head_list, out.already, out.charge, out.spent, out.lifetime, out.path, out.round_id,
                out.tighter) == (H1, False, (2.0, 1e-5), (15.0, 2e-5), (16.0, 1e-4), str(tmp_path / "d.json"), rid,
                                 9.5)
        assert str(out).startswith(f"round {rid} (head list {H1[:19]}…): reporting would spend ε = 2, δ = 1e-05 more")
        assert "spent so far ε = 15 by basic composition, ε = 9.5 by PLD accounting, δ = 2e-05" in str(out)
    assert refusal.explained("W").explained("W").round_id == "R7"
    once = DeviceLedgerRefusal("x", head_list=H2, already=True, charge=(1.0, 0.0), spent=(1.0, 0.0),
                               lifetime=(4.0, 1e-6), path="p")
    assert once.explained("W").already is True and once.explained("W").round_id is None


# ----- the tighter accountant: what the ledger asks it and what it does with the answer ---------------------------
class _Accountant:
    """A stand-in tighter accountant: ``admits`` decides ``within`` (an exception instance is raised); ``epsilon``
    is half the Σε of the history, and every δ it is asked at is noted."""

    def __init__(self, admits: bool | Exception) -> None:
        self.admits = admits
        self.deltas: list[float] = []

    def within(self, history: list[tuple[float, float, dict | None]], lifetime_epsilon: float,
               lifetime_delta: float) -> bool:
        if isinstance(self.admits, Exception):
            raise self.admits
        return self.admits

    def epsilon(self, history: list[tuple[float, float, dict | None]], delta: float) -> float:
        self.deltas.append(delta)
        return 0.5 * sum(e for e, _, _ in history)


def test_a_refusal_over_budget_names_the_tighter_accountants_epsilon(tmp_path: Path) -> None:
    """Over budget by both rules after one round of ε 2: the message gives Σε = 2 and the accountant's ε (1 = 2/2),
    the refusal is not an "already reported" one, and it carries the tighter ε."""
    acc = _Accountant(False)
    led = DeviceLedger(tmp_path / "d.json", lifetime_epsilon=3.0, lifetime_delta=1e-5, accountant=acc)
    led.record("r1", 2.0, 0.0)
    with pytest.raises(DeviceLedgerRefusal, match=exact_message(
            "reporting would exceed this device's lifetime budget (epsilon 3.0, delta 1e-05; spent 2, 0 by basic "
            "composition; epsilon 1 by PLD accounting); not reporting")) as info:
        led.check("r2", 2.0, 0.0)
    assert info.value.already is False and info.value.tighter == 1.0


def test_a_first_round_over_budget_names_no_tighter_epsilon(tmp_path: Path) -> None:
    """Nothing spent yet: there is no tighter ε to name (None), even though an accountant is there."""
    led = DeviceLedger(tmp_path / "d.json", lifetime_epsilon=3.0, lifetime_delta=1e-5, accountant=_Accountant(False))
    with pytest.raises(DeviceLedgerRefusal, match=exact_message(
            "reporting would exceed this device's lifetime budget (epsilon 3.0, delta 1e-05; spent 0, 0); not "
            "reporting")) as info:
        led.check("r1", 4.0, 0.0)
    assert info.value.tighter is None


def test_an_accountant_that_cannot_say_leaves_basic_composition_to_decide(tmp_path: Path) -> None:
    """``within`` raising: the round is admitted only if basic composition admits it (Σε 3 + 1 > 3: refused)."""
    for error in (ValueError("x"), KeyError("x"), TypeError("x"), ZeroDivisionError("x")):
        led = DeviceLedger(tmp_path / "d.json", lifetime_epsilon=3.0, lifetime_delta=1e-5,
                           accountant=_Accountant(error))
        led.check("r1", 3.0, 0.0)
        with pytest.raises(DeviceLedgerRefusal):
            led.check("r1", 3.5, 0.0)
    admitting = DeviceLedger(tmp_path / "e.json", lifetime_epsilon=3.0, lifetime_delta=1e-5,
                             accountant=_Accountant(True))
    admitting.check("r1", 3.5, 0.0)  # the tighter accountant admits what basic composition does not


def test_tighter_epsilon_is_asked_at_the_delta_given_else_the_lifetime_delta(tmp_path: Path) -> None:
    """``tighter_epsilon(δ)`` asks the accountant at δ; without δ, at the ledger's lifetime δ."""
    acc = _Accountant(True)
    led = DeviceLedger(tmp_path / "d.json", lifetime_epsilon=3.0, lifetime_delta=1e-5, accountant=acc)
    led.record("r1", 2.0, 0.0)
    assert led.tighter_epsilon(1e-3) == 1.0 and led.tighter_epsilon() == 1.0
    assert acc.deltas == [1e-3, 1e-5]


# ----- what a charge keeps: its shape and memo, and nothing of a charge that was not saved -------------------------
def test_a_charge_keeps_its_memo_whole(tmp_path: Path) -> None:
    """The memo is kept as given: the records key, the reports, and the service round it was sent in."""
    p = tmp_path / "d.json"
    led = DeviceLedger(p, lifetime_epsilon=3.0, lifetime_delta=1e-5)
    led.record("r1", 1.0, 0.0, memo=("KEY", [["q", 1]], "S1"))
    assert json.loads(p.read_text())["memo"] == {"r1": {"records": "KEY", "reports": [["q", 1]], "sent_in": ["S1"]}}


def test_a_charge_that_cannot_be_saved_keeps_no_memo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing was charged, so nothing was sent: the memo of the refused round is gone from the ledger's state too,
    and the same round can be charged (with its memo) once the file can be written."""
    p = tmp_path / "d.json"
    led = DeviceLedger(p, lifetime_epsilon=3.0, lifetime_delta=1e-5)
    led.record("r0", 1.0, 0.0, memo=("K0", [0], "S0"))
    writable = _unwritable(monkeypatch)
    with pytest.raises(DeviceError, match="nothing was charged"):
        led.record("r1", 1.0, 0.0, memo=("K1", [1], "S1"))
    assert led.state["memo"] == {"r0": {"records": "K0", "reports": [0], "sent_in": ["S0"]}}
    assert led.memoized("r1", "S2") is None
    writable()
    led.record("r1", 1.0, 0.0, memo=("K1", [1], "S1"))
    assert led.memoized("r1", "S2") == [1]


def test_a_shape_is_checked_and_kept_canonical(tmp_path: Path) -> None:
    """A shape read from the file or given to record is kept as ``kq`` ints, ``f_c`` float and ``m_c`` int, with
    nothing else; the file is rewritten so."""
    p = _ledger_file(tmp_path, _good(h={"epsilon": 1.0, "delta": 0.0,
                                        "shape": {"kq": [3.0, 1], "f_c": 1, "m_c": 2.0, "note": "x"}}))
    led = DeviceLedger(p)
    assert led.state["rounds"]["h"] == {"epsilon": 1.0, "delta": 0.0, "shape": {"kq": [3, 1], "f_c": 1.0, "m_c": 2}}
    kept = led.state["rounds"]["h"]["shape"]
    assert [type(x) for x in kept["kq"]] == [int, int] and type(kept["f_c"]) is float and type(kept["m_c"]) is int
    led.record("g", 1.0, 0.0, shape={"kq": [2.0], "f_c": 0.5, "m_c": 1, "other": 0})
    rounds = json.loads(p.read_text())["rounds"]
    assert rounds == {"h": {"epsilon": 1.0, "delta": 0.0, "shape": {"kq": [3, 1], "f_c": 1.0, "m_c": 2}},
                      "g": {"epsilon": 1.0, "delta": 0.0, "shape": {"kq": [2], "f_c": 0.5, "m_c": 1}}}


@pytest.mark.parametrize(("shape", "shown"), [
    ({"kq": [], "f_c": 0.5, "m_c": 1}, "kq []…, f_c 0.5, m_c 1"),
    ({"kq": [2, 0], "f_c": 0.5, "m_c": 1}, "kq [2, 0]…, f_c 0.5, m_c 1"),
    ({"kq": [1, 2, 3, 4, 5, 6, 0], "f_c": 0.5, "m_c": 1}, "kq [1, 2, 3, 4, 5]…, f_c 0.5, m_c 1"),
    ({"kq": [2], "f_c": 0.0, "m_c": 1}, "kq [2]…, f_c 0.0, m_c 1"),
    ({"kq": [2], "f_c": 1.5, "m_c": 1}, "kq [2]…, f_c 1.5, m_c 1"),
    ({"kq": [2], "f_c": 0.5, "m_c": 0}, "kq [2]…, f_c 0.5, m_c 0"),
])
def test_a_shape_out_of_range_is_refused_naming_the_ledger_and_the_ranges(
        tmp_path: Path, shape: dict, shown: str) -> None:
    """kq must be non-empty integers >= 1, f_c in (0, 1], m_c >= 1; the message names the ledger file, the values
    (kq's first five) and the ranges, whether the shape comes from record or from the file."""
    message = (f"device ledger {{p}}: a round's shape has {shown}: kq must be integers >= 1, f_c in (0, 1], "
               "m_c >= 1")
    p = tmp_path / "d.json"
    led = DeviceLedger(p, lifetime_epsilon=3.0, lifetime_delta=1e-5)
    with pytest.raises(DeviceError, match=exact_message(message.format(p=p))):
        led.record("r1", 1.0, 0.0, shape=shape)
    q = _ledger_file(tmp_path, _good(h={"epsilon": 1.0, "delta": 0.0, "shape": shape}))
    with pytest.raises(DeviceError, match=exact_message(message.format(p=q))):
        DeviceLedger(q)


def test_a_shape_at_the_edges_is_accepted(tmp_path: Path) -> None:
    """f_c = 1 (all of the budget to the queries) and kq = m_c = 1 are the edges of the allowed ranges."""
    led = DeviceLedger(tmp_path / "d.json", lifetime_epsilon=3.0, lifetime_delta=1e-5)
    led.record("r1", 1.0, 0.0, shape={"kq": [1], "f_c": 1.0, "m_c": 1})
    assert led.state["rounds"]["r1"]["shape"] == {"kq": [1], "f_c": 1.0, "m_c": 1}


def test_a_shape_of_the_wrong_form_is_refused_showing_it_cut(tmp_path: Path) -> None:
    """A shape without kq: the message names the ledger and shows the shape's repr cut to 60 characters."""
    p = tmp_path / "d.json"
    led = DeviceLedger(p, lifetime_epsilon=3.0, lifetime_delta=1e-5)
    shape = {"f_c": 0.5, "m_c": 1, "note": "x" * 80}
    # repr: "{'f_c': 0.5, 'm_c': 1, 'note': '" (32 characters), then x's: 57 characters and "..."
    shown = "{'f_c': 0.5, 'm_c': 1, 'note': '" + "x" * 25 + "..."
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p}: a round's shape must be {{'kq': [...], 'f_c': f, 'm_c': m}}, got {shown}")):
        led.record("r1", 1.0, 0.0, shape=shape)


# ----- memoized: a damaged memo, a note that cannot be saved ----------------------------------------------------
def test_memoized_of_a_memo_field_that_is_not_an_object_is_none(tmp_path: Path) -> None:
    """A ``memo`` field that is not an object holds no reports: nothing to send again."""
    p = _ledger_file(tmp_path, {**_good(h={"epsilon": 1.0, "delta": 0.0}), "memo": [["h"]]})
    assert DeviceLedger(p).memoized("h", "S1") is None


def test_memoized_reports_that_cannot_be_noted_are_not_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service round is noted before the reports are sent again; if the note cannot be saved the device does not
    report (the message says so) and the round is not noted, so it may send them once the file can be written."""
    p = tmp_path / "d.json"
    led = DeviceLedger(p, lifetime_epsilon=3.0, lifetime_delta=1e-5)
    led.record("h", 1.0, 0.0, memo=("K", [7], "S1"))
    writable = _unwritable(monkeypatch)
    with pytest.raises(DeviceError, match=exact_message(
            f"cannot write device ledger {p} (Read-only file system); not reporting")):
        led.memoized("h", "S2")
    assert led.state["memo"]["h"]["sent_in"] == ["S1"]
    writable()
    assert led.memoized("h", "S2") == [7] and led.memoized("h", "S2") is None


# ----- re-reading the file at a charge ---------------------------------------------------------------------------
def test_a_ledger_file_that_became_unreadable_is_named_at_the_charge(tmp_path: Path) -> None:
    """The file is read again under the lock at every charge: a path that has become a directory, or a file that has
    become damaged, is refused with the ledger's path and the OS's reason."""
    p = tmp_path / "d.json"
    led = DeviceLedger(p, lifetime_epsilon=3.0, lifetime_delta=1e-5)
    p.mkdir()
    with pytest.raises(DeviceError, match=exact_message(f"cannot read device ledger {p}: Is a directory")):
        led.record("r1", 1.0, 0.0)
    p.rmdir()
    led.record("r1", 1.0, 0.0)
    p.write_text("", encoding="utf-8")
    with pytest.raises(DeviceError, match=exact_message(
            f"device ledger {p} is empty. hybriddp writes it atomically, so it was never left empty by a report: "
            f"something else truncated it. {FIX}")):
        led.record("r2", 1.0, 0.0)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_a_file_system_without_modes_still_keeps_the_charge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the new file's mode cannot be set to 0600, the charge stands all the same (the file is written)."""
    p = tmp_path / "d.json"
    real = os.chmod

    def chmod(path: str | os.PathLike[str], mode: int) -> None:
        if os.fspath(path) == str(p):
            raise PermissionError(1, "Operation not permitted")
        real(path, mode)

    monkeypatch.setattr(os, "chmod", chmod)
    led = DeviceLedger(p, lifetime_epsilon=3.0, lifetime_delta=1e-5)
    led.record("r1", 1.0, 0.0)
    assert json.loads(p.read_text())["rounds"] == {"r1": {"epsilon": 1.0, "delta": 0.0}}


# ----- the records key ------------------------------------------------------------------------------------------
def test_records_key_is_the_sha256_of_the_sorted_json_rows() -> None:
    """SHA-256 of the rows' compact-spaced JSON (non-ASCII kept as UTF-8, a lone surrogate passed through), sorted and
    joined by newlines. Expected digests from `printf '<rows>' | sha256sum`, not from the code."""
    from hybriddp.device.ledger import records_key

    # printf '["a", "u"]\n["b", null]' | sha256sum
    assert records_key([("b", None), ("a", "u")]) == \
        "a4ac9a6a11743e6ee494046ed27ec0860188f60fdfd4727f425da21947fe74cd"
    # printf '["café", null]' | sha256sum  (UTF-8, not \u00e9)
    assert records_key([("café", None)]) == "a4487e71d2ae1fd7129c0fa6a9a02ff003e2f7728158c9943eb2c28d63bd0b2f"
    # printf '["\xed\xa0\x80", null]' | sha256sum  (U+D800 alone, as UTF-8 with surrogatepass)
    assert records_key([("\ud800", None)]) == "24552fe8cd705eb5d6a0e2298ae5fb4e75554bcbace17993aa96279a1034394e"


def test_a_refused_shape_charges_nothing(tmp_path: Path) -> None:
    """A charge whose shape is refused leaves the ledger as it was, in memory too: the round is not counted as
    spent, and the same round with a good shape is charged afterwards (it was once counted and then said "already
    reported" when the ledger had no file yet to be re-read)."""
    led = DeviceLedger(tmp_path / "d.json", lifetime_epsilon=3.0, lifetime_delta=1e-5)
    with pytest.raises(DeviceError, match="shape"):
        led.record("r1", 1.0, 0.0, shape={"kq": [0], "f_c": 0.5, "m_c": 1})
    assert led.state["rounds"] == {} and led.spent() == (0.0, 0.0)
    led.record("r1", 1.0, 0.0, shape={"kq": [2], "f_c": 0.5, "m_c": 1})
    assert led.spent() == (1.0, 0.0)

"""The device's own ledger and input checks at their edges, messages compared whole (issue 14 mutants)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from clihelpers import exact_message
from hybriddp.device import DeviceError, DeviceLedger, check_message_id, new_message_id

FIX = ("Restore it from a backup; do not delete it, since a new ledger would forget the budget this device has "
       "already spent.")


def _ledger_file(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "dev.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def _good(**rounds: dict) -> dict:
    return {"lifetime": {"epsilon": 8.0, "delta": 1e-4}, "rounds": dict(rounds)}


# ----- message ids -----------------------------------------------------------------------------------------------

def test_message_ids() -> None:
    for _ in range(20):
        mid = new_message_id()
        assert len(mid) == 22 and check_message_id(mid) == mid
    assert check_message_id("AAAAAAAAAAAAAAAAAAAAAA") == "AAAAAAAAAAAAAAAAAAAAAA"
    assert check_message_id("-_-_-_-_-_-_-_-_-_-_-w") == "-_-_-_-_-_-_-_-_-_-_-w"
    tail = "it must be 16 random bytes in URL-safe base64 without padding (22 characters of A-Z a-z 0-9 - _), e.g. " \
           "from new_message_id()"
    # 22 characters whose last one carries bits beyond 16 bytes decode to 16 bytes but are not canonical
    for bad in ["A" * 21, "A" * 23, "A" * 21 + "=", "A" * 21 + "é", "A" * 21 + "+", 12345, None, "x" * 50]:
        shown = repr(bad)[:40]
        with pytest.raises(DeviceError, match=exact_message(f"message id {shown} is not valid: {tail}")):
            check_message_id(bad)


# ----- a new device ledger -------------------------------------------------------------------------------------

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


# ----- parsing a ledger file -----------------------------------------------------------------------------------

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


# ----- charging --------------------------------------------------------------------------------------------------

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


# ----- how values are shown in messages --------------------------------------------------------------------------

def test_show_and_kind() -> None:
    from hybriddp.device import _kind, _show

    assert _show("x" * 58) == repr("x" * 58)  # 60 characters with the quotes: shown whole
    assert _show("x" * 59) == "'" + "x" * 56 + "..."  # 61: cut to 57 + "..."
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert _show(nested) == "<list nested too deeply>"
    assert [_kind(v) for v in (None, True, "s", 1, 1.5, [], {}, (1,))] == [
        "null", "a boolean", "a string", "a number", "a number", "a list", "an object", "a tuple"]


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


def test_a_ledger_that_cannot_be_saved_charges_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hybriddp.device as device_mod

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


def test_new_message_ids_are_16_bytes_canonically_encoded() -> None:
    """16 bytes are 128 bits; 22 base64 characters carry 132, so the last character holds 2 data bits and 4 zero
    bits: it is one of A, Q, g, w. Decoding and re-encoding gives the id back (P[pass] for ids of more random
    bytes: (1/16)^50)."""
    import base64

    for _ in range(50):
        mid = new_message_id()
        assert mid[-1] in "AQgw"
        raw = base64.urlsafe_b64decode(mid + "==")
        assert len(raw) == 16 and base64.urlsafe_b64encode(raw).decode() == mid + "=="


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

"""The device ledger a device keeps by default: where it lives, its permissions, its default budget, the
one-line refusal, and charges from several objects or threads on one file (no server; the service tests
run `participate` and DeviceClient against a real one)."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from hybriddp.device import (
    DEVICE_LIFETIME_DELTA,
    DEVICE_LIFETIME_EPSILON,
    DeviceError,
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

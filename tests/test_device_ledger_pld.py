"""The device ledger's lifetime budget by the tighter of basic composition and PLD accounting (ALGORITHM.md §14,
§15; ``hybriddp.device.ledger``).

A device that keeps each round's head-list shape is composed as LocalAlg's exact mechanism (whose PLD
tests/test_pld.py checks against the exact output distributions). It reports in as many rounds as that accountant
admits, never fewer than basic composition; a round kept without its shape counts by its (ε, δ).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headlisthelpers import signed_headlist
from hybriddp.audit.pld import Mechanism, admitted_rounds, device_accountant
from hybriddp.core.protocol import DeviceError
from hybriddp.device.ledger import DeviceLedger, DeviceLedgerRefusal, open_device_ledger
from hybriddp.device.localalg import SeededSource, randomize_records

LIFE = (11.0, 1e-4)
EPS, DELTA = 1.0, 1e-6


def _doc(k: int) -> dict:
    """A 16-query head list for round k (a different list each round: its own content hash)."""
    queries = [{"query": f"q{j}-{k}", "urls": ["https://a.example/", "https://b.example/"]} for j in range(16)]
    return signed_headlist(epsilon=EPS, delta=DELTA, queries=queries)


def _reports_until_refused(ledger: DeviceLedger, most: int) -> int:
    for k in range(most):
        doc = _doc(k)
        try:
            randomize_records(doc, [(doc["queries"][0]["query"], "https://a.example/")], source=SeededSource(k),
                              ledger=ledger)
        except DeviceLedgerRefusal as refusal:
            assert not refusal.already and "lifetime budget" in str(refusal)
            if ledger.accountant is not None:  # the message names what the accountant counts, not only Σε
                assert refusal.tighter is not None and "by PLD accounting" in str(refusal.explained("x", "R"))
            return k
    return most


def test_a_device_reports_in_as_many_rounds_as_its_exact_accounting_admits(tmp_path: Path) -> None:
    kq = tuple([3] * 16 + [1])  # the lists' URLs per query, ⟨q,*⟩ included, and ⟨*,*⟩
    basic, tight = admitted_rounds(Mechanism("local", EPS, DELTA, kq=kq, f_c=0.85, m_c=1), *LIFE, 60)
    assert basic == 11 and tight > basic
    plain = DeviceLedger(tmp_path / "plain.json", lifetime_epsilon=LIFE[0], lifetime_delta=LIFE[1])
    assert _reports_until_refused(plain, 60) == basic and plain.tighter_epsilon() is None  # no accountant: basic
    ledger = DeviceLedger(tmp_path / "ledger.json", lifetime_epsilon=LIFE[0], lifetime_delta=LIFE[1],
                          accountant=device_accountant())
    assert _reports_until_refused(ledger, 60) == tight < 60
    assert ledger.spent()[0] == pytest.approx(tight * EPS)  # basic composition's sum, past the lifetime ε
    assert ledger.tighter_epsilon() <= LIFE[0] * (1 + 1e-9)
    kept = json.loads((tmp_path / "ledger.json").read_text())
    assert all(r["shape"] == {"kq": list(kq), "f_c": 0.85, "m_c": 1} for r in kept["rounds"].values())
    again = open_device_ledger(tmp_path / "ledger.json", accountant=device_accountant())  # read back: the same
    assert again.tighter_epsilon() == pytest.approx(ledger.tighter_epsilon())


def test_rounds_without_their_shape_count_by_their_epsilon_and_delta(tmp_path: Path) -> None:
    ledger = DeviceLedger(tmp_path / "ledger.json", lifetime_epsilon=LIFE[0], lifetime_delta=LIFE[1],
                          accountant=device_accountant())
    stated_basic, stated = admitted_rounds(Mechanism("local", EPS, DELTA), *LIFE, 60)
    n = 0
    while True:
        try:
            ledger.record(f"sha256:{n:064x}", EPS, DELTA)  # e.g. an opt-in upload: no head-list shape
        except DeviceLedgerRefusal:
            break
        n += 1
    assert n == stated >= stated_basic == 11


def test_a_damaged_shape_in_the_ledger_file_is_refused_with_its_fix(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"lifetime": {"epsilon": 8.0, "delta": 1e-5},
                                "rounds": {"sha256:aa": {"epsilon": 1.0, "delta": 0.0, "shape": {"kq": [0]}}}}))
    with pytest.raises(DeviceError, match="shape"):
        DeviceLedger(path)


def test_the_sdk_opens_its_device_ledger_with_the_tighter_accountant(tmp_path: Path) -> None:
    from hybriddp.sdk import DeviceClient

    with DeviceClient("http://127.0.0.1:9", "r" * 22, tmp_path / "sdk.json") as client:
        assert client.ledger is not None and client.ledger.accountant is not None

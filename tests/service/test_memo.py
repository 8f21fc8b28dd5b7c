"""Memoized device reports over a series of rounds (ALGORITHM.md §15): a device, in rounds whose head list does not
change, sends the same randomized reports every round, whatever its records, and is charged once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hybriddp.core.protocol import DeviceError
from hybriddp.device.ledger import DeviceLedger, records_key
from hybriddp.device.localalg import randomize_records
from test_localalg import signed_headlist


def _ledger(path: Path) -> DeviceLedger:
    return DeviceLedger(path, lifetime_epsilon=20.0, lifetime_delta=1e-3)


def test_same_head_list_same_records_reports_the_same_and_pays_once(tmp_path: Path) -> None:
    doc = signed_headlist(epsilon=4, delta=1e-5, f_c=0.85, m_c=1)
    records = [("a", "u")]
    led = _ledger(tmp_path / "l.json")
    msgs = [randomize_records(doc, records, ledger=led, round_id=f"round-{i}") for i in range(6)]
    assert len({m["id"] for m in msgs}) == 6  # fresh ids: the server counts each round's message once
    assert all(m["reports"] == msgs[0]["reports"] for m in msgs)  # the same randomized reports
    assert led.spent() == (4.0, 1e-5)  # one round's budget however many rounds
    saved = json.loads((tmp_path / "l.json").read_text())
    memo = saved["memo"][doc["content_hash"]]
    assert re.fullmatch(r"[0-9a-f]{64}", memo["records"]) and memo["records"] == records_key(records)
    assert memo["sent_in"] == [f"round-{i}" for i in range(6)]
    # a second message in a round already reported in is refused, memo or not
    with pytest.raises(DeviceError, match="already reported"):
        randomize_records(doc, records, ledger=led, round_id="round-3")
    # other records in a later round: the same kept reports, uncharged. Whether and what the device sends must not
    # depend on its records now: a refusal here would tell the server that they changed
    again = randomize_records(doc, [("b", "v")], ledger=led, round_id="round-7")
    assert again["reports"] == msgs[0]["reports"] and led.spent() == (4.0, 1e-5)
    # another head list: randomized afresh and charged
    other = signed_headlist(epsilon=2, delta=1e-5, f_c=0.85, m_c=1)
    randomize_records(other, records, ledger=led, round_id="round-9")
    assert led.spent() == pytest.approx((6.0, 2e-5))


def test_without_a_round_id_there_is_no_memo(tmp_path: Path) -> None:
    doc = signed_headlist(epsilon=4, delta=1e-5, f_c=0.85, m_c=1)
    led = _ledger(tmp_path / "l.json")
    randomize_records(doc, [("a", "u")], ledger=led)
    assert "memo" not in json.loads((tmp_path / "l.json").read_text())
    with pytest.raises(DeviceError, match="already reported"):
        randomize_records(doc, [("a", "u")], ledger=led, round_id="r2")


def test_records_key_is_of_the_multiset() -> None:
    assert records_key([("a", "u"), ("b", None)]) == records_key([("b", None), ("a", "u")])
    assert records_key([("a", "u")]) != records_key([("a", "u"), ("a", "u")])
    assert records_key([("a", None)]) != records_key([("a", "")])


def test_a_series_through_the_service(store_url: str, tmp_path: Path) -> None:
    """Two rounds of one service with the same head list (seeded rounds on the same opt-in data): the device's
    second participation sends the same reports, is counted in the second round, and is not charged."""
    from fastapi.testclient import TestClient
    from test_api import ADMIN, API, AUTH, PARAMS, optin_all

    from hybriddp.sdk import AdminClient, DeviceClient
    from hybriddp.service import create_app
    from hybriddp.service.demo import local_server

    with local_server(create_app(store_url, ADMIN, allow_seeds=True, open_admission=True)) as url:
        rids = []
        with TestClient(create_app(store_url, ADMIN, allow_seeds=True, open_admission=True)) as c:
            for i in range(2):
                resp = c.post(f"{API}/rounds", json={"kind": "blender", "params": {**PARAMS, "seed": 7}},
                              headers=AUTH)
                rid = resp.json()["id"]
                optin_all(c, rid, first_user=100 * i)
                assert c.post(f"{API}/rounds/{rid}/headlist", headers=AUTH).status_code == 200
                rids.append(rid)
        docs = [DeviceClient(url, r, DeviceClient.NO_LEDGER).fetch_headlist() for r in rids]
        # the same lists (protocol v2: each round commits to its own key and window, so the documents differ)
        from hybriddp.core.protocol import lists_hash
        assert lists_hash(docs[0]) == lists_hash(docs[1]) and docs[0]["content_hash"] != docs[1]["content_hash"]
        ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=40.0, lifetime_delta=1e-3)
        acks = [DeviceClient(url, r, ledger, report_now=True).participate(  # at once: a test of the memo
            [("weather", "https://w.example/a")]) for r in rids]
        assert [a.counted for a in acks] == [1, 1]
        assert ledger.spent()[0] == PARAMS["epsilon"]
        admin = AdminClient(url, ADMIN)
        assert [admin.round(r)["counts"]["messages"] for r in rids] == [1, 1]

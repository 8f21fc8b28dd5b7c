"""A service head list's round commitments (docs/TOKENS.md "One key per round"): checked when present, inside the
content hash, and outside the lists hash that the device ledger keys charges and memoized reports by (ALGORITHM.md
§15), so that two rounds publishing the same lists are the same head list to a device's ledger."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from headlisthelpers import signed_headlist
from hybriddp.core.protocol import ROUND_COMMITMENTS, DeviceError, content_hash, lists_hash, validate_headlist
from hybriddp.device.ledger import DeviceLedger
from hybriddp.device.localalg import SeededSource, randomize_records

KEY_ID = "A" * 43  # 32 bytes of base64url


def committed(doc: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``doc`` with round commitments (defaults: a valid set) and its content hash recomputed."""
    out = {k: v for k, v in doc.items() if k != "content_hash"}
    out.update({"token_key": {"key_id": KEY_ID, "modulus_bits": 2048, "e": 65537}, "ohttp_key": "AQAQBAQE",
                "report_window": {"opens": "2026-11-28T19:00:00Z", "closes": "2026-11-28T20:00:00Z"}})
    out.update(fields)
    out["content_hash"] = content_hash(out)
    return out


def independent_hash(doc: dict[str, Any], leave_out: tuple[str, ...]) -> str:
    """sha256 of the canonical JSON without ``leave_out`` and content_hash, computed here (not by the library)."""
    body = {k: v for k, v in doc.items() if k not in (*leave_out, "content_hash")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_the_lists_hash_leaves_out_exactly_the_round_commitments() -> None:
    plain = signed_headlist()
    assert lists_hash(plain) == plain["content_hash"] == independent_hash(plain, ())
    a = committed(plain)
    b = committed(plain, token_key={"key_id": "B" * 43, "modulus_bits": 2048, "e": 65537},
                  report_window={"opens": "2026-12-01T00:00:00Z", "closes": "2026-12-01T01:00:00Z"})
    assert a["content_hash"] != b["content_hash"] != plain["content_hash"]  # messages commit to their round's keys
    assert lists_hash(a) == lists_hash(b) == independent_hash(a, ROUND_COMMITMENTS) == plain["content_hash"]
    other = committed(signed_headlist(epsilon=2.0))
    assert lists_hash(other) != lists_hash(a)
    assert validate_headlist(a) is a


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("token_key", {"key_id": KEY_ID, "modulus_bits": 2048, "e": 3}, "token_key"),
    ("token_key", {"key_id": KEY_ID, "modulus_bits": 1024, "e": 65537}, "token_key"),
    ("token_key", {"key_id": "A" * 42, "modulus_bits": 2048, "e": 65537}, "token_key"),
    ("token_key", {"key_id": KEY_ID, "modulus_bits": True, "e": 65537}, "token_key"),
    ("token_key", "not an object", "token_key"),
    ("ohttp_key", "not base64!", "ohttp_key"),
    ("ohttp_key", 17, "ohttp_key"),
    ("report_window", {"opens": "2026-11-28T20:00:00Z", "closes": "2026-11-28T19:00:00Z"}, "report_window"),
    ("report_window", {"opens": "tomorrow", "closes": "2026-11-28T19:00:00Z"}, "report_window"),
    ("report_window", ["2026-11-28T19:00:00Z", "2026-11-28T20:00:00Z"], "report_window"),
])
def test_malformed_commitments_are_refused_naming_the_field(field: str, value: Any, needle: str) -> None:
    with pytest.raises(DeviceError, match=needle):
        validate_headlist(committed(signed_headlist(), **{field: value}))


def test_the_same_lists_in_a_later_round_resend_the_kept_reports_uncharged(tmp_path: Path) -> None:
    """Memoization across rounds (ALGORITHM.md §15) survives per-round keys: the second round's head list commits to
    another key and window, yet the device re-sends its earlier reports, under the new content hash, uncharged."""
    plain = signed_headlist()
    first = committed(plain)
    second = committed(plain, token_key={"key_id": "C" * 43, "modulus_bits": 2048, "e": 65537})
    ledger = DeviceLedger(tmp_path / "ledger.json", lifetime_epsilon=100.0, lifetime_delta=1e-3)
    rec = [(plain["queries"][0]["query"], plain["queries"][0]["urls"][0])]
    one = randomize_records(first, rec, source=SeededSource(3), ledger=ledger, round_id="round-1")
    spent = ledger.spent()
    two = randomize_records(second, rec, ledger=ledger, round_id="round-2")
    assert two["reports"] == one["reports"] and two["headlist"] == second["content_hash"] != one["headlist"]
    assert ledger.spent() == spent  # not charged again
    with pytest.raises(DeviceError):  # the same round again: one message per round
        randomize_records(second, rec, ledger=ledger, round_id="round-2")

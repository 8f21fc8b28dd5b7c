"""A service head list's round commitments (docs/TOKENS.md "One key per round"): checked when present, inside the
content hash, and outside the lists hash that the device ledger keys charges and memoized reports by (ALGORITHM.md
§15), so that two rounds publishing the same lists are the same head list to a device's ledger."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from clihelpers import exact_message
from headlisthelpers import signed_headlist
from hybriddp.core.protocol import (
    ROUND_COMMITMENTS,
    DeviceError,
    _b64_bytes,
    content_hash,
    lists_hash,
    validate_headlist,
)
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


FETCH = "Fetch the round's head list again from its server."
TOKEN_SHAPE = '{"key_id": 32 bytes in base64url, "modulus_bits": an integer >= 2048, "e": 65537}'


@pytest.mark.parametrize(("field", "value", "shown", "must_be"), [
    ("token_key", "not an object", "'not an object'", f"must be {TOKEN_SHAPE}"),
    ("ohttp_key", "not base64!", "'not base64!'", "must be an OHTTP key config in base64url (RFC 9458 §3.1)"),
    ("report_window", ["a", "b"], "['a', 'b']", 'must be {"opens": time, "closes": time} in UTC like '
                                                "'2026-11-28T19:00:00Z', opens no later than closes"),
])
def test_commitment_refusals_are_whole_naming_source_field_and_value(field: str, value: Any, shown: str,
                                                                     must_be: str) -> None:
    """Each refusal is one whole sentence: the source given to validate_headlist, the field, the value as found and
    what to do (fetch the head list again)."""
    doc = committed(signed_headlist(), **{field: value})
    with pytest.raises(DeviceError, match=exact_message(f"round 7: field '{field}' = {shown} {must_be}. {FETCH}")):
        validate_headlist(doc, "round 7")


@pytest.mark.parametrize("bits", ["4096", 4096.0, None, 2047])
def test_token_key_modulus_bits_must_be_a_json_integer(bits: Any) -> None:
    """modulus_bits is an integer >= 2048: a quoted number, a float, a missing value or 2047 is refused as a
    DeviceError (never a TypeError from comparing it), while 2048 and 4096 are accepted."""
    for ok in (2048, 4096):
        doc = committed(signed_headlist(), token_key={"key_id": KEY_ID, "modulus_bits": ok, "e": 65537})
        assert validate_headlist(doc) is doc
    tk: dict[str, Any] = {"key_id": KEY_ID, "e": 65537}
    if bits is not None:
        tk["modulus_bits"] = bits
    with pytest.raises(DeviceError, match="field 'token_key'"):
        validate_headlist(committed(signed_headlist(), token_key=tk))


@pytest.mark.parametrize("key_id", ["A" * 43 + "=", "A" * 42 + "+", "A" * 42 + "/", "A" * 43 + ".", "A" * 43 + " "])
def test_token_key_id_outside_the_url_safe_alphabet_is_refused(key_id: str) -> None:
    """key_id is base64url without padding: a padded form, the standard alphabet's + and /, or any other character
    is refused, even where the standard library's lenient decoder reads 32 bytes from it."""
    if key_id[-1] in "=+/":
        assert len(base64.urlsafe_b64decode(key_id + "=" * (-len(key_id) % 4))) == 32
    with pytest.raises(DeviceError, match="field 'token_key'"):
        validate_headlist(committed(signed_headlist(), token_key={"key_id": key_id, "modulus_bits": 2048,
                                                                  "e": 65537}))


def test_ohttp_key_config_size_bounds() -> None:
    """ohttp_key holds 5 to 1024 bytes in base64url: 5 and 1024 bytes are accepted, 4 and 1025 refused, counted from
    the standard library's encoding."""
    for n, ok in [(5, True), (6, True), (1024, True), (4, False), (1025, False), (0, False)]:
        key = base64.urlsafe_b64encode(bytes(n)).decode().rstrip("=")
        doc = committed(signed_headlist(), ohttp_key=key)
        if ok:
            assert validate_headlist(doc) is doc
        else:
            with pytest.raises(DeviceError, match="field 'ohttp_key'"):
                validate_headlist(doc)


def test_a_report_window_may_open_and_close_at_the_same_time() -> None:
    """opens <= closes: an instant window (opens == closes) is accepted; one second backwards is refused."""
    same = committed(signed_headlist(), report_window={"opens": "2026-11-28T19:00:00Z",
                                                        "closes": "2026-11-28T19:00:00Z"})
    assert validate_headlist(same) is same
    with pytest.raises(DeviceError, match="field 'report_window'"):
        validate_headlist(committed(signed_headlist(), report_window={"opens": "2026-11-28T19:00:01Z",
                                                                      "closes": "2026-11-28T19:00:00Z"}))


def test_b64_bytes_counts_six_bits_per_character() -> None:
    """Unpadded base64url of n characters holds ⌊6n/8⌋ bytes, and no string has n ≡ 1 (mod 4) characters; checked
    against the standard library's decoding of random bytes encoded by it, up to 8192 characters."""
    rng = random.Random(5)
    for n_bytes in [*range(0, 40), 1024, 6144]:
        text = base64.urlsafe_b64encode(rng.randbytes(n_bytes)).decode().rstrip("=")
        assert _b64_bytes(text) == n_bytes == len(text) * 6 // 8
    for n in range(0, 40):
        assert _b64_bytes("A" * n) == (None if n % 4 == 1 else n * 6 // 8), n
    assert _b64_bytes("A" * 8192) == 6144
    for bad in ["AA==", "AA+A", "AA/A", "AA A", 12, None, b"AAAA"]:
        assert _b64_bytes(bad) is None, bad

"""The protocol every party shares (core/protocol.py): message ids, the head-list document's checks with every
refusal whole, its content hash (a known answer written by hand), the largest ε LocalAlg can compute with, and
LocalAlg's budget split and keep probability worked out by hand (ALGORITHM.md §5, FORMATS.md)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re

import pytest

from clihelpers import exact_message
from headlisthelpers import DROP, KAT_CANONICAL, KAT_HASH, canonical_hash, headlist_doc, kat_doc, signed_headlist
from hybriddp.core.protocol import (
    DeviceError,
    _kind,
    _show,
    budget_split,
    check_message_id,
    content_hash,
    keep_probability,
    max_epsilon,
    new_message_id,
    validate_headlist,
)
from hybriddp.device.localalg import DeviceHeadList

REBUILD = "Use the head list exactly as `hybriddp headlist` wrote it, or rebuild it."


# ----- message ids and how values are shown in messages -------------------------------------------------------

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


def test_new_message_ids_are_16_bytes_canonically_encoded() -> None:
    """16 bytes are 128 bits; 22 base64 characters carry 132, so the last character holds 2 data bits and 4 zero
    bits: it is one of A, Q, g, w. Decoding and re-encoding gives the id back (P[pass] for ids of more random
    bytes: (1/16)^50)."""
    for _ in range(50):
        mid = new_message_id()
        assert mid[-1] in "AQgw"
        raw = base64.urlsafe_b64decode(mid + "==")
        assert len(raw) == 16 and base64.urlsafe_b64encode(raw).decode() == mid + "=="


def test_show_and_kind() -> None:
    assert _show("x" * 58) == repr("x" * 58)  # 60 characters with the quotes: shown whole
    assert _show("x" * 59) == "'" + "x" * 56 + "..."  # 61: cut to 57 + "..."
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert _show(nested) == "<list nested too deeply>"
    assert [_kind(v) for v in (None, True, "s", 1, 1.5, [], {}, (1,))] == [
        "null", "a boolean", "a string", "a number", "a number", "a list", "an object", "a tuple"]


# ----- the head-list document: range checks at the boundaries, messages whole --------------------------------

TINY = 5e-324  # the smallest positive float
BELOW_ONE = math.nextafter(1.0, 0.0)
ABOVE_ONE = math.nextafter(1.0, 2.0)


@pytest.mark.parametrize(("field", "value", "ok"), [
    ("epsilon", 0.0, False), ("epsilon", 0, False), ("epsilon", -1.0, False), ("epsilon", TINY, True),
    ("epsilon", 1.0, True), ("epsilon", ABOVE_ONE, True),
    ("delta", 0.0, False), ("delta", 0, False), ("delta", TINY, True), ("delta", 0.5, True),
    ("delta", BELOW_ONE, True), ("delta", 1.0, False), ("delta", 1, False), ("delta", ABOVE_ONE, False),
    ("delta", -TINY, False),
    ("f_c", 0.0, False), ("f_c", 0, False), ("f_c", TINY, True), ("f_c", 0.5, True), ("f_c", BELOW_ONE, True),
    ("f_c", 1.0, True), ("f_c", 1, True), ("f_c", ABOVE_ONE, False), ("f_c", -TINY, False),
])
def test_device_range_checks_at_the_boundaries(field: str, value: float, ok: bool) -> None:
    """ε > 0, δ ∈ (0, 1), f_C ∈ (0, 1] (FORMATS.md), at 0, the smallest float, 1 and just beyond."""
    doc = signed_headlist(**{field: value})
    if ok:
        assert validate_headlist(doc) is doc
    else:
        with pytest.raises(DeviceError, match=f"'{field}'"):
            validate_headlist(doc)


def _refused(doc: object, message: str) -> None:
    with pytest.raises(DeviceError, match=exact_message(message)):
        validate_headlist(doc, "hl.json")


@pytest.mark.parametrize(("doc", "found"), [([1], "a list"), (None, "null"), ("{}", "a string"), (3, "a number")])
def test_headlist_not_an_object(doc: object, found: str) -> None:
    _refused(doc, f"hl.json: expected a JSON object (a head list written by `hybriddp headlist`), found {found}")


def test_headlist_format_and_version_messages() -> None:
    fmt = "expected 'hybriddp-headlist': this is not a head list written by `hybriddp headlist`"
    _refused(headlist_doc(format="hybriddp-headlisT"), f"hl.json: field 'format' = 'hybriddp-headlisT', {fmt}")
    _refused(headlist_doc(format=DROP), f"hl.json: field 'format' = None, {fmt}")
    for version, shown in [(2, "2"), (0, "0"), (True, "True"), ("1", "'1'"), (1.0, "1.0"), (DROP, "None")]:
        _refused(headlist_doc(version=version), f"hl.json: field 'version' = {shown}; this reader understands "
                                                "version 1. Upgrade hybriddp or rebuild the head list.")
    with pytest.raises(DeviceError, match=exact_message("head list: field 'version' = 2; this reader understands "
                                                        "version 1. Upgrade hybriddp or rebuild the head list.")):
        validate_headlist(headlist_doc(version=2))  # the default source name


def test_headlist_missing_fields_in_order() -> None:
    for key in ("epsilon", "delta", "f_c", "m_c", "queries"):
        _refused(headlist_doc(**{key: DROP}), f"hl.json: missing field {key!r}. {REBUILD}")
    _refused(headlist_doc(delta=DROP, m_c=DROP), f"hl.json: missing field 'delta'. {REBUILD}")
    doc = headlist_doc()
    del doc["content_hash"]
    _refused(doc, f"hl.json: missing field 'content_hash'. {REBUILD}")


M_C_RANGE = "an integer from 1 to 9223372036854775807"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("epsilon", "4.0", "'4.0' is a string, not a number (numbers are written without quotes); it must be a "
                       "number > 0."),
    ("epsilon", None, "None is null, not a number; it must be a number > 0."),
    ("epsilon", [4.0], "[4.0] is a list, not a number; it must be a number > 0."),
    ("epsilon", {"v": 4}, "{'v': 4} is an object, not a number; it must be a number > 0."),
    ("epsilon", True, "True is a boolean, not a number; it must be a number > 0."),
    ("epsilon", 0, "0 is not allowed: it must be a number > 0."),
    ("epsilon", -(10**400), "-" + "1" + "0" * 55 + "... is not allowed: it must be a number > 0."),
    ("delta", 0.0, "0.0 is not allowed: it must be a number in (0, 1)."),
    ("delta", 1, "1 is not allowed: it must be a number in (0, 1)."),
    ("f_c", 0, "0 is not allowed: it must be a number in (0, 1]."),
    ("f_c", 1.25, "1.25 is not allowed: it must be a number in (0, 1]."),
    ("m_c", 2.0, f"2.0 is not an integer; it must be {M_C_RANGE}."),
    ("m_c", "2", f"'2' is a string, not a number (numbers are written without quotes); it must be {M_C_RANGE}."),
    ("m_c", False, f"False is a boolean, not a number; it must be {M_C_RANGE}."),
    ("m_c", 0, f"0 is not allowed: it must be {M_C_RANGE}."),
    ("m_c", 2**63, f"9223372036854775808 is not allowed: it must be {M_C_RANGE}."),
])
def test_headlist_number_fields(field: str, value: object, message: str) -> None:
    _refused(headlist_doc(**{field: value}), f"hl.json: field {field!r} = {message} {REBUILD}")


@pytest.mark.parametrize(("value", "kind"), [("yes", "a string"), (1, "a number"), (None, "null"), ([], "a list")])
def test_headlist_url_level_must_be_a_boolean(value: object, kind: str) -> None:
    _refused(headlist_doc(url_level=value), f"hl.json: field 'url_level' = {value!r} is {kind}; it must be true or "
                                            f"false. {REBUILD}")


ENTRY = '{"query": "...", "urls": ["...", ...]}'


@pytest.mark.parametrize(("queries", "message"), [
    ({"a": []}, "field 'queries' = {'a': []} is an object; it must be a list of objects " + ENTRY + "."),
    ("a", "field 'queries' = 'a' is a string; it must be a list of objects " + ENTRY + "."),
    ([{"query": "a", "urls": []}, ["b"]], "queries[1] = ['b'] is a list; it must be an object " + ENTRY + "."),
    ([{"urls": []}], "queries[0] has no field 'query'; each entry is " + ENTRY + "."),
    ([{"query": "a", "urls": []}, {"query": "b"}], "queries[1] has no field 'urls'; each entry is " + ENTRY + "."),
    ([{"query": 7, "urls": []}], "queries[0].query = 7 is a number; it must be a string."),
    ([{"query": "\ud800", "urls": []}], "queries[0].query = '\\ud800' holds a lone surrogate, which is not text."),
    ([{"query": "a", "urls": []}, {"query": "b", "urls": []}, {"query": "a", "urls": []}],
     "query 'a' is listed twice (queries[0] and queries[2]); a head list lists each query once."),
    ([{"query": "a", "urls": "u"}], "queries[0].urls = 'u' is a string; it must be a list of strings (empty when "
                                    "the query has no listed URL)."),
    ([{"query": "a", "urls": []}, {"query": "b", "urls": ["u", "v", 5]}],
     "queries[1].urls[2] = 5 is a number; it must be a string."),
    ([{"query": "b", "urls": ["x", "\udfff"]}], "queries[0].urls[1] = '\\udfff' holds a lone surrogate, which is "
                                                "not text."),
    ([{"query": "c", "urls": []}, {"query": "a", "urls": ["u", "v", "w", "v"]}],
     "URL 'v' is listed twice under query 'a' (queries[1].urls[1] and [3])."),
])
def test_headlist_query_list_messages(queries: object, message: str) -> None:
    _refused(headlist_doc(queries=queries), f"hl.json: {message} {REBUILD}")


def test_headlist_the_same_url_under_two_queries_is_fine() -> None:
    doc = headlist_doc(queries=[{"query": "a", "urls": ["u"]}, {"query": "b", "urls": ["u"]}])
    doc["content_hash"] = canonical_hash(doc)
    assert validate_headlist(doc) is doc


def test_headlist_that_cannot_be_hashed() -> None:
    doc = headlist_doc(extra={1, 2})
    _refused(doc, f"hl.json: the document cannot be hashed (Object of type set is not JSON serializable). {REBUILD}")
    loop: list = []
    loop.append(loop)
    _refused(headlist_doc(extra=loop),
             f"hl.json: the document cannot be hashed (Circular reference detected). {REBUILD}")


def test_headlist_hash_mismatch_message() -> None:
    doc = headlist_doc()
    actual = canonical_hash(doc)
    doc["content_hash"] = "sha256:" + "0" * 64
    _refused(doc, "hl.json: field 'content_hash' = 'sha256:" + "0" * 49 + "... does not match the content "
                  f"({actual[:19]}…): the file was altered or damaged after it was written. Use the original file, or "
                  "rebuild the head list.")
    doc["content_hash"] = 17
    _refused(doc, f"hl.json: field 'content_hash' = 17 does not match the content ({actual[:19]}…): the file was "
                  "altered or damaged after it was written. Use the original file, or rebuild the head list.")


def test_headlist_epsilon_too_large_message() -> None:
    """f_C = 1/2, m_C = 1: both exponents are ε/2, so ε may be at most about 2·ln(max float) ≈ 1419.57."""
    for f_c, m_c, eps, shown in [(0.5, 1, 1e308, "1e+308"), (0.5, 1, 10**400, "1" + "0" * 56 + "..."),
                                 (0.25, 3, 1e5, "100000.0")]:
        doc = signed_headlist(epsilon=eps, f_c=f_c, m_c=m_c)
        with pytest.raises(DeviceError) as info:
            validate_headlist(doc, "hl.json")
        pattern = (re.escape(f"hl.json: field 'epsilon' = {shown} is too large: LocalAlg computes e^(f_C·ε/m_C) and "
                             "e^((1−f_C)·ε/m_C), which overflow a float when the exponent passes ln(largest float) = "
                             f"709.78; with f_c = {f_c!r} and m_c = {m_c} epsilon must be at most ")
                   + r"(\S+)" + re.escape(". Rebuild the head list with a smaller --epsilon (beyond about 50 per "
                                          "report LocalAlg reports the true record anyway)."))
        match = re.fullmatch(pattern, str(info.value))
        assert match, str(info.value)
        limit = float(match.group(1))
        # the largest ε that works: e^{max(f_C, 1 − f_C)·ε/m_C} is finite at it and overflows one step above
        bound = m_c * math.log(1.7976931348623157e308) / max(f_c, 1 - f_c)
        assert limit == pytest.approx(bound, rel=1e-13)
        assert validate_headlist(signed_headlist(epsilon=limit, f_c=f_c, m_c=m_c))["epsilon"] == limit
        with pytest.raises(DeviceError, match="is too large"):
            validate_headlist(signed_headlist(epsilon=math.nextafter(limit, math.inf), f_c=f_c, m_c=m_c))


def test_headlist_edges_that_are_accepted() -> None:
    big = signed_headlist(m_c=2**63 - 1, epsilon=1e21)  # 2**63 − 1 is not a float: compared exactly
    assert validate_headlist(big) is big
    assert DeviceHeadList.from_json(big).m_c == 2**63 - 1
    no_level = signed_headlist(url_level=DROP)
    assert DeviceHeadList.from_json(no_level).url_level is True
    assert DeviceHeadList.from_json(signed_headlist(url_level=False)).url_level is False
    huge = signed_headlist(epsilon=800)  # an integer ε is read as a number
    assert validate_headlist(huge) is huge


@pytest.mark.parametrize(("f_c", "m_c"), [(0.02, 1), (0.003, 1), (0.5, 1)])
def test_max_epsilon_is_the_largest_that_works_even_when_the_first_guess_overflows(f_c: float, m_c: int) -> None:
    """For f_C = 0.02 and 0.003 the guess m_C·ln(max float)/max(f_C, 1 − f_C) rounds so that e^{(1−f_C)ε} overflows;
    the answer is stepped down to a float at which LocalAlg's thresholds can be computed, one step above it they
    cannot."""
    limit = max_epsilon(f_c, m_c)
    assert limit == pytest.approx(m_c * math.log(1.7976931348623157e308) / max(f_c, 1 - f_c), rel=1e-14)
    assert DeviceHeadList.from_json(signed_headlist(epsilon=limit, f_c=f_c, m_c=m_c)).one_minus_tq[0] == 0.0
    with pytest.raises(DeviceError, match="is too large"):
        validate_headlist(signed_headlist(epsilon=math.nextafter(limit, math.inf), f_c=f_c, m_c=m_c))


# ----- the content hash: a known-answer test ------------------------------------------------------------------

def test_content_hash_known_answer() -> None:
    """The pinned sha256 of the hand-written canonical text; content_hash must give exactly it
    (unsorted keys, other separators or ASCII escapes would change it), whatever the key order in memory."""
    assert "sha256:" + hashlib.sha256(KAT_CANONICAL.encode("utf-8")).hexdigest() == KAT_HASH
    assert json.loads(KAT_CANONICAL) == kat_doc()
    assert content_hash(kat_doc()) == KAT_HASH
    signed = {**kat_doc(), "content_hash": KAT_HASH}
    assert content_hash(signed) == KAT_HASH  # the hash field itself is left out
    assert validate_headlist(signed) is signed
    with pytest.raises(DeviceError, match="content_hash"):
        validate_headlist({**kat_doc(), "content_hash": KAT_HASH[:-1] + "0"})


def test_content_hash_of_a_lone_surrogate_hashes_its_code_point() -> None:
    """'\\udfff' has no UTF-8 form; it is hashed as the three bytes ED BF BF of its code point (surrogatepass)."""
    canonical = b'{"note":"x\xed\xbf\xbf"}'
    assert content_hash({"note": "x\udfff", "content_hash": "ignored"}) == (
        "sha256:" + hashlib.sha256(canonical).hexdigest())


# ----- LocalAlg's budget split and keep probability ---------------------------------------------------------

def test_budget_split_and_keep_probability_by_hand() -> None:
    # ε = 2, δ = 0.1, f_C = 1/4, m_C = 2: ε' = 1, δ' = 0.05; ε'_Q = 1/4, δ'_Q = 1/80; ε'_U = 3/4, δ'_U = 3/80
    got = budget_split(2.0, 0.1, 0.25, 2)
    assert got == pytest.approx((0.25, 0.0125, 0.75, 0.0375), rel=1e-15)
    # e^ε = 3, δ = 0.1: n = 3 → (3 + 0.05·2)/(3 + 2) = 0.62; n = 2 → 3.05/4; n = 1 and 0 → 1
    ln3 = math.log(3.0)
    assert keep_probability(ln3, 0.1, 3) == pytest.approx(0.62, rel=1e-15)
    assert keep_probability(ln3, 0.1, 2) == pytest.approx(0.7625, rel=1e-15)
    assert keep_probability(ln3, 0.1, 1) == 1.0 and keep_probability(ln3, 0.1, 0) == 1.0
    assert keep_probability(0.0, 0.5, 5) == pytest.approx((1 + 0.25 * 4) / 5, rel=1e-15)

"""The head list with wildcards and its device JSON (ALGORITHM.md §1, §3, §4 mapping, §5 mapping), whose writer
gives the pinned known answer of the wire format."""

from __future__ import annotations

import json

import numpy as np
import pytest

from headlisthelpers import KAT_HASH, canonical_hash, kat_doc
from hybriddp.core.errors import HeadListError
from hybriddp.core.headlist import (
    WILDCARD,
    HeadList,
    from_device_json,
    read_device_json,
    record_keys,
    split_keys,
    validate_device_json,
)
from hybriddp.core.records import NO_URL, ArrayVocabulary
from hybriddp.device.localalg import DeviceHeadList


def test_record_keys_round_trip() -> None:
    q = np.array([0, 5, 2**30, 7])
    u = np.array([3, NO_URL, 2**31 - 1, 0])
    assert all(np.array_equal(a, b) for a, b in zip(split_keys(record_keys(q, u)), (q, u), strict=True))


def test_from_records_groups_urls_and_adds_wildcards() -> None:
    hl = HeadList.from_records(np.array([7, 3, 7, 7, 3]), np.array([10, 4, 11, 10, 5]))
    assert hl.query_ids.tolist() == [3, 7]
    assert hl.k == 3 and hl.kq.tolist() == [3, 3, 1]
    assert hl.entry_url.tolist() == [4, 5, WILDCARD, 10, 11, WILDCARD, WILDCARD]
    assert hl.n_records == 4 and hl.n_entries == 7
    assert hl.wildcard_entry.tolist() == [2, 5, 6]


def test_from_records_without_url_level() -> None:
    hl = HeadList.from_records(np.array([4, 2]), np.array([NO_URL, NO_URL]))
    assert hl.query_ids.tolist() == [2, 4]
    assert hl.kq.tolist() == [1, 1, 1] and hl.n_records == 0


def test_map_records_follows_spec_mapping() -> None:
    hl = HeadList.from_lists([3, 7], [[4, 5], [10]])
    #            in HL     q in, u out  q out    in HL   no URL
    q = np.array([3, 3, 3, 99, 7, 7])
    u = np.array([5, 4, 9, 4, 10, NO_URL])
    entries = hl.map_records(q, u)
    # entries: 0 ⟨3,4⟩ 1 ⟨3,5⟩ 2 ⟨3,*⟩ 3 ⟨7,10⟩ 4 ⟨7,*⟩ 5 ⟨*,*⟩
    assert entries.tolist() == [1, 0, 2, 5, 3, 4]


def test_map_records_with_empty_list_maps_all_to_star() -> None:
    hl = HeadList.from_lists([], [])
    assert hl.k == 1
    assert hl.map_records(np.array([1, 2]), np.array([1, 2])).tolist() == [0, 0]


def _doc() -> dict:
    hl = HeadList.from_lists([1, 0], [[2, 0], []])
    qv = ArrayVocabulary(["bing", "google"])
    uv = ArrayVocabulary(["http://google.com", "unused", "https://www.google.com"])
    return hl.to_device_json(qv, uv, epsilon=4.0, delta=1e-5, f_c=0.85, m_c=1)


def test_device_json_shape_and_round_trip(tmp_path) -> None:
    doc = _doc()
    assert doc["format"] == "hybriddp-headlist" and doc["version"] == 1
    assert doc["queries"] == [{"query": "google", "urls": ["https://www.google.com", "http://google.com"]},
                              {"query": "bing", "urls": []}]
    assert set(doc) == {"format", "version", "epsilon", "delta", "f_c", "m_c", "url_level", "queries",
                        "content_hash"}
    path = tmp_path / "hl.json"
    path.write_text(json.dumps(doc))
    back = read_device_json(path)
    hl, qv, uv = from_device_json(back)
    assert hl.kq.tolist() == [3, 1, 1]
    assert qv.decode(hl.query_ids) == ["google", "bing"]
    assert uv.decode(hl.entry_url[:2]) == ["https://www.google.com", "http://google.com"]
    # the device indexes the same entries in the same order
    dhl = DeviceHeadList.from_json(back)
    assert dhl.kq == hl.kq.tolist()
    assert dhl.encode("google", "http://google.com") == (0, 1)
    assert dhl.encode("google", "http://other") == (0, 2)
    assert dhl.encode("yahoo", None) == (2, 0)


def test_head_list_writer_produces_the_known_answer() -> None:
    """`hybriddp headlist`'s document builder gives the same document and hash."""
    hl = HeadList.from_lists([0, 1], [[0, 1], []])
    doc = hl.to_device_json(ArrayVocabulary(["café", "zürich"]),
                            ArrayVocabulary(["http://a.example/été", "http://b.example/"]),
                            epsilon=4.0, delta=1e-5, f_c=0.85, m_c=1)
    assert doc["content_hash"] == KAT_HASH
    assert {k: v for k, v in doc.items() if k != "content_hash"} == kat_doc()


@pytest.mark.parametrize("mutate", [
    lambda d: d["queries"][0]["urls"].append("http://evil"),
    lambda d: d.update(epsilon=40.0),
    lambda d: d.update(content_hash="sha256:00"),
])
def test_tampered_head_list_is_rejected(tmp_path, mutate) -> None:
    doc = _doc()
    mutate(doc)
    path = tmp_path / "hl.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HeadListError, match="content_hash"):
        read_device_json(path)


def test_wrong_version_and_missing_file(tmp_path) -> None:
    doc = _doc()
    doc["version"] = 2
    path = tmp_path / "hl.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HeadListError, match="version"):
        read_device_json(path)
    with pytest.raises(HeadListError, match="not found"):
        read_device_json(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(HeadListError, match="not valid JSON"):
        read_device_json(tmp_path / "bad.json")


def _map_reference(hl: HeadList, q: np.ndarray, u: np.ndarray) -> list[int]:
    """Per-record reference of ALGORITHM.md §4/§5 mapping (slow, for the tests only)."""
    out = []
    for qq, uu in zip(q.tolist(), u.tolist(), strict=True):
        pos = [i for i, x in enumerate(hl.query_ids.tolist()) if x == qq]
        if not pos:
            out.append(int(hl.wildcard_entry[-1]))
            continue
        lo, hi = int(hl.url_offsets[pos[0]]), int(hl.url_offsets[pos[0] + 1]) - 1
        hits = [e for e in range(lo, hi) if hl.entry_url[e] == uu]
        out.append(hits[0] if hits else hi)
    return out


@pytest.mark.parametrize("big_ids", [False, True])
def test_map_records_dense_and_search_paths_agree_with_reference(big_ids: bool) -> None:
    rng = np.random.default_rng(4)
    offset = 2**40 if big_ids else 0  # huge ids force the binary-search path
    # URL 5 is listed under two queries (shared), URL 9 under one
    hl = HeadList.from_lists(np.array([3, 7, 11]) + offset, [[5, 9], [5, 2], []])
    q = rng.choice(np.array([3, 7, 11, 12, 0]) + offset, size=2000)
    u = rng.choice(np.array([5, 9, 2, 1, NO_URL]), size=2000)
    got = hl.map_records(q, u)
    assert got.tolist() == _map_reference(hl, q, u)
    # a second call with larger ids rebuilds the cached table
    got2 = hl.map_records(np.array([3 + offset, 10**6 + offset]), np.array([9, 9]))
    assert got2.tolist() == [1, int(hl.wildcard_entry[-1])]


# ----- bad head lists: each refusal names the field, the value and the fix -----------------------


def _rehashed(doc: dict, **changes: object) -> dict:
    """``doc`` with ``changes`` and a matching content hash (SHA-256 of the canonical JSON, written
    out here rather than taken from the code under test)."""
    out = {**json.loads(json.dumps(doc)), **changes}
    out["content_hash"] = canonical_hash(out)
    return out


@pytest.mark.parametrize(("changes", "needles"), [
    ({"epsilon": "4.0"}, ["'epsilon' = '4.0' is a string, not a number", "without quotes", "rebuild"]),
    ({"epsilon": float("nan")}, ["'epsilon' = nan is not allowed", "> 0"]),
    ({"epsilon": -1.0}, ["'epsilon' = -1.0 is not allowed"]),
    ({"epsilon": True}, ["'epsilon' = True is a boolean, not a number"]),
    ({"delta": 1.0}, ["'delta' = 1.0 is not allowed", "(0, 1)"]),
    ({"f_c": 0.0}, ["'f_c' = 0.0 is not allowed", "(0, 1]"]),
    ({"f_c": 1.5}, ["'f_c' = 1.5 is not allowed"]),
    ({"m_c": -3}, ["'m_c' = -3 is not allowed", "an integer from 1 to"]),
    ({"m_c": 2.0}, ["'m_c' = 2.0 is not an integer"]),
    ({"m_c": 2**63}, ["'m_c' = 9223372036854775808 is not allowed"]),
    ({"url_level": "yes"}, ["'url_level' = 'yes' is a string", "true or false"]),
    ({"queries": {"google": []}}, ["'queries' = {'google': []} is an object", "a list of objects"]),
    ({"queries": [{"query": "a", "urls": []}, {"query": "a", "urls": []}]},
     ["query 'a' is listed twice (queries[0] and queries[1])"]),
    ({"queries": [{"query": "a", "urls": ["u", "v", "u"]}]},
     ["URL 'u' is listed twice under query 'a'", "[0] and [2]"]),
    ({"queries": [{"query": "a", "urls": [["nested", {"junk": 1}]]}]}, ["queries[0].urls[0] = [", "is a list"]),
    ({"queries": [{"query": 7, "urls": []}]}, ["queries[0].query = 7 is a number; it must be a string"]),
    ({"queries": [{"query": "a"}]}, ["queries[0] has no field 'urls'"]),
    ({"queries": ["a"]}, ["queries[0] = 'a' is a string; it must be an object"]),
    ({"version": True}, ["'version' = True", "understands version 1"]),
])
def test_bad_field_is_named_with_value_and_fix(changes: dict, needles: list[str]) -> None:
    doc = _rehashed(_doc(), **changes)
    with pytest.raises(HeadListError) as info:
        validate_device_json(doc, "hl.json")
    message = str(info.value)
    assert message.startswith("hl.json: ") and "\n" not in message
    for needle in needles:
        assert needle in message, message
    assert "out of range" not in message  # the old catch-all that printed '4.0' like a number


def test_missing_field_and_wrong_hash() -> None:
    doc = _doc()
    del doc["m_c"]
    with pytest.raises(HeadListError, match="missing field 'm_c'"):
        validate_device_json(doc)
    doc = _rehashed(_doc())
    doc["content_hash"] = "sha256:" + "0" * 64
    with pytest.raises(HeadListError, match=r"'content_hash' = 'sha256:0000.*does not match the content"):
        validate_device_json(doc)


@pytest.mark.parametrize(("f_c", "m_c"), [(0.85, 1), (0.5, 1), (1.0, 3), (0.1, 2)])
def test_epsilon_so_large_that_exp_overflows_is_refused_with_the_largest_that_works(f_c: float, m_c: int) -> None:
    import math
    import sys

    # LocalAlg computes e^(f_C·ε/m_C) and e^((1−f_C)·ε/m_C): both exponents must stay ≤ ln(max float)
    expected = m_c * math.log(sys.float_info.max) / max(f_c, 1 - f_c)
    with pytest.raises(HeadListError, match="too large") as info:
        validate_device_json(_rehashed(_doc(), epsilon=1e308, f_c=f_c, m_c=m_c))
    message = str(info.value)
    assert "e^(f_C·ε/m_C)" in message and "--epsilon" in message
    largest = float(message.split("epsilon must be at most ")[1].split(". ")[0])
    assert largest == pytest.approx(expected, rel=1e-12)
    dhl = DeviceHeadList.from_json(_rehashed(_doc(), epsilon=largest, f_c=f_c, m_c=m_c))
    assert dhl.one_minus_t == 0.0  # works, and at this ε LocalAlg keeps every record
    with pytest.raises(HeadListError, match="too large"):
        validate_device_json(_rehashed(_doc(), epsilon=largest * (1 + 1e-12), f_c=f_c, m_c=m_c))
    with pytest.raises(HeadListError, match="too large"):
        validate_device_json(_rehashed(_doc(), epsilon=10**400, f_c=f_c, m_c=m_c))


@pytest.mark.parametrize(("data", "needle"), [
    (b"", "is empty"),
    (b"\xff\xfe{}", "byte 0 is 0xff, which is not UTF-8"),
    (b"[]", "expected a JSON object"),
    (b'{"format": "hybriddp-headlist", "version": 1, "epsilon": ', "not valid JSON"),
])
def test_head_list_file_problems(tmp_path, data: bytes, needle: str) -> None:
    path = tmp_path / "hl.json"
    path.write_bytes(data)
    with pytest.raises(HeadListError, match=needle):
        read_device_json(path)
    with pytest.raises(HeadListError, match="is a directory"):
        read_device_json(tmp_path)

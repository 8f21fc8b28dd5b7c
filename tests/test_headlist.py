"""The head list with wildcards and its device JSON (ALGORITHM.md §1, §3, §4 mapping, §5 mapping), whose writer
gives the pinned known answer of the wire format."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest

from headlisthelpers import KAT_HASH, canonical_hash, kat_doc
from hybriddp.core.counting import NumpyBackend
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
from hybriddp.core.noise import DiscreteLaplaceNoise
from hybriddp.core.records import NO_URL, ArrayVocabulary
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.curator.kept import KeptCount
from hybriddp.curator.mechanisms import (
    create_head_list,
    create_head_list_with_counts,
    estimate_optin_probabilities,
    reuse_s,
)
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


# ----- CreateHeadList's released counts, carried records, and the opt-in estimates with S reused, by hand ---------
# (ALGORITHM.md §3, §3.3, §4, §4.1, §13.1). The noise is scripted: the discrete noise's τ_d = 7 and variance at
# ε = 4, m_O = 1 (t = 1/2) are kept, its draws are given, so every number below is worked out from the document.

EPS, DELTA = 4.0, 1e-5
Q_DISC = math.exp(-2.0)  # q = e^(−1/t), t = 1/2
VAR_Y = 2 * Q_DISC / (1 - Q_DISC) ** 2  # Var Y of one discrete Laplace draw (ALGORITHM.md §3.2): 0.3620


class _ScriptedDiscrete(DiscreteLaplaceNoise):
    """Discrete Laplace noise whose draws are given by ``draws(size)`` (τ_d and Var Y are the real ones)."""

    def __init__(self, draws: Callable[[int], np.ndarray]) -> None:
        super().__init__(np.random.default_rng(0))
        self.draws = draws

    def sample(self, scale: float, size: int) -> np.ndarray:
        assert scale == 0.5  # b = 2·m_O/ε
        return np.asarray(self.draws(size), dtype=np.float64)


def _log(*groups: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Records ⟨q,u⟩ repeated ``times``, from (q, u, times) groups."""
    q = np.concatenate([np.full(n, qq, dtype=np.int64) for qq, _, n in groups])
    u = np.concatenate([np.full(n, uu, dtype=np.int64) for _, uu, n in groups])
    return q, u


def _hand_estimates() -> OptinEstimates:
    """D_S: ⟨1,10⟩×9, ⟨1,11⟩×12, ⟨2,20⟩×8, ⟨3,30⟩×2 (|D_S| = 31), every S draw +1: noisy 10, 13, 9, 3 against
    τ_d = 7 lists ⟨1,10⟩, ⟨1,11⟩, ⟨2,20⟩. D_T: ⟨1,10⟩×3, ⟨1,11⟩, ⟨1,12⟩ (→ ⟨1,*⟩), ⟨2,20⟩×2, ⟨5,50⟩×3 (→ ⟨*,*⟩),
    |D_T| = 10, T draws per HL_S entry 0, +1, 0, −1, 0, 0: p̂ = .3, .2, .1, .1, 0, .3. M = 3 keeps all three."""
    hl_s, s_counts = create_head_list_with_counts(*_log((1, 10, 9), (1, 11, 12), (2, 20, 8), (3, 30, 2)),
                                                  epsilon=EPS, delta=DELTA, m_o=1,
                                                  noise=_ScriptedDiscrete(lambda n: np.ones(n)))
    t_noise = _ScriptedDiscrete(lambda n: np.array([0.0, 1.0, 0.0, -1.0, 0.0, 0.0]))
    return estimate_optin_probabilities(*_log((1, 10, 3), (1, 11, 1), (1, 12, 1), (2, 20, 2), (5, 50, 3)), hl_s,
                                        epsilon=EPS, m_o=1, head_list_size=3, noise=t_noise, s_counts=s_counts,
                                        n_s=31)


def test_create_head_list_with_counts_releases_the_noisy_count_that_passed_tau_by_hand() -> None:
    """§3/§3.3: a record is listed iff N + Y > τ_d = 7, and its released count is exactly N + Y (wildcards: NaN)."""
    hl, s_counts = create_head_list_with_counts(*_log((1, 10, 9), (1, 11, 12), (2, 20, 8), (3, 30, 2)),
                                                epsilon=EPS, delta=DELTA, m_o=1,
                                                noise=_ScriptedDiscrete(lambda n: np.ones(n)))
    assert hl.query_ids.tolist() == [1, 2]
    assert hl.entry_url.tolist() == [10, 11, WILDCARD, 20, WILDCARD, WILDCARD]
    assert np.array_equal(s_counts, [10.0, 13.0, np.nan, 9.0, np.nan, np.nan], equal_nan=True)


def test_create_head_list_with_carry_lists_the_union_and_releases_no_count_for_carried_records() -> None:
    """§13.1: carried records join the list whatever S says, with no S count (NaN); a carried record S also listed
    keeps the count that listed it. S: ⟨1,10⟩×9, ⟨1,11⟩×3, ⟨2,20⟩×8, draws +1 → 10, 4, 9 against τ_d = 7."""
    carry = (np.array([1, 2, 3]), np.array([11, 20, 30]))  # ⟨1,11⟩ failed τ, ⟨2,20⟩ passed, ⟨3,30⟩ not in D_S
    hl, s_counts = create_head_list_with_counts(*_log((1, 10, 9), (1, 11, 3), (2, 20, 8)), epsilon=EPS,
                                                delta=DELTA, m_o=1, noise=_ScriptedDiscrete(lambda n: np.ones(n)),
                                                carry=carry)
    assert hl.query_ids.tolist() == [1, 2, 3]
    assert hl.entry_url.tolist() == [10, 11, WILDCARD, 20, WILDCARD, 30, WILDCARD, WILDCARD]
    assert np.array_equal(s_counts, [10.0, np.nan, np.nan, 9.0, np.nan, np.nan, np.nan, np.nan], equal_nan=True)


def test_create_head_list_counts_with_the_backend_it_is_given() -> None:
    """The ``backend`` argument (e.g. Spark's) is the one that counts D_S; the list is the same as the default's."""
    calls: list[int] = []

    class Recording(NumpyBackend):
        def count_distinct(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            calls.append(len(keys))
            return super().count_distinct(keys)

    q, u = _log((1, 10, 9), (2, 20, 3))
    hl = create_head_list(q, u, epsilon=EPS, delta=DELTA, m_o=1, noise=_ScriptedDiscrete(lambda n: np.zeros(n)),
                          backend=Recording())
    assert calls == [12]
    assert hl.query_ids.tolist() == [1] and hl.entry_url.tolist() == [10, WILDCARD, WILDCARD]


def test_optin_estimates_remember_s_counts_of_kept_records_by_hand() -> None:
    """§4 then §4.1: the T estimates of the hand log (final order q1: 10, 11, *; q2: 20, *; *), each kept record
    carrying the S count that listed it and |D_S|; nothing is reused yet."""
    est = _hand_estimates()
    assert est.head_list.query_ids.tolist() == [1, 2]
    assert est.head_list.entry_url.tolist() == [10, 11, WILDCARD, 20, WILDCARD, WILDCARD]
    assert est.p_record == pytest.approx([0.3, 0.2, 0.1, 0.1, 0.0, 0.3], abs=1e-12)
    assert np.array_equal(est.s_counts, [10.0, 13.0, np.nan, 9.0, np.nan, np.nan], equal_nan=True)
    assert est.n == 10 and est.n_s == 31 and est.reused is None


def test_reuse_s_pools_s_and_t_by_hand() -> None:
    """§4.1: a reused record is (N̂_S + N̂_T)/(|D_S| + |D_T|) with J = 2 and variance p(1−p)/(n−1) + 2V/(n(n−1)),
    n = 41; wildcards stay T's (J = 1, n = 10); queries sum their entries; S's counts stay with the estimates."""
    est = reuse_s(_hand_estimates())
    expected = np.array([(3 + 10) / 41, (2 + 13) / 41, 0.1, (1 + 9) / 41, 0.0, 0.3])
    assert est.p_record == pytest.approx(expected, abs=1e-12)
    assert est.draws_record.tolist() == [2, 2, 1, 2, 1, 1]
    assert est.reused is not None and est.reused.tolist() == [True, True, False, True, False, False]
    assert est.p_query == pytest.approx([expected[:3].sum(), expected[3:5].sum(), 0.3], abs=1e-12)
    assert est.draws_query.tolist() == [5, 3, 1]
    assert est.n == 10 and est.n_s == 31 and est.kept is None
    assert np.array_equal(est.s_counts, [10.0, 13.0, np.nan, 9.0, np.nan, np.nan], equal_nan=True)
    n_rec = np.array([41, 41, 10, 41, 10, 10], dtype=np.float64)
    j = np.array([2, 2, 1, 2, 1, 1])
    pc = np.clip(expected, 0, 1)
    var = pc * (1 - pc) / (n_rec - 1) + j * VAR_Y / (n_rec * (n_rec - 1))
    assert est.var_record == pytest.approx(var, rel=1e-12)
    assert est.noise_variance == pytest.approx(VAR_Y, rel=1e-12)


def test_reuse_s_is_idempotent() -> None:
    """§4.1: estimates that already reuse S come back unchanged (S is not counted twice)."""
    once = reuse_s(_hand_estimates())
    assert reuse_s(once) is once
    assert once.draws_record.tolist() == [2, 2, 1, 2, 1, 1]


def test_reuse_s_with_kept_pools_the_count_corrected_for_tau() -> None:
    """§4.1 "Reusing S given τ": with the correction, the pooled count is X̃(X), whose values ALGORITHM.md gives at
    ε = 4, m_O = 1: X̃(9) = 8.84, X̃(10) = 9.98, X̃(13) = 13; the correction is kept with the estimates."""
    kept = KeptCount(threshold=7.0, discrete=True, scale=0.5, n_s=31)
    est = reuse_s(_hand_estimates(), kept)
    expected = np.array([(3 + 9.98) / 41, (2 + 13) / 41, 0.1, (1 + 8.84) / 41, 0.0, 0.3])
    assert est.p_record == pytest.approx(expected, abs=0.006 / 41)
    assert est.kept is kept
    assert est.reused is not None and est.reused.tolist() == [True, True, False, True, False, False]
    assert est.draws_record.tolist() == [2, 2, 1, 2, 1, 1]
    assert np.array_equal(est.s_counts, [10.0, 13.0, np.nan, 9.0, np.nan, np.nan], equal_nan=True)


def test_reuse_s_divides_by_ds_plus_dt_with_one_s_record_and_empty_t() -> None:
    """§4.1 at the edge |D_S| = 1, |D_T| = 0: the one record of S (1 + 7 = 8 > τ_d) is estimated as 8/(1 + 0)."""
    hl_s, s_counts = create_head_list_with_counts(np.array([1]), np.array([10]), epsilon=EPS, delta=DELTA, m_o=1,
                                                  noise=_ScriptedDiscrete(lambda n: np.full(n, 7.0)))
    empty = np.array([], dtype=np.int64)
    est = estimate_optin_probabilities(empty, empty, hl_s, epsilon=EPS, m_o=1, head_list_size=1,
                                       noise=_ScriptedDiscrete(lambda n: np.zeros(n)), s_counts=s_counts, n_s=1)
    pooled = reuse_s(est)
    assert pooled.p_record.tolist() == [8.0, 0.0, 0.0]


def test_reuse_s_refuses_estimates_made_without_s_counts() -> None:
    """Estimates made without S's counts remember none (s_counts None, n_s 0 even if n_s is given), and reuse_s
    refuses them with a message naming the fix."""
    q, u = _log((1, 10, 3), (2, 20, 2))
    hl = HeadList.from_lists([1, 2], [[10], [20]])
    for kw in ({}, {"n_s": 30}):
        est = estimate_optin_probabilities(q, u, hl, epsilon=EPS, m_o=1, head_list_size=2,
                                           noise=_ScriptedDiscrete(lambda n: np.zeros(n)), **kw)
        assert est.s_counts is None and est.n_s == 0
        with pytest.raises(ValueError) as info:
            reuse_s(est)
        assert str(info.value) == ("these opt-in estimates were made without S's counts (pass s_counts to "
                                   "estimate_optin_probabilities)")


def test_optin_estimates_n_s_defaults_to_zero() -> None:
    """n_s = |D_S| is 0 unless given, even with S's counts: reuse then pools over |D_T| alone."""
    q, u = _log((1, 10, 3), (2, 20, 2))
    hl = HeadList.from_lists([1, 2], [[10], [20]])
    s_counts = np.array([12.0, np.nan, 9.0, np.nan, np.nan])
    est = estimate_optin_probabilities(q, u, hl, epsilon=EPS, m_o=1, head_list_size=2,
                                       noise=_ScriptedDiscrete(lambda n: np.zeros(n)), s_counts=s_counts)
    assert est.n_s == 0
    assert reuse_s(est).p_record[0] == pytest.approx((3 + 12) / 5, abs=1e-12)


# HL_S for trimming: q1: 10, 11, 12 (⟨1,12⟩ carried: no S count); q2: 20. |D_S| = 30; D_T: ⟨1,11⟩×5, ⟨1,12⟩×4,
# ⟨2,20⟩, |D_T| = 10, no T noise.
RANK_S_COUNTS = np.array([20.0, 9.0, np.nan, np.nan, 10.0, np.nan, np.nan])


def _rank_estimates(rank_with_s: bool) -> OptinEstimates:
    hl_s = HeadList.from_lists([1, 2], [[10, 11, 12], [20]])
    return estimate_optin_probabilities(*_log((1, 11, 5), (1, 12, 4), (2, 20, 1)), hl_s, epsilon=EPS, m_o=1,
                                        head_list_size=3, noise=_ScriptedDiscrete(lambda n: np.zeros(n)),
                                        s_counts=RANK_S_COUNTS, n_s=30, rank_with_s=rank_with_s)


def test_rank_with_s_trims_by_the_pooled_estimate_by_hand() -> None:
    """§4.1: with rank_with_s, the M = 3 records kept are those with the largest S ∪ T estimate (N_S + N_T)/40:
    ⟨1,10⟩ .5, ⟨1,11⟩ .35, ⟨2,20⟩ .275, and a carried record's is T's alone: ⟨1,12⟩ .4. So ⟨2,20⟩ is trimmed, q2
    keeps nothing and folds into ⟨*,*⟩; the final order is still T's (11 .5, 12 .4, 10 0)."""
    est = _rank_estimates(True)
    assert est.head_list.query_ids.tolist() == [1]
    assert est.head_list.entry_url.tolist() == [11, 12, 10, WILDCARD, WILDCARD]
    assert est.p_record == pytest.approx([0.5, 0.4, 0.0, 0.0, 0.1], abs=1e-12)
    assert est.draws_record.tolist() == [1, 1, 1, 1, 3]
    assert np.array_equal(est.s_counts, [9.0, np.nan, 20.0, np.nan, np.nan], equal_nan=True)
    assert est.n_s == 30


def test_without_rank_with_s_trimming_is_by_t_alone() -> None:
    """§4 step 3: T's estimates .5 (⟨1,11⟩), .4 (⟨1,12⟩), .1 (⟨2,20⟩), 0 (⟨1,10⟩) keep the first three."""
    est = _rank_estimates(False)
    assert est.head_list.query_ids.tolist() == [1, 2]
    assert est.head_list.entry_url.tolist() == [11, 12, WILDCARD, 20, WILDCARD, WILDCARD]
    assert est.p_record == pytest.approx([0.5, 0.4, 0.0, 0.1, 0.0, 0.0], abs=1e-12)
    assert est.draws_record.tolist() == [1, 1, 2, 1, 1, 1]


def test_rank_with_s_without_s_counts_is_refused() -> None:
    """rank_with_s needs S's counts; the refusal says so."""
    hl_s = HeadList.from_lists([1], [[10]])
    with pytest.raises(ValueError) as info:
        estimate_optin_probabilities(np.array([1]), np.array([10]), hl_s, epsilon=EPS, m_o=1, head_list_size=1,
                                     noise=_ScriptedDiscrete(lambda n: np.zeros(n)), rank_with_s=True)
    assert str(info.value) == "rank_with_s needs S's counts (s_counts)"

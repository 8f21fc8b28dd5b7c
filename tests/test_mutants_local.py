"""The local randomizers (device LocalAlg, its head-list checks, the numeric randomizer) with replayed uniforms
and whole messages: issue 14's mutation survivors of device.py, randomizer.py and mean_device.py.

Expected values are worked out by hand from ALGORITHM.md §5 and §11 (the Laplace draw −ln(1 − U) with a
fair sign, the clamp, the log density −|r − x̃|/b − ln 2b), and head-list hashes are computed here with
hashlib from the canonical JSON, not with the code under test.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math

import pytest

from clihelpers import exact_message
from hybriddp.device import DeviceError, DeviceHeadList, UniformReplay, validate_headlist
from hybriddp.errors import ParameterError
from hybriddp.mean_device import NumericRandomizer, clamp, laplace, output_log_density, randomize_value

LN2 = math.log(2.0)
REBUILD = "Use the head list exactly as `hybriddp headlist` wrote it, or rebuild it."


# ----- mean_device: the Laplace draw, the clamp, the density ------------------------------------------------

@pytest.mark.parametrize(("u_sign", "u_mag", "expected"), [
    (0.25, 0.75, -2.0 * 2 * LN2),  # U < 1/2: negative; −ln(1 − 3/4) = ln 4
    (0.4999, 0.5, -2.0 * LN2),
    (0.5, 0.75, 2.0 * 2 * LN2),  # U = 1/2 is the positive half
    (0.9999, 0.5, 2.0 * LN2),
    (0.1, 0.0, 0.0),  # −ln 1 = 0
])
def test_laplace_draw_by_hand(u_sign: float, u_mag: float, expected: float) -> None:
    got = laplace(2.0, UniformReplay([u_sign, u_mag]))
    assert got == pytest.approx(expected, rel=1e-15, abs=0.0)


def test_clamp_edges_and_types() -> None:
    for value, lower, upper, expected in [(2, 0, 5, (2.0, False)), (0, 0, 5, (0.0, False)), (5, 0, 5, (5.0, False)),
                                          (-1, 0, 5, (0.0, True)), (7, 0, 5, (5.0, True)),
                                          (-0.5, -0.5, 0.5, (-0.5, False)), (0.5000001, -0.5, 0.5, (0.5, True))]:
        got = clamp(value, lower, upper)
        assert got == expected and type(got[0]) is float


@pytest.mark.parametrize(("report", "value", "expected"), [
    (3.0, 1.0, -1.0 - 2 * LN2),  # b = (2 − 0)/1 = 2: −|3 − 1|/2 − ln 4
    (3.0, 5.0, -0.5 - 2 * LN2),  # 5 clamps to 2
    (3.0, -1.0, -1.5 - 2 * LN2),  # −1 clamps to 0
    (-1.0, 1.0, -1.0 - 2 * LN2),
    (1.0, 1.0, -2 * LN2),
])
def test_output_log_density_by_hand(report: float, value: float, expected: float) -> None:
    got = output_log_density(report, value, lower=0.0, upper=2.0, epsilon=1.0)
    assert got == pytest.approx(expected, rel=1e-15)


def test_output_log_density_other_scale_and_checks() -> None:
    # [−1, 3], ε = 2: b = 2; r = 0, x = 1: −1/2 − ln 4.  [1, 2], ε = 4: b = 1/4; r = 2, x = 1.5: −2 − ln(1/2)
    assert output_log_density(0.0, 1.0, lower=-1.0, upper=3.0, epsilon=2.0) == pytest.approx(-0.5 - 2 * LN2)
    assert output_log_density(2.0, 1.5, lower=1.0, upper=2.0, epsilon=4.0) == pytest.approx(-2.0 + LN2)
    with pytest.raises(ParameterError, match=exact_message(
            "upper = 0.0 is not allowed: it must be > lower = 1.0. Give the range [lower, upper] the values are "
            "known to lie in.")):
        output_log_density(0.0, 0.0, lower=1.0, upper=0.0, epsilon=1.0)


# ----- mean_device: parameter checks, messages whole ------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lower": True}, "lower = True is not allowed: it must be a finite number."),
    ({"lower": "0"}, "lower = '0' is not allowed: it must be a finite number."),
    ({"lower": None}, "lower = None is not allowed: it must be a finite number."),
    ({"lower": -math.inf}, "lower = -inf is not allowed: it must be a finite number."),
    ({"upper": False}, "upper = False is not allowed: it must be a finite number."),
    ({"upper": math.nan}, "upper = nan is not allowed: it must be a finite number."),
    ({"upper": math.inf}, "upper = inf is not allowed: it must be a finite number."),
    ({"upper": [1]}, "upper = [1] is not allowed: it must be a finite number."),
    ({"lower": 1, "upper": 1}, "upper = 1 is not allowed: it must be > lower = 1. Give the range [lower, upper] "
                               "the values are known to lie in."),
    ({"lower": 2.5, "upper": 1.0}, "upper = 1.0 is not allowed: it must be > lower = 2.5. Give the range "
                                   "[lower, upper] the values are known to lie in."),
    ({"epsilon": True}, "epsilon = True is not allowed: it must be a finite number > 0."),
    ({"epsilon": "1"}, "epsilon = '1' is not allowed: it must be a finite number > 0."),
    ({"epsilon": 0}, "epsilon = 0 is not allowed: it must be a finite number > 0."),
    ({"epsilon": -0.5}, "epsilon = -0.5 is not allowed: it must be a finite number > 0."),
    ({"epsilon": math.inf}, "epsilon = inf is not allowed: it must be a finite number > 0."),
    ({"epsilon": math.nan}, "epsilon = nan is not allowed: it must be a finite number > 0."),
])
def test_numeric_randomizer_refuses_settings(kwargs: dict, message: str) -> None:
    setting = {"lower": 0.0, "upper": 1.0, "epsilon": 1.0, **kwargs}
    with pytest.raises(ParameterError, match=exact_message(message)):
        NumericRandomizer(**setting)


def test_numeric_randomizer_accepts_the_edges_and_stores_floats() -> None:
    r = NumericRandomizer(lower=0, upper=math.nextafter(0.0, 1.0), epsilon=5e-324)  # lower < upper by one step
    assert (r.lower, r.upper, r.epsilon) == (0.0, 5e-324, 5e-324)
    r = NumericRandomizer(lower=-1, upper=3, epsilon=2)
    assert all(type(v) is float for v in (r.lower, r.upper, r.epsilon)) and (r.lower, r.upper, r.epsilon) == (
        -1.0, 3.0, 2.0)
    assert r.scale == 2.0  # (3 − (−1))/2
    assert NumericRandomizer(lower=1.0, upper=2.0, epsilon=4.0).scale == 0.25
    assert r.clamped == 0


def test_numeric_randomizer_by_hand(caplog: pytest.LogCaptureFixture) -> None:
    """[−1, 3], ε = 2 (b = 2) with replayed uniforms: report = clamp(x) ± 2·(−ln(1 − U))."""
    src = UniformReplay([0.25, 0.75, 0.5, 0.5, 0.6, 0.0, 0.7, 0.5, 0.1, 0.75, 0.5, 0.0])
    r = NumericRandomizer(lower=-1, upper=3, epsilon=2, source=src)
    with caplog.at_level(logging.WARNING, logger="hybriddp.mean_device"):
        assert r.randomize(1) == pytest.approx(1.0 - 4 * LN2, rel=1e-15)
        assert r.clamped == 0
        assert r.randomize(5.0) == pytest.approx(3.0 + 2 * LN2, rel=1e-15)  # clamped to 3
        assert r.clamped == 1
        got = r.randomize(-1)  # on the edge: not clamped
        assert got == -1.0 and type(got) is float
        assert r.randomize(3.0) == pytest.approx(3.0 + 2 * LN2, rel=1e-15)
        assert r.clamped == 1
        assert r.randomize(-1.5) == pytest.approx(-1.0 - 4 * LN2, rel=1e-15)  # clamped to −1
        assert r.clamped == 2
    assert [(rec.levelname, rec.getMessage()) for rec in caplog.records] == [
        ("WARNING", "a value outside [-1, 3] was clamped before randomizing (1 so far on this device)"),
        ("WARNING", "a value outside [-1, 3] was clamped before randomizing (2 so far on this device)"),
    ]
    assert r.randomize(0.0) == 0.0  # (0.5, 0.0): +0


@pytest.mark.parametrize(("value", "shown"), [(True, "True"), ("1.0", "'1.0'"), (None, "None"), (math.nan, "nan"),
                                               ([1.0], "[1.0]")])
def test_numeric_randomizer_refuses_values(value: object, shown: str) -> None:
    r = NumericRandomizer(lower=0, upper=1, epsilon=1, source=UniformReplay([]))
    with pytest.raises(ParameterError, match=exact_message(
            f"value = {shown} is not allowed: it must be a number (NaN is not allowed).")):
        r.randomize(value)  # type: ignore[arg-type]
    assert r.clamped == 0


def test_randomize_value_uses_the_source_given() -> None:
    # [0, 4], ε = 1/2: b = 8; x = 1, uniforms (0.25, 0.5): 1 − 8 ln 2
    got = randomize_value(1, lower=0, upper=4, epsilon=0.5, source=UniformReplay([0.25, 0.5]))
    assert got == pytest.approx(1.0 - 8 * LN2, rel=1e-15)
    assert randomize_value(9, lower=0, upper=4, epsilon=0.5, source=UniformReplay([0.5, 0.0])) == 4.0
    with pytest.raises(ParameterError, match=exact_message("epsilon = 0 is not allowed: it must be a finite number "
                                                           "> 0.")):
        randomize_value(1, lower=0, upper=4, epsilon=0, source=UniformReplay([]))


# ----- device: the head-list checks, messages whole -----------------------------------------------------------

def _hash(doc: dict) -> str:
    """sha256 of the canonical JSON (keys sorted, no spaces, UTF-8) without the content_hash field."""
    body = {k: v for k, v in doc.items() if k != "content_hash"}
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                 ensure_ascii=False).encode("utf-8")).hexdigest()


def _doc(**fields: object) -> dict:
    doc = {"format": "hybriddp-headlist", "version": 1, "epsilon": 4.0, "delta": 1e-5, "f_c": 0.85, "m_c": 1,
           "url_level": True, "queries": [{"query": "a", "urls": ["u", "v"]}, {"query": "b", "urls": []}]}
    doc.update(fields)
    doc = {k: v for k, v in doc.items() if v is not _DROP}
    doc["content_hash"] = "sha256:unchecked"  # the checks below fail before the hash is compared
    return doc


_DROP = object()


def _refused(doc: object, message: str) -> None:
    with pytest.raises(DeviceError, match=exact_message(message)):
        validate_headlist(doc, "hl.json")


@pytest.mark.parametrize(("doc", "found"), [([1], "a list"), (None, "null"), ("{}", "a string"), (3, "a number")])
def test_headlist_not_an_object(doc: object, found: str) -> None:
    _refused(doc, f"hl.json: expected a JSON object (a head list written by `hybriddp headlist`), found {found}")


def test_headlist_format_and_version_messages() -> None:
    fmt = "expected 'hybriddp-headlist': this is not a head list written by `hybriddp headlist`"
    _refused(_doc(format="hybriddp-headlisT"), f"hl.json: field 'format' = 'hybriddp-headlisT', {fmt}")
    _refused(_doc(format=_DROP), f"hl.json: field 'format' = None, {fmt}")
    for version, shown in [(2, "2"), (0, "0"), (True, "True"), ("1", "'1'"), (1.0, "1.0"), (_DROP, "None")]:
        _refused(_doc(version=version), f"hl.json: field 'version' = {shown}; this reader understands version 1. "
                                        "Upgrade hybriddp or rebuild the head list.")
    with pytest.raises(DeviceError, match=exact_message("head list: field 'version' = 2; this reader understands "
                                                        "version 1. Upgrade hybriddp or rebuild the head list.")):
        validate_headlist(_doc(version=2))  # the default source name


def test_headlist_missing_fields_in_order() -> None:
    for key in ("epsilon", "delta", "f_c", "m_c", "queries"):
        _refused(_doc(**{key: _DROP}), f"hl.json: missing field {key!r}. {REBUILD}")
    _refused(_doc(delta=_DROP, m_c=_DROP), f"hl.json: missing field 'delta'. {REBUILD}")
    doc = _doc()
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
    _refused(_doc(**{field: value}), f"hl.json: field {field!r} = {message} {REBUILD}")


@pytest.mark.parametrize(("value", "kind"), [("yes", "a string"), (1, "a number"), (None, "null"), ([], "a list")])
def test_headlist_url_level_must_be_a_boolean(value: object, kind: str) -> None:
    _refused(_doc(url_level=value), f"hl.json: field 'url_level' = {value!r} is {kind}; it must be true or false. "
                                    f"{REBUILD}")


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
    _refused(_doc(queries=queries), f"hl.json: {message} {REBUILD}")


def test_headlist_the_same_url_under_two_queries_is_fine() -> None:
    doc = _doc(queries=[{"query": "a", "urls": ["u"]}, {"query": "b", "urls": ["u"]}])
    doc["content_hash"] = _hash(doc)
    assert validate_headlist(doc) is doc


def test_headlist_that_cannot_be_hashed() -> None:
    doc = _doc(extra={1, 2})
    _refused(doc, f"hl.json: the document cannot be hashed (Object of type set is not JSON serializable). {REBUILD}")
    loop: list = []
    loop.append(loop)
    _refused(_doc(extra=loop), f"hl.json: the document cannot be hashed (Circular reference detected). {REBUILD}")


def test_headlist_hash_mismatch_message() -> None:
    doc = _doc()
    actual = _hash(doc)
    doc["content_hash"] = "sha256:" + "0" * 64
    _refused(doc, "hl.json: field 'content_hash' = 'sha256:" + "0" * 49 + "... does not match the content "
                  f"({actual[:19]}…): the file was altered or damaged after it was written. Use the original file, or "
                  "rebuild the head list.")
    doc["content_hash"] = 17
    _refused(doc, f"hl.json: field 'content_hash' = 17 does not match the content ({actual[:19]}…): the file was "
                  "altered or damaged after it was written. Use the original file, or rebuild the head list.")


def _signed(**fields: object) -> dict:
    doc = _doc(**fields)
    doc["content_hash"] = _hash(doc)
    return doc


def test_headlist_epsilon_too_large_message() -> None:
    """f_C = 1/2, m_C = 1: both exponents are ε/2, so ε may be at most about 2·ln(max float) ≈ 1419.57."""
    import re

    for f_c, m_c, eps, shown in [(0.5, 1, 1e308, "1e+308"), (0.5, 1, 10**400, "1" + "0" * 56 + "..."),
                                 (0.25, 3, 1e5, "100000.0")]:
        doc = _signed(epsilon=eps, f_c=f_c, m_c=m_c)
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
        assert validate_headlist(_signed(epsilon=limit, f_c=f_c, m_c=m_c))["epsilon"] == limit
        with pytest.raises(DeviceError, match="is too large"):
            validate_headlist(_signed(epsilon=math.nextafter(limit, math.inf), f_c=f_c, m_c=m_c))


def test_headlist_edges_that_are_accepted() -> None:
    big = _signed(m_c=2**63 - 1, epsilon=1e21)  # 2**63 − 1 is not a float: compared exactly
    assert validate_headlist(big) is big
    assert DeviceHeadList.from_json(big).m_c == 2**63 - 1
    no_level = _signed(url_level=_DROP)
    assert DeviceHeadList.from_json(no_level).url_level is True
    assert DeviceHeadList.from_json(_signed(url_level=False)).url_level is False
    huge = _signed(epsilon=800)  # an integer ε is read as a number
    assert validate_headlist(huge) is huge


# ----- device: LocalAlg's arithmetic and draws with replayed uniforms ------------------------------------------

def test_budget_split_and_keep_probability_by_hand() -> None:
    from hybriddp.device import budget_split, keep_probability

    # ε = 2, δ = 0.1, f_C = 1/4, m_C = 2: ε' = 1, δ' = 0.05; ε'_Q = 1/4, δ'_Q = 1/80; ε'_U = 3/4, δ'_U = 3/80
    got = budget_split(2.0, 0.1, 0.25, 2)
    assert got == pytest.approx((0.25, 0.0125, 0.75, 0.0375), rel=1e-15)
    # e^ε = 3, δ = 0.1: n = 3 → (3 + 0.05·2)/(3 + 2) = 0.62; n = 2 → 3.05/4; n = 1 and 0 → 1
    ln3 = math.log(3.0)
    assert keep_probability(ln3, 0.1, 3) == pytest.approx(0.62, rel=1e-15)
    assert keep_probability(ln3, 0.1, 2) == pytest.approx(0.7625, rel=1e-15)
    assert keep_probability(ln3, 0.1, 1) == 1.0 and keep_probability(ln3, 0.1, 0) == 1.0
    assert keep_probability(0.0, 0.5, 5) == pytest.approx((1 + 0.25 * 4) / 5, rel=1e-15)


def _device(**fields: object) -> DeviceHeadList:
    """Queries a (URLs u, v) and b (none): positions a = 0, b = 1, * = 2; k_a = 3, k_b = k_* = 1."""
    return DeviceHeadList.from_json(_signed(epsilon=1.0, delta=0.1, f_c=0.5, **fields))


def test_device_head_list_index() -> None:
    hl = _device()
    assert (hl.k, hl.kq) == (3, [3, 1, 1])
    assert hl.query_index == {"a": 0, "b": 1} and hl.url_index == [{"u": 0, "v": 1}, {}, {}]
    # t = (e^½ + 0.025·2)/(e^½ + 2) (ε'_Q = ½, δ'_Q = 0.05); t_a = the same with k_a = 3; t_b = t_* = 1
    e = math.exp(0.5)
    t = (e + 0.05) / (e + 2)
    assert hl.one_minus_t == pytest.approx(1 - t, rel=1e-14)
    assert hl.one_minus_tq == pytest.approx([1 - t, 0.0, 0.0], rel=1e-14, abs=0.0)
    assert [hl.encode(*r) for r in [("a", "u"), ("a", "v"), ("a", "w"), ("a", None), ("b", "u"), ("b", None),
                                    ("c", "u"), ("c", None)]] == [(0, 0), (0, 1), (0, 2), (0, 2), (1, 0), (1, 0),
                                                                  (2, 0), (2, 0)]
    assert [hl.decode(*p) for p in [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)]] == [
        {"query": "a", "url": "u"}, {"query": "a", "url": "v"}, {"query": "a", "url": None},
        {"query": "b", "url": None}, {"query": None, "url": None}]
    assert hl.m_c == 1 and type(hl.m_c) is int


@pytest.mark.parametrize(("record", "uniforms", "expected", "left"), [
    # query stage: v1 < 1 − t → another query: j = ⌊v·(k − 1)⌋, skipping q; then a URL ⌊v·k_q'⌋
    ((1, 0), [0.0, 0.4, 0.5], (0, 1), 0),  # j = 0 < 1: query a; URL ⌊0.5·3⌋ = 1
    ((1, 0), [0.0, 0.6, 0.9], (2, 0), 0),  # j = 1 ≥ 1: query 2 (*); its only URL position
    ((0, 1), [0.0, 0.0, 0.99], (1, 0), 0),  # j = 0 ≥ 0: query 1
    ((2, 0), [0.0, 0.99, 0.7], (1, 0), 0),  # j = 1 < 2: query 1
    ((2, 0), [0.0, 0.2, 0.7], (0, 2), 0),  # j = 0: query 0, URL ⌊0.7·3⌋ = 2
    # URL stage of a (k_a = 3): v2 < 1 − t_a → another URL: j = ⌊v·2⌋ skipping u
    ((0, 1), ["1-t", 0.0, 0.5], (0, 2), 0),  # v1 = 1 − t exactly keeps the query; j = 1 ≥ 1
    ((0, 1), ["1-t", 0.0, 0.2], (0, 0), 0),  # j = 0 < 1
    ((0, 0), [0.99, 0.0, 0.2], (0, 1), 0),  # j = 0 ≥ 0
    ((0, 2), [0.99, 0.0, 0.99], (0, 1), 0),  # j = 1 < 2
    ((0, 1), [0.99, "1-tq", 0.5], (0, 1), 1),  # v2 = 1 − t_a exactly keeps the URL; v3 not drawn
    # b has k_b = 1: no URL stage, no second draw
    ((1, 0), [0.99, 0.0, 0.0], (1, 0), 2),
])
def test_local_alg_draws_by_hand(record: tuple[int, int], uniforms: list, expected: tuple[int, int], left: int) -> None:
    from hybriddp.device import local_alg

    hl = _device()
    values = [hl.one_minus_t if v == "1-t" else hl.one_minus_tq[0] if v == "1-tq" else v for v in uniforms]
    src = UniformReplay(values)
    assert local_alg(*record, hl, src) == expected
    assert len(list(src._it)) == left  # how many of the uniforms were not drawn


def test_local_alg_with_only_the_wildcard_draws_nothing() -> None:
    from hybriddp.device import local_alg

    hl = DeviceHeadList.from_json(_signed(queries=[]))
    assert hl.k == 1
    assert local_alg(0, 0, hl, UniformReplay([])) == (0, 0)


def test_seeded_and_system_sources() -> None:
    import random

    from hybriddp.device import SeededSource, SystemSource

    ref = random.Random(11)
    src = SeededSource(11)
    for n in (1, 2, 7, 1000):
        assert src.uniform() == ref.random()
        assert src.below(n) == int(ref.random() * n)
    sysrc = SystemSource()
    assert all(0 <= sysrc.below(3) < 3 for _ in range(50)) and {sysrc.below(2) for _ in range(200)} == {0, 1}
    u = [sysrc.uniform() for _ in range(200)]
    assert all(0.0 <= x < 1.0 for x in u) and min(u) < 0.1 and max(u) > 0.9  # P(fail) = 2·0.9^200 ≈ 1e-9
    assert UniformReplay([0.5, 0.99]).below(4) == 2


# ----- device: one device's message ----------------------------------------------------------------------------

def test_randomize_records_sampling_order_and_charge(tmp_path) -> None:
    from hybriddp.device import DeviceLedger, randomize_records

    doc = _signed(epsilon=2, delta=1e-5, f_c=0.5, m_c=2)  # an integer ε: charged as a float
    records = [("a", "u"), ("b", None), ("a", "v"), ("c", "x")]
    # sampling: ⌊0.6·4⌋ = 2 → record 2 (pool 0, 1, 3 left); ⌊0.5·3⌋ = 1 → record 1; then LocalAlg keeps both
    # (v1 = 0.999 ≥ 1 − t; record 2 has k_a = 3: v2 = 0.999 ≥ 1 − t_a; record 1 has k_b = 1: one draw)
    src = UniformReplay([0.6, 0.5, 0.999, 0.999, 0.999])
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=3.0, lifetime_delta=1e-4)
    msg = randomize_records(doc, records, source=src, ledger=ledger, message_id="B" * 22)
    assert msg == {"id": "B" * 22, "headlist": doc["content_hash"],
                   "reports": [{"query": "a", "url": "v"}, {"query": "b", "url": None}]}
    assert list(src._it) == []
    saved = json.loads((tmp_path / "dev.json").read_text(encoding="utf-8"))
    assert saved["rounds"] == {doc["content_hash"]: {"epsilon": 2.0, "delta": 1e-5}}
    assert type(ledger.state["rounds"][doc["content_hash"]]["epsilon"]) is float
    # a second message of the same round is refused by the ledger
    with pytest.raises(DeviceError, match="already reported"):
        randomize_records(doc, records, source=UniformReplay([0.0] * 10), ledger=ledger)


def test_randomize_records_takes_all_records_when_fewer_than_m_c() -> None:
    from hybriddp.device import randomize_records

    doc = _signed(epsilon=1.0, delta=0.1, f_c=0.5, m_c=3)
    src = UniformReplay([0.5, 0.0, 0.999, 0.999, 0.999])  # ⌊0.5·2⌋ = 1, then ⌊0·1⌋ = 0
    msg = randomize_records(DeviceHeadList.from_json(doc), [("a", "u"), ("c", None)], source=src)
    assert msg["reports"] == [{"query": None, "url": None}, {"query": "a", "url": "u"}]
    assert len(msg["id"]) == 22
    with pytest.raises(DeviceError, match=r"^message id 'short' is not valid"):
        randomize_records(doc, [("a", "u")], source=src, message_id="short")


@pytest.mark.parametrize(("records", "index", "shown"), [
    ([("a", "u"), ("a",)], 1, "('a',)"),
    ([("a", "u", "v")], 0, "('a', 'u', 'v')"),
    ([(1, "u")], 0, "(1, 'u')"),
    ([("a", 2)], 0, "('a', 2)"),
    ([("a", "u"), ("b", None), "ab"], 2, "'ab'"),
    ([None], 0, "None"),
])
def test_check_records_messages(tmp_path, records: list, index: int, shown: str) -> None:
    from hybriddp.device import DeviceLedger, randomize_records

    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=30.0, lifetime_delta=0.5)
    with pytest.raises(DeviceError, match=exact_message(
            f"record {index} = {shown} is not a (query, url) pair of strings; give each record as (query, clicked "
            "URL), with url None when the record has none")):
        randomize_records(_signed(), records, source=UniformReplay([]), ledger=ledger)
    assert ledger.state["rounds"] == {}  # refused before the charge


def test_check_records_url_level_without_urls(tmp_path) -> None:
    from hybriddp.device import DeviceLedger, randomize_records

    doc = _signed()
    ledger = DeviceLedger(tmp_path / "dev.json", lifetime_epsilon=30.0, lifetime_delta=0.5)
    with pytest.raises(DeviceError, match=exact_message(
            "this device's 2 record(s) have no URL (they are (query, None)), but the head list "
            f"{doc['content_hash'][:19]}… is URL-level (url_level true): every record would be reported as ⟨q,*⟩, "
            "a click on an unlisted URL, "
            "which biases the estimate of every listed URL. Give the device its (query, clicked URL) records (for a "
            "table, name the URL column with --url-col), or use a head list built from a log without URLs "
            "(url_level false).")):
        randomize_records(doc, [("a", None), ["b", None]], source=UniformReplay([]), ledger=ledger)
    assert ledger.state["rounds"] == {}
    # one record with a URL is enough; a query-level list takes records without URLs; no records at all is fine
    src = UniformReplay([0.0, 0.999, 0.999])
    assert randomize_records(doc, [("a", None), ("a", "u")], source=src)["reports"] == [{"query": "a", "url": None}]
    level = _signed(url_level=False, queries=[{"query": "a", "urls": []}])
    assert randomize_records(level, [("a", None)], source=UniformReplay([0.0, 0.999]))["reports"] == [
        {"query": "a", "url": None}]
    msg = randomize_records(doc, [], source=UniformReplay([]), ledger=ledger)
    assert msg["reports"] == [] and list(ledger.state["rounds"]) == [doc["content_hash"]]


# ----- randomizer: the batch twin by hand, its pool, the exact privacy loss -----------------------------------

def _batch_setup():
    import numpy as np

    from hybriddp.headlist import HeadList
    from hybriddp.randomizer import LocalAlgParams

    # entries 0 ⟨a,u0⟩, 1 ⟨a,u1⟩, 2 ⟨a,*⟩, 3 ⟨b,*⟩, 4 ⟨*,*⟩; ε = 1, δ = 0.1, f_C = ½ as _device()
    hl = HeadList.from_lists([0, 1], [[0, 1], []])
    return np, hl, LocalAlgParams.build(hl, 1.0, 0.1, 0.5, 1)


def test_local_alg_params_by_hand() -> None:
    np, _, lp = _batch_setup()
    e = math.exp(0.5)
    t = (e + 0.05) / (e + 2)  # k = 3 and k_a = 3 share t; k_b = k_* = 1 keep everything
    assert lp.k == 3 and lp.kq.tolist() == [3, 1, 1]
    assert lp.t == pytest.approx(t, rel=1e-15) and lp.tq.tolist() == pytest.approx([t, 1.0, 1.0], rel=1e-15)
    assert lp.one_minus_t == 1.0 - lp.t and lp.one_minus_tq.tolist() == [1.0 - x for x in lp.tq.tolist()]
    assert lp.tq.dtype == np.float64 and lp.one_minus_tq.dtype == np.float64


def test_randomize_batch_by_hand() -> None:
    """The cases of test_local_alg_draws_by_hand as entries, three uniforms (v1, v2, v3) per report."""
    from hybriddp.randomizer import randomize_batch

    np, hl, lp = _batch_setup()
    cases = [  # (record entry, v1, v2, v3, report entry)
        (3, 0.0, 0.4, 0.5, 1), (3, 0.0, 0.6, 0.9, 4), (1, 0.0, 0.0, 0.99, 3), (4, 0.0, 0.99, 0.7, 3),
        (4, 0.0, 0.2, 0.7, 2), (1, "1-t", 0.0, 0.5, 2), (1, "1-t", 0.0, 0.2, 0), (0, 0.99, 0.0, 0.2, 1),
        (2, 0.99, 0.0, 0.99, 1), (1, 0.99, "1-tq", 0.5, 1), (3, 0.99, 0.0, 0.0, 3), (4, 0.99, 0.0, 0.0, 4),
    ]

    def value(v: object) -> float:
        return lp.one_minus_t if v == "1-t" else float(lp.one_minus_tq[0]) if v == "1-tq" else float(v)

    entries = np.array([c[0] for c in cases])
    uniforms = np.array([[value(c[i]) for c in cases] for i in (1, 2, 3)])
    got = randomize_batch(entries, hl, lp, uniforms=uniforms)
    assert got.tolist() == [c[4] for c in cases] and got.dtype == np.int64
    with pytest.raises(ValueError, match=exact_message("randomize_batch needs rng or uniforms")):
        randomize_batch(entries, hl, lp)


def test_randomize_batch_with_only_the_wildcard() -> None:
    import numpy as np

    from hybriddp.headlist import HeadList
    from hybriddp.randomizer import LocalAlgParams, randomize_batch

    hl = HeadList.from_lists([], [])
    lp = LocalAlgParams.build(hl, 1.0, 0.1, 0.5, 1)
    got = randomize_batch([0, 0, 0], hl, lp)  # needs no randomness at all
    assert got.tolist() == [0, 0, 0] and got.dtype == np.int64


def test_randomize_batch_thread_pool_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks run on ``threads`` threads (default: default_threads()); one thread or one chunk: no pool."""
    from concurrent.futures import ThreadPoolExecutor

    from hybriddp import randomizer
    from hybriddp.threads import set_default_threads

    np, hl, lp = _batch_setup()
    pools: list[int | None] = []

    class CountingPool(ThreadPoolExecutor):
        def __init__(self, max_workers: int | None = None) -> None:
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(randomizer, "ThreadPoolExecutor", CountingPool)
    monkeypatch.setattr(randomizer, "CHUNK", 4)
    entries = np.arange(10) % 5  # three chunks
    reference = randomizer.randomize_batch(entries, hl, lp, np.random.default_rng(3), threads=1)
    assert pools == []
    for threads, expected in [(3, [3]), (2, [2])]:
        pools.clear()
        got = randomizer.randomize_batch(entries, hl, lp, np.random.default_rng(3), threads=threads)
        assert pools == expected and got.tolist() == reference.tolist()
    pools.clear()
    randomizer.randomize_batch(entries[:4], hl, lp, np.random.default_rng(3), threads=4)  # one chunk
    assert pools == []
    try:
        for default, expected in [(5, [5]), (1, [])]:
            set_default_threads(default)
            pools.clear()
            got = randomizer.randomize_batch(entries, hl, lp, np.random.default_rng(3))
            assert pools == expected and got.tolist() == reference.tolist()
    finally:
        set_default_threads(None)


def test_privacy_loss_delta_by_hand() -> None:
    """Σ_y max(0, P[y|x] − e^ε P[y|x']), maximised over the pairs (x, x'), worked out by hand.

    Rows x = 0, 1, 2. At ε = ln 2 the worst pair is x = 2 against x' = 0:
    (0.2 − 1.7)⁺ + (0.3 − 0.2)⁺ + (0.5 − 0.1)⁺ = 0.5; every other pair gives less (e.g. 2 vs 1: 0.1).
    At ε = 0 it is the total variation distance, largest for rows 0 and 2: 0.65. At ε = ln 100 nothing is left."""
    import numpy as np

    from hybriddp.randomizer import privacy_loss_delta

    P = np.array([[0.85, 0.1, 0.05], [0.3, 0.5, 0.2], [0.2, 0.3, 0.5]])
    assert privacy_loss_delta(P, math.log(2.0)) == pytest.approx(0.5, rel=1e-12)
    assert privacy_loss_delta(P, 0.0) == pytest.approx(0.65, rel=1e-12)
    assert privacy_loss_delta(P, math.log(100.0)) == 0.0
    assert privacy_loss_delta(np.eye(2), 5.0) == 1.0  # a deterministic output: no ε helps
    # the first two rows only: row 1 against row 0 gives (0.5 − 0.2)⁺ + (0.2 − 0.1)⁺ = 0.4, row 0 against 1 0.25
    assert privacy_loss_delta(P[:2, :], math.log(2.0)) == pytest.approx(0.4, rel=1e-12)


def test_content_hash_of_a_lone_surrogate_hashes_its_code_point() -> None:
    """'\\udfff' has no UTF-8 form; it is hashed as the three bytes ED BF BF of its code point (surrogatepass)."""
    from hybriddp.device import content_hash

    canonical = b'{"note":"x\xed\xbf\xbf"}'
    assert content_hash({"note": "x\udfff", "content_hash": "ignored"}) == (
        "sha256:" + hashlib.sha256(canonical).hexdigest())


@pytest.mark.parametrize(("f_c", "m_c"), [(0.02, 1), (0.003, 1), (0.5, 1)])
def test_max_epsilon_is_the_largest_that_works_even_when_the_first_guess_overflows(f_c: float, m_c: int) -> None:
    """For f_C = 0.02 and 0.003 the guess m_C·ln(max float)/max(f_C, 1 − f_C) rounds so that e^{(1−f_C)ε} overflows;
    the answer is stepped down to a float at which LocalAlg's thresholds can be computed, one step above it they
    cannot."""
    from hybriddp.device import max_epsilon

    limit = max_epsilon(f_c, m_c)
    assert limit == pytest.approx(m_c * math.log(1.7976931348623157e308) / max(f_c, 1 - f_c), rel=1e-14)
    assert DeviceHeadList.from_json(_signed(epsilon=limit, f_c=f_c, m_c=m_c)).one_minus_tq[0] == 0.0
    with pytest.raises(DeviceError, match="is too large"):
        validate_headlist(_signed(epsilon=math.nextafter(limit, math.inf), f_c=f_c, m_c=m_c))


def test_randomize_batch_of_no_records() -> None:
    from hybriddp.randomizer import randomize_batch

    np, hl, lp = _batch_setup()
    for entries in ([], np.array([], dtype=np.int64)):
        got = randomize_batch(entries, hl, lp, np.random.default_rng(0))  # an empty list is read as integers
        assert got.tolist() == [] and got.dtype == np.int64

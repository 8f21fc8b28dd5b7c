"""The JavaScript device randomizer (clients/js/hybriddp-device.js) against the Python device (ALGORITHM.md §5).

Python writes the fixtures (:func:`build_fixtures`) and node's own test runner checks the JS module
against them (clients/js/test/*.test.js, reading the file named by ``HYBRIDDP_JS_FIXTURES``):

* head lists written by :meth:`HeadList.to_device_json` (non-ASCII queries and URLs, with and
  without URL level, m_C = 1 and > 1): the same content hash, thresholds and ``max_epsilon``;
* replays: the same message from the same uniforms, drawn in the same order and number;
* ``output_distribution`` rows for listed, ⟨q,*⟩ and ⟨*,*⟩ inputs, and m_C > 1, which the JS
  test samples 10^6 times through ``systemSource`` over seeded bytes (chi-square, p > 1e-6; deterministic);
* scipy's chi-square tail probabilities, which the JS p-value function must reproduce;
* mutated head lists with Python's verdict (refused, and which field it names, or accepted);
* lists hashes (protocol v2): head lists with and without round commitments (token_key, ohttp_key, report_window),
  with Python's ``lists_hash``, and the keys Python's device ledger holds after a message made with a ledger in one
  round and memoized in the next (same lists, another key and window);
* report tokens, protocol v2 (tests/jstokenhelpers.py, also run alone by tests/test_js_tokens.py): token inputs and
  message ids from nonces, token-key verdicts against the head list's commitment, and blinded messages and Tokens
  replayed from given nonces and random bytes;
* OHTTP (clients/js/test/ohttp.test.js): this Python (``HYBRIDDP_PYTHON``) runs hybriddp.core.ohttp as the gateway
  for what the JS module encapsulates.

``node`` missing is a failure, not a skip: CI must run these tests.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from headlisthelpers import KAT_CANONICAL, KAT_HASH, kat_doc
from hybriddp.core.headlist import HeadList
from hybriddp.core.protocol import (
    ROUND_COMMITMENTS,
    DeviceError,
    content_hash,
    lists_hash,
    max_epsilon,
    validate_headlist,
)
from hybriddp.core.records import ArrayVocabulary
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.device.ledger import DeviceLedger
from hybriddp.device.localalg import DeviceHeadList, UniformReplay, randomize_records
from jstokenhelpers import token_fixtures

ROOT = Path(__file__).resolve().parents[1]
JS_DIR = ROOT / "clients" / "js"
SAMPLES = 1_000_000

# Query and URL names that stress the canonical JSON: quotes, backslashes, control characters,
# U+007F, U+2028, combining marks, CJK, astral characters (UTF-16 surrogate pairs), U+FFFF.
QUERY_NAMES = ["weather", "pâte à crêpes", 'say "hi"', "back\\slash", "tab\there", "new\nline", "日本語 検索",
               "emoji 😀🚀", "del\x7f", "ls\u2028ps", "e\u0301", "\uffff", "\U0001f600 first", "bell\x07", "",
               "ρ"]
URL_NAMES = ["https://example.com/", "https://münchen.de/straße?q=ä&x=1", "https://例え.jp/パス", "http://x/\"q\"",
             "https://e.com/😀", "https://e.com/\\", "https://e.com/\u2028", "https://e.com/\x01", "u"]


def make_hl(urls_per_query: list[list[int]]) -> HeadList:
    """Head list with queries 0..len−1 and the given real URL ids per query."""
    return HeadList.from_lists(list(range(len(urls_per_query))), urls_per_query)


def device_doc(hl: HeadList, *, epsilon: float, delta: float, f_c: float, m_c: int, url_level: bool = True) -> dict:
    """The head-list document :meth:`HeadList.to_device_json` writes, with the stress names."""
    return hl.to_device_json(ArrayVocabulary(QUERY_NAMES), ArrayVocabulary(URL_NAMES), epsilon=epsilon, delta=delta,
                             f_c=f_c, m_c=m_c, url_level=url_level)


# name: (urls per query, epsilon, delta, f_c, m_c, url_level)
HEADLISTS: dict[str, tuple[list[list[int]], float, float, float, int, bool]] = {
    "mixed k_q, m_C=1": ([[0, 1], [2, 3, 4, 5], [], [6], [7, 8]], 4.0, 1e-05, 0.85, 1, True),
    "non-ASCII, m_C=3": ([[1], [2, 4], [3], [0, 5, 6, 7], [], [8]], 3.0, 1e-07, 0.5, 3, True),
    "no URL level, m_C=2": ([[] for _ in range(12)], 2.0, 0.001, 1.0, 2, False),
    "all 16 queries, small eps": ([[j % 9] if j % 3 else [] for j in range(16)], 0.1, 0.3, 0.1, 1, True),
    "large eps, m_C=4": ([[0], [1, 2], [3, 4, 5]], 40.0, 1e-16, 0.99, 4, True),
    "k=2": ([[0, 1, 2]], 1.0, 0.05, 0.85, 1, True),
    "k=1 (only *)": ([], 1.0, 1e-05, 0.85, 2, True),
}


def _headlists() -> list[dict[str, Any]]:
    out = []
    for name, (shape, eps, delta, f_c, m_c, url_level) in HEADLISTS.items():
        hl = make_hl(shape)
        doc = device_doc(hl, epsilon=eps, delta=delta, f_c=f_c, m_c=m_c, url_level=url_level)
        text = json.dumps(doc, ensure_ascii=False, indent=1)
        dhl = DeviceHeadList.from_json(json.loads(text))
        body = {k: v for k, v in doc.items() if k != "content_hash"}
        canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert doc["content_hash"] == "sha256:" + hashlib.sha256(canon.encode("utf-8")).hexdigest()
        out.append({"name": name, "text": text, "canonical": canon, "hash": doc["content_hash"], "k": dhl.k,
                    "kq": dhl.kq, "one_minus_t": dhl.one_minus_t, "one_minus_tq": dhl.one_minus_tq,
                    "max_epsilon": max_epsilon(f_c, m_c)})
    return out


def _record_pool(doc: dict) -> list[tuple[str, str | None]]:
    """Listed records, ⟨q,*⟩ records (unlisted URL or none) and ⟨*,*⟩ records (unlisted query)."""
    pool: list[tuple[str, str | None]] = []
    for q in doc["queries"]:
        pool += [(q["query"], u) for u in q["urls"]]
        pool += [(q["query"], "https://unlisted.example/ü"), (q["query"], None)]
    pool += [("not listed ∅", "https://example.com/"), ("also not listed", None), ("ÿ", "u")]
    if doc["url_level"]:
        pool = [r for r in pool if r[1] is not None] + [r for r in pool if r[1] is None][:2]
    return pool


class CountingReplay(UniformReplay):
    """UniformReplay that counts the values drawn, so the JS side can check it draws as many."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(values)
        self.used = 0

    def uniform(self) -> float:
        self.used += 1
        return super().uniform()

    def below(self, n: int) -> int:
        self.used += 1
        return super().below(n)


def _replays(headlists: list[dict[str, Any]], seeds: int = 150) -> list[dict[str, Any]]:
    """Messages Python makes from given uniforms (1 to 6 records per device)."""
    out = []
    for h, entry in enumerate(headlists):
        doc = json.loads(entry["text"])
        pool = _record_pool(doc)
        for seed in range(seeds):
            rng = np.random.default_rng([h, seed])
            n_rec = int(rng.integers(1, 7))
            records = [pool[int(i)] for i in rng.integers(0, len(pool), n_rec)]
            if doc["url_level"] and all(u is None for _, u in records):
                records[0] = pool[0]
            uniforms = rng.random(4 * n_rec).tolist()
            if seed % 5 == 0:  # values at the edges of [0, 1)
                uniforms = [0.0 if i % 2 else math.nextafter(1.0, 0.0) for i in range(4 * n_rec)]
            src = CountingReplay(uniforms)
            mid = f"{seed:022d}"[-22:].replace("0", "A")
            msg = randomize_records(doc, records, source=src, message_id=mid)
            out.append({"headlist": h, "records": [list(r) for r in records], "uniforms": uniforms,
                        "used": src.used, "message_id": mid, "expected": msg})
    return out


# (head list, record, description); every row of output_distribution the JS test samples 10^6 times
DISTRIBUTION_INPUTS = [
    ("mixed k_q, m_C=1", ("q:1", "u:3"), "listed record"),
    ("mixed k_q, m_C=1", ("q:1", "https://unlisted.example/"), "⟨q,*⟩ (unlisted URL)"),
    ("mixed k_q, m_C=1", ("not listed", "https://example.com/"), "⟨*,*⟩ (unlisted query)"),
    ("non-ASCII, m_C=3", ("q:3", "u:0"), "listed record, m_C = 3"),
    ("non-ASCII, m_C=3", ("q:4", "https://other/"), "⟨q,*⟩ of a query without URLs, m_C = 3"),
    ("no URL level, m_C=2", ("q:5", None), "query-level list, m_C = 2"),
    ("all 16 queries, small eps", ("q:2", "u:0"), "listed record, small ε, k = 17"),
]


def _distributions(headlists: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = [h["name"] for h in headlists]
    out = []
    for hl_name, (q_ref, u_ref), what in DISTRIBUTION_INPUTS:
        h = names.index(hl_name)
        shape, eps, delta, f_c, m_c, _ = HEADLISTS[hl_name]
        hl = make_hl(shape)
        doc = json.loads(headlists[h]["text"])
        query, url = q_ref, u_ref
        if q_ref.startswith("q:"):
            qi = int(q_ref[2:])
            query = doc["queries"][qi]["query"]
            if u_ref is not None and u_ref.startswith("u:"):
                url = doc["queries"][qi]["urls"][int(u_ref[2:])]
        dhl = DeviceHeadList.from_json(doc)
        qi, ui = dhl.encode(query, url)
        row = int(hl.url_offsets[qi] + ui)
        P = output_distribution(LocalAlgParams.build(hl, eps, delta, f_c, m_c))
        # the outcome of each entry, in entry order, as the device decodes it
        outcomes = [dhl.decode(int(q), int(e - hl.url_offsets[q])) for e, q in enumerate(hl.entry_query)]
        assert abs(P[row].sum() - 1.0) < 1e-12
        out.append({"headlist": h, "record": [query, url], "what": what, "outcomes": outcomes,
                    "probs": P[row].tolist(), "samples": SAMPLES})
    return out


def _chi2_cases() -> list[list[float]]:
    """(statistic, degrees of freedom, scipy's upper tail probability): the JS p-value must match."""
    cases = [(0.5, 1), (3.84, 1), (30.0, 1), (2.0, 2), (1.0, 3), (12.0, 5), (60.0, 5), (9.0, 10), (45.0, 10),
             (17.0, 17), (80.0, 17), (0.01, 4), (150.0, 100), (60.0, 100), (100.0, 100), (1200.0, 1000),
             (5.0, 30), (2.5, 1), (0.0001, 2), (400.0, 300)]
    return [[s, d, float(stats.chi2.sf(s, d))] for s, d in cases]


def _rehash(doc: dict) -> dict:
    """``doc`` with a content hash matching its body (SHA-256 of the canonical JSON, written out here)."""
    body = {k: v for k, v in doc.items() if k != "content_hash"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    doc["content_hash"] = "sha256:" + hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()
    return doc


def _variants(base: dict) -> list[dict[str, Any]]:
    """Mutated head lists with Python's verdict on them.

    ``field``: a string the refusal names (None = Python accepts). ``typing``: the verdict depends
    on ints vs floats or on integers beyond 2^53, which a parsed JS object cannot tell apart; for
    those only the JSON text must get Python's verdict.
    """
    cases: list[tuple[str, Any, str | None, bool]] = []  # name, doc or text, field, typing

    def changed(name: str, field: str | None, typing: bool = False, rehash: bool = True, **changes: Any) -> None:
        doc = {**copy.deepcopy(base), **changes}
        cases.append((name, _rehash(doc) if rehash else doc, field, typing))

    def edited(name: str, field: str | None, edit: Any, rehash: bool = True, typing: bool = False) -> None:
        doc = copy.deepcopy(base)
        edit(doc)
        cases.append((name, _rehash(doc) if rehash else doc, field, typing))

    changed("unchanged", None)
    # the content hash
    changed("epsilon changed, not rehashed", "content_hash", rehash=False, epsilon=base["epsilon"] * 2)
    edited("query renamed, not rehashed", "content_hash",
           lambda d: d["queries"][0].update(query=d["queries"][0]["query"] + "x"), rehash=False)
    edited("URL appended, not rehashed", "content_hash", lambda d: d["queries"][1]["urls"].append("https://x/"),
           rehash=False)
    edited("url_level flipped, not rehashed", "content_hash", lambda d: d.update(url_level=not d["url_level"]),
           rehash=False)
    edited("hash in upper case", "content_hash", lambda d: d.update(content_hash=d["content_hash"].upper()),
           rehash=False)
    edited("hash is a number", "content_hash", lambda d: d.update(content_hash=12), rehash=False)
    edited("hash missing", "content_hash", lambda d: d.pop("content_hash"), rehash=False)
    edited("extra field, not rehashed", "content_hash", lambda d: d.update(note="hi"), rehash=False)
    # format and version
    changed("format wrong", "'format'", format="hybriddp-headlist-2")
    edited("format missing", "'format'", lambda d: d.pop("format"))
    changed("format null", "'format'", format=None)
    changed("version 2", "'version'", version=2)
    changed("version '1'", "'version'", version="1")
    changed("version true", "'version'", version=True)
    changed("version 1.0", "'version'", typing=True, version=1.0)
    # privacy fields
    for field, values in {
        "epsilon": [0.0, -1.0, "4.0", True, None, float("nan"), float("inf"), [1.0], 1e308],
        "delta": [0.0, 1.0, 1.5, -1e-9, "1e-5", float("nan")],
        "f_c": [0.0, 1.5, -0.5, False, float("nan")],
        "m_c": [0, -3, 2.0, 1.5, "2", True, 2**63, 2**64 + 5, 10**400, None],
    }.items():
        for v in values:
            typing = field == "m_c" and (isinstance(v, float) or (isinstance(v, int) and abs(v) >= 2**53))
            changed(f"{field} = {v!r}"[:60], f"'{field}'", typing=typing, **{field: v})
        edited(f"{field} missing", f"'{field}'", lambda d, f=field: d.pop(f))
    changed("epsilon integral int", None, typing=True, epsilon=2)
    changed("f_c = 1 (int)", None, typing=True, f_c=1)
    changed("f_c = 1.0", None, f_c=1.0)
    changed("epsilon tiny", None, epsilon=5e-324)
    changed("m_c = 2**53 + 1", None, typing=True, m_c=2**53 + 1)
    changed("m_c = 2**62", None, typing=True, m_c=2**62)
    changed("m_c = 2**63 - 1 (the largest, compared exactly)", None, typing=True, m_c=2**63 - 1)
    changed("epsilon at max_epsilon", None, epsilon=max_epsilon(base["f_c"], base["m_c"]))
    changed("epsilon just above max_epsilon", "'epsilon'",
            epsilon=math.nextafter(max_epsilon(base["f_c"], base["m_c"]), math.inf))
    changed("url_level 'yes'", "'url_level'", url_level="yes")
    changed("url_level 1", "'url_level'", url_level=1)
    changed("url_level null", "'url_level'", url_level=None)
    edited("url_level missing", None, lambda d: d.pop("url_level"))
    # the query list
    changed("queries an object", "'queries'", queries={"google": []})
    changed("queries null", "'queries'", queries=None)
    changed("query listed twice", "listed twice", queries=[{"query": "a", "urls": []}, {"query": "a", "urls": []}])
    changed("URL listed twice", "listed twice", queries=[{"query": "a", "urls": ["u", "v", "u"]}])
    changed("URL a list", "queries[0].urls[0]", queries=[{"query": "a", "urls": [["nested", {"junk": 1}]]}])
    changed("query a number", "queries[0].query", queries=[{"query": 7, "urls": []}])
    changed("entry without urls", "queries[0]", queries=[{"query": "a"}])
    changed("entry a string", "queries[0]", queries=["a"])
    changed("urls a string", "queries[0].urls", queries=[{"query": "a", "urls": "u"}])
    changed("lone surrogate query", "queries[1].query", queries=[{"query": "ok", "urls": []},
                                                                   {"query": "bad\ud800", "urls": []}])
    changed("lone low surrogate url", "queries[0].urls[0]", queries=[{"query": "ok", "urls": ["\udc00x"]}])
    changed("empty query list", None, queries=[])
    changed("surrogate pair is fine", None, queries=[{"query": "\U0001f600", "urls": ["\U0001f680"]}])
    changed("extra entry fields", None, queries=[{"query": "a", "urls": [], "score": 0.5, "n": 3}])
    # extra top-level fields are hashed exactly as Python writes them
    changed("extra floats", None, typing=True,
            note=[1e-05, 1e16, 2.0, 0.1, 1e22, -0.0, 123456789.125, 5e-324, 1.7976931348623157e308])
    changed("extra ints", None, typing=True, note=[0, -1, 2**53 + 1, 10**30, -(2**70)])
    changed("extra key order", None, note={"\uffff": 1.5, "\U0001f600": 2.5, "a": True, "": None, "é": "x"})
    changed("extra lone surrogate", None, note="x\udfff")
    changed("extra nan", None, note=[float("nan"), float("inf"), -float("inf")])
    changed("extra control chars", None, note="\x00\x1f\x7f\b\f\n\r\t\"\\/")
    out = []
    for name, doc, field, typing in cases:
        text = json.dumps(doc, ensure_ascii=False)
        try:
            validate_headlist(json.loads(text))
        except DeviceError as exc:
            verdict: str | None = str(exc)
        else:
            verdict = None
        assert (verdict is None) == (field is None), (name, verdict)
        assert field is None or field in verdict, (name, field, verdict)
        out.append({"name": name, "text": text, "field": field, "python_error": verdict, "typing": typing})
    for name, value, field in (("a list", [], "expected a JSON object"), ("a string", "hl", "expected a JSON object"),
                               ("null", None, "expected a JSON object")):
        try:
            validate_headlist(value)
        except DeviceError as exc:
            out.append({"name": name, "text": json.dumps(value), "field": field, "python_error": str(exc),
                        "typing": False})
    return out


def _commitments(n: int) -> dict[str, Any]:
    """Round ``n``'s commitments (token key, OHTTP key config, report window), of the types Python checks."""
    digest = hashlib.sha256(f"round {n}".encode()).digest()
    def b64(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).decode().rstrip("=")
    return {"token_key": {"key_id": b64(digest), "modulus_bits": 2048, "e": 65537},
            "ohttp_key": b64(bytes([n]) + digest),
            "report_window": {"opens": f"2031-01-0{n}T00:00:00Z", "closes": f"2031-01-0{n}T06:30:00Z"}}


def _lists_hashes(base: dict) -> dict[str, Any]:
    """Head lists with and without round commitments, Python's lists hash of each, and a memo across two rounds
    that publish the same lists under their own commitments: the keys Python's ledger holds, and its messages."""
    def hashed(doc: dict) -> dict:
        doc = {k: v for k, v in doc.items() if k != "content_hash"}
        doc["content_hash"] = content_hash(doc)
        validate_headlist(json.loads(json.dumps(doc)))
        return doc

    plain = hashed(base)
    docs = {"no commitments (the file workflow)": plain,
            "round 1: token key, OHTTP key, report window": hashed({**base, **_commitments(1)}),
            "round 2: the same lists, another key and window": hashed({**base, **_commitments(2)}),
            "report window only": hashed({**base, "report_window": _commitments(3)["report_window"]}),
            "commitments and an extra field": hashed({**base, **_commitments(4), "note": ["é", 1e-05]})}
    cases = []
    for name, doc in docs.items():
        lh = lists_hash(doc)
        assert (lh == doc["content_hash"]) == (not any(k in doc for k in ROUND_COMMITMENTS)), name
        cases.append({"name": name, "text": json.dumps(doc, ensure_ascii=False), "content_hash": doc["content_hash"],
                      "lists_hash": lh})
    assert cases[1]["lists_hash"] == cases[2]["lists_hash"] == cases[3]["lists_hash"] == plain["content_hash"]
    assert cases[1]["content_hash"] != cases[2]["content_hash"]
    round1, round2 = docs["round 1: token key, OHTTP key, report window"], docs[
        "round 2: the same lists, another key and window"]
    records = _record_pool(base)[:3]
    uniforms = np.random.default_rng(15).random(12).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.json"
        ledger = DeviceLedger(path, lifetime_epsilon=100.0, lifetime_delta=0.5)
        first = randomize_records(round1, records, source=UniformReplay(uniforms), ledger=ledger,
                                  message_id="A" * 22, round_id="rnd-one")
        second = randomize_records(round2, records, source=UniformReplay([]), ledger=ledger,
                                   message_id="B" * 22, round_id="rnd-two")
        state = json.loads(path.read_text(encoding="utf-8"))
    assert first["headlist"] == round1["content_hash"] and second["headlist"] == round2["content_hash"]
    assert second["reports"] == first["reports"] and list(state["rounds"]) == [lists_hash(round1)]
    return {"cases": cases, "memo": {"rounds": [1, 2], "round_ids": ["rnd-one", "rnd-two"], "records": records,
                                     "uniforms": uniforms, "message_ids": ["A" * 22, "B" * 22],
                                     "messages": [first, second], "ledger_rounds": sorted(state["rounds"]),
                                     "ledger_memo": sorted(state["memo"]),
                                     "sent_in": state["memo"][lists_hash(round1)]["sent_in"]}}


def _float_reprs() -> list[list[Any]]:
    """[float, Python's json.dumps of it] for edge values and random doubles of every magnitude."""
    rng = np.random.default_rng(7)
    values = [1e-05, 1e-4, 0.0001234, 1e16, 1e15, 9999999999999998.0, 1e21, 1e22, 2.0, 0.1, 0.3, 1 / 3, 5e-324,
              2.2250738585072014e-308, 1.7976931348623157e308, 123456789012345680.0, 0.5, 100.0, 1.5e-7, 4.35e-5]
    values += (rng.random(400) * 10.0 ** rng.integers(-30, 30, 400)).tolist()
    values += rng.integers(0, 2**63, 100).astype(np.uint64).view(np.float64).tolist()  # random bit patterns
    values = [v for v in values if math.isfinite(v)]
    values += [-v for v in values[:50]]
    return [[v, json.dumps(v)] for v in values]


def build_fixtures() -> dict[str, Any]:
    """Everything the JS tests compare against, computed by the Python device."""
    headlists = _headlists()
    base = json.loads(headlists[1]["text"])
    return {"headlists": headlists, "replays": _replays(headlists), "distributions": _distributions(headlists),
            "chi2": _chi2_cases(), "variants": _variants(base), "float_reprs": _float_reprs(),
            "max_epsilon": [[f_c, m_c, max_epsilon(f_c, m_c)] for f_c in (0.1, 0.5, 0.85, 1.0, 0.3333, 1e-9)
                            for m_c in (1, 2, 3, 7, 1000, 2**40)],
            # the pinned wire-format answer of tests/headlisthelpers.py (hand-written text, hash and an unsorted doc)
            "known_answer": {"canonical": KAT_CANONICAL, "hash": KAT_HASH,
                             "doc_text": json.dumps(kat_doc(), ensure_ascii=False)},
            "tokens": token_fixtures(), "lists_hashes": _lists_hashes(base)}


def write_fixtures(path: Path) -> None:
    """The fixture file (ASCII JSON: lone surrogates travel as \\u escapes)."""
    path.write_text(json.dumps(build_fixtures(), ensure_ascii=True), encoding="ascii")


def test_js_device_matches_python(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node is not None, ("`node` is not on PATH: the JavaScript device randomizer (clients/js) cannot be "
                              "tested. Install Node.js 20 or newer (e.g. `apt-get install nodejs`).")
    fixtures = tmp_path / "js-fixtures.json"
    write_fixtures(fixtures)
    env = {**os.environ, "HYBRIDDP_JS_FIXTURES": str(fixtures), "HYBRIDDP_PYTHON": sys.executable}
    start = time.monotonic()
    proc = subprocess.run([node, "--test", "test/"], cwd=JS_DIR, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"node --test failed (exit {proc.returncode}):\n{output}"
    assert "# fail 0" in output and "# skipped 0" in output and "# pass 0" not in output, output
    print(f"node --test: {time.monotonic() - start:.1f} s")


if __name__ == "__main__":  # write the fixtures for running `node --test` by hand
    write_fixtures(Path(sys.argv[1]))

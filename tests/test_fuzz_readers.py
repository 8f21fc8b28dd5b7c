"""Property-based fuzzing of the input readers: whatever the input, only HybridDPError escapes.

Readers covered: the log loaders (``load_log`` and the AOL / CSV / TSV / Parquet / item loaders it
dispatches to, plain and compressed), the head-list reader and validator (server and device side),
the SQLite privacy ledger and the device's JSON ledger. Valid input may also load; then a few
invariants are checked. Hypothesis runs derandomized (a fixed sequence of examples, no example
database), so a run is reproducible and CI never flakes; the whole file takes a few seconds.
"""

from __future__ import annotations

import bz2
import copy
import gzip
import hashlib
import io
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybriddp.core.errors import HybridDPError
from hybriddp.core.headlist import from_device_json, read_device_json, validate_device_json
from hybriddp.core.records import RecordLog
from hybriddp.device.ledger import DeviceLedger
from hybriddp.device.localalg import DeviceHeadList, randomize_records
from hybriddp.io.loaders import load_log
from hybriddp.privacy.ledger import Charge, PrivacyLedger

FUZZ = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])


def only_project_errors(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; a HybridDPError is returned (it must be one non-empty line), anything
    else propagates and fails the test."""
    try:
        return fn(*args, **kwargs)
    except HybridDPError as exc:
        message = str(exc)
        assert message.strip() and "\n" not in message, repr(message)
        return exc


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ----- log loaders ----------------------------------------------------------------------------------

PIECES = [b"\t", b",", b"\n", b"\r\n", b"\r", b"\x00", b"\xff\xfe", b'"', b'""', b"1", b"-5", b"479",
          b"99999999999999999999", b"q", b"http://u", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b" ", b"user",
          b"query", b"url", "café ☕".encode(), b"x" * 3000]
# kind: (header lines, name endings, the options that read it)
KINDS = {
    "aol": ([b"AnonID\tQuery\tQueryTime\tItemRank\tClickURL"], [".txt", ".tsv", ".log"], {}),
    "csv": ([b"user,query,url", b"\xef\xbb\xbfuser,query,url", b"user,user,query,url", b'"user","query",url'],
            [".csv"], {"user_col": "user", "url_col": "url"}),
    "tsv": ([b"user\tquery\turl", b"query\tuser\turl"], [".tsv", ".txt"], {"user_col": "user", "url_col": "url"}),
    "items": ([b"1 2 3", b""], [".dat"], {}),
}
COMPRESSION = {"": lambda b: b, ".gz": lambda b: gzip.compress(b, mtime=0), ".bz2": bz2.compress}


@st.composite
def log_file(draw: st.DrawFn) -> tuple[str, bytes, dict]:
    """``(name ending, bytes, load_log options)``: a header of some log kind with rows of awkward
    pieces (or random bytes / text), named and compressed to match most of the time, sometimes
    truncated after compression, with junk after it, or named as another kind."""
    kind = draw(st.sampled_from(sorted(KINDS)))
    headers, endings, options = KINDS[kind]
    data = draw(st.one_of(
        st.builds(lambda h, ps: h + b"\n" + b"".join(ps), st.sampled_from(headers),
                  st.lists(st.sampled_from(PIECES), max_size=40)),
        st.binary(max_size=300),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    ))
    ending = draw(st.sampled_from(endings))
    compression = draw(st.sampled_from(sorted(COMPRESSION)))
    data = COMPRESSION[compression](data)
    damage = draw(st.sampled_from(["none", "none", "none", "truncate", "junk", "rename"]))
    if damage == "truncate" and compression:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif damage == "junk" and compression:
        data += draw(st.binary(min_size=1, max_size=20))
    elif damage == "rename":
        ending, compression = draw(st.sampled_from([".csv", ".tsv", ".dat", ".parquet", ".pq", ".gz", ""])), ""
    options = dict(options)
    options.update(draw(st.fixed_dictionaries({}, optional={
        "skip_bad_rows": st.booleans(), "format": st.sampled_from(["aol", "csv", "tsv", "items", "parquet"])})))
    if options.get("format") in ("aol", "items"):
        options = {k: v for k, v in options.items() if k not in ("user_col", "url_col")}
    return ending + compression, data, options


def check_log(log: RecordLog) -> None:
    """Invariants of a loaded log: consistent offsets and codes, every string valid UTF-8 text."""
    assert log.user_offsets[0] == 0 and log.user_offsets[-1] == log.n_records
    assert (log.user_offsets[1:] >= log.user_offsets[:-1]).all()
    assert len(log.query) == log.n_records
    assert log.n_records == 0 or 0 <= int(log.query.min()) <= int(log.query.max()) < len(log.queries)
    for s in log.queries.strings.tolist() + (log.urls.strings.tolist() if log.has_urls else []):
        s.encode("utf-8")  # no lone surrogates: undecodable bytes became U+FFFD


@settings(FUZZ, max_examples=300)
@given(case=log_file())
def test_load_log_raises_only_project_errors(scratch: Path, case: tuple[str, bytes, dict]) -> None:
    suffix, data, options = case
    path = scratch / f"log{suffix}"
    path.write_bytes(data)
    result = only_project_errors(load_log, path, **options)
    if isinstance(result, RecordLog):
        check_log(result)


PARQUET_COLUMNS = {
    "int": pa.array([1, None, 3]), "float": pa.array([1.5, float("nan"), None]), "str": pa.array(["a", "", None]),
    "bytes": pa.array([b"\xff", b"a", None]), "list": pa.array([[1], [], None]),
    "struct": pa.array([{"x": 1}, None, {"x": 2}]), "bool": pa.array([True, False, None]),
    "null": pa.array([None, None, None]), "dict": pa.array(["a", "b", None]).dictionary_encode(),
    "map": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
}


@FUZZ
@given(user=st.sampled_from(sorted(PARQUET_COLUMNS)), query=st.sampled_from(sorted(PARQUET_COLUMNS)),
       url=st.sampled_from(sorted(PARQUET_COLUMNS)), skip=st.booleans(), cut=st.one_of(st.none(), st.integers(0, 400)))
def test_parquet_of_any_column_types(scratch: Path, user: str, query: str, url: str, skip: bool,
                                     cut: int | None) -> None:
    """Every column type (nested ones included) and truncated files give a result or a project error."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"user": PARQUET_COLUMNS[user], "query": PARQUET_COLUMNS[query],
                             "url": PARQUET_COLUMNS[url]}), buf)
    data = buf.getvalue()
    path = scratch / "t.parquet"
    path.write_bytes(data if cut is None else data[:cut])
    result = only_project_errors(load_log, path, user_col="user", query_col="query", url_col="url",
                                 skip_bad_rows=skip)
    if isinstance(result, RecordLog):
        check_log(result)


# ----- head lists --------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["format", "version", "epsilon", "delta", "f_c", "m_c", "url_level", "queries", "content_hash"]
SPECIAL = st.sampled_from(["4.0", "", 1e308, 1e300, 800.0, float("nan"), float("inf"), -math.inf, -1, 0, 0.0, 1,
                           1.5, 2, 10**30, 10**400, True, False, None, [], {}, [{"query": "q", "urls": []}],
                           "hybriddp-headlist", "sha256:00", "\ud800"])
JUNK = st.one_of(SPECIAL, JSON)


def reference_hash(doc: dict) -> str:
    """The documented content hash: SHA-256 of the canonical JSON without ``content_hash``."""
    body = {k: v for k, v in doc.items() if k != "content_hash"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()


@st.composite
def valid_headlist(draw: st.DrawFn) -> dict:
    names = st.text(min_size=1, max_size=6)
    queries = draw(st.lists(names, unique=True, max_size=4))
    doc = {
        "format": "hybriddp-headlist", "version": 1,
        "epsilon": draw(st.floats(0.05, 60.0)), "delta": draw(st.floats(1e-12, 0.5)),
        "f_c": draw(st.floats(0.05, 1.0)), "m_c": draw(st.integers(1, 5)), "url_level": draw(st.booleans()),
        "queries": [{"query": q, "urls": draw(st.lists(names, unique=True, max_size=3))} for q in queries],
    }
    doc["content_hash"] = reference_hash(doc)
    return doc


@st.composite
def mutated_headlist(draw: st.DrawFn) -> dict:
    """A valid head list with one to three mutations, its hash then (usually) made to match again so
    that validation gets past the hash to the mutated content."""
    doc = draw(valid_headlist())
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "delete", "dup query", "dup url", "item", "query", "urls", "url"]))
        qs = doc.get("queries")
        has_items = isinstance(qs, list) and qs and all(isinstance(q, dict) for q in qs)
        if kind == "set":
            doc[draw(st.sampled_from([*FIELDS, "extra"]))] = draw(JUNK)
        elif kind == "delete":
            doc.pop(draw(st.sampled_from(FIELDS)), None)
        elif kind == "dup query" and has_items:
            qs.append(copy.deepcopy(qs[0]))
        elif kind == "dup url" and has_items and isinstance(qs[0].get("urls"), list) and qs[0]["urls"]:
            qs[0]["urls"].append(qs[0]["urls"][0])
        elif kind == "item" and isinstance(qs, list):
            qs.append(draw(JUNK))
        elif kind == "query" and has_items:
            qs[0]["query"] = draw(JUNK)
        elif kind == "urls" and has_items:
            qs[0]["urls"] = draw(JUNK)
        elif kind == "url" and has_items and isinstance(qs[0].get("urls"), list):
            qs[0]["urls"].append(draw(JUNK))
    if draw(st.integers(0, 4)) and "content_hash" in doc:  # 4 in 5: a matching hash
        doc["content_hash"] = reference_hash(doc)
    return doc


def check_accepted(doc: dict) -> None:
    """An accepted head list works on the device and on the server, with no overflow."""
    hl = DeviceHeadList.from_json(doc)
    assert 0.0 <= hl.one_minus_t <= 1.0 and all(0.0 <= x <= 1.0 for x in hl.one_minus_tq)
    records = [(q["query"], u) for q in doc["queries"] for u in q["urls"] or ["http://other"]] or [("q", "u")]
    msg = randomize_records(hl, records)
    assert msg["headlist"] == doc["content_hash"] and len(msg["reports"]) == min(doc["m_c"], len(records))
    server_hl, qv, _ = from_device_json(doc)
    assert server_hl.k == hl.k and len(qv) == len(doc["queries"])


@FUZZ
@given(doc=JSON)
def test_headlist_validation_of_arbitrary_json(doc: Any) -> None:
    for validate in (validate_device_json, DeviceHeadList.from_json):
        result = only_project_errors(validate, doc)
        assert isinstance(result, HybridDPError)  # no random value is a head list with a matching hash


@FUZZ
@given(doc=st.dictionaries(st.sampled_from(FIELDS), JUNK, min_size=5))
def test_headlist_validation_of_junk_fields(doc: dict) -> None:
    if "content_hash" in doc:
        doc["content_hash"] = reference_hash(doc)
    result = only_project_errors(DeviceHeadList.from_json, doc)
    if not isinstance(result, HybridDPError):
        check_accepted(doc)


@FUZZ
@given(doc=mutated_headlist())
def test_headlist_validation_of_mutated_documents(scratch: Path, doc: dict) -> None:
    result = only_project_errors(DeviceHeadList.from_json, doc)
    path = scratch / "hl.json"
    path.write_text(json.dumps(doc), encoding="utf-8", errors="surrogatepass")
    from_file = only_project_errors(read_device_json, path)
    assert isinstance(from_file, HybridDPError) == isinstance(result, HybridDPError)
    if not isinstance(result, HybridDPError):
        check_accepted(doc)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=100).map(str.encode),
                      st.builds(lambda d, n: json.dumps(d).encode()[:n], valid_headlist(), st.integers(0, 400))))
def test_headlist_file_of_random_bytes(scratch: Path, data: bytes) -> None:
    path = scratch / "bytes.json"
    path.write_bytes(data)
    only_project_errors(read_device_json, path)


def test_headlist_file_nested_too_deeply(scratch: Path) -> None:
    path = scratch / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in str(only_project_errors(read_device_json, path))
    path.write_text("1" * 5000)  # beyond Python's int-string conversion limit
    assert "not valid JSON" in str(only_project_errors(read_device_json, path))


# ----- the privacy ledger (SQLite) ------------------------------------------------------------------

META_ROWS = [("format", "hybriddp-ledger-1"), ("lifetime_epsilon", "10.0"), ("lifetime_delta", "0.0001"),
             ("salt", "ab" * 32)]


@st.composite
def sqlite_recipe(draw: st.DrawFn) -> list[tuple[str, list[str], list[tuple]]]:
    """Tables of an SQLite database: random ones and sometimes the ledger's, with right or wrong
    columns, and random meta rows (sometimes the valid ones)."""
    columns = {"meta": ["key", "value"], "rounds": ["id", "name", "created"],
               "charges": ["user", "round", "grp", "epsilon", "delta"], "other": ["a"], "users": ["id", "x"]}
    recipe = []
    for t in draw(st.lists(st.sampled_from(sorted(columns)), unique=True, max_size=5)):
        cols = columns[t] if draw(st.integers(0, 3)) else draw(
            st.lists(st.sampled_from(["a", "key", "value", "b"]), min_size=1, max_size=3, unique=True))
        rows: list[tuple] = []
        if t == "meta" and cols == ["key", "value"]:
            value = st.one_of(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), st.floats(), st.binary(max_size=4))
            rows = draw(st.lists(st.one_of(st.sampled_from(META_ROWS),
                                           st.tuples(st.sampled_from([k for k, _ in META_ROWS]), value)),
                                 max_size=5, unique_by=lambda r: r[0]))
        recipe.append((t, cols, rows))
    return recipe


def write_sqlite(path: Path, recipe: list[tuple[str, list[str], list[tuple]]]) -> bytes:
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    for table, cols, rows in recipe:
        conn.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
        conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", rows)
    conn.commit()
    conn.close()
    return path.read_bytes()


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), st.builds(lambda b: b"SQLite format 3\x00" + b, st.binary(max_size=300)),
                      sqlite_recipe()),
       create=st.booleans())
def test_privacy_ledger_open_raises_only_project_errors(scratch: Path, data: Any, create: bool) -> None:
    path = scratch / "ledger.db"
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        data = write_sqlite(path, data)
    budget = {"lifetime_epsilon": 10.0, "lifetime_delta": 1e-4} if create else {}
    result = only_project_errors(PrivacyLedger.open, path, **budget)
    if isinstance(result, HybridDPError):
        assert path.read_bytes() == data  # a file that is not a ledger is never written to
        return
    with result as ledger:
        only_project_errors(ledger.charge, "r1", [Charge("clients", ["a", "b"], 1.0, 1e-6)])
        only_project_errors(ledger.report)


# ----- the device ledger (JSON) ------------------------------------------------------------------

VALID_DEVICE_STATE = {"lifetime": {"epsilon": 6.0, "delta": 1e-3}, "rounds": {"sha256:aa": {"epsilon": 1.0,
                                                                                          "delta": 1e-6}}}


@st.composite
def device_ledger_bytes(draw: st.DrawFn) -> bytes:
    state = copy.deepcopy(VALID_DEVICE_STATE)
    choice = draw(st.sampled_from(["json", "junk field", "bytes", "fixed"]))
    if choice == "json":
        return json.dumps(draw(JSON)).encode()
    if choice == "bytes":
        return draw(st.binary(max_size=100))
    if choice == "fixed":
        return draw(st.sampled_from([b"", b"  \n", b"[]", b"{}", b"null", b"\xff\xfe{}", b'{"lifetime": 1}',
                                     json.dumps(state).encode()[:-3]]))
    where = draw(st.sampled_from(["top", "lifetime", "round", "rounds"]))
    value = draw(JUNK)
    if where == "top":
        state[draw(st.sampled_from(["lifetime", "rounds"]))] = value
    elif where == "lifetime":
        state["lifetime"][draw(st.sampled_from(["epsilon", "delta"]))] = value
    elif where == "round":
        state["rounds"]["sha256:aa"][draw(st.sampled_from(["epsilon", "delta"]))] = value
    else:
        state["rounds"]["sha256:bb"] = value
    return json.dumps(state).encode("utf-8", "surrogatepass")


@FUZZ
@given(data=device_ledger_bytes())
def test_device_ledger_raises_only_project_errors(scratch: Path, data: bytes) -> None:
    path = scratch / "device.json"
    path.write_bytes(data)
    ledger = only_project_errors(DeviceLedger, path, lifetime_epsilon=None, lifetime_delta=None)
    if isinstance(ledger, HybridDPError):
        assert path.read_bytes() == data
        return
    eps, delta = ledger.spent()
    assert math.isfinite(eps) and math.isfinite(delta)
    result = only_project_errors(ledger.record, "sha256:new", 1.0, 1e-6)
    state = json.loads(path.read_text(encoding="utf-8"))  # whole, whatever happened
    assert ("sha256:new" in state["rounds"]) == (not isinstance(result, HybridDPError))

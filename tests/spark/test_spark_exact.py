"""Spark and NumPy give identical counts, hence identical estimates (issue 12; ALGORITHM.md §3, §4, §6).

The NumPy side is the existing in-process path (``NumpyBackend``; the server's ``MessageCounter``
over device messages); the Spark side counts the same data on the session's ``local[2]`` Spark.
Data sets: Zipf logs with m = 1 and m > 1, a log without a URL level, device messages whose
reports include both wildcards, and repeated messages.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybriddp.core.counting import NumpyBackend
from hybriddp.core.errors import DataError, HeadListError
from hybriddp.core.params import BlenderParams
from hybriddp.core.protocol import new_message_id
from hybriddp.core.records import RecordLog
from hybriddp.curator.party import curate
from hybriddp.curator.release import release_from_documents
from hybriddp.device.party import log_messages
from hybriddp.io.parquet_reports import read_parquet_messages, write_reports_parquet
from hybriddp.server.party import MessageCounter, count_messages, serve_estimates
from hybriddp.simulation.pipeline import run_blender, split_optin
from hybriddp.spark.backend import SparkBackend
from hybriddp.spark.reports import count_reports_spark
from logdata import zipf_log

DATASETS = {
    "m1": (lambda: zipf_log(n_users=4_000, n_queries=60, seed=3), BlenderParams(optin_fraction=0.2,
                                                                                head_list_size=15)),
    "m2-m3": (lambda: zipf_log(n_users=5_000, n_queries=80, seed=8, max_records=7),
              BlenderParams(optin_fraction=0.2, head_list_size=25, m_o=2, m_c=3)),
    "no-urls": (lambda: _no_urls(zipf_log(n_users=4_000, n_queries=40, seed=11)),
                BlenderParams(optin_fraction=0.2, head_list_size=10, m_c=2)),
}


def _no_urls(log: RecordLog) -> RecordLog:
    """The same users and queries without a URL level (an item log)."""
    from hybriddp.core.records import NO_URL, ArrayVocabulary
    return RecordLog(log.user_offsets, log.query, np.full(log.n_records, NO_URL, np.int32), log.queries,
                     ArrayVocabulary([]), has_urls=False)


def test_backend_primitives_equal_numpy(spark) -> None:
    rng = np.random.default_rng(1)
    sb, nb = SparkBackend(spark), NumpyBackend()
    for keys in (np.zeros(0, np.int64), np.array([7]), rng.integers(0, 50, 3_000), (rng.integers(0, 9, 500) << 32) | 5):
        got, want = sb.count_distinct(keys), nb.count_distinct(keys)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    entries = rng.integers(0, 30, 4_000)
    assert np.array_equal(sb.count_entries(entries, 40), nb.count_entries(entries, 40))
    assert sb.count_entries(np.array([2, 2, 0]), 3).tolist() == [1, 0, 2]  # by hand
    with pytest.raises(ValueError, match=r"out of range \[0, 3\)"):
        sb.count_entries(np.array([3]), 3)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_run_with_spark_backend_equals_numpy(spark, name: str) -> None:
    make, params = DATASETS[name]
    log = make()
    a = run_blender(log, params, seed=17)
    b = run_blender(log, params, seed=17, backend=SparkBackend(spark))
    assert a.head_list.n_entries == b.head_list.n_entries > 3
    assert np.array_equal(a.report_counts, b.report_counts)
    assert np.array_equal(a.curator.optin.p_record, b.curator.optin.p_record)
    assert np.array_equal(a.blended.records_final, b.blended.records_final)
    assert np.array_equal(a.blended.queries_final, b.blended.queries_final)


def _release_and_messages(name: str, seed: int = 23):
    """A served release and the clients' seeded messages, as the file commands make them."""
    make, params = DATASETS[name]
    log = make()
    optin, clients = split_optin(log.n_users, params.optin_fraction, seed)
    rel, _ = curate(log, params, optin_users=optin, seed=seed)
    served = release_from_documents(*json.loads(json.dumps([rel.headlist, rel.estimates])))
    return log, params, served, list(log_messages(log, clients, served.headlist, seed=seed))


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_parquet_reports_counted_by_spark_equal_server(spark, tmp_path: Path, name: str) -> None:
    log, params, served, messages = _release_and_messages(name)
    resent = messages[:5] + messages[40:41]  # devices retrying: counted once
    write_reports_parquet(tmp_path / "reports.parquet", messages + resent, rows_per_file=1_000)
    assert len(list((tmp_path / "reports.parquet").glob("part-*.parquet"))) > 2
    want = count_messages(served, messages + resent)
    got = count_reports_spark(spark, served, tmp_path / "reports.parquet")
    assert np.array_equal(got.counts, want.counts)
    assert (got.messages, got.reports, got.duplicates) == (want.messages, want.reports, 6) == (
        len(messages), sum(len(m["reports"]) for m in messages), 6)
    hl = served.head_list
    assert got.counts[hl.wildcard_entry[hl.k - 1]] > 0 and got.counts[hl.wildcard_entry[: hl.k - 1]].sum() > 0
    # the same counts from a full simulation with the same seed (log_messages replays it exactly)
    run = run_blender(log, params, seed=23)
    assert np.array_equal(got.counts, run.report_counts)
    a, b = serve_estimates(served, want), serve_estimates(served, got)
    assert a.records_table().to_pylist() == b.records_table().to_pylist()
    # and the one-process reader of the same directory agrees
    counter = MessageCounter(served)
    for where, msg in read_parquet_messages(tmp_path / "reports.parquet"):
        counter.add(msg, where)
    assert np.array_equal(counter.result.counts, want.counts) and counter.result.duplicates == 6


def _write_rows(path: Path, rows: list[tuple]) -> Path:
    names = ["id", "pos", "headlist", "query", "url"]
    cols = list(zip(*rows, strict=True))
    types = [pa.string(), pa.int32(), pa.string(), pa.string(), pa.string()]
    tbl = pa.table({n: pa.array(c, t) for n, c, t in zip(names, cols, types, strict=True)})
    path.mkdir()
    pq.write_table(tbl, path / "part-00000.parquet")
    return path


def test_bad_reports_refused_like_the_server(spark, tmp_path: Path) -> None:
    _, _, served, messages = _release_and_messages("m1")
    msg = messages[0]
    good = (msg["id"], 0, served.hash, msg["reports"][0]["query"], msg["reports"][0]["url"])
    other = new_message_id()
    cases = [
        ("hl", (other, 0, "sha256:" + "0" * 64, good[3], good[4]), HeadListError, "report made for head list"),
        ("pos", (good[0], 1, served.hash, good[3], good[4]), DataError, "allows m_C = 1"),
        ("id", ("short", 0, served.hash, good[3], good[4]), DataError, "message id 'short'"),
        ("query", (other, 0, served.hash, "never listed", None), DataError,
         "query 'never listed' is not in the head list"),
        ("url", (other, 0, served.hash, served.headlist["queries"][0]["query"], "never.listed"), DataError,
         "URL 'never.listed' is not in the head list for query"),
        ("wildcard-url", (other, 0, served.hash, None, "x.org"), DataError, "wildcard query has only the wildcard"),
        ("order", (other, 3, "sha256:" + "0" * 64, good[3], good[4]), HeadListError, "report made for head list"),
        ("charset", ("!" * 22, 0, served.hash, good[3], good[4]), DataError, "message id '!!!!"),
    ]
    for name, row, exc, text in cases:
        path = _write_rows(tmp_path / name, [good, row])
        with pytest.raises(exc, match=text):
            count_reports_spark(spark, served, path, strict_ids=True)
        if name != "charset":
            with pytest.raises(exc, match=text):
                count_reports_spark(spark, served, path)
        with pytest.raises((DataError, HeadListError)):  # the one-process server refuses too
            count_messages(served, [m for _, m in read_parquet_messages(path)])


def test_id_characters_checked_only_when_strict(spark, tmp_path: Path) -> None:
    """By default an id's length is checked, not its characters: a 22-byte id counts as any other."""
    _, _, served, messages = _release_and_messages("m1")
    q, u = messages[0]["reports"][0]["query"], messages[0]["reports"][0]["url"]
    path = _write_rows(tmp_path / "r", [(messages[0]["id"], 0, served.hash, q, u), ("!" * 22, 0, served.hash, q, u),
                                        ("!" * 22, 0, served.hash, q, u)])
    got = count_reports_spark(spark, served, path)
    entry = MessageCounter(served).entry_map[(q, u)]
    assert (got.counts[entry], got.counts.sum(), got.messages, got.duplicates, got.rows) == (2, 2, 2, 1, 3)


def test_missing_column_named(spark, tmp_path: Path) -> None:
    _, _, served, _ = _release_and_messages("m1")
    (tmp_path / "r").mkdir()
    pq.write_table(pa.table({"id": ["x"], "query": ["q"]}), tmp_path / "r" / "part-0.parquet")
    with pytest.raises(DataError, match="column 'pos' is missing"):
        count_reports_spark(spark, served, tmp_path / "r")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no \.parquet files"):
        count_reports_spark(spark, served, tmp_path / "empty")


def test_resent_message_with_other_reports_refused(spark, tmp_path: Path) -> None:
    _, _, served, messages = _release_and_messages("m1")
    msg = messages[0]
    q, u = msg["reports"][0]["query"], msg["reports"][0]["url"]
    other = (None, None) if q is not None else (served.headlist["queries"][0]["query"], None)
    path = _write_rows(tmp_path / "c", [(msg["id"], 0, served.hash, q, u), (msg["id"], 0, served.hash, *other)])
    with pytest.raises(DataError, match=f"message {msg['id']}: sent more than once with different reports"):
        count_reports_spark(spark, served, path)


def test_colliding_report_keys_refused_not_miscounted(spark, tmp_path: Path, monkeypatch) -> None:
    """If two listed reports shared a 64-bit key, counts could not be told apart: refuse, name the fix."""
    from pyspark.sql import functions as F

    import hybriddp.spark.reports as sr
    from hybriddp.core.errors import HybridDPError

    _, _, served, messages = _release_and_messages("m1")
    write_reports_parquet(tmp_path / "r.parquet", messages[:50])
    monkeypatch.setattr(sr, "report_key", lambda q, u: F.xxhash64(F.lit(1)))  # every report, one key
    with pytest.raises(HybridDPError, match="share a 64-bit report key"):
        count_reports_spark(spark, served, tmp_path / "r.parquet")

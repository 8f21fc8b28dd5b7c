"""Counting device reports per head-list entry with Spark, from a Parquet reports directory.

The server's job of ALGORITHM.md §6 (EstimateClientProbabilities needs only the counts N(r, D_C)
of reports per head-list entry) as one Spark job over the layout of
:mod:`hybriddp.io.parquet_reports`: repeated (id, pos) rows (a resent message) are counted once
(they are grouped by two 64-bit hashes of (id, pos): two different reports would have to collide
in all 128 bits to be merged, probability below 10⁻²⁰ for 10⁹ reports),
every row is checked (head-list hash, message id, ``pos < m_C``, report on the head list), and
only one count per entry comes back to the driver. The checks are the server's
(:class:`~hybriddp.server.party.MessageCounter`): the same data gives the same counts, or the
same refusal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hybriddp.core.errors import DataError, HeadListError, HybridDPError
from hybriddp.core.protocol import ID_PATTERN
from hybriddp.curator.release import CuratorRelease
from hybriddp.io.parquet_reports import REPORT_SCHEMA, check_report_schema, report_files
from hybriddp.server.party import MessageCounter, ReportCounts

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

WRONG_HEADLIST, BAD_ID, TOO_MANY, NOT_LISTED = -2, -3, -4, -1


@dataclass
class SparkCounts(ReportCounts):
    """Report counts from Spark, with the rows read (``rows``) besides the messages and reports."""

    rows: int = 0


def entry_table(release: CuratorRelease) -> pa.Table:
    """(query, url, entry) of every report a device can send for this release (null = wildcard)."""
    emap = MessageCounter(release).entry_map
    keys = list(emap)
    return pa.table({"q": pa.array([k[0] for k in keys], pa.string()), "u": pa.array([k[1] for k in keys], pa.string()),
                     "entry": pa.array([emap[k] for k in keys], pa.int64())})


ReportPaths = str | Path | Sequence[str | Path]


def read_reports(spark: SparkSession, path: ReportPaths) -> DataFrame:
    """The reports directories (or files) as one DataFrame.

    Local paths: every file's columns are checked on the driver first. URIs (``s3a://…``,
    ``hdfs://…``, ``abfss://…``) go to Spark as they are, and the merged schema is checked.
    """
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    remote = [str(p) for p in paths if "://" in str(p)]
    files = [str(f) for f in report_files([p for p in paths if "://" not in str(p)])] if len(remote) < len(paths) \
        else []
    for f in files:
        check_report_schema(Path(f), pq.read_schema(f))
    df = spark.read.parquet(*files, *remote)
    if remote:
        check_report_schema(Path(remote[0]), pa.schema([(f.name, _arrow_type(f.dataType.simpleString()))
                                                        for f in df.schema.fields]))
    return df.select(*REPORT_SCHEMA.names)


def _arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type the schema check compares with, for a Spark column type."""
    return {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "smallint": pa.int16(),
            "tinyint": pa.int8()}.get(spark_type, pa.binary())


def report_key(query: Column, url: Column) -> Column:
    """A 64-bit key of a report (query, url), null (wildcard) told apart from every string."""
    from pyspark.sql import functions as F

    return F.xxhash64(query, url, query.isNull(), url.isNull())


def _partitions(spark: SparkSession, path: ReportPaths) -> int:
    """Shuffle partitions for deduplicating the reports at ``path``: one per ~40 MB of local Parquet.

    Each partition's distinct (id, pos) hashes are held in one hash table: ~40 MB of Parquet is
    ~1.6 M reports, ~130 MB of table, which two tasks at a time keep in a 2 GB driver without
    spilling (16 partitions for 10⁸ reports took 1.7 times as long as 64, in a 1 GB driver).
    Remote paths: ``spark.sql.shuffle.partitions``.
    """
    configured = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if any("://" in str(p) for p in paths):
        return configured
    size = sum(f.stat().st_size for f in report_files(paths))
    return max(configured, -(-size // (40 << 20)))


def count_reports_spark(spark: SparkSession, release: CuratorRelease, path: ReportPaths, *,
                        strict_ids: bool = False) -> SparkCounts:
    """Counts of reports per head-list entry of ``release`` from the Parquet reports at ``path`` (one or several).

    Raises the :class:`DataError` / :class:`HeadListError` the server raises for the first bad
    row found (file and message id named), so a refused directory is refused on every engine.
    Every id must be 22 bytes long; ``strict_ids`` also checks its characters (URL-safe base64,
    as the service does on arrival), a regular expression per row that costs ~60% more time.
    """
    from pyspark.sql import functions as F

    df = read_reports(spark, path)
    pos = F.col("pos")
    bad = _bad_rows(release, strict_ids)
    code = (F.when(bad[BAD_ID], F.lit(BAD_ID))
            .when(bad[WRONG_HEADLIST], F.lit(WRONG_HEADLIST))
            .when(bad[TOO_MANY], F.lit(TOO_MANY))
            .otherwise(report_key(F.col("query"), F.col("url"))))
    # one shuffle of three longs per row, keyed by a 128-bit hash of (id, pos): the copies of a resent report
    # collapse into one row. The explicit repartition makes the deduplication a single hash aggregation after
    # the shuffle (a partial one before it would find nothing to merge); the per-code totals after it are
    # aggregated before their own (tiny) shuffle. The low bit of "tagged" is pos == 0 (a message's first row).
    tagged = F.shiftleft(code, 1).bitwiseOR(F.coalesce((pos == 0).cast("long"), F.lit(0)))
    dedup = (df.select(F.xxhash64("id", "pos").alias("h1"), F.xxhash64("pos", "id").alias("h2"), tagged.alias("t"))
             .repartition(_partitions(spark, path), "h1", "h2")
             .groupBy("h1", "h2")
             .agg(F.count(F.lit(1)).alias("copies"), F.min("t").alias("t"), F.max("t").alias("t_max")))
    rows = (dedup.groupBy("t", (F.col("t") != F.col("t_max")).alias("conflict"))
            .agg(F.count(F.lit(1)).alias("n"), F.sum("copies").alias("rows"))
            .collect())
    codes = _entry_codes(spark, release)
    found = {r["t"] >> 1 for r in rows}  # the code of each row kind (an arithmetic shift drops the tag bit)
    for problem in (BAD_ID, WRONG_HEADLIST, TOO_MANY):  # the server's order of checks
        if problem in found:
            _explain(df, release, problem, strict_ids)
    if found - set(codes):  # a report key of no head-list entry
        _explain(df, release, NOT_LISTED, strict_ids)
    if any(r["conflict"] for r in rows):
        r = (df.select("id", "pos", code.alias("code")).groupBy("id", "pos")
             .agg(F.min("code").alias("code"), F.max("code").alias("code_max"))
             .filter(F.col("code") != F.col("code_max")).first())
        raise DataError(f"message {r['id']}: sent more than once with different reports at pos = {r['pos']}; a "
                        "resent message must repeat its reports exactly (is a device reusing message ids?)")
    counts = np.zeros(release.head_list.n_entries, dtype=np.int64)
    out = SparkCounts(counts)
    for r in rows:
        counts[codes[r["t"] >> 1]] += r["n"]
        first = r["t"] & 1
        out.messages += int(r["n"]) * first
        out.duplicates += (int(r["rows"]) - int(r["n"])) * first
        out.rows += int(r["rows"])
    out.reports = int(counts.sum())
    return out


def _bad_rows(release: CuratorRelease, strict_ids: bool) -> dict[int, Column]:
    """The server's checks as Spark conditions, true on a row that fails: {BAD_ID, WRONG_HEADLIST, TOO_MANY: …}."""
    from pyspark.sql import functions as F

    rid, pos, headlist = F.col("id"), F.col("pos"), F.col("headlist")
    bad_id = rid.isNull() | (F.octet_length(rid) != 22)
    return {BAD_ID: bad_id | ~rid.rlike(f"^{ID_PATTERN}$") if strict_ids else bad_id,
            WRONG_HEADLIST: headlist.isNull() | (headlist != release.hash),
            TOO_MANY: pos.isNull() | (pos < 0) | (pos >= release.m_c)}


def _entry_codes(spark: SparkSession, release: CuratorRelease) -> dict[int, int]:
    """{report key: head-list entry} for every report a device can send for ``release``.

    The keys are 64-bit hashes, computed by the same Spark expression as the rows'; a report not on
    the head list takes a listed report's key with probability ~entries/2⁶³ per distinct report.
    """
    from pyspark.sql import functions as F

    entries = entry_table(release)
    table = spark.createDataFrame(entries)
    key = F.shiftright(F.shiftleft(report_key(F.col("q"), F.col("u")), 1), 1)  # as the rows' tag leaves it
    codes = {int(r["k"]): int(r["entry"]) for r in table.select(key.alias("k"), "entry").collect()}
    if len(codes) < entries.num_rows or codes.keys() & {BAD_ID, WRONG_HEADLIST, TOO_MANY, NOT_LISTED}:
        raise HybridDPError(f"two reports of head list {release.hash[:19]}… share a 64-bit report key (chance "
                            "~2⁻⁵⁰); count this round with the NumPy engine (hybriddp estimate --reports)")
    return codes


def _explain(df: DataFrame, release: CuratorRelease, code: int, strict_ids: bool) -> None:
    """Raise the server's error for one row of this kind of problem (``df``: the reports).

    Only runs when the counting job found a problem: the rows are joined with the head list here.
    """
    from pyspark.sql import functions as F

    entries = df.sparkSession.createDataFrame(entry_table(release))
    src = (df.join(F.broadcast(entries), df["query"].eqNullSafe(entries["q"]) & df["url"].eqNullSafe(entries["u"]),
                   "left")
           .withColumn("file", F.input_file_name()))
    bad = _bad_rows(release, strict_ids)
    if code == WRONG_HEADLIST:
        r = src.filter(bad[WRONG_HEADLIST]).first()
        raise HeadListError(f"{r['file']}, message {r['id']}: report made for head list {str(r['headlist'])[:19]}…, "
                            f"expected {release.hash[:19]}…; devices must randomize over the head list being "
                            "estimated")
    if code == BAD_ID:
        r = src.filter(bad[BAD_ID]).first()
        raise DataError(f"{r['file']}: message id {r['id']!r:.40} is not 22 URL-safe base64 characters (16 random "
                        "bytes); ids are made by hybriddp.core.protocol.new_message_id")
    if code == TOO_MANY:
        r = src.filter(bad[TOO_MANY]).first()
        raise DataError(f"{r['file']}: message {r['id']} has a report at pos = {r['pos']} but the head list allows "
                        f"m_C = {release.m_c} per device (pos 0 … {release.m_c - 1}); a device sends at most m_C "
                        "reports (refused: counting more would break the devices' privacy accounting)")
    r = src.filter(F.col("entry").isNull()).first()
    if r is None:
        raise HybridDPError("the Spark count found a report key of no head-list entry but no unlisted report; "
                            "count this round with the NumPy engine (hybriddp estimate --reports)")
    queries = {q["query"] for q in release.headlist["queries"]}
    where = f"{r['file']}, message {r['id']}"
    if r["query"] is None:
        raise DataError(f"{where}: the wildcard query has only the wildcard URL (url null), found url={r['url']!r}")
    if r["query"] not in queries:
        raise DataError(f"{where}: query {r['query']!r} is not in the head list")
    raise DataError(f"{where}: URL {r['url']!r} is not in the head list for query {r['query']!r}")

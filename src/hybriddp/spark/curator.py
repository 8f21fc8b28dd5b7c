"""CreateHeadList on an opt-in log too big for one machine: sample and count in Spark, noise on the driver; and the
same for every period of a timestamped log in one job (:func:`spark_optin_counts_by_period`, round series).

ALGORITHM.md §3 needs N(r, D_S), the count of every distinct record of the sampled opt-in records
D_S (≤ m_O per user). Here Spark samples D_S with the keyed scheme (:mod:`hybriddp.spark.keyed`)
and counts it; only the distinct records and their counts reach the driver, where
:func:`hybriddp.curator.mechanisms.create_head_list` (the NumPy path's own code: one noise draw per distinct
record, threshold τ) runs on them unchanged. Records are coded in string order (queries sorted,
URLs sorted), so the noise draws follow one canonical order whatever the partitioning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import NoiseSource
from hybriddp.core.records import NO_URL, ArrayVocabulary
from hybriddp.curator.mechanisms import create_head_list
from hybriddp.spark.keyed import keyed_sample, spark_keyed_sample

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

COUNT_SCHEMA = pa.schema([("query", pa.string()), ("url", pa.string()), ("n", pa.int64())])


@dataclass
class CountedRecords:
    """Distinct sampled records of D_S with their counts, integer-coded in string order."""

    query: np.ndarray  # int64 ids into ``queries``
    url: np.ndarray  # int64 ids into ``urls``, NO_URL for a null URL
    counts: np.ndarray
    queries: ArrayVocabulary
    urls: ArrayVocabulary

    @classmethod
    def from_table(cls, table: pa.Table) -> CountedRecords:
        """Code a (query, url, n) table: ids are positions in the sorted distinct strings."""
        q = table.column("query").to_pylist()
        u = table.column("url").to_pylist()
        qv = sorted(set(q))
        uv = sorted({x for x in u if x is not None})
        qi, ui = {s: i for i, s in enumerate(qv)}, {s: i for i, s in enumerate(uv)}
        return cls(np.array([qi[x] for x in q], np.int64), np.array([NO_URL if x is None else ui[x] for x in u],
                                                                     np.int64),
                   table.column("n").to_numpy().astype(np.int64), ArrayVocabulary(qv), ArrayVocabulary(uv))

    @property
    def n_records(self) -> int:
        """|D_S|."""
        return int(self.counts.sum())

    def head_list(self, *, epsilon: float, delta: float, m_o: int, noise: NoiseSource) -> HeadList:
        """CreateHeadList (ALGORITHM.md §3) on these counts, by the NumPy path's code on D_S rebuilt from them."""
        return create_head_list(np.repeat(self.query, self.counts), np.repeat(self.url, self.counts),
                                epsilon=epsilon, delta=delta, m_o=m_o, noise=noise)


def spark_optin_counts(df: DataFrame, m_o: int, seed: int, *, user_col: str = "user", query_col: str = "query",
                       url_col: str | None = "url") -> CountedRecords:
    """Keyed sample of ≤ m_O records per user, counted per distinct record in Spark; counts to the driver."""
    from pyspark.sql import functions as F

    sample = spark_keyed_sample(df, m_o, seed, "sample_optin", user_col=user_col, query_col=query_col,
                                url_col=url_col)
    table = sample.groupBy("query", "url").agg(F.count(F.lit(1)).alias("n")).toArrow()
    return CountedRecords.from_table(table.select(COUNT_SCHEMA.names).cast(COUNT_SCHEMA))


def reference_optin_counts(users: Sequence[object], queries: Sequence[str], urls: Sequence[str | None], m_o: int,
                           seed: int) -> CountedRecords:
    """The same counts from the pure-Python keyed sampler (tests; small logs)."""
    c = Counter((q, u) for _, q, u in keyed_sample(users, queries, urls, m_o, seed, "sample_optin"))
    keys = list(c)
    return CountedRecords.from_table(pa.table({"query": [k[0] for k in keys], "url": [k[1] for k in keys],
                                               "n": [c[k] for k in keys]}, schema=COUNT_SCHEMA))


PERIOD_SEPARATOR = "\x1f"
"""Joins a user and a period into the key a period's sample is drawn per (a unit separator: not in an id)."""


def with_period(df: DataFrame, time_col: str, start: int, period_seconds: int) -> DataFrame:
    """``df`` with an integer column ``period``: floor((time − start) / period_seconds) of the time in ``time_col``
    (Unix seconds as a number, or a Spark timestamp), as :func:`hybriddp.core.periods.period_index` computes it."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    col = F.col(time_col)
    kind = df.schema[time_col].dataType
    seconds = F.unix_timestamp(col) if isinstance(kind, (TimestampType, TimestampNTZType)) else col
    return df.withColumn("period", F.floor((seconds.cast("double") - F.lit(float(start)))
                                           / F.lit(float(period_seconds))).cast("long"))


def spark_optin_counts_by_period(df: DataFrame, m_o: int, seed: int, *, period_col: str = "period",
                                 user_col: str = "user", query_col: str = "query",
                                 url_col: str | None = "url") -> dict[int, CountedRecords]:
    """Every period's counts of :func:`spark_optin_counts` in one Spark job (docs/SCALE.md, round series): each user
    contributes ≤ m_O records *per period* (the keyed sample is drawn per (user, period), with the key of the user
    joined to the period by :data:`PERIOD_SEPARATOR`), and the sample is counted per (period, query, url); only the
    counts reach the driver, one :class:`CountedRecords` per period that has records. Period ``p``'s counts equal
    :func:`reference_optin_counts` of that period's records with users ``f"{user}{PERIOD_SEPARATOR}{p}"``."""
    from pyspark.sql import functions as F

    keyed = df.withColumn("_user_period", F.concat_ws(PERIOD_SEPARATOR, F.col(user_col).cast("string"),
                                                      F.col(period_col).cast("long").cast("string")))
    sample = spark_keyed_sample(keyed, m_o, seed, "sample_optin", user_col="_user_period", query_col=query_col,
                                url_col=url_col)
    period = F.element_at(F.split(F.col("user"), PERIOD_SEPARATOR), -1).cast("long")
    table = (sample.withColumn("period", period).groupBy("period", "query", "url")
             .agg(F.count(F.lit(1)).alias("n")).toArrow())
    periods = table.column("period").to_numpy()
    out = {}
    for p in sorted(set(periods.tolist())):
        part = table.filter(pc.equal(table.column("period"), p))
        out[int(p)] = CountedRecords.from_table(part.select(COUNT_SCHEMA.names).cast(COUNT_SCHEMA))
    return out

"""Counting with Apache Spark: the :class:`~hybriddp.core.counting.CountingBackend` on a Spark session.

The counts are exact integers, so a run with :class:`SparkBackend` gives the same head list and
estimates as with :class:`~hybriddp.core.counting.NumpyBackend` for the same seed: noise
is drawn on the driver, once per record, by the same noise classes (ALGORITHM.md §3, §4, §6).
The bulk jobs on data that never fits one machine (device reports from Parquet, the keyed per-user
sampling) are in :mod:`hybriddp.spark.reports` and :mod:`hybriddp.spark.keyed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from hybriddp.spark.session import spark_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def arrow_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A Spark DataFrame of an Arrow table (PySpark ≥ 4 takes Arrow directly)."""
    return spark.createDataFrame(table)


class SparkBackend:
    """Counts on a Spark session (``local[N]`` or a cluster); same results as the NumPy backend."""

    name = "spark"

    def __init__(self, spark: SparkSession | None = None, master: str | None = None) -> None:
        self.spark = spark or spark_session(master)

    def count_distinct(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sorted distinct keys and how often each occurs (``groupBy(key).count()``)."""
        from pyspark.sql import functions as F

        keys = np.asarray(keys, dtype=np.int64)
        if len(keys) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        df = arrow_frame(self.spark, pa.table({"k": keys}))
        out = df.groupBy("k").agg(F.count(F.lit(1)).alias("n")).orderBy("k").toArrow()
        return (out.column("k").to_numpy().astype(np.int64), out.column("n").to_numpy().astype(np.int64))

    def count_entries(self, entries: np.ndarray, n_entries: int) -> np.ndarray:
        """counts[i] = occurrences of entry i for i in range(n_entries) (``groupBy(entry).count()``)."""
        entries = np.asarray(entries, dtype=np.int64)
        if len(entries) and (entries.min() < 0 or entries.max() >= n_entries):
            raise ValueError(f"entry index out of range [0, {n_entries})")
        out = np.zeros(n_entries, dtype=np.int64)
        if len(entries) == 0:
            return out
        keys, counts = self.count_distinct(entries)
        out[keys] = counts
        return out

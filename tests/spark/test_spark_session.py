"""The Spark session hybriddp starts, and the counting job's partitioning (docs/SCALE.md).

The JVM of a local session must get the settings asked for at its launch: ``spark.driver.memory``
given to a session after the JVM is up is silently ignored by Spark (hybriddp once ran every local
session with Spark's 1 GB that way).
"""

from __future__ import annotations

from pathlib import Path

from hybriddp.spark.reports import _partitions


def test_jvm_launched_with_the_session_settings(spark) -> None:
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-Xmx2g" in args and "-XX:+UseParallelGC" in args  # hybriddp's launch defaults
    assert jvm.java.lang.Runtime.getRuntime().maxMemory() > 1.5 * 2**30  # not Spark's 1 GB
    assert spark.conf.get("spark.ui.showConsoleProgress") == "false"


def test_one_shuffle_partition_per_40_mb(spark, tmp_path: Path) -> None:
    """max(spark.sql.shuffle.partitions = 4, ceil(bytes / 40 MiB)); sparse files stand in for reports."""
    (tmp_path / "r").mkdir()
    for i, mib in enumerate((100, 100, 41)):
        with open(tmp_path / "r" / f"part-{i}.parquet", "wb") as f:
            f.truncate(mib << 20)
    assert _partitions(spark, tmp_path / "r") == 7  # 241 MiB / 40 MiB = 6.025 -> 7
    assert _partitions(spark, tmp_path / "r" / "part-2.parquet") == 4  # 41 MiB -> 2, below the configured 4
    assert _partitions(spark, "s3a://bucket/reports/") == 4  # remote: the configured number

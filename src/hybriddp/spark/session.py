"""Starting (or reusing) the Spark session of the Spark engine (docs/SCALE.md).

PySpark is an optional extra (``pip install 'hybriddp[spark]'``) and needs Java 17 or newer.
Both are checked here, once, with an error that says what to install: nothing else in hybriddp
imports :mod:`pyspark` at module level.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Any

from hybriddp.core.errors import HybridDPError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"
"""``local[N]`` runs Spark in this process's JVM with N worker threads; any other master URL
(``spark://…``, ``yarn``, ``k8s://…``) runs on a cluster."""

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.shuffle.compress": "false",
}
"""Settings for a small ``local[N]`` session, used only where ``spark-defaults.conf`` or
``spark-submit --conf`` say nothing; a cluster session gets none of them (its own defaults apply).
Shuffle compression is off: the counting job's shuffle is random 64-bit hashes, which do not
compress (off, with no partial aggregation, its deduplication of 10⁷ reports took 4.2 s instead
of 9.7 s; docs/SCALE.md)."""

JVM_LAUNCH_KEYS = ("spark.driver.memory", "spark.driver.extraJavaOptions", "spark.driver.extraClassPath",
                   "spark.driver.extraLibraryPath")
"""Settings that shape the driver's JVM itself: they count only when that JVM is started, so they
are passed to its launch (a session asked for later in the same process cannot change them)."""

LAUNCH_DEFAULTS: dict[str, str] = {
    "spark.driver.memory": "2g",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
    "spark.ui.showConsoleProgress": "false",
}
"""Given to a driver JVM that hybriddp starts itself (not under ``spark-submit``), unless ``conf``
says otherwise; as launch settings they also take precedence over ``spark-defaults.conf``. The
throughput collector counted 10⁸ reports 5% faster than Java's default G1 (docs/SCALE.md); 2 GB
(Spark's default is 1 GB) is the memory the counting job's partitions are sized for; Spark's
console progress bar is off because the commands draw their own."""


class SparkUnavailable(HybridDPError):
    """PySpark or Java is missing: the Spark engine cannot start."""


def require_pyspark() -> Any:
    """Import :mod:`pyspark`, or raise :class:`SparkUnavailable` naming the fix."""
    try:
        import pyspark
    except ImportError:
        raise SparkUnavailable("the Spark engine needs PySpark: pip install 'hybriddp[spark]' "
                               "(and Java 17 or newer on the PATH or in JAVA_HOME)") from None
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) and not shutil.which("java"):
        raise SparkUnavailable("the Spark engine needs Java 17 or newer: install a JDK (e.g. apt-get install "
                               "openjdk-17-jre-headless) or set JAVA_HOME")
    return pyspark


def _configured(launch: dict[str, str] | None = None) -> Any:
    """The settings ``spark-submit`` (``--master``, ``--conf``) or ``spark-defaults.conf`` already give.

    Both reach the JVM as system properties, which a :class:`SparkConf` reads once the JVM gateway
    is up (starting it here costs nothing extra: the session needs it anyway). ``launch``: settings
    for a JVM started here (ignored when one is already running, e.g. under ``spark-submit``).
    """
    from pyspark import SparkConf, SparkContext

    start = SparkConf(loadDefaults=False).setAll(sorted((launch or {}).items())) if launch else None
    try:
        SparkContext._ensure_initialized(conf=start)
    except Exception as exc:
        raise SparkUnavailable(f"the JVM for Spark did not start ({' '.join(str(exc).split())[:300]}); check "
                               "Java 17+ (java -version) and JAVA_HOME") from exc
    return SparkConf()


def spark_session(master: str | None = None, conf: dict[str, str] | None = None,
                  app_name: str = "hybriddp") -> SparkSession:
    """The active Spark session, or a new one on ``master`` (default :data:`DEFAULT_MASTER`).

    ``conf`` adds or overrides settings (e.g. ``{"spark.driver.memory": "4g"}``). With
    ``master=None`` under ``spark-submit --master URL``, that master is used.
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None and not conf:
        return active
    launch = {**LAUNCH_DEFAULTS, **{k: v for k, v in (conf or {}).items()
                                    if k in JVM_LAUNCH_KEYS or k in LAUNCH_DEFAULTS}}
    configured = _configured(launch)
    builder = SparkSession.builder.appName(app_name)
    if master is not None or not configured.contains("spark.master"):
        builder = builder.master(master or DEFAULT_MASTER)
    effective = master or configured.get("spark.master", DEFAULT_MASTER)
    local = effective.startswith("local")
    defaults = {k: v for k, v in DEFAULT_CONF.items() if local and not configured.contains(k)}
    for key, value in {**defaults, **(conf or {})}.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # Py4J / Java gateway failures surface as plain exceptions
        raise SparkUnavailable(f"Spark did not start ({' '.join(str(exc).split())[:300]}); check Java 17+ "
                               "(java -version) and the --spark-master value") from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark

"""``--engine`` and ``--spark-master``: where the counting runs (docs/SCALE.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from hybriddp.core.counting import CountingBackend, NumpyBackend

F = TypeVar("F", bound=Callable[..., Any])


def engine_options(what: str) -> Callable[[F], F]:
    """Add ``--engine numpy|spark`` and ``--spark-master URL``; ``what`` says what the engine counts."""
    def deco(f: F) -> F:
        f = click.option("--spark-master", default=None, metavar="URL",
                         help="With --engine spark: the Spark master, e.g. local[4] (4 threads in this process) "
                              "or spark://host:7077, yarn, k8s://…. Default: spark-submit's --master, else "
                              "local[2]. Spark settings come from the usual places (spark-defaults.conf, "
                              "spark-submit --conf).")(f)
        return click.option("--engine", type=click.Choice(["numpy", "spark"]), default="numpy", show_default=True,
                            help=f"numpy: count {what} in this process; spark: count them with Apache Spark "
                                 "(pip install 'hybriddp[spark]', Java 17+). Same seed, same counts, same "
                                 "estimates.")(f)
    return deco


def make_backend(engine: str, spark_master: str | None) -> CountingBackend:
    """The counting backend the options ask for (Spark starts here, with a clear error if it cannot)."""
    if engine == "spark":
        from hybriddp.spark.backend import SparkBackend
        return SparkBackend(master=spark_master)
    if spark_master is not None:
        raise click.BadParameter("--spark-master needs --engine spark", param_hint="--spark-master")
    return NumpyBackend()

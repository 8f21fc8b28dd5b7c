"""One local Spark session for every Spark test (docs/TESTING.md): ``local[2]``, no UI, 4 shuffle partitions.

PySpark and Java 17 are required components here (the ``test`` extra installs PySpark): a missing
one FAILS these tests with the fix, never skips them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sessiononce import once_per_run


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's SparkSession, stopped at the end."""
    once_per_run(tmp_path_factory, "the Spark tests' SparkSession")
    from hybriddp.spark.session import SparkUnavailable, spark_session

    try:
        session = spark_session("local[2]", {"spark.sql.shuffle.partitions": "4",
                                             "spark.default.parallelism": "4"}, app_name="hybriddp-tests")
    except SparkUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield session
    session.stop()

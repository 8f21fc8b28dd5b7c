"""Fixtures of the service tests: every test reaches the database through ``store_url``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcluster import PgCluster, PgClusterError


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL server for the session (tests/pgcluster.py); missing binaries FAIL the tests."""
    cluster = PgCluster()
    try:
        cluster.start()
    except PgClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database for one test: an SQLite file in the test's temporary directory, or a new
    database on the session's PostgreSQL cluster."""
    if request.param == "postgresql":
        return request.getfixturevalue("pg_cluster").create_database()
    return f"sqlite:///{tmp_path / 'hybriddp.db'}"

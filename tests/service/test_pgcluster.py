"""The throwaway PostgreSQL cluster of the service tests (tests/pgcluster.py)."""

from __future__ import annotations

import psycopg
import pytest

from pgcluster import PgCluster, PgClusterError


def test_missing_server_binaries_fail_with_what_to_install() -> None:
    with pytest.raises(PgClusterError) as info:
        PgCluster(bindir="/nonexistent/postgresql/bin").start()
    text = str(info.value)
    assert "initdb" in text and "/nonexistent/postgresql/bin" in text
    assert "apt-get install -y postgresql-15" in text and "HYBRIDDP_PG_BINDIR" in text


def test_the_cluster_listens_on_loopback_only_and_hands_out_fresh_databases(pg_cluster: PgCluster) -> None:
    first, second = pg_cluster.create_database(), pg_cluster.create_database()
    assert first != second and first.startswith("postgresql+psycopg://") and "@127.0.0.1:" in first
    assert pg_cluster.root is not None
    hba = (pg_cluster.root / "data" / "pg_hba.conf").read_text().split("\n")
    assert [line for line in hba if line.startswith("host")] == ["host all all 127.0.0.1/32 trust"]
    with psycopg.connect(host="127.0.0.1", port=pg_cluster.port, user=pg_cluster.user,
                         dbname=first.rsplit("/", 1)[1]) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SHOW server_version_num").fetchone()[0] >= "150000"
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
        assert tables == (0,)

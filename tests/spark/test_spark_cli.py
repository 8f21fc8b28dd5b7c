"""The commands with ``--engine spark`` (issue 12): same result as ``--engine numpy``, clean errors.

``run`` on a partitioned Parquet log and the file workflow with Parquet reports; every run uses the
test session's Spark (the commands reuse an active session when no --spark-master is given).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clihelpers import assert_clean_error, invoke
from logdata import zipf_log

KNOBS = ("--optin-fraction", "0.2", "--head-list-size", "15", "--m-c", "2", "--seed", "5")


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A partitioned synthetic AOL-like log: 2,597 users in 4 Parquet files."""
    out = tmp_path_factory.mktemp("synth") / "log.parquet"
    invoke("synth", "--partitioned", "--scale", "0.005", "--users-per-file", "700", "--seed", "2", "-o", out)
    return out


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Zipf log of 4,000 users written as 3 Parquet files (columns user, query, url)."""
    log = zipf_log(n_users=4_000, n_queries=60, seed=3)
    users = np.repeat(np.arange(log.n_users), log.records_per_user())
    table = pa.table({"user": users, "query": log.queries.decode(log.query), "url": log.urls.decode(log.url)})
    out = tmp_path_factory.mktemp("log") / "log.parquet"
    out.mkdir()
    for i, a in enumerate(range(0, table.num_rows, 4_500)):
        pq.write_table(table.slice(a, 4_500), out / f"part-{i:05d}.parquet")
    return out


def test_synth_partitioned_log(synth_dir: Path) -> None:
    parts = sorted(synth_dir.glob("part-*.parquet"))
    assert len(parts) == 4  # ceil(round(0.005 * 519,371) / 700) = ceil(2,597 / 700)
    users = [pq.read_table(p, columns=["user"]).column("user").to_numpy() for p in parts]
    assert users[0].min() == 0 and all(a.max() + 1 == b.min() for a, b in itertools.pairwise(users))
    assert sum(len(set(u.tolist())) for u in users) == 2_597


def test_run_engine_spark_equals_numpy(spark, log_dir: Path) -> None:
    a = invoke("run", "--input", log_dir, *KNOBS, "--json")
    b = invoke("run", "--input", log_dir, *KNOBS, "--json", "--engine", "spark")
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    ja.pop("stage_seconds"), jb.pop("stage_seconds")
    assert ja == jb
    assert ja["sizes"]["users"] == 4_000


def test_file_workflow_with_parquet_reports(spark, log_dir: Path, tmp_path: Path) -> None:
    hl, est = tmp_path / "hl.json", tmp_path / "est.json"
    invoke("headlist", "--input", log_dir, "--out-headlist", hl, "--out-estimates", est, *KNOBS)
    base = ("--headlist", hl, "--input", log_dir, "--optin-fraction", "0.2", "--seed", "5")
    invoke("randomize", *base, "--output", tmp_path / "r.jsonl")
    invoke("randomize", *base, "--output", tmp_path / "r.parquet")
    assert (tmp_path / "r.parquet").is_dir() and list((tmp_path / "r.parquet").glob("part-*.parquet"))
    common = ("estimate", "--headlist", hl, "--optin-estimates", est, "--json")
    jsonl = json.loads(invoke(*common, "--reports", tmp_path / "r.jsonl").stdout)
    numpy_pq = json.loads(invoke(*common, "--reports", tmp_path / "r.parquet").stdout)
    spark_pq = json.loads(invoke(*common, "--reports", tmp_path / "r.parquet", "--engine", "spark").stdout)
    strict = json.loads(invoke(*common, "--reports", tmp_path / "r.parquet", "--engine", "spark",
                               "--strict-ids").stdout)
    assert jsonl == numpy_pq == spark_pq == strict
    run = json.loads(invoke("run", "--input", log_dir, *KNOBS, "--json").stdout)
    assert [r["p_blended"] for r in spark_pq["records"]] == [r["p_blended"] for r in run["records"]]


def test_engine_errors(spark, log_dir: Path, tmp_path: Path) -> None:
    hl, est = tmp_path / "hl.json", tmp_path / "est.json"
    invoke("headlist", "--input", log_dir, "--out-headlist", hl, "--out-estimates", est, *KNOBS)
    invoke("randomize", "--headlist", hl, "--input", log_dir, "--seed", "1", "--output", tmp_path / "r.jsonl")
    r = invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", tmp_path / "r.jsonl",
               "--engine", "spark", ok=False)
    assert_clean_error(r, "--engine spark reads Parquet reports", "--engine numpy")
    r = invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", tmp_path / "r.jsonl",
               "--strict-ids", ok=False)
    assert_clean_error(r, "--strict-ids is for --engine spark")
    r = invoke("run", "--input", log_dir, "--spark-master", "local[1]", ok=False)
    assert_clean_error(r, "--spark-master needs --engine spark")
    r = invoke("run", "--input", log_dir, "--engine", "spark", "--algorithm", "central", ok=False)
    assert_clean_error(r, "--engine spark runs --algorithm blender only")
    (tmp_path / "empty").mkdir()
    r = invoke("run", "--input", tmp_path / "empty", ok=False)
    assert_clean_error(r, "is a directory without .parquet files")
    (tmp_path / "file.parquet").write_text("x")
    r = invoke("synth", "--partitioned", "--scale", "0.001", "-o", tmp_path / "file.parquet", ok=False)
    assert_clean_error(r, "--output", "An existing file is not replaced by a directory")

"""The Spark engine at browser scale: counting N device reports from partitioned Parquet (docs/SCALE.md).

Generates N one-report device messages over a real head list (a small synthetic AOL round), as a
directory of Parquet files (one row per report, docs/FORMATS.md; 0.1% of messages resent), then
counts them per head-list entry with ``local[1]`` and ``local[2]`` (each in a fresh process, so
neither inherits the other's warmed-up JVM) and checks the counts against the NumPy counts of the
generated entries. Prints a table, or one JSON object with ``--json``:

    reports, rows_written, duplicates_dropped, files, bytes_on_disk, seconds_generate,
    seconds_local1, seconds_local2, reports_per_s (local[2]), reports_per_s_local1, speedup,
    equal_to_numpy, spark_start_seconds_local1, spark_start_seconds_local2, cpus_local1, cpus_local2,
    strict_ids

``local[N]`` runs pinned to N CPUs (``cpus_local*``; null = not pinned, ``--no-pin`` or too few CPUs).

``equal_to_numpy``: both Spark runs' counts equal ``np.bincount`` of the generated entries (the
NumPy backend's count) and both counted exactly N messages.

``seconds_local*`` time the counting job only (read, deduplicate, check, join, count); the JVM's
start is reported apart. Run the 100 M measurement niced (``nice -n 19``); it needs ~2.5 GB of disk.

    nice -n 19 python benchmarks/bench_spark.py --reports 100000000 --json
    python benchmarks/bench_spark.py --reports 2000000

First a calibration of the machine (benchmarks/machine.py, in this process, before the generation); every time and
rate is also given in its numpy units (columnar, memory-bound work: the JVM's counting and NumPy's generation), in
the table's last column or, with ``--json``, as ``in_numpy_units`` next to ``machine`` (the calibration line then
goes to stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def make_release(workdir: Path) -> tuple[str, str]:
    """A small synthetic AOL round's release documents (head list of 50 records), written to ``workdir``."""
    from hybriddp.core.params import BlenderParams
    from hybriddp.curator.party import curate
    from hybriddp.datasets.synth import generate
    from hybriddp.io.exchange import write_release_files

    log = generate("aol", seed=1, scale=0.2)
    rel, _ = curate(log, BlenderParams(optin_fraction=0.5, head_list_size=50), seed=1, with_charges=False)
    hl, est = workdir / "headlist.json", workdir / "optin-estimates.json"
    write_release_files(hl, est, rel.headlist, rel.estimates)
    return str(hl), str(est)


def load_release(hl: str, est: str) -> Any:
    from hybriddp.curator.release import release_from_documents
    from hybriddp.io.exchange import read_release_files
    return release_from_documents(*read_release_files(hl, est))


def worker(args: argparse.Namespace) -> None:
    """One measurement in this process: start Spark on ``--master``, count, print JSON."""
    from hybriddp.spark.reports import count_reports_spark
    from hybriddp.spark.session import spark_session

    rel = load_release(args.headlist, args.estimates)
    t0 = time.perf_counter()
    conf = {"spark.driver.memory": args.driver_memory, "spark.sql.files.maxPartitionBytes": "64m"}
    if args.shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(args.shuffle_partitions)
    spark = spark_session(args.master, conf)
    t1 = time.perf_counter()
    got = count_reports_spark(spark, rel, args.dir, strict_ids=args.strict_ids)
    t2 = time.perf_counter()
    spark.stop()
    print(json.dumps({"start": t1 - t0, "seconds": t2 - t1, "counts": got.counts.tolist(),
                      "messages": got.messages, "duplicates": got.duplicates, "rows": got.rows}))


def cpus_for(master: str) -> set[int] | None:
    """The first N CPUs this process may use, for ``local[N]`` (None: fewer than N, so not pinned)."""
    n = int(master[len("local["):-1])
    allowed = sorted(os.sched_getaffinity(0))
    return set(allowed[:n]) if len(allowed) >= n else None


def measure(master: str, args: argparse.Namespace, hl: str, est: str, data: Path) -> dict[str, Any]:
    """One fresh process counting ``data`` on ``master``, pinned to as many CPUs as it has threads.

    Without the pinning ``local[1]`` would not be one core: the JVM's garbage collector, JIT
    compiler and I/O threads would run on the second core (that made 1 → 2 threads look like a
    speed-up of 1.65 instead of the 1.85 measured pinned, for 10⁸ reports; docs/SCALE.md).
    """
    cpus = None if args.no_pin else cpus_for(master)
    cmd = [sys.executable, __file__, "--worker", "--master", master, "--dir", str(data), "--headlist", hl,
           "--estimates", est, "--driver-memory", args.driver_memory,
           "--shuffle-partitions", str(args.shuffle_partitions or 0)] + (["--strict-ids"] if args.strict_ids else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "cpus": len(cpus) if cpus else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reports", type=int, default=2_000_000,
                    help="Number of distinct device reports (messages of one report) to generate (default 2,000,000).")
    ap.add_argument("--json", action="store_true", help="Print one JSON object instead of a table.")
    ap.add_argument("--workdir", default=None,
                    help="Directory for the generated Parquet reports (default: a temporary directory, removed).")
    ap.add_argument("--keep", action="store_true", help="Keep the generated reports (with --workdir).")
    ap.add_argument("--driver-memory", default="2g", help="spark.driver.memory of each local run (default 2g).")
    ap.add_argument("--shuffle-partitions", type=int, default=0,
                    help="At least this many shuffle partitions (default 0: one per ~40 MB of reports, "
                         "hybriddp.spark.reports chooses).")
    ap.add_argument("--strict-ids", action="store_true",
                    help="Count with strict_ids=True (every id's characters checked, as `estimate --strict-ids`).")
    ap.add_argument("--no-pin", action="store_true",
                    help="Do not pin local[N] to N CPUs (local[1] then also uses other cores for the JVM's threads).")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--headlist", help=argparse.SUPPRESS)
    ap.add_argument("--estimates", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.reports < 1:
        ap.error(f"--reports = {args.reports}: must be >= 1")
    from machine import calibrate, print_calibration, timing_figures, unit_label  # a sibling module, as synth_reports
    from rich.progress import Progress
    from synth_reports import write_synthetic_reports  # a sibling module: this script's folder is on sys.path

    machine = calibrate()
    print_calibration(machine, sys.stderr if args.json else None)

    tmp = tempfile.TemporaryDirectory(dir=args.workdir) if not args.keep else None
    work = Path(tmp.name if tmp else (args.workdir or tempfile.mkdtemp()))
    hl, est = make_release(work)
    rel = load_release(hl, est)
    data = work / "reports.parquet"
    t0 = time.perf_counter()
    with Progress(disable=args.json, transient=True) as bar:
        task = bar.add_task("generating reports", total=args.reports)
        truth = write_synthetic_reports(data, rel, args.reports, seed=7,
                                        progress=lambda k: bar.update(task, completed=k))
    gen = time.perf_counter() - t0
    runs = {m: measure(m, args, hl, est, data) for m in ("local[1]", "local[2]")}
    equal = all(np.array_equal(np.asarray(r["counts"]), truth) and r["messages"] == args.reports
                for r in runs.values())
    s1, s2 = runs["local[1]"]["seconds"], runs["local[2]"]["seconds"]
    result = {
        "reports": args.reports, "rows_written": runs["local[2]"]["rows"],
        "duplicates_dropped": runs["local[2]"]["duplicates"], "head_list_entries": len(truth),
        "files": len(list(data.glob("*.parquet"))),
        "bytes_on_disk": sum(f.stat().st_size for f in data.glob("*.parquet")),
        "seconds_generate": round(gen, 2), "seconds_local1": round(s1, 2), "seconds_local2": round(s2, 2),
        "reports_per_s": round(args.reports / s2), "reports_per_s_local1": round(args.reports / s1),
        "speedup": round(s1 / s2, 3), "equal_to_numpy": equal,
        "spark_start_seconds_local1": round(runs["local[1]"]["start"], 2),
        "spark_start_seconds_local2": round(runs["local[2]"]["start"], 2),
        "cpus_local1": runs["local[1]"]["cpus"], "cpus_local2": runs["local[2]"]["cpus"],
        "strict_ids": args.strict_ids,
    }
    if tmp:
        tmp.cleanup()
    relative = timing_figures(result, machine, "numpy")
    if args.json:
        print(json.dumps({**result, "machine": machine, "in_numpy_units": relative}))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"Spark counting of {args.reports:,} device reports")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("in numpy units", justify="right")
    for k, v in result.items():
        t.add_row(k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v),
                  unit_label(k, relative[k], "numpy") if k in relative else "")
    Console().print(t)


if __name__ == "__main__":
    main()

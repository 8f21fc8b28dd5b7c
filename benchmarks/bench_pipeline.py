"""Speed and memory of the BLENDER pipeline on a synthetic preset (issue: core, point 8).

Prints a table: stage, seconds, peak RSS after the stage. Loading (here: generating the
synthetic log) is reported but not counted in ``pipeline_seconds``, which covers sampling,
head list, opt-in estimates, randomizing every client, client estimates, blending and metrics.

The batch randomizer's rate is measured on every client report; the baseline is a per-record
pure-Python LocalAlg (``hybriddp.device.local_alg``) over the first ``--python-reports`` of
the same reports, in the same run, and the speed-up is the ratio of the two rates.

    python benchmarks/bench_pipeline.py --preset yandex [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

from hybriddp import BlenderParams
from hybriddp.device import DeviceHeadList, SeededSource, local_alg
from hybriddp.io.synth import generate
from hybriddp.pipeline import Stages, run_blender
from hybriddp.randomizer import randomize_batch
from hybriddp.result import result_from_run

TARGETS = {"yandex": {"pipeline_seconds": 20.0, "peak_rss_gb": 4.0, "randomizer_reports_per_second": 1e7,
                      "randomizer_speedup": 50.0}}


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["aol", "yandex"], default="yandex")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the preset's users (default 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--python-reports", type=int, default=300_000,
                    help="reports run through the pure-Python LocalAlg baseline (default 300000)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)

    params = BlenderParams.paper_defaults(args.preset)
    rows: list[tuple[str, float, float]] = []
    t0 = time.perf_counter()
    log = generate(args.preset, seed=args.seed, scale=args.scale)
    rows.append(("generate log (not counted)", time.perf_counter() - t0, peak_rss_gb()))

    def on_stage(name: str) -> None:
        if stages.seconds:
            last = next(reversed(stages.seconds))
            rows.append((last, stages.seconds[last], peak_rss_gb()))

    stages = Stages(on_stage)
    t1 = time.perf_counter()
    run = run_blender(log, params, seed=args.seed, stages=stages)
    last = next(reversed(stages.seconds))
    rows.append((last, stages.seconds[last], peak_rss_gb()))
    t2 = time.perf_counter()
    res = result_from_run(run)
    rows.append(("metrics", time.perf_counter() - t2, peak_rss_gb()))
    pipeline_seconds = time.perf_counter() - t1

    # --- randomizer: batch over all client reports vs per-record pure Python -----------------
    hl, lp = run.head_list, run.lp
    entries = hl.map_records(run.sampled_c.query, run.sampled_c.url)
    rng = np.random.default_rng(args.seed)
    randomize_batch(entries[:1000], hl, lp, rng)  # warm-up
    t = time.perf_counter()
    randomize_batch(entries, hl, lp, rng)
    batch_rate = len(entries) / (time.perf_counter() - t)
    doc = hl.to_device_json(log.queries, log.urls, epsilon=params.epsilon, delta=params.delta, f_c=run.f_c_used,
                            m_c=params.m_c, url_level=log.has_urls)
    dhl = DeviceHeadList.from_json(doc)
    n_py = min(args.python_reports, len(entries))
    q_pos = (np.searchsorted(hl.url_offsets, entries[:n_py], side="right") - 1).tolist()
    u_pos = (entries[:n_py] - hl.url_offsets[q_pos]).tolist()
    src = SeededSource(args.seed)
    t = time.perf_counter()
    for qi, ui in zip(q_pos, u_pos, strict=True):
        local_alg(qi, ui, dhl, src)
    python_rate = n_py / (time.perf_counter() - t)

    out = {
        "preset": args.preset, "scale": args.scale, "users": log.n_users, "records": log.n_records,
        "reports": int(len(entries)), "head_list_records": res.head_list.n_records,
        "pipeline_seconds": pipeline_seconds, "peak_rss_gb": peak_rss_gb(),
        "randomizer_reports_per_second": batch_rate, "python_reports_per_second": python_rate,
        "python_reports_measured": n_py, "randomizer_speedup": batch_rate / python_rate,
        "ndcg": res.metrics["ndcg"], "l1": res.metrics["l1"],
        "stages": [{"stage": s, "seconds": sec, "peak_rss_gb": rss} for s, sec, rss in rows],
    }
    if args.json:
        print(json.dumps(out))
        return 0
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"BLENDER pipeline, {args.preset} preset ({log.n_users:,} users, {log.n_records:,} records,"
                        f" M = {params.head_list_size})", title_justify="left")
    for col in ("stage", "seconds", "peak RSS (GB)"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for s, sec, rss in rows:
        table.add_row(s, f"{sec:.2f}", f"{rss:.2f}")
    table.add_row("[b]pipeline after loading[/b]", f"[b]{pipeline_seconds:.2f}[/b]", f"{out['peak_rss_gb']:.2f}")
    con = Console()
    con.print(table)
    con.print(f"batch randomizer: {batch_rate / 1e6:.1f} M reports/s over {len(entries):,} reports; "
              f"pure-Python LocalAlg: {python_rate / 1e6:.3f} M reports/s over {n_py:,} of them; "
              f"speed-up {out['randomizer_speedup']:.0f}x")
    con.print(f"NDCG {out['ndcg']:.4f}, L1 {out['l1']:.4f}, head list {out['head_list_records']} records")
    target = TARGETS.get(args.preset)
    if target and args.scale == 1.0:
        ok = (pipeline_seconds <= target["pipeline_seconds"] and out["peak_rss_gb"] <= target["peak_rss_gb"]
              and batch_rate >= target["randomizer_reports_per_second"]
              and out["randomizer_speedup"] >= target["randomizer_speedup"])
        con.print(f"targets (<= 20 s, <= 4 GB, >= 10M reports/s, >= 50x): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

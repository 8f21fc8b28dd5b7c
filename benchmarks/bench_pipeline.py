"""Speed and memory of the BLENDER pipeline on a synthetic preset.

Prints a table: stage, seconds, peak RSS after the stage. Loading (here: generating the
synthetic log) is reported but not counted in ``pipeline_seconds``, which covers sampling,
head list, opt-in estimates, randomizing every client, client estimates, blending and metrics.

The batch randomizer's rate is measured on every client report. The baseline is the per-record
pure-Python LocalAlg of ``hybriddp.device.localalg`` over the first ``--python-reports`` of the same
records, in the same run: mapping the record onto the head list, randomizing, building the
report, with OS randomness (what one device does). The headline speed-up compares it with the
batch path doing the same work (``map_records`` + ``randomize_batch``); two more ratios are
printed for transparency (Python with a seeded Mersenne Twister; both cores only).

    python benchmarks/bench_pipeline.py --preset yandex [--json]

First a calibration of the machine (benchmarks/machine.py). The stages and the batch randomizer are vectorized:
their times and rates are also given in its numpy units; the per-record pure-Python rates in its python units
(JSON: ``machine``, ``in_numpy_units``, ``in_python_units``, each stage's ``numpy_units``; the calibration line then
goes to stderr). The calibration allocates ~50 MB for a moment, before the log is generated.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

from hybriddp import BlenderParams
from hybriddp.datasets.synth import generate
from hybriddp.device.batch import randomize_batch
from hybriddp.device.localalg import DeviceHeadList, SeededSource, SystemSource, local_alg
from hybriddp.simulation.pipeline import Stages, result_from_run, run_blender

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
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, in_units, print_calibration, rate_relative, relative

    machine = calibrate()
    print_calibration(machine, sys.stderr if args.json else None)

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
    d_c = run.sampled_c
    rng = np.random.default_rng(args.seed)
    randomize_batch(hl.map_records(d_c.query[:1000], d_c.url[:1000]), hl, lp, rng)  # warm-up
    t = time.perf_counter()
    entries = hl.map_records(d_c.query, d_c.url)
    t_map = time.perf_counter() - t
    t = time.perf_counter()
    randomize_batch(entries, hl, lp, rng)
    t_rand = time.perf_counter() - t
    batch_rate = len(entries) / t_rand
    batch_e2e_rate = len(entries) / (t_map + t_rand)
    doc = hl.to_device_json(log.queries, log.urls, epsilon=params.epsilon, delta=params.delta, f_c=run.f_c_used,
                            m_c=params.m_c, url_level=log.has_urls)
    dhl = DeviceHeadList.from_json(doc)
    n_py = min(args.python_reports, len(entries))
    q_names = log.queries.decode(d_c.query[:n_py])
    u_names = log.urls.decode(d_c.url[:n_py]) if log.has_urls else [None] * n_py
    py_rates = {}
    for label, src in (("os", SystemSource()), ("mt", SeededSource(args.seed))):
        t = time.perf_counter()
        for qs, us in zip(q_names, u_names, strict=True):  # what one device does per record
            dhl.decode(*local_alg(*dhl.encode(qs, us), dhl, src))
        py_rates[label] = n_py / (time.perf_counter() - t)
    q_pos = hl.entry_query[entries[:n_py]].tolist()
    u_pos = (entries[:n_py] - hl.url_offsets[hl.entry_query[entries[:n_py]]]).tolist()
    src = SeededSource(args.seed)
    t = time.perf_counter()
    for qi, ui in zip(q_pos, u_pos, strict=True):
        local_alg(qi, ui, dhl, src)
    py_rates["core"] = n_py / (time.perf_counter() - t)
    python_rate = py_rates["os"]

    out = {
        "preset": args.preset, "scale": args.scale, "users": log.n_users, "records": log.n_records,
        "reports": len(entries), "head_list_records": res.head_list.n_records,
        "pipeline_seconds": pipeline_seconds, "peak_rss_gb": peak_rss_gb(),
        "randomizer_reports_per_second": batch_rate, "mapping_and_randomizer_reports_per_second": batch_e2e_rate,
        "python_reports_per_second": python_rate, "python_reports_measured": n_py,
        # headline: both paths end to end in their production configuration (records in, reports out;
        # batch = map_records + randomize_batch with OS-seeded PCG64, Python = the device randomizer
        # per record with OS randomness)
        "randomizer_speedup": batch_e2e_rate / python_rate,
        # the same with a fast seeded PRNG on the Python side, and core-only (pre-mapped indices)
        "randomizer_speedup_python_mt": batch_e2e_rate / py_rates["mt"],
        "randomizer_speedup_core": batch_rate / py_rates["core"],
        "python_rates": py_rates,
        "ndcg": res.metrics["ndcg"], "l1": res.metrics["l1"],
        "stages": [{"stage": s, "seconds": sec, "numpy_units": relative(sec, machine, "numpy"), "peak_rss_gb": rss}
                   for s, sec, rss in rows],
        "machine": machine,
        "in_numpy_units": in_units(machine, "numpy", seconds={"pipeline_seconds": pipeline_seconds},
                                   rates={"randomizer_reports_per_second": batch_rate,
                                          "mapping_and_randomizer_reports_per_second": batch_e2e_rate}),
        "in_python_units": {**in_units(machine, "python", rates={"python_reports_per_second": python_rate}),
                            "python_rates": in_units(machine, "python", rates=py_rates)},
    }
    if args.json:
        print(json.dumps(out))
        return 0
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"BLENDER pipeline, {args.preset} preset ({log.n_users:,} users, {log.n_records:,} records,"
                        f" M = {params.head_list_size})", title_justify="left")
    for col in ("stage", "seconds", "numpy units", "peak RSS (GB)"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for s, sec, rss in rows:
        table.add_row(s, f"{sec:.2f}", f"{relative(sec, machine, 'numpy'):.3g}", f"{rss:.2f}")
    table.add_row("[b]pipeline after loading[/b]", f"[b]{pipeline_seconds:.2f}[/b]",
                  f"[b]{relative(pipeline_seconds, machine, 'numpy'):.3g}[/b]", f"{out['peak_rss_gb']:.2f}")
    con = Console()
    con.print(table)
    rt = Table(title=f"LocalAlg throughput ({len(entries):,} client reports; pure Python on the first {n_py:,})",
               title_justify="left")
    for col in ("randomizer", "M reports/s", "reports per unit", "batch speed-up"):
        rt.add_column(col, justify="left" if col == "randomizer" else "right")

    def per_unit(rate: float, kind: str) -> str:
        return f"{rate_relative(rate, machine, kind):,.0f} / {kind}"
    rt.add_row("batch: randomize_batch (pre-mapped entries)", f"{batch_rate / 1e6:.2f}", per_unit(batch_rate, "numpy"),
               "")
    rt.add_row("batch: map_records + randomize_batch", f"{batch_e2e_rate / 1e6:.2f}",
               per_unit(batch_e2e_rate, "numpy"), "")
    rt.add_row("device per record, OS randomness (production)", f"{py_rates['os'] / 1e6:.3f}",
               per_unit(py_rates["os"], "python"), f"{out['randomizer_speedup']:.0f}x")
    rt.add_row("device per record, Mersenne Twister", f"{py_rates['mt'] / 1e6:.3f}", per_unit(py_rates["mt"], "python"),
               f"{out['randomizer_speedup_python_mt']:.0f}x")
    rt.add_row("local_alg core only, pre-mapped, Mersenne Twister", f"{py_rates['core'] / 1e6:.3f}",
               per_unit(py_rates["core"], "python"), f"{out['randomizer_speedup_core']:.0f}x")
    con.print(rt)
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

"""Mean generalized NDCG over seeds on the aol preset with the paper's defaults (ALGORITHM.md §10).

ε = 4, δ = 1e-5, 5% opt-in, M = 50, f_O = 0.95, f_C = 0.85, m = 1. Target: mean ≥ 0.95.

    python benchmarks/utility_ndcg.py [--seeds 5] [--preset aol] [--json]

First a calibration of the machine (benchmarks/machine.py); the total run time is also given in its numpy units
(whole-log pipeline runs: vectorized work). With ``--json`` the calibration line goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from hybriddp import BlenderParams
from hybriddp.datasets.synth import generate
from hybriddp.simulation.pipeline import result_from_run, run_blender


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["aol", "yandex"], default="aol")
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds (default 5)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, in_units, print_calibration, units

    machine = calibrate()
    print_calibration(machine, sys.stderr if args.json else None)
    start = time.perf_counter()
    params = BlenderParams.paper_defaults(args.preset)
    rows = []
    for seed in range(args.seeds):
        log = generate(args.preset, seed=1000 + seed, scale=args.scale)
        res = result_from_run(run_blender(log, params, seed=seed))
        m = res.metrics
        rows.append({"seed": seed, "ndcg": m["ndcg"], "ndcg_queries_at_10": m["ndcg_queries_at_10"],
                     "l1": m["l1"], "head_list_records": res.head_list.n_records,
                     "head_list_queries": res.head_list.n_queries})
        if not args.json:
            print(f"seed {seed}: NDCG {m['ndcg']:.4f}  NDCG@10 queries {m['ndcg_queries_at_10']:.4f}  "
                  f"L1 {m['l1']:.4f}  head list {res.head_list.n_records} records / "
                  f"{res.head_list.n_queries} queries", flush=True)
    nd = np.array([r["ndcg"] for r in rows])
    half = 1.96 * nd.std(ddof=1) / np.sqrt(len(nd)) if len(nd) > 1 else float("nan")
    summary = {"preset": args.preset, "params": params.to_dict(), "seeds": args.seeds, "mean_ndcg": float(nd.mean()),
               "ci95_halfwidth": float(half), "target": 0.95, "met": bool(nd.mean() >= 0.95), "runs": rows}
    seconds = time.perf_counter() - start
    summary.update(seconds=seconds, machine=machine, in_numpy_units=in_units(machine, "numpy", {"seconds": seconds}))
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"mean generalized NDCG over {args.seeds} seeds: {nd.mean():.4f} ± {half:.4f} (95% CI); "
              f"target >= 0.95: {'met' if summary['met'] else 'NOT met'}")
        print(f"run time {seconds:.0f} s ({units(seconds, machine, 'numpy')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Selection bias near the threshold (issue 28): per estimator, over the records listed in ≥ 10% of the rounds, the
mean RMSE, the largest |bias|/RMSE, the largest |z| of the bias and the range of reported variance / MSE.

Each round draws a fresh population of 40,000 users (one record each, 48 records with Zipf weights k^−1.1 over 12
queries), 5% opt in (|D_S| = 1,900, |D_T| = 100), and runs the shipped pipeline: CreateHeadList with its threshold
and released counts, the opt-in estimates, the clients' reports from LocalAlg's exact law, the server's blend
(:mod:`hybriddp.simulation.selection`; ε = 4, δ = 1e-5, f_C = 0.85, M = 100). Truth: the population's p.

    python benchmarks/selection_bias.py --rounds 4000 [--per-record] [--json]

First a calibration of the machine (benchmarks/machine.py); the run time is also given in its python units (many
small rounds: interpreter-bound work). With ``--json`` the calibration line goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from hybriddp.simulation.selection import Population, Setting, format_table, run_selection

NAMES = ("paper", "pooled", "reuse", "consistent")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4_000, help="rounds (default 4000)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the rounds (default 1)")
    ap.add_argument("--min-listed", type=float, default=0.10, help="records listed in at least this share of rounds")
    ap.add_argument("--per-record", action="store_true", help="also print every record's numbers for `reuse`")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args()
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, in_units, print_calibration, units

    machine = calibrate()
    print_calibration(machine, sys.stderr if args.json else None)
    start = time.perf_counter()
    runs = run_selection(Population.zipf(), Setting(), NAMES, rounds=args.rounds, seed=args.seed)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({"rounds": args.rounds, "seed": args.seed, "seconds": seconds, "machine": machine,
                          "in_python_units": in_units(machine, "python", {"seconds": seconds}),
                          **{n: runs.table_row(n, args.min_listed) for n in NAMES}}))
        return
    print(f"{args.rounds} rounds, seed {args.seed}, {seconds:.0f} s ({units(seconds, machine, 'python')}), "
          f"{runs.empty_rounds} with an empty head list")
    print(format_table(runs, NAMES, args.min_listed))
    if args.per_record:
        s = runs.summary("reuse", args.min_listed)
        print("\nreuse per record: expected S count λ, share of rounds listed, bias/RMSE, z, reported var / MSE "
              "± its standard error (from the MSE's)")
        listed = runs.listed("reuse")[s["record"]]
        err2 = (runs.estimates["reuse"][:, s["record"]] - s["p"]) ** 2
        se = s["ratio"] * np.nanstd(err2, axis=0) / np.nanmean(err2, axis=0) / np.sqrt(s["rounds"])
        for i in range(len(s["record"])):
            print(f"  λ {s['p'][i] * Setting().sizes[0]:7.1f}  listed {listed[i]:5.2f}  bias/RMSE "
                  f"{s['bias'][i] / s['rmse'][i]:+.3f}  z {s['z'][i]:+5.1f}  ratio {s['ratio'][i]:.3f} ± {se[i]:.3f}")
    np.set_printoptions(precision=3)


if __name__ == "__main__":
    main()

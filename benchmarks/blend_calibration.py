"""Calibration of the blended estimates at many rounds: per entry, bias (z) and reported variance / MSE.

The target (ALGORITHM.md §7): every entry unbiased (|z| < 3) over ≥ 5,000 rounds and the reported variance within 5% of
the empirical mean squared error. The unit tests check the same with margins; this script measures it with
as many rounds as you like and prints one table per estimator (and ``--json``: one object): per entry z,
the bias over the RMSE (a z-test over n rounds flags a bias at |z| ≥ 3 once it exceeds about 3/√n of the
RMSE: 4.2% at 5,000 rounds, 2.1% at 20,000) and the reported variance over the empirical MSE.

    python benchmarks/blend_calibration.py --trials 20000 [--json]

The list is ``hybriddp.server.calibration.six_queries()``, also the tests' (20 entries; ⟨q,*⟩ and ⟨*,*⟩
among the smallest, with expected T counts of 1.7–2.7), |D_T| = 500, |D_S| = 9,500, 20,000 reports,
ε = 4 (ALGORITHM.md §7, §7.1).

First a calibration of the machine (benchmarks/machine.py); the run time is also given in its python units (many
small blends: interpreter-bound work). With ``--json`` the calibration line goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from hybriddp.core.reportlaw import LocalAlgParams
from hybriddp.server.calibration import calibrate, six_queries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20_000, help="rounds per estimator (default 20000)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the rounds (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args()
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate as calibrate_machine
    from machine import in_units, print_calibration, units

    machine = calibrate_machine()
    print_calibration(machine, sys.stderr if args.json else None)
    hl, p = six_queries()
    lp = LocalAlgParams.build(hl, 4.0, 1e-5, 0.85, 1)
    out: dict[str, dict] = {"trials": args.trials, "seed": args.seed, "p_record": p.tolist(), "machine": machine}
    start = time.perf_counter()
    runs = {**calibrate(hl, p, lp, ("paper", "pooled"), n_t=500, n_s=0, n_c=20_000, epsilon=4.0,
                        trials=args.trials, seed=args.seed),
            **calibrate(hl, p, lp, ("reuse", "consistent"), n_t=500, n_s=9_500, n_c=20_000, epsilon=4.0,
                        trials=args.trials, seed=args.seed + 1)}
    for name, cal in runs.items():
        out[name] = {lvl: {"z": cal.z(lvl).tolist(), "bias_over_rmse": cal.relative_bias(lvl).tolist(),
                           "variance_ratio": cal.variance_ratio(lvl).tolist(), "mse": cal.mse(lvl)}
                     for lvl in ("records", "queries")}
    out["seconds"] = time.perf_counter() - start
    out["in_python_units"] = in_units(machine, "python", {"seconds": out["seconds"]})
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.trials} rounds per estimator, {out['seconds']:.0f} s ({units(out['seconds'], machine, 'python')})")
    for name in runs:
        for lvl in ("records", "queries"):
            d = out[name][lvl]
            z, r, b = np.array(d["z"]), np.array(d["variance_ratio"]), np.array(d["bias_over_rmse"])
            print(f"\n{name} {lvl}: total MSE {d['mse']:.4g}; max |z| {np.abs(z).max():.2f}; "
                  f"max |bias|/RMSE {np.abs(b).max():.3f}; variance/MSE {r.min():.3f}–{r.max():.3f} "
                  f"(mean {r.mean():.3f})")
            print("  entry     " + " ".join(f"{i:>6d}" for i in range(len(z))))
            print("  z         " + " ".join(f"{x:>6.2f}" for x in z))
            print("  bias/RMSE " + " ".join(f"{x:>6.3f}" for x in b))
            print("  ratio     " + " ".join(f"{x:>6.3f}" for x in r))


if __name__ == "__main__":
    main()

"""Honest error bars of the defended default (issue 40): the opt-in anchor against the undefended blend.

For each opt-in group size, ``--rounds`` honest rounds, each a fresh population of 20 × the opt-in group (5% opt
in, as the issue's measurement; ``--max-devices`` caps the devices), one record per user drawn from 48 Zipf records
(p_k ∝ k^−1.1 over 12 queries), ε = 4, M = 100, the default estimator ``reuse``, through the shipped curator,
devices and server (:mod:`hybriddp.simulation.defended_calibration`). Every defense publishes from the same reports.
One row per (opt-in size, defense), over the entries (records, wildcards included) and queries listed in ≥ 10% of
the rounds: the largest |z| of the bias (bias over its standard error; in brackets the entries with |z| > 4 of
those kept), reported var / MSE min–max, the RMSE (√ of the entries' mean MSE), the defended RMSE over the
undefended one, NDCG@10 of the queries and its difference, the share of entries the bound moved and of rounds the
test flagged. In brackets after a var / MSE range: the largest |ratio − 1| in the ratio's own standard errors
(from the spread of the squared errors; an entry listed in few rounds has a wide one). Truth: the distribution the
users are drawn from (``--truth sample``: the round's own frequencies).

One table per published column: ``p_blended_raw`` (unprojected records, what the calibration harnesses of §7
measure) and ``p_blended`` (records projected onto the simplex, queries clipped into [0, 1]); ``var_blended`` is
the reported variance of both.

    python benchmarks/anchor_calibration.py --optin 1000,2000,10000,50000 --rounds 800 --seed 1 [--json]

Issue 40's targets, at every opt-in size, for the defended default: reported var / MSE in [0.8, 1.25] and
|bias|/SE ≤ 4 for every entry listed in ≥ 10% of the rounds; RMSE ≤ 1.15 × the undefended blend's (records and
queries); NDCG@10 within 0.003 of it. At 800 rounds a ratio's own standard error is about 5% (√(2/800)), so the
band [0.8, 1.25] is about ±4 of them; a single |z| > 4 among ~75 entries is noise with probability ~0.5%.

First a calibration of the machine (benchmarks/machine.py); run times are also given in its python units (the
rounds are many small arrays: interpreter-bound work). With ``--json`` the calibration line goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from hybriddp.simulation.defended_calibration import COLUMNS, calibrate_defended

TARGETS = {"ratio": (0.8, 1.25), "z": 4.0, "rmse_over_reference": 1.15, "ndcg10": 0.003}


def sizes(text: str) -> list[int]:
    """``1000,2000`` → [1000, 2000]."""
    try:
        out = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--optin {text!r}: expected comma-separated integers, e.g. "
                                         "1000,2000,10000,50000") from None
    if not out or min(out) < 2:
        raise argparse.ArgumentTypeError(f"--optin {text!r}: every opt-in size must be an integer >= 2")
    return out


def fmt_row(n_optin: int, n_users: int, row: dict[str, Any]) -> str:
    r, q = row["records"], row["queries"]

    def ratio(x: dict[str, Any]) -> str:
        return f"{x['rmse_over_reference']:.2f}" if "rmse_over_reference" in x else "—"
    d_ndcg = f"{row['ndcg10_minus_reference']:+.4f}" if "ndcg10_minus_reference" in row else "—"
    return (f"| {n_optin:,} | {n_users:,} | {row['defense']} | {r['max_abs_z']:.1f} ({r['over_z_limit']} of "
            f"{r['entries']}) | {r['ratio_min']:.2f} – {r['ratio_max']:.2f} ({r['ratio_max_dev_se']:.1f}) | "
            f"{q['max_abs_z']:.1f} ({q['over_z_limit']} of {q['entries']}) | {q['ratio_min']:.2f} – "
            f"{q['ratio_max']:.2f} ({q['ratio_max_dev_se']:.1f}) | "
            f"{r['rmse']:.3g} | {q['rmse']:.3g} | {ratio(r)} / {ratio(q)} | {row['ndcg10']:.4f} | {d_ndcg} | "
            f"{row['clamped_share']:.2f} | {row['flagged_rounds']:.3f} |")


HEADER = ("| opt-in | users | defense | records: max \\|z\\| (\\|z\\| > 4) | records: var / MSE | "
          "queries: max \\|z\\| (\\|z\\| > 4) | queries: var / MSE | RMSE records | RMSE queries | "
          "RMSE / undefended (records / queries) | NDCG@10 | Δ NDCG@10 | clamped | flagged rounds |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--optin", type=sizes, default=[1000, 2000, 10000, 50000],
                    help="opt-in group sizes (default 1000,2000,10000,50000)")
    ap.add_argument("--rounds", type=int, default=800, help="rounds per opt-in size (default 800)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the rounds (default 1)")
    ap.add_argument("--max-devices", type=int, default=None,
                    help="cap on the devices per round (default: none, 19 × the opt-in group)")
    ap.add_argument("--truth", choices=("law", "sample"), default="law",
                    help="score against the users' distribution (law, default) or the round's own frequencies")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args()
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, in_units, print_calibration, units

    machine = calibrate()  # the rounds are many small arrays: interpreter-bound, so their times in python units
    print_calibration(machine, sys.stderr if args.json else None)
    out: dict[str, Any] = {"rounds": args.rounds, "seed": args.seed, "truth": args.truth, "targets": TARGETS,
                           "machine": machine, "sizes": []}
    start = time.perf_counter()
    for n_optin in args.optin:
        devices = 19 * n_optin if args.max_devices is None else min(19 * n_optin, args.max_devices)
        cal = calibrate_defended(n_optin, n_users=n_optin + devices, rounds=args.rounds, seed=args.seed,
                                 truth=args.truth)
        out["sizes"].append({"n_optin": n_optin, "n_users": n_optin + devices, "seconds": cal.seconds,
                             "in_python_units": in_units(machine, "python", {"seconds": cal.seconds}),
                             "empty_rounds": cal.empty_rounds,
                             **{c: [cal.row(d, column=c) for d in cal.runs] for c in COLUMNS}})
        if not args.json:
            print(f"opt-in {n_optin:,}: {cal.seconds:.0f} s ({units(cal.seconds, machine, 'python')}) for "
                  f"{args.rounds} rounds "
                  f"({cal.empty_rounds} with an empty head list)", flush=True)
    out["seconds"] = time.perf_counter() - start
    out["in_python_units"] = in_units(machine, "python", {"seconds": out["seconds"]})
    if args.json:
        print(json.dumps(out))
        return
    for column in ("p_blended_raw", "p_blended"):
        print(f"\n{column}, {args.rounds} rounds per size, seed {args.seed}, truth {args.truth}, "
              f"{out['seconds']:.0f} s ({units(out['seconds'], machine, 'python')}) in all\n{HEADER}")
        for s in out["sizes"]:
            for row in s[column]:
                print(fmt_row(s["n_optin"], s["n_users"], row))


if __name__ == "__main__":
    main()

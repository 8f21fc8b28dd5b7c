"""How rare a record ε-LDP devices can find without a dictionary (issue 43's feasibility): PEM (Wang, Li, Jha 2019,
:mod:`hybriddp.simulation.baselines.pem`) over a 32-bit hash of the record, every device sending one report.

Each repetition plants 7 records at user shares 0.05%–1% (three of each) in ``n`` devices; a device holding one
reports it with probability 1/r (``--records-per-report``: a device with r records outside the head list reports
one of them at random, so a record held by a share s of the users is a share s/r of the reports), every other
device reports a distinct long-tail item. Printed: per share, how often PEM (k = 50, ε = 4) returns the planted
hash, and the share below which no ε-LDP protocol can find a record, up to its constant C ≥ 1: about
√(n·ln d)·e^{ε/2}/(e^ε − 1) reports, d the domain (Bassily–Smith 2015's bound with the frequency oracle's noise per
report at large ε in place of 1/ε: an assumption, ALGORITHM.md §16).

    python benchmarks/discovery_limit.py [--devices 1000000,4000000] [--records-per-report 1,4] [--reps 3]

First a calibration of the machine (benchmarks/machine.py); each cell's time is also given in its numpy units.

Only the hash is found here; recovering the record's string needs more reports still (ALGORITHM.md §16).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from hybriddp.simulation.baselines.pem import pem

SHARES = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01)
EPSILON = 4.0
BITS = 32
PER_SHARE = 3
"""Planted records per share and repetition."""


def recall(n: int, r: int, reps: int) -> tuple[dict[float, float], float]:
    """Share → fraction of planted records PEM found, over ``reps`` repetitions (:data:`PER_SHARE` each)."""
    shares = np.repeat(np.array(SHARES), PER_SHARE)
    found = np.zeros(shares.size)
    start = time.perf_counter()
    for rep in range(reps):
        rng = np.random.default_rng([43, n, r, rep])
        items = rng.choice(2**BITS, shares.size, replace=False)
        holders = np.round(shares * n).astype(np.int64)
        reporting = rng.binomial(holders, 1.0 / r)  # holders whose report carries the record
        tail = rng.integers(0, 2**BITS, n - int(reporting.sum()))
        values = np.concatenate([np.repeat(items, reporting), tail])
        found += np.isin(items, pem(values, BITS, EPSILON, rng, k=50).items)
    per = {s: float(found[shares == s].sum() / (PER_SHARE * reps)) for s in SHARES}
    return per, time.perf_counter() - start


def floor_share(n: int, r: int) -> float:
    """The user share whose reports reach √(n·ln 2^BITS)·e^{ε/2}/(e^ε − 1), times r (C = 1)."""
    return r * math.sqrt(math.log(2.0**BITS) / n) * math.exp(EPSILON / 2) / math.expm1(EPSILON)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="1000000,4000000", help="devices reporting, comma-separated")
    ap.add_argument("--records-per-report", default="1,4", help="r: records a device chooses among, comma-separated")
    ap.add_argument("--reps", type=int, default=3, help=f"repetitions per cell ({PER_SHARE} records per share each)")
    args = ap.parse_args()
    cells = [(int(n), int(r)) for n in args.devices.split(",") for r in args.records_per_report.split(",")]
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, print_calibration, units

    machine = calibrate()
    print_calibration(machine)
    print("| devices | r | " + " | ".join(f"{s:.2%}" for s in SHARES) + " | lower bound (C = 1) | time |")
    print("|---|---|" + "---|" * len(SHARES) + "---|---|")
    for n, r in cells:
        per, secs = recall(n, r, args.reps)
        print(f"| {n:,} | {r} | " + " | ".join(f"{per[s]:.0%}" for s in SHARES)
              + f" | {floor_share(n, r):.3%} | {secs:.0f} s ({units(secs, machine)}) |")


if __name__ == "__main__":
    main()

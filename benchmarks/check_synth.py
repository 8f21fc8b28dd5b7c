"""Check the synthetic generator's calibration against the published statistics (ALGORITHM.md §10).

Usage::

    python benchmarks/check_synth.py --preset aol --seed 1
    python benchmarks/check_synth.py --preset yandex --seed 1

Prints users, records, distinct queries and URLs, records per user, the per-user-sampled
query probabilities of the top queries (exact expectation over the log and one sample of one
record per user, as in the paper's Figure 9), the probability mass outside the top-M records,
the expected CreateHeadList size at the paper's opt-in rates, generation time and peak RSS.

First a calibration of the machine (benchmarks/machine.py); the generation time is also given in its numpy units
(vectorized work).
"""

from __future__ import annotations

import argparse
import logging
import math
import resource
import sys
import time

import numpy as np
from scipy import stats

from hybriddp.core.records import RecordLog, sample_records
from hybriddp.datasets.synth import PRESETS, generate

# paper Figure 9 (AOL, one random record per user)
PAPER_AOL = {"google": .0213, "yahoo": .0067, "google.com": .0067, "myspace.com": .0057,
             "mapquest": .0054, "yahoo.com": .0043, "www.google.com": .0034, "myspace": .0033,
             "ebay": .0028}
PAPER_OUTSIDE_TOP50 = .9108

# the paper's experiment settings (Figure 10, §4.2.3): (M, δ, opt-in fractions)
SETTINGS = {"aol": (50, 1e-5, (0.045, 0.05)), "yandex": (500, 1e-7, (0.015, 0.025))}


def per_user_probabilities(log: RecordLog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact E[per-user-sampled probability] of every query and every distinct record."""
    counts = log.records_per_user()
    weight = np.repeat(1.0 / np.maximum(counts, 1), counts) / log.n_users
    p_query = np.bincount(log.query, weights=weight, minlength=len(log.queries))
    key = log.query.astype(np.int64) * (int(log.url.max()) + 2) + (log.url.astype(np.int64) + 1)
    uniq, inverse = np.unique(key, return_inverse=True)
    p_record = np.bincount(inverse, weights=weight)
    return p_query, uniq, p_record


def expected_head_list_size(p_record: np.ndarray, n_users: int, optin: float, delta: float,
                            eps: float = 4.0, f_o: float = 0.95) -> float:
    """E|HL_S| of CreateHeadList (ALGORITHM.md §3, m_O = 1): Σ_r P(Poisson(|S|p_r) + Lap(b) > τ)."""
    b = 2.0 / eps
    tau = b * (math.log(math.exp(eps / 2)) - math.log(delta))
    s = round(f_o * round(optin * n_users))
    p = np.sort(p_record)[::-1][:200_000]
    lam = s * p
    ks = np.arange(0, int(tau) + 200)
    pmf = stats.poisson.pmf(ks[None, :], lam[:, None])
    x = tau - ks
    surv = np.where(x >= 0, 0.5 * np.exp(-np.abs(x) / b), 1 - 0.5 * np.exp(-np.abs(x) / b))
    tail = stats.poisson.sf(ks[-1], lam)  # counts beyond the table: surely kept
    return float((pmf * surv[None, :]).sum() + tail.sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="aol")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    log_ = logging.getLogger("check_synth")
    pre = PRESETS[args.preset]
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, print_calibration, units

    machine = calibrate()
    print_calibration(machine)

    t0 = time.perf_counter()
    log = generate(args.preset, seed=args.seed, scale=args.scale)
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    counts = log.records_per_user()
    n_q = int((np.bincount(log.query, minlength=len(log.queries)) > 0).sum())
    n_u = int((np.bincount(log.url, minlength=len(log.urls)) > 0).sum())
    rows = [
        ("users", f"{log.n_users:,}", f"{round(args.scale * pre.n_users):,}"),
        ("records", f"{log.n_records:,}", f"{args.scale * pre.n_users * pre.mean_records:,.0f}"),
        ("distinct queries", f"{n_q:,}", f"{round(args.scale * pre.distinct_queries):,}"),
        ("distinct URLs", f"{n_u:,}", f"{round(args.scale * pre.distinct_urls):,}"),
        ("records/user mean", f"{counts.mean():.2f}", f"{pre.mean_records:.2f}"),
    ]
    qs = np.percentile(counts, [0, 10, 25, 50, 75, 90, 99, 100])
    rows.append(("records/user min,10,25,50,75,90,99%,max", ", ".join(f"{q:g}" for q in qs), ""))

    p_query, rec_key, p_record = per_user_probabilities(log)
    sample = sample_records(log, np.arange(log.n_users), 1, np.random.default_rng(args.seed + 1))
    p_sample = np.bincount(sample.query, minlength=len(log.queries)) / len(sample)
    top = np.argsort(p_query)[::-1][:10]
    names = log.queries.decode(top)
    p_sorted = np.sort(p_record)[::-1]
    m_head, delta, optins = SETTINGS[args.preset]

    out = ["", f"# synthetic {args.preset} (seed {args.seed}, scale {args.scale:g})", "",
           f"| {'statistic':<42} | {'synthetic':>26} | {'target':>14} |",
           f"|{'-' * 44}|{'-' * 28}|{'-' * 16}|"]
    out += [f"| {a:<42} | {b:>26} | {c:>14} |" for a, b, c in rows]
    out += ["", f"| {'rank':>4} | {'query':<16} | {'E[p_q]':>8} | {'sampled':>8} | {'paper':>7} |",
            f"|{'-' * 6}|{'-' * 18}|{'-' * 10}|{'-' * 10}|{'-' * 9}|"]
    for i, (q, name) in enumerate(zip(top, names, strict=True), 1):
        paper = PAPER_AOL.get(name) if args.preset == "aol" else None
        out.append(f"| {i:>4} | {name:<16} | {p_query[q]:>8.4f} | {p_sample[q]:>8.4f} | "
                   f"{'' if paper is None else f'{paper:.4f}':>7} |")
    out += ["", f"mass outside the top-50 records: {1 - p_sorted[:50].sum():.4f}"
            + (f" (paper Figure 9: {PAPER_OUTSIDE_TOP50})" if args.preset == "aol" else "")]
    if m_head != 50:
        out.append(f"mass outside the top-{m_head} records: {1 - p_sorted[:m_head].sum():.4f}")
    urls_per_query = np.bincount(rec_key // (int(log.url.max()) + 2))
    urls_per_query = urls_per_query[urls_per_query > 0]
    two_to_five = np.mean((urls_per_query >= 2) & (urls_per_query <= 5))
    out += [f"URLs per distinct query: 1: {np.mean(urls_per_query == 1):.1%}, 2-5: {two_to_five:.1%}, "
            f">5: {np.mean(urls_per_query > 5):.2%}, max {urls_per_query.max()}",
            "record probability at rank " + ", ".join(
                f"{r}: {p_sorted[r - 1]:.2e}" for r in (10, 50, 100, 500, 600, 1000) if r <= len(p_sorted)),
            ]
    for f in optins:
        hl = expected_head_list_size(p_record, log.n_users, f, delta)
        out.append(f"expected CreateHeadList size at {f:.1%} opt-in (ε=4, δ={delta:g}): {hl:,.0f} records"
                   f" (M = {m_head})")
    out += [f"generation: {seconds:.1f} s ({units(seconds, machine, 'numpy')}), peak RSS {peak_mb:,.0f} MB", ""]
    log_.info("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

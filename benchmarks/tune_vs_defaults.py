"""Does ``hybriddp tune`` pick parameters at least as good as the paper's defaults? (aol, yandex presets)

For each preset:

1. generate the synthetic log (:func:`hybriddp.datasets.synth.generate`);
2. run the curator exactly as ``hybriddp headlist --optin-fraction c --seed s`` does, with the
   paper's defaults (ε = 4, δ, c, f_O = 0.95, M = 50 / 500, discrete noise) on a random opt-in
   group, and write its two DP files (head list, opt-in estimates);
3. run :func:`hybriddp.tune.tune` on those files only (population = the preset's users);
4. evaluate the chosen (f_O, f_C, M) and the paper's defaults (f_O = 0.95, f_C = 0.85) at the
   same M on the real preset log, with the same ``--seeds`` BLENDER seeds (paired), plus the
   paper's defaults at the paper's M for reference.

The table shows mean NDCG / L1 over the seeds, tune's own prediction, and the paired difference
chosen − defaults with a 95% interval.

    python benchmarks/tune_vs_defaults.py [--presets aol yandex] [--seeds 5] [--trials 3] [--json]

First a calibration of the machine (benchmarks/machine.py); tune's run time is also given in its numpy units
(whole-log pipeline runs: vectorized work). With ``--json`` the calibration line goes to stderr and every preset's
object carries it (``machine``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from hybriddp.core.noise import DiscreteLaplaceNoise
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog
from hybriddp.curator.party import curate
from hybriddp.datasets.synth import generate
from hybriddp.io.exchange import write_release_files
from hybriddp.simulation.pipeline import result_from_run, run_blender, split_optin
from hybriddp.tune import NDCG_TIE, PAPER_F_C, PAPER_F_O, Interval, load_privatized, tune

logger = logging.getLogger("tune_vs_defaults")


def curator_files(log: RecordLog, params: BlenderParams, seed: int, directory: Path) -> tuple[Path, Path]:
    """The two DP files ``hybriddp headlist --optin-fraction c --seed seed`` writes for ``log``."""
    optin, _ = split_optin(log.n_users, params.optin_fraction, seed)
    rel, cur = curate(log, params, optin_users=optin, seed=seed, noise_factory=DiscreteLaplaceNoise,
                      with_charges=False)
    hl_path, est_path = directory / "headlist.json", directory / "optin-estimates.json"
    write_release_files(hl_path, est_path, rel.headlist, rel.estimates)
    logger.info("curator: head list %d records (|HL_S| = %d), |D_T| = %d", rel.head_list.n_records,
                cur.head_list_s.n_records, rel.optin.n)
    return hl_path, est_path


def evaluate(log: RecordLog, params: BlenderParams, seeds: list[int]) -> dict[str, Any]:
    """NDCG, L1 and head-list size of BLENDER on the real log, one run per seed."""
    rows = []
    for s in seeds:
        res = result_from_run(run_blender(log, params, seed=s))
        rows.append((res.metrics["ndcg"], res.metrics["l1"], res.head_list.n_records))
    ndcg, l1, size = (np.array(x) for x in zip(*rows, strict=True))
    return {"ndcg": ndcg, "l1": l1, "records": size}


def run_preset(preset: str, seeds: int, trials: int, data_seed: int, machine: dict[str, Any]) -> dict[str, Any]:
    """Steps 1-4 of the module docstring for one preset; ``machine``: the run's calibration (benchmarks/machine.py),
    which the result carries with tune's run time in its numpy units."""
    from machine import in_units  # a sibling module, as in main

    t0 = time.perf_counter()
    log = generate(preset, seed=data_seed)
    paper = BlenderParams.paper_defaults(preset)
    logger.info("%s: %d users, %d records (%.0f s)", preset, log.n_users, log.n_records, time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as d:
        files = curator_files(log, paper, data_seed + 1, Path(d))
        inputs = load_privatized(*files)
    t1 = time.perf_counter()
    res = tune(log.n_users, paper.optin_fraction, paper.epsilon, paper.delta, inputs=inputs, trials=trials,
               seed=data_seed + 2, progress=lambda msg: logger.info("%s tune: %s", preset, msg))
    tune_seconds = time.perf_counter() - t1
    c = res.chosen
    m = c.head_list_size
    eval_seeds = [10_000 + i for i in range(seeds)]
    settings = {
        "tuned": BlenderParams(epsilon=paper.epsilon, delta=paper.delta, optin_fraction=paper.optin_fraction,
                               f_o=c.f_o, f_c=c.f_c, head_list_size=m),
        "paper defaults, same M": BlenderParams(epsilon=paper.epsilon, delta=paper.delta,
                                                optin_fraction=paper.optin_fraction, f_o=PAPER_F_O, f_c=PAPER_F_C,
                                                head_list_size=m),
        "paper defaults, paper M": paper,
    }
    scores = {name: evaluate(log, p, eval_seeds) for name, p in settings.items()}
    d_ndcg = Interval.of(scores["tuned"]["ndcg"] - scores["paper defaults, same M"]["ndcg"])
    d_l1 = Interval.of(scores["tuned"]["l1"] - scores["paper defaults, same M"]["l1"])
    return {"preset": preset, "users": log.n_users, "tune_seconds": round(tune_seconds, 1),
            "machine": machine, "in_numpy_units": in_units(machine, "numpy", {"tune_seconds": tune_seconds}),
            "tune": res.to_json(),
            "settings": {k: {"f_o": p.f_o, "f_c": p.f_c, "head_list_size": p.head_list_size,
                             "ndcg_mean": float(scores[k]["ndcg"].mean()),
                             "ndcg_sd": float(scores[k]["ndcg"].std(ddof=1)),
                             "l1_mean": float(scores[k]["l1"].mean()), "l1_sd": float(scores[k]["l1"].std(ddof=1)),
                             "head_list_records_min": int(scores[k]["records"].min())}
                         for k, p in settings.items()},
            "tuned_minus_defaults": {"ndcg": d_ndcg.to_json(), "l1": d_l1.to_json()}, "seeds": eval_seeds}


def verdict(diff: dict[str, float | None], higher_better: bool) -> str:
    """"yes" (better or equal), "tie" (95% interval covers 0, or |Δ| < 0.001 as in tune), or "no"."""
    mean, lo, hi = diff["mean"], diff["lo"], diff["hi"]
    assert mean is not None and lo is not None and hi is not None
    good = mean >= 0 if higher_better else mean <= 0
    if good:
        return "yes"
    return "tie (within noise)" if lo <= 0 <= hi or abs(mean) < NDCG_TIE else "no"


def print_table(results: list[dict[str, Any]], console: Console) -> None:
    t = Table(title="tune vs the paper's defaults, evaluated on the real preset (mean ± sd over seeds)",
              title_justify="left")
    for col in ("preset", "setting", "f_O", "f_C", "M", "NDCG", "L1", "tune's prediction"):
        t.add_column(col, justify="left" if col in ("preset", "setting") else "right", no_wrap=True)
    for r in results:
        pred = r["tune"]
        for name, s in r["settings"].items():
            if name == "tuned":
                p = f"{pred['ndcg']['mean']:.4f} / {pred['l1']['mean']:.4f}"
            elif name == "paper defaults, same M":
                p = f"{pred['paper_defaults']['ndcg']['mean']:.4f} / {pred['paper_defaults']['l1']['mean']:.4f}"
            else:
                p = ""
            t.add_row(r["preset"], name, f"{s['f_o']:g}", f"{s['f_c']:g}", str(s["head_list_size"]),
                      f"{s['ndcg_mean']:.4f} ± {s['ndcg_sd']:.4f}", f"{s['l1_mean']:.4f} ± {s['l1_sd']:.4f}", p)
    console.print(t)
    for r in results:
        d = r["tuned_minus_defaults"]
        console.print(f"{r['preset']}: tuned − defaults (same M), paired over {len(r['seeds'])} seeds: "
                      f"NDCG {d['ndcg']['mean']:+.4f} [{d['ndcg']['lo']:+.4f}, {d['ndcg']['hi']:+.4f}] → at least as "
                      f"good: {verdict(d['ndcg'], True)}; L1 {d['l1']['mean']:+.4f} [{d['l1']['lo']:+.4f}, "
                      f"{d['l1']['hi']:+.4f}] → at least as good: {verdict(d['l1'], False)}; tune took "
                      f"{r['tune_seconds']:.0f} s ({r['in_numpy_units']['tune_seconds']:.3g} numpy units), "
                      f"met = {r['tune']['met']}, fit: {r['tune']['fit']['source']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", choices=["aol", "yandex"], default=["aol", "yandex"])
    ap.add_argument("--seeds", type=int, default=5, help="evaluation seeds per setting (default 5)")
    ap.add_argument("--trials", type=int, default=3, help="tune's --trials (default 3)")
    ap.add_argument("--data-seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("hybriddp").setLevel(logging.WARNING)
    # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
    from machine import calibrate, print_calibration

    machine = calibrate()
    print_calibration(machine, sys.stderr if args.json else None)
    results = [run_preset(p, max(args.seeds, 2), args.trials, args.data_seed, machine) for p in args.presets]
    if args.json:
        sys.stdout.write(json.dumps(results, indent=1) + "\n")
    else:
        print_table(results, Console(width=160))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Mutation testing of the privacy-critical core with mutmut 3 (docs/TESTING.md).

Runs ``mutmut run`` with the ``[tool.mutmut]`` configuration of pyproject.toml (the modules that carry the
privacy guarantee and the estimates, tested by the fast core tests only) and prints the mutation score per
module and in total, with the run time:

    score = (killed + timed out) / all mutants generated

Mutants no test reaches ("no tests"), survivors, skipped and suspicious ones all count against the score.
Not part of the pytest run: it takes tens of minutes on 2 cores. Install the tool with
``pip install -e '.[mutation]'``.

    nice -n 19 python benchmarks/bench_mutation.py                 # every module, one table
    python benchmarks/bench_mutation.py --modules server/blend core/noise   # a subset (mutmut reuses its cache)
    python benchmarks/bench_mutation.py --fresh --json              # from scratch, one JSON object
    python benchmarks/bench_mutation.py --report-only --survivors   # read mutants/ without running
    nice -n 19 python benchmarks/bench_mutation.py --rerun-survivors   # after adding tests: re-test the rest

``--rerun-survivors`` keeps the cached verdict of every mutant that was killed or timed out and re-tests
all the others (survived, no tests, not checked, ...). That gives the same score as a fresh run as long as
tests were only *added* since the cached run (a killed mutant stays killed when tests are added; mutmut
itself re-tests every mutant of a function whose source changed, and collects the new tests' coverage).
After a test was changed or removed, run ``--fresh`` instead.

mutmut writes ``mutants/`` (git-ignored) in the repository root; ``--fresh`` deletes it first.
``mutmut show <name>`` prints the diff of one mutant.

Before running mutmut, a calibration of the machine (benchmarks/machine.py); the run time is also given in its
python units (mutmut runs pytest: interpreter-bound work). With ``--json``: ``machine`` and ``in_python_units``
(the calibration line then goes to stderr). ``--report-only`` times nothing and calibrates nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# module (path under src/hybriddp) -> the dotted prefix of its mutants' names
MODULES: dict[str, str] = {
    "server/blend.py": "hybriddp.server.blend",
    "server/weights.py": "hybriddp.server.weights",
    "server/client_estimates.py": "hybriddp.server.client_estimates",
    "curator/mechanisms.py": "hybriddp.curator.mechanisms",
    "curator/estimates.py": "hybriddp.curator.estimates",
    "core/protocol.py": "hybriddp.core.protocol",
    "core/reportlaw.py": "hybriddp.core.reportlaw",
    "device/localalg.py": "hybriddp.device.localalg",
    "device/ledger.py": "hybriddp.device.ledger",
    "device/batch.py": "hybriddp.device.batch",
    "core/noise.py": "hybriddp.core.noise",
    "privacy/ledger.py": "hybriddp.privacy.ledger",
    "mean/mechanisms.py": "hybriddp.mean.mechanisms",
    "device/mean.py": "hybriddp.device.mean",
}

# mutmut's exit codes (mutmut/stats.py) grouped the way the score counts them
KILLED = {1: "killed", 3: "killed"}
TIMEOUT = {36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}
OTHER = {0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 35: "suspicious", None: "not checked",
         -9: "segfault", -11: "segfault", 2: "interrupted"}


def status(exit_code: int | None) -> str:
    """The status mutmut gives an exit code (unknown codes are 'suspicious', as in mutmut)."""
    for table in (KILLED, TIMEOUT, OTHER):
        if exit_code in table:
            return table[exit_code]
    return "suspicious"


def read_results(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """{module: {mutant name: status}} from mutmut's ``mutants/src/hybriddp/*.meta`` files."""
    results: dict[str, dict[str, str]] = {}
    for module in MODULES:
        meta = root / "mutants" / "src" / "hybriddp" / (module + ".meta")
        if not meta.exists():
            continue
        data = json.loads(meta.read_text(encoding="utf-8"))
        results[module] = {name: status(code) for name, code in data.get("exit_code_by_key", {}).items()}
    return results


def score_table(results: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Per-module and total counts and the score (killed + timeout) / all mutants."""
    rows: dict[str, dict[str, Any]] = {}
    total: Counter[str] = Counter()
    for module, by_name in results.items():
        counts = Counter(by_name.values())
        total.update(counts)
        rows[module] = _row(counts)
    return {"modules": rows, "total": _row(total)}


def _row(counts: Counter[str]) -> dict[str, Any]:
    mutants = sum(counts.values())
    caught = counts["killed"] + counts["timeout"]
    return {"mutants": mutants, "killed": counts["killed"], "timeout": counts["timeout"],
            "survived": counts["survived"], "no_tests": counts["no tests"],
            "other": mutants - caught - counts["survived"] - counts["no tests"],
            "score": caught / mutants if mutants else None}


def print_table(table: dict[str, Any], seconds: float | None, run_units: str = "") -> None:
    """The score table as plain text; ``run_units``: the run time in calibration units, printed after it."""
    head = f"{'module':<22}{'mutants':>8}{'killed':>8}{'timeout':>8}{'survived':>9}{'no tests':>9}{'other':>7}"
    print(head + f"{'score':>8}")
    print("-" * (len(head) + 8))
    for module, row in [*table["modules"].items(), ("total", table["total"])]:
        if module == "total":
            print("-" * (len(head) + 8))
        score = "-" if row["score"] is None else f"{100 * row['score']:.1f}%"
        print(f"{module:<22}{row['mutants']:>8}{row['killed']:>8}{row['timeout']:>8}{row['survived']:>9}"
              f"{row['no_tests']:>9}{row['other']:>7}{score:>8}")
    if seconds is not None:
        print(f"run time: {seconds:.0f} s" + (f" ({run_units})" if run_units else ""))


def reset_survivors(modules: list[str], root: Path = ROOT) -> int:
    """Forget mutmut's verdict (set it to null, "not checked") for every mutant of ``modules`` that was
    not killed or timed out; return how many. The next ``mutmut run`` without names re-tests exactly those."""
    count = 0
    for module in modules:
        meta = root / "mutants" / "src" / "hybriddp" / (module + ".meta")
        if not meta.exists():
            continue
        data = json.loads(meta.read_text(encoding="utf-8"))
        codes = data.get("exit_code_by_key", {})
        for name, code in codes.items():
            if code is not None and status(code) not in ("killed", "timeout"):
                codes[name] = None
                count += 1
        meta.write_text(json.dumps(data, indent=4), encoding="utf-8")
    return count


def run_mutmut(modules: list[str], max_children: int, log: Path, all_names: bool = False) -> int:
    """``mutmut run`` for the mutants of ``modules`` (all when every module is asked for), at nice 19.

    With ``all_names`` no names are given: mutmut then tests only the mutants without a cached verdict."""
    names = [] if all_names or set(modules) == set(MODULES) else [MODULES[m] + ".*" for m in modules]
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if mutmut is None:
        sys.exit("mutmut is not installed: pip install -e '.[mutation]'")
    cmd = ["nice", "-n", "19", mutmut, "run", "--max-children", str(max_children), *names]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        return subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def main(argv: list[str] | None = None) -> int:
    """Run mutmut (unless --report-only), then print the score table or one JSON object."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="+", choices=sorted(MODULES) + [m.removesuffix(".py") for m in MODULES],
                    help="only these modules (default: all of [tool.mutmut] only_mutate)")
    ap.add_argument("--max-children", type=int, default=2, choices=[1, 2],
                    help="parallel test processes (default 2; the machine has 2 cores)")
    ap.add_argument("--fresh", action="store_true", help="delete mutants/ first (no cached results)")
    ap.add_argument("--report-only", action="store_true", help="do not run mutmut; read mutants/")
    ap.add_argument("--rerun-survivors", action="store_true",
                    help="keep the cached killed/timed-out verdicts, re-test every other mutant (valid after "
                         "tests were only added)")
    ap.add_argument("--survivors", action="store_true", help="also list every mutant not killed or timed out")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    modules = sorted({m if m.endswith(".py") else m + ".py" for m in (args.modules or MODULES)})

    seconds = None
    exit_code = 0
    machine: dict[str, Any] | None = None
    relative: dict[str, float | None] = {}
    if not args.report_only:
        if args.fresh and args.rerun_survivors:
            ap.error("--fresh and --rerun-survivors exclude each other")
        # a sibling module: the folder of a script run as `python benchmarks/X.py` is on sys.path
        from machine import calibrate, in_units, print_calibration

        machine = calibrate()
        print_calibration(machine, sys.stderr if args.json else None)
        if args.fresh and (ROOT / "mutants").exists():
            shutil.rmtree(ROOT / "mutants")
        if args.rerun_survivors:
            print(f"re-testing {reset_survivors(modules)} mutants not killed before", file=sys.stderr)
        log = ROOT / "mutants" / "bench-mutation.log"
        start = time.monotonic()
        exit_code = run_mutmut(modules, args.max_children, log, all_names=args.rerun_survivors)
        seconds = time.monotonic() - start
        relative = in_units(machine, "python", {"run_seconds": seconds})
        if exit_code != 0:
            print(f"mutmut run failed with exit code {exit_code}; see {log}", file=sys.stderr)

    results = {m: r for m, r in read_results().items() if m in modules}
    if not results:
        print("no mutmut results under mutants/: run without --report-only first", file=sys.stderr)
        return 1
    table = score_table(results)
    survivors = sorted(name for r in results.values() for name, s in r.items() if s not in ("killed", "timeout"))
    if args.json:
        out: dict[str, Any] = {**table, "run_seconds": seconds, "max_children": args.max_children,
                               "machine": machine, "in_python_units": relative}
        if args.survivors:
            out["survivors"] = survivors
        print(json.dumps(out))
    else:
        print_table(table, seconds, f"{relative['run_seconds']:.3g} python units" if relative else "")
        if args.survivors:
            print("\n".join(["", "not killed:", *survivors]))
    return exit_code


if __name__ == "__main__":
    sys.exit(main())

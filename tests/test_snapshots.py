"""Regression guards: seeded outputs must not change unless a commit says why.

Each case runs with a fixed seed on a small log built in code and is compared with
``tests/snapshots/seeded.json``: head-list sizes, a SHA-256 of each estimate vector (values rounded
to 12 significant digits, and |x| < 1e-14 written as 0, so a change of summation order does not
count as a change) and a few readable numbers. These are **not** correctness tests: they only say
that a refactor left the seeded outputs exactly as they were. A deliberate change (a bug fix, a new
random stream, a different sampler) is recorded with

    python -m pytest tests/test_snapshots.py --update-snapshots

and the commit that updates the JSON file must say which entries changed and why (and that the
others did not).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clihelpers import invoke
from hybriddp.core.atomic import write_text
from hybriddp.core.noise import noise_factory
from hybriddp.core.params import BlenderParams
from hybriddp.mean import simulate
from hybriddp.simulation.algorithms import run_algorithm
from hybriddp.simulation.pipeline import run_blender
from logdata import write_aol, zipf_log

SNAPSHOT_FILE = Path(__file__).parent / "snapshots" / "seeded.json"

Entry = dict[str, Any]


def _round12(x: float) -> str:
    """x with 12 significant digits; tiny values (|x| < 1e-14) and −0 as 0."""
    return "0" if abs(x) < 1e-14 else f"{x:.11e}"


def digest(*vectors: Any) -> str:
    """SHA-256 of the vectors, each value rounded to 12 significant digits."""
    h = hashlib.sha256()
    for v in vectors:
        h.update(",".join(_round12(float(x)) for x in np.asarray(v, dtype=np.float64).ravel()).encode())
        h.update(b";")
    return h.hexdigest()


def readable(v: Any, k: int = 3) -> list[float]:
    """The first ``k`` values, rounded to 12 significant digits."""
    return [float(_round12(float(x))) for x in np.asarray(v, dtype=np.float64).ravel()[:k]]


def _log() -> Any:
    return zipf_log(n_users=8000, seed=11)


# ----- the cases -------------------------------------------------------------------------------

def blender_case(epsilon: float, m_o: int, noise: str, estimator: str = "paper") -> Entry:
    """run_blender: the head list, the opt-in, client and blended estimates (records and queries)."""
    params = BlenderParams(epsilon=epsilon, optin_fraction=0.3, head_list_size=20, m_o=m_o, m_c=m_o,
                           estimator=estimator)
    run = run_blender(_log(), params, seed=7, noise_factory=noise_factory(noise))
    hl = run.head_list
    cur, cli, bl = run.curator, run.client, run.blended
    return {
        "head_list_entries": hl.n_entries, "head_list_queries": hl.n_queries, "tau": cur.tau,
        "head_list_sha256": digest(hl.query_ids, hl.url_offsets, hl.entry_url, cur.head_list_s.entry_url),
        "blended_sha256": digest(bl.records_final, bl.records.p, bl.queries_final),
        "optin_sha256": digest(cur.optin.p_record, cur.optin.var_record, cur.optin.p_query),
        "client_sha256": digest(cli.p_record, cli.var_record, cli.p_query),
        "first_blended": readable(bl.records_final),
    }


def algorithm_case(name: str) -> Entry:
    """run_algorithm at ε = 4: head list, final estimates and metrics."""
    params = BlenderParams(epsilon=4.0, optin_fraction=0.3, head_list_size=20, estimator="paper")
    res = run_algorithm(name, _log(), params, seed=7)
    hl = res.head_list
    return {
        "head_list_entries": hl.n_entries, "head_list_queries": hl.n_queries,
        "head_list_sha256": digest(hl.query_ids, hl.url_offsets, hl.entry_url),
        "estimates_sha256": digest(res.p_record, res.p_query),
        "first_estimates": readable(res.p_record),
        "metrics": {k: float(_round12(v)) for k, v in sorted(res.metrics.items()) if isinstance(v, float)},
    }


def mean_case() -> Entry:
    """hybriddp.mean.simulate at one setting: the simulated MSEs and their standard errors."""
    r = simulate(2000, 0.1, 1.0, trials=5000, seed=11)
    keys = sorted(r.mse)
    return {
        "mse_sha256": digest([r.mse[k].simulated for k in keys], [r.mse[k].simulated_se for k in keys]),
        "mse_simulated": {k: float(_round12(r.mse[k].simulated)) for k in keys},
        "r_simulated": float(_round12(r.r_simulated)),
    }


def cli_files_case(tmp_path: Path, estimator: str = "paper") -> Entry:
    """headlist → randomize → estimate --json on an AOL-format file."""
    log = tmp_path / "log.tsv"
    write_aol(zipf_log(n_users=6000, seed=5), log)
    hl, est, rep = tmp_path / "hl.json", tmp_path / "optin.json", tmp_path / "reports.jsonl"
    invoke("headlist", "--input", log, "--optin-fraction", "0.3", "--head-list-size", "20", "--seed", "3",
           "--estimator", estimator, "--out-headlist", hl, "--out-estimates", est)
    invoke("randomize", "--headlist", hl, "--input", log, "--optin-fraction", "0.3", "--seed", "3", "--output", rep)
    out = json.loads(invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", rep,
                            "--json").stdout)
    recs, qrys = out["records"], out["queries"]
    names = "\n".join(f"{r['query']}\t{r['url']}" for r in recs)
    return {
        "records": len(recs), "queries": len(qrys),
        "names_sha256": hashlib.sha256(names.encode()).hexdigest(),
        "estimates_sha256": digest([r["p_optin"] for r in recs], [r["p_client"] for r in recs],
                                   [r["p_blended"] for r in recs], [q["p_blended"] for q in qrys]),
        "first_blended": readable([r["p_blended"] for r in recs]),
    }


CASES: dict[str, Callable[[Path], Entry]] = {
    **{f"blender eps={eps} m_o={m_o} noise={noise}": (lambda _p, e=eps, m=m_o, n=noise: blender_case(e, m, n))
       for eps in (5.0, 2.5, 1.2, 4.0) for m_o in (1, 2) for noise in ("discrete", "laplace")},
    **{f"blender eps=4.0 m_o={m_o} noise=discrete estimator=reuse":
       (lambda _p, m=m_o: blender_case(4.0, m, "discrete", "reuse")) for m_o in (1, 2)},
    **{f"algorithm {name} eps=4": (lambda _p, a=name: algorithm_case(a))
       for name in ("optin-only", "client-only", "local-only", "central")},
    "mean simulate n=2000 c=0.1 eps=1": lambda _p: mean_case(),
    "cli headlist/randomize/estimate eps=4": cli_files_case,
    "cli headlist/randomize/estimate eps=4 estimator=reuse": lambda p: cli_files_case(p, "reuse"),
}


# ----- comparing with (or rewriting) the file --------------------------------------------------

@pytest.fixture(scope="module")
def snapshots(request: pytest.FixtureRequest) -> Iterator[dict[str, Entry]]:
    """The stored entries; with ``--update-snapshots`` the file is rewritten after the module."""
    stored = json.loads(SNAPSHOT_FILE.read_text(encoding="utf-8")) if SNAPSHOT_FILE.exists() else {}
    yield stored
    if request.config.getoption("--update-snapshots"):
        kept = {name: stored[name] for name in CASES if name in stored}  # drop entries of removed cases
        write_text(SNAPSHOT_FILE, json.dumps(kept, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("name", list(CASES))
def test_seeded_output_unchanged(name: str, snapshots: dict[str, Entry], tmp_path: Path,
                                 request: pytest.FixtureRequest) -> None:
    entry = json.loads(json.dumps(CASES[name](tmp_path)))  # as it reads back from JSON
    if request.config.getoption("--update-snapshots"):
        snapshots[name] = entry
        return
    assert name in snapshots, f"no snapshot for {name!r}: run pytest with --update-snapshots"
    changed = {k: (snapshots[name].get(k), v) for k, v in entry.items() if snapshots[name].get(k) != v}
    assert not changed and set(entry) == set(snapshots[name]), (
        f"seeded output of {name!r} changed (stored, now): {changed}. If deliberate, rerun with "
        "--update-snapshots and explain the change in the commit.")

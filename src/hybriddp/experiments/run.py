"""``run_experiment``: figures → runs → ``trials.csv`` → ``figN.csv``/``.png``, ``summary.json``, ``report.md``.

Every output is replaced atomically (:mod:`hybriddp.core.atomic`): a killed experiment leaves each
file as it was or complete; ``trials.csv`` is the resume log (:class:`~hybriddp.experiments.runner.TrialStore`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybriddp.core.atomic import check_output_dir, write_bytes, write_text
from hybriddp.core.stages import ProgressFn
from hybriddp.experiments import claims as claims_mod
from hybriddp.experiments import plots
from hybriddp.experiments.aggregate import PointStat, figure9_summary, figure_points, tuned_knobs
from hybriddp.experiments.claims import Claim
from hybriddp.experiments.claims_fig12 import fig12_claims, sizes_claims, tuned_vs_defaults_claim
from hybriddp.experiments.datasets import DatasetSpec
from hybriddp.experiments.figures import FAMILY_ALGORITHMS, Figure, Point, figures, select
from hybriddp.experiments.report import write_report
from hybriddp.experiments.runner import TABLES_FILE, TRIALS_FILE, RunSet, Task, TrialStore, execute, make_tasks

logger = logging.getLogger(__name__)

POINT_COLUMNS = ("algorithm", "x", "metric", "head_list_size", "mean", "lo", "hi", "n_trials", "n_reached", "reached")
"""Columns of ``figN.csv`` and keys of the points in ``summary.json`` (the same records)."""
FIG9_CSV_COLUMNS = ("query", "p_true", "p_blended", "p_optin_sum", "p_client_direct", "p_client_sum",
                    "p_blended_regression", "p_optin_sum_regression", "p_client_direct_regression",
                    "p_client_sum_regression")


@dataclass
class ExperimentOutput:
    """What an experiment wrote and how long it took."""

    out_dir: Path
    figures: tuple[str, ...]
    n_runs: int
    n_ran: int
    seconds: float
    files: list[Path]


def default_out_dir(spec: DatasetSpec) -> Path:
    """``experiments-out/<dataset>``."""
    return Path("experiments-out") / spec.name


def _needed(figs: list[Figure], base: Point) -> list[tuple[str, Point]]:
    return [(fam, point) for fig in figs for fam in fig.families() for _, _, point in fig.points(base)]


def run_experiment(name: str, spec: DatasetSpec, *, trials: int = 5, out_dir: Path | None = None,
                   jobs: int = 1, quick: bool = False, progress: ProgressFn | None = None) -> ExperimentOutput:
    """Reproduce figure ``name`` (or ``all``) of the paper's §4.2 on ``spec``'s data.

    Parameters
    ----------
    name : ``fig9``, ``fig11`` … ``fig16`` or ``all`` (:data:`~hybriddp.experiments.figures.FIGURE_NAMES`).
    spec : the dataset (synthetic preset or log file), its seed and scale.
    trials : trials per point (≥ 1).
    out_dir : output directory (default ``experiments-out/<dataset>``); ``trials.csv`` there is resumed.
    jobs : worker processes.
    quick : tiny grids (tests).
    progress : ``progress(done, total)`` after each run (and once at the start).
    """
    from hybriddp.core.errors import parameter_error

    t0 = time.perf_counter()
    selected = select(name)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise parameter_error("trials (--trials)", trials, "an integer >= 1")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise parameter_error("jobs (--jobs)", jobs, "an integer >= 1")
    spec.validate()
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(spec)
    outputs = [TRIALS_FILE, TABLES_FILE, "summary.json", "report.md", *(f"{n}.{e}" for n in selected
                                                                           for e in ("csv", "png"))]
    check_output_dir(out_dir, "out_dir (--out)", outputs)  # before loading or running anything
    log = spec.load()
    base = spec.base_point(log)
    defs = figures(spec.kind, quick=quick)
    wanted = [defs[n] for n in selected]
    tasks = make_tasks(_needed(wanted, base), trials, spec.seed)
    for point in {t.point for t in tasks}:
        point.params()  # every point's parameters are valid before anything runs
    store = TrialStore(out_dir)
    runs = RunSet(store, spec.data_id, trials, spec.seed)
    n_skip = sum(store.done(t, spec.data_id) for t in tasks)
    done = [n_skip]
    if progress:
        progress(n_skip, len(tasks))

    def on_done(_task: Task) -> None:
        done[0] += 1
        if progress:
            progress(done[0], len(tasks))

    n_ran = execute(log, tasks, store, spec.data_id, jobs=jobs, on_done=on_done)
    # Report every figure whose runs are all stored (figures share runs: fig13 makes fig14 available).
    shown = {n: f for n, f in defs.items() if n in selected or all(
        store.done(t, spec.data_id) for t in make_tasks(_needed([f], base), trials, spec.seed))}
    meta = {"dataset": spec.dataset, "data": spec.data_id, "kind": spec.kind, "n_users": log.n_users,
            "n_records": log.n_records, "trials": trials, "seed": spec.seed, "quick": quick,
            "params": base.params().to_dict(),
            "missing_rule": "a point is missing (mean null) unless every trial's head list reached M records"}
    files = _write_outputs(out_dir, shown, base, runs, meta, tasks, n_ran, jobs, time.perf_counter() - t0)
    return ExperimentOutput(out_dir, tuple(shown), len(tasks), n_ran, time.perf_counter() - t0, files)


def _comparisons(runs: RunSet, tasks: list[Task]) -> list[claims_mod.Comparison]:
    """Blended vs the better ingredient for L1 and NDCG at every BLENDER point of this run."""
    out = []
    for point in sorted({t.point for t in tasks if t.family == "blender"}):
        m = point.head_list_size
        where = f"ε={point.epsilon:g} opt-in={100 * point.optin_fraction:g}% f_C={point.f_c:g} M={m}"
        rows = {a: runs.rows(a, point) for a in FAMILY_ALGORITHMS["blender"]}
        for metric in ("l1", "ndcg"):
            if (c := claims_mod.compare_blended(where, metric, m, rows)) is not None:
                out.append(c)
    return out


def all_claims(kind: str, base: Point, runs: RunSet, figure_points: dict[str, list[PointStat]],
               fig9: dict[str, Any] | None, comparisons: Callable[[], list[claims_mod.Comparison]],
               figures: dict[str, Figure]) -> list[Claim]:
    """Every claim that the figures of this run can check, in the paper's order."""
    fig = {name: claims_mod.Points(p) for name, p in figure_points.items()}
    out = claims_mod.default_point_claims(kind, base, runs)
    if fig9 is not None:
        out += claims_mod.fig9_claims(fig9)
    if "fig11" in fig:
        out += claims_mod.fig11_claims(fig["fig11"])
    out += claims_mod.never_worse_claims(comparisons())
    if "fig12" in fig:
        out += fig12_claims(fig["fig12"])
        out += tuned_vs_defaults_claim(runs, [point for _, _, point in figures["fig12"].points(base)])
    if "sizes" in fig:
        out += sizes_claims(fig["sizes"])
    if "estimators" in fig:
        out += claims_mod.estimator_claims(runs, [point for _, _, point in figures["estimators"].points(base)])
    if kind == "yandex":
        sizes = sorted({p.head_list_size for name in ("fig13", "fig14", "fig15", "fig16") if name in fig
                        for p in fig[name].points})
        out += claims_mod.yandex_claims(fig, sizes)
    else:
        out += claims_mod.aol_robustness_claims(fig)
    return out


def _write_outputs(out_dir: Path, figs: dict[str, Figure], base: Point, runs: RunSet, meta: dict[str, Any],
                   tasks: list[Task], n_ran: int, jobs: int, wall: float) -> list[Path]:
    files: list[Path] = [runs.store.path]
    subtitle = f"dataset {meta['dataset']}, {meta['trials']} trials, 95% t-intervals; gaps: head list shorter than M"
    points: dict[str, list[PointStat]] = {}
    fig9 = None
    for name, fig in figs.items():
        csv_path, png_path = out_dir / f"{name}.csv", out_dir / f"{name}.png"
        if name == "fig9":
            fig9 = figure9_summary(base, runs)
            _write_csv(csv_path, FIG9_CSV_COLUMNS, (fig9["first_trial"] or {}).get("rows", []))
            plots.plot_figure9(fig9, png_path, f"dataset {meta['dataset']}, paper defaults (Fig. 10)")
        else:
            points[name] = figure_points(fig, base, runs)
            _write_csv(csv_path, POINT_COLUMNS, [p.to_dict() for p in points[name]])
            plots.plot_figure(fig, points[name], png_path, subtitle)
        files += [csv_path, png_path]
    # Compute time from the stored rows: one value per task (all of a task's rows carry the same seconds).
    compute = sum(r["seconds"] or 0.0 for t in tasks
                  if (r := runs.store.get(t, runs.data_id, FAMILY_ALGORITHMS[t.family][0])) is not None)
    meta["runs"] = {"total": len(tasks), "ran": n_ran, "skipped": len(tasks) - n_ran, "jobs": jobs,
                    "seconds_wall": wall, "seconds_compute": compute}
    claims = all_claims(meta["kind"], base, runs, points, fig9, lambda: _comparisons(runs, tasks), figs)
    if "fig12" in figs:
        meta["tuned_knobs"] = tuned_knobs(figs["fig12"], base, runs)
    summary = {**meta, "figures": {n: [p.to_dict() for p in pts] for n, pts in points.items()},
               "claims": [c.to_dict() for c in claims]}
    if fig9 is not None:
        summary["figures"]["fig9"] = fig9
    summary_path = out_dir / "summary.json"
    write_text(summary_path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    report_path = out_dir / "report.md"
    write_text(report_path, write_report(meta, figs, points, fig9, claims))
    return [*files, summary_path, report_path]


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """Replace ``path`` atomically (:mod:`hybriddp.core.atomic`) with ``rows`` as CSV."""
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, columns, extrasaction="ignore")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    write_bytes(path, buf.getvalue().encode("utf-8"))

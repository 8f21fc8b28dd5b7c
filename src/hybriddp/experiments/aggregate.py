"""Trials → figure points: mean and 95% t-interval, and the "head list not reached" rule.

A point of a figure (algorithm, x, metric, M) aggregates the trials of its run. It is
**missing** (mean, lo, hi empty; a gap in the plot) unless *every* trial's final head list
reached the requested size M (``head_list_records >= M``) — the paper leaves a line out
where "that size head list was not created" (§4.2.3, Figs. 13a, 15a), and averaging lists
of different lengths would mix different quantities. A run that failed (e.g. an empty head
list at 1% opt-in) counts as not reached.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hybriddp.core.stats import t_quantile_975
from hybriddp.experiments.figures import ALGORITHM_ESTIMATORS, DEFAULT_LINE, Figure, Point
from hybriddp.experiments.runner import FIG9_COLUMNS, RunSet


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval ``(mean, lo, hi)``; one value gives ``lo = hi = mean``."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, mean, mean
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile_975(n - 1) * math.sqrt(var / n)
    return mean, mean - half, mean + half


@dataclass
class PointStat:
    """One plotted point (a row of ``figN.csv``)."""

    algorithm: str
    x: float | None
    metric: str
    head_list_size: int
    mean: float | None
    lo: float | None
    hi: float | None
    n_trials: int
    n_reached: int
    reached: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def point_stat(rows: list[dict[str, Any]], algorithm: str, x: float | None, metric: str, m: int) -> PointStat:
    """Aggregate one point (see the module docstring for the missing rule)."""
    reached_rows = [r for r in rows if not r.get("error") and (r.get("head_list_records") or 0) >= m]
    reached = bool(rows) and len(reached_rows) == len(rows)
    values = [float(r[metric]) for r in reached_rows if r.get(metric) is not None]
    if reached and values:
        mean, lo, hi = mean_ci(values)
        return PointStat(algorithm, x, metric, m, mean, lo, hi, len(rows), len(reached_rows), True)
    return PointStat(algorithm, x, metric, m, None, None, None, len(rows), len(reached_rows), False)


def figure_points(fig: Figure, base: Point, runs: RunSet) -> list[PointStat]:
    """Every point of a figure: algorithms × metrics × M × x (the rows of ``figN.csv``)."""
    return [point_stat(runs.rows(algorithm, point), algorithm, x, metric, m)
            for algorithm in fig.algorithms for metric in fig.metrics for x, m, point in fig.points(base)]


def _mean_regressions(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean regressions per Fig. 9 column over the completed runs."""
    out: dict[str, float | None] = {}
    for c in FIG9_COLUMNS:
        col = f"regressions_{c.removeprefix('p_')}"
        vals = [r[col] for r in rows if not r.get("error") and r.get(col) is not None]
        out[c] = (sum(vals) / len(vals)) if vals else None
    return out


def figure9_summary(base: Point, runs: RunSet) -> dict[str, Any]:
    """Paper Fig. 9 at the defaults: the first trial's table and the mean regressions per column, for the paper's
    estimator, and the mean regressions of the default estimator's runs with the same seeds (``default``)."""
    rows = runs.rows("blender", base)
    ok = [r for r in rows if not r.get("error")]
    first = next(({"trial": t, "rows": tab} for t in range(runs.trials)
                  if (tab := runs.table(base, t)) is not None), None)
    reached = bool(rows) and len(ok) == len(rows) and all(r["head_list_records"] >= base.head_list_size for r in ok)
    out = {"n_trials": len(rows), "head_list_size": base.head_list_size, "reached": reached,
           "first_trial": first, "mean_regressions": _mean_regressions(rows)}
    if DEFAULT_LINE != "blender" and (default_rows := runs.rows(DEFAULT_LINE, base)):
        out["default"] = {"algorithm": DEFAULT_LINE, "estimator": ALGORITHM_ESTIMATORS[DEFAULT_LINE],
                          "n_trials": len(default_rows), "mean_regressions": _mean_regressions(default_rows)}
    return out


def tuned_knobs(fig: Figure, base: Point, runs: RunSet) -> list[dict[str, Any]]:
    """Per x of ``fig``: the estimator ``blender-tuned`` ran and how often tune chose each (f_O, f_C)."""
    out = []
    for x, _m, point in fig.points(base):
        rows = [r for r in runs.rows("blender-tuned", point) if not r.get("error") and r.get("tuned_f_o") is not None]
        if not rows:
            continue
        knobs = Counter((r["tuned_f_o"], r["tuned_f_c"]) for r in rows)
        out.append({"x": x, "estimators": sorted({str(r.get("estimator")) for r in rows}),
                    "knobs": [{"f_o": fo, "f_c": fc, "trials": n} for (fo, fc), n in knobs.most_common()]})
    return out


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as CSV text, one column per key in order of first appearance (a row may lack some)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()

"""PNG plots of the reproduced figures (matplotlib's Agg canvas directly: no display, no pyplot state).

Every line is one algorithm (Figs. 11, 12) or one algorithm at one head-list size M (Figs. 13–16: colour = M,
style = estimator), with 95% t-interval error bars over the trials; every BLENDER line's legend names its
estimator. A missing point (head list shorter than M) is a gap, as in the paper. Fig. 9 is drawn as grouped
bars of the first trial's top-10 table. Images are written atomically (:mod:`hybriddp.core.atomic`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure

from hybriddp.core.atomic import atomic_path
from hybriddp.core.estimators import DEFAULT_ESTIMATOR
from hybriddp.experiments.aggregate import PointStat
from hybriddp.experiments.figures import ALGORITHM_ESTIMATORS, METRIC_LABELS, X_LABELS, Figure


def _estimator_label(algorithm: str) -> str:
    """``estimator paper`` / ``estimator reuse, the default``: the estimator of a BLENDER line, as the legend says."""
    est = ALGORITHM_ESTIMATORS.get(algorithm)
    return "" if est is None else f"estimator {est}" + (", the default" if est == DEFAULT_ESTIMATOR else "")


ALGORITHM_LABELS = {"blender": f"BLENDER ({_estimator_label('blender')}, as published)",
                    "optin-only": f"opt-in only ({_estimator_label('optin-only')})",
                    "client-only": "client only",
                    "blender-tuned": f"BLENDER ({_estimator_label('blender-tuned')}), knobs from hybriddp tune",
                    "blender-pooled": f"BLENDER ({_estimator_label('blender-pooled')}: pooled blend weights)",
                    "blender-reuse": f"BLENDER ({_estimator_label('blender-reuse')}: S reused + pooled weights)",
                    "blender-consistent": f"BLENDER ({_estimator_label('blender-consistent')}: reuse + consistent "
                                          "queries)",
                    "local-only": "local-only, record dictionary (PEM/OLH + LocalAlg)",
                    "local-only-hashed": "local-only, no dictionary (32-bit PEM/OLH + LocalAlg)"}
"""The legend of each line; every BLENDER line names its estimator (and whether it is the default)."""
ALGORITHM_COLORS = {"blender": "tab:green", "optin-only": "tab:orange", "client-only": "tab:blue",
                    "blender-tuned": "tab:olive", "local-only": "tab:red", "local-only-hashed": "tab:purple",
                    "blender-pooled": "tab:cyan", "blender-reuse": "tab:brown",
                    "blender-consistent": "tab:pink"}
MARKERS = "osD^vP*X"
LINESTYLES = {"blender": "-", "blender-reuse": "--", "blender-consistent": ":", "blender-pooled": "-."}
"""With several M per panel colours mark M, so the estimator of a line shows in its style."""


def save_figure(f: MplFigure, path: str | Path) -> None:
    """Write the figure atomically (temporary file, rename), in the format of the name's suffix (PNG by default):
    a killed run leaves no half-written image."""
    with atomic_path(path) as tmp:
        f.savefig(tmp, dpi=110, format=Path(path).suffix.lstrip(".").lower() or "png")


def _x(fig: Figure, x: float) -> float:
    return 100.0 * x if fig.x_name == "optin_fraction" else x


def plot_figure(fig: Figure, points: list[PointStat], path: Path, subtitle: str) -> None:
    """One panel per metric; lines per algorithm and M; gaps at missing points."""
    n = len(fig.metrics)
    f = MplFigure(figsize=(6.4 * n, 4.6))
    FigureCanvasAgg(f)
    axes = f.subplots(1, n, squeeze=False)
    sizes: list[int | None] = [None] if fig.sweeps_m else sorted({p.head_list_size for p in points})
    for ax, metric in zip(axes[0], fig.metrics, strict=True):
        for i, (algorithm, m) in enumerate((a, m) for a in fig.algorithms for m in sizes):
            pts = sorted((p for p in points if p.algorithm == algorithm and p.metric == metric
                          and (m is None or p.head_list_size == m)), key=lambda p: p.x or 0.0)
            if not pts:
                continue
            xs = [_x(fig, p.x or 0.0) for p in pts]
            ys = [p.mean if p.mean is not None else math.nan for p in pts]
            err = [[(p.mean - p.lo) if p.mean is not None else 0.0 for p in pts],
                   [(p.hi - p.mean) if p.mean is not None else 0.0 for p in pts]]
            label = ALGORITHM_LABELS.get(algorithm, algorithm) if len(fig.algorithms) > 1 else ""
            if len(sizes) > 1:
                label = f"{label}, M = {m}" if label else f"M = {m}"
            if all(p.mean is None for p in pts):
                label += " (head list never reached M)" if len(sizes) > 1 else " (never reached M)"
            color = ALGORITHM_COLORS.get(algorithm) if len(sizes) == 1 else f"C{sizes.index(m) % 10}"
            style = LINESTYLES.get(algorithm, "-") if len(sizes) > 1 else "-"
            ax.errorbar(xs, ys, yerr=err, fmt=style, marker=MARKERS[i % len(MARKERS)], capsize=3, label=label,
                        color=color, markersize=5, linewidth=1.6)
        if metric.startswith("ndcg"):  # NDCG lies in [0, 1]: keep the axis there (the CSV keeps full intervals)
            lows = [p.lo for p in points if p.metric == metric and p.lo is not None]
            ax.set_ylim(max(-0.02, min(lows, default=0.0) - 0.02), 1.02)
        ax.set_xlabel(X_LABELS.get(fig.x_name or "", fig.x_name or ""))
        ax.set_ylabel(METRIC_LABELS.get(metric, metric))
        if fig.x_name:
            ticks = sorted({_x(fig, x) for x in fig.x_values})
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    f.suptitle(f"{fig.title}\n{subtitle}", fontsize=10)
    f.tight_layout()
    save_figure(f, path)


def plot_figure9(summary: dict[str, Any], path: Path, subtitle: str) -> None:
    """Grouped horizontal bars: true p_q and the four estimate columns of the first trial (paper Fig. 9)."""
    first = summary.get("first_trial")
    f = MplFigure(figsize=(8.5, 6))
    FigureCanvasAgg(f)
    ax = f.subplots()
    if first:
        rows = first["rows"]
        cols = [("p_true", "true p_q", "black"), ("p_blended", "blended p̂_q", "tab:green"),
                ("p_optin_sum", "opt-in Σ_u", "tab:orange"), ("p_client_direct", "client p̂_C,q (direct)", "tab:blue"),
                ("p_client_sum", "client Σ_u", "tab:purple")]
        cols = [c for c in cols if c[0] in rows[0]]
        h = 0.8 / len(cols)
        for j, (key, label, color) in enumerate(cols):
            ys = [i + (j - (len(cols) - 1) / 2) * h for i in range(len(rows))]
            ax.barh(ys, [r[key] for r in rows], height=h, label=label, color=color)
            for y, r in zip(ys, rows, strict=True):
                if r.get(key + "_regression"):
                    ax.annotate("↑", (r[key], y), xytext=(2, -3), textcoords="offset points", color="red",
                                fontsize=8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([str(r["query"])[:30] for r in rows])
        ax.invert_yaxis()
        ax.set_xlabel("probability of the query (one sampled record per user)")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(True, axis="x", alpha=0.3)
    else:
        ax.text(0.5, 0.5, "no completed run at the defaults", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title("Top-10 queries by true p_q, trial 0 (↑ = regression: larger than the row above)\n" + subtitle,
                 fontsize=10)
    f.tight_layout()
    save_figure(f, path)

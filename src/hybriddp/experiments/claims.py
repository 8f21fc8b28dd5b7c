"""The paper's claims about its Figures 9–16 (and ALGORITHM.md §10), checked against this run's numbers.

Fig. 12's lines (the paper's estimator, the default, tune's knobs, local-only) and the ``sizes`` figure are
checked in :mod:`hybriddp.experiments.claims_fig12`; :func:`hybriddp.experiments.run.all_claims` gathers all.

Each :class:`Claim` states what the paper says, what the data here show, and whether the
claim holds here (``True``/``False``), or ``None`` when the run does not contain what the
claim needs (the figure was not run, or its grid lacks the value). Nothing is hard-coded:
every verdict is computed from the aggregated points.

A claim about a point holds only if the point exists (its head list reached M in every
trial, :mod:`hybriddp.experiments.aggregate`): a missing point cannot support a claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hybriddp.experiments.aggregate import PointStat, mean_ci, point_stat
from hybriddp.experiments.figures import Point
from hybriddp.experiments.runner import RunSet

NDCG_TARGET = 0.95
FAR_BELOW = 0.05
"""NDCG gap that counts as "far below" in Fig. 12 (the paper's gap was ~0.65)."""
YANDEX_L1_TARGET = 0.1


@dataclass
class Claim:
    """One row of the report's claims table."""

    figure: str
    paper: str
    here: str
    holds: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {"figure": self.figure, "paper": self.paper, "here": self.here, "holds": self.holds}


class Points:
    """Lookup of aggregated points by (algorithm, metric, M, x)."""

    def __init__(self, points: list[PointStat]) -> None:
        self.points = points

    def line(self, algorithm: str, metric: str, m: int | None = None) -> list[PointStat]:
        return sorted((p for p in self.points if p.algorithm == algorithm and p.metric == metric
                       and (m is None or p.head_list_size == m)), key=lambda p: p.x or 0.0)

    def at(self, algorithm: str, metric: str, m: int, x: float) -> PointStat | None:
        return next((p for p in self.line(algorithm, metric, m) if p.x is not None and abs(p.x - x) < 1e-9), None)

    def sizes(self) -> list[int]:
        return sorted({p.head_list_size for p in self.points})


def _n(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _f(v: float | None) -> str:
    return "missing" if v is None else f"{v:.3f}"


def x_text(name: str, x: float | None) -> str:
    """``4.5%`` for an opt-in fraction, ``ε=3`` for ε, ``name=x`` otherwise."""
    if x is None:
        return "?"
    if name == "optin":
        return f"{100 * x:g}%"
    return f"ε={x:g}" if name in ("eps", "ε") else f"{name}={x:g}"


def _first_reached(line: list[PointStat]) -> PointStat | None:
    return next((p for p in line if p.reached), None)


def all_above(line: list[PointStat], target: float, x: str = "x") -> tuple[bool | None, str]:
    """Every point reached and above ``target``; text lists the minimum and the missing points (``x``: axis name)."""
    if not line:
        return None, "not run"
    missing = [p for p in line if p.mean is None]
    have = [p for p in line if p.mean is not None]
    text = ""
    if have:
        low = min(have, key=lambda p: p.mean or 0.0)
        text = f"min {low.mean:.3f} at {x_text(x, low.x)}"
    if missing:
        text += ("; " if text else "") + f"missing at {', '.join(x_text(x, p.x) for p in missing)}"
    return (not missing and all((p.mean or 0.0) > target for p in have)), text


def default_point_claims(kind: str, base: Point, runs: RunSet) -> list[Claim]:
    """Generalized NDCG at the paper defaults (Fig. 10): > 0.95 (ALGORITHM.md §10)."""
    rows = runs.rows("blender", base)
    if not rows:
        return []
    st = point_stat(rows, "blender", None, "ndcg", base.head_list_size)
    where = {"yandex": "Yandex"}.get(kind, "AOL")
    paper = (f"{where} defaults (M = {base.head_list_size}, ε = {base.epsilon:g}, "
             f"{100 * base.optin_fraction:g}% opt-in): generalized NDCG > {NDCG_TARGET}")
    here = (f"{st.mean:.3f} [{st.lo:.3f}, {st.hi:.3f}] over {_n(st.n_trials, 'trial')}" if st.mean is not None else
            f"missing: the head list reached M in {st.n_reached} of {st.n_trials} trials")
    return [Claim("defaults", paper, here, st.mean is not None and st.mean > NDCG_TARGET)]


def fig9_claims(summary: dict[str, Any]) -> list[Claim]:
    """Fig. 9: the blended column has one regression in the top-10 table (the ingredients more)."""
    reg = summary.get("mean_regressions", {})
    first = summary.get("first_trial")
    if not first or reg.get("p_blended") is None:
        return [Claim("fig9", "Top-10 table: only one regression in the blended column", "no completed run", None)]
    n0 = sum(bool(r.get("p_blended_regression")) for r in first["rows"])
    mean = reg["p_blended"]
    others = ", ".join(f"{k.removeprefix('p_')} {v:.1f}" for k, v in reg.items() if k != "p_blended" and v is not None)
    default = summary.get("default") or {}
    d_mean = (default.get("mean_regressions") or {}).get("p_blended")
    also = "" if d_mean is None else f"; default estimator (`{default['estimator']}`), same seeds: {d_mean:.2f}"
    return [Claim("fig9", "Top-10 table: only one regression in the blended column (≤ 1)",
                  f"trial 0: {n0} (table of {len(first['rows'])} queries); mean over "
                  f"{_n(summary['n_trials'], 'trial')}: {mean:.2f} (ingredients: {others}){also}",
                  mean <= 1.0)]


def fig11_claims(pts: Points) -> list[Claim]:
    """Fig. 11: L1 falls as f_C grows (client, blended); client NDCG peaks near f_C = 0.85."""
    out = []
    parts, ok = [], True
    for a in ("client-only", "blender"):
        line = [p for p in pts.line(a, "l1") if p.mean is not None]
        if len(line) < 2:
            ok = None if ok is not False else ok
            continue
        low = min(line, key=lambda p: p.mean or 0.0)
        parts.append(f"{a}: {line[0].mean:.3f} at f_C={line[0].x:g}, min {low.mean:.3f} at {low.x:g}, "
                     f"{line[-1].mean:.3f} at {line[-1].x:g}")
        ok = ok and (line[-1].mean or 0.0) < (line[0].mean or 0.0)
    out.append(Claim("fig11", "L1 of the client and blended results improves (falls) as f_C grows",
                     "; ".join(parts) or "not enough points", ok if parts else None))
    line = [p for p in pts.line("client-only", "ndcg") if p.mean is not None]
    at85 = next((p for p in line if abs((p.x or 0) - 0.85) < 1e-9), None)
    if line and at85 is not None:
        best = max(line, key=lambda p: p.mean or 0.0)
        out.append(Claim("fig11", "client NDCG peaks at f_C ≈ 0.85 (drops before and after)",
                         f"max {best.mean:.3f} at f_C={best.x:g}; {at85.mean:.3f} at 0.85 "
                         f"(holds if 0.85 is within the max's 95% interval)", (at85.mean or 0.0) >= (best.lo or 0.0)))
    return out


@dataclass
class Comparison:
    """Blended against the better of opt-in-only and client-only, one metric at one point (paired trials).

    ``diff`` is the per-trial difference, signed so that positive means blended is worse; the
    better ingredient is chosen by its mean.
    """

    where: str
    metric: str
    blended: float
    best: float
    best_algorithm: str
    diff_mean: float
    diff_lo: float
    diff_hi: float
    n_pairs: int

    @property
    def significantly_worse(self) -> bool:
        """The paired 95% interval lies entirely on the worse side (needs ≥ 2 trials)."""
        return self.n_pairs >= 2 and self.diff_lo > 0


def compare_blended(where: str, metric: str, m: int, rows: dict[str, list[dict[str, Any]]]) -> Comparison | None:
    """Paired comparison at one point; ``None`` when a point is missing (head list < M) for any of the three."""
    stats = {a: point_stat(r, a, None, metric, m) for a, r in rows.items()}
    if any(st.mean is None for st in stats.values()):
        return None
    lower_better = metric.startswith("l1")
    sign = 1.0 if lower_better else -1.0
    best = min(("optin-only", "client-only"), key=lambda a: sign * (stats[a].mean or 0.0))
    diff = paired_difference(rows["blender"], rows[best], metric, m, sign)
    if diff is None:
        return None
    return Comparison(where, metric, stats["blender"].mean or 0.0, stats[best].mean or 0.0, best, *diff)


def paired_difference(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], metric: str, m: int,
                      sign: float = 1.0) -> tuple[float, float, float, int] | None:
    """Mean and 95% interval of ``sign·(a − b)`` over the trials both have (a run counts when it
    completed, reached M and has the metric), and the number of pairs; None without a pair."""
    def by_trial(rows: list[dict[str, Any]]) -> dict[int, float]:
        return {r["trial"]: r[metric] for r in rows if not r.get("error") and r.get(metric) is not None
                and (r.get("head_list_records") or 0) >= m}

    a, b = by_trial(rows_a), by_trial(rows_b)
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return (*mean_ci([sign * (a[t] - b[t]) for t in common]), len(common))


CHANCE_RATE = 0.025
"""Chance that one point's paired 95% interval lies entirely on the worse side when blended and the
better ingredient are in fact equal (one side of a two-sided 95% interval)."""


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p)."""
    return float(sum(math.comb(n, j) * p ** j * (1.0 - p) ** (n - j) for j in range(max(k, 0), n + 1)))


def never_worse_claims(comparisons: list[Comparison]) -> list[Claim]:
    """Blended never worse on average than the better of opt-in-only and client-only (paper §4.1, Fig. 9
    takeaways; ALGORITHM.md §12 for MSE), one claim per metric.

    Each point is a paired comparison over the trials; a point is *significantly* worse when the
    paired 95% interval of the difference lies entirely on the worse side. With many points some
    such intervals are expected by chance alone (rate :data:`CHANCE_RATE` each when the two are
    equal), so the claim holds here when (1) the number of significantly worse points is not more
    than chance explains (binomial tail probability ≥ 0.05) and (2) averaged over all points,
    blended is not significantly worse (95% interval of the mean difference over the points). The
    text also counts the points where the mean is worse at all. With a single trial there is no
    interval: then it holds only if blended is never worse at all.
    """
    out = []
    for metric in ("l1", "ndcg"):
        cs = [c for c in comparisons if c.metric == metric]
        if not cs:
            continue
        worse = [c for c in cs if c.diff_mean > 0]
        paired = all(c.n_pairs >= 2 for c in cs)
        signif = [c for c in worse if c.significantly_worse] if paired else worse
        here = (f"{len(cs) - len(worse)} of {len(cs)} points better or equal on average; worse on average at "
                f"{len(worse)}")
        if paired:
            tail = binomial_tail(len(signif), len(cs), CHANCE_RATE)
            avg, avg_lo, avg_hi = mean_ci([c.diff_mean for c in cs])
            here += (f", significantly (paired 95% CI) at {len(signif)} (chance alone: {CHANCE_RATE * len(cs):.1f} "
                     f"expected, P(≥ {len(signif)}) = {tail:.2f}); averaged over the {len(cs)} points blended is "
                     f"{'worse' if avg > 0 else 'better or equal'} by {abs(avg):.4f} (mean difference, worse side "
                     f"positive: {avg:+.4f} [{avg_lo:+.4f}, {avg_hi:+.4f}])")
            holds = tail >= 0.05 and not (len(cs) >= 2 and avg_lo > 0)
        else:
            here += ", (single trial: no interval, strict comparison)"
            holds = not signif
        shown = signif or worse
        if shown:
            worst = max(shown, key=lambda c: c.diff_mean)
            here += (f"; largest: {worst.where}: blended {worst.blended:.4f} vs {worst.best_algorithm} "
                     f"{worst.best:.4f}")
        out.append(Claim("fig11 + all BLENDER points", f"{metric}: blended is never worse on average than the better "
                         "of opt-in only and client only", here, holds))
    return out


def estimator_claims(runs: RunSet, points: list[Point]) -> list[Claim]:
    """Beyond the paper (ALGORITHM.md §4.1, §7, §7.1): pooled blend weights, reusing S, and reusing S with
    consistent queries are each never significantly worse than the paper's estimates, and consistent queries never
    significantly worse than reuse without them.

    ``blender-pooled`` is the same run as ``blender`` blended differently, ``blender-reuse`` a run
    with the same seed (the same S/T split, samples and noise streams) and ``blender-consistent`` that
    run made consistent (§7.1), so every trial is a pair. Per comparison and metric, it holds when no
    point has it significantly worse (paired 95% interval entirely on the worse side) and, over the
    points, the 95% interval of the mean difference does not lie entirely on the worse side either.
    """
    out = []
    for algo, base, short, what in (
            ("blender-pooled", "blender", "pooled − paper", "pooled blend weights are"),
            ("blender-reuse", "blender", "reuse − paper", "reusing S (with pooled weights) is"),
            ("blender-consistent", "blender", "consistent − paper", "reusing S with consistent queries is"),
            ("blender-consistent", "blender-reuse", "consistent − reuse", "making reuse's queries consistent is")):
        versus = "the paper's estimates" if base == "blender" else "reuse without it"
        for metric in ("l1", "l1_queries", "ndcg", "ndcg_queries_at_10"):
            sign = 1.0 if metric.startswith("l1") else -1.0  # worse side positive
            diffs = [(point, d) for point in points
                     if (d := paired_difference(runs.rows(algo, point), runs.rows(base, point), metric,
                                                point.head_list_size, sign)) is not None]
            if not diffs:
                continue
            worse = [x for x in diffs if x[1][3] >= 2 and x[1][1] > 0]
            better = [x for x in diffs if x[1][3] >= 2 and x[1][2] < 0]
            avg, avg_lo, avg_hi = mean_ci([d[0] for _, d in diffs])
            text = (f"{short} (worse side positive) from {min(d[0] for _, d in diffs):+.4f} to "
                    f"{max(d[0] for _, d in diffs):+.4f}, mean {avg:+.4f} [{avg_lo:+.4f}, {avg_hi:+.4f}] over "
                    f"{len(diffs)} ε; significantly worse (paired 95% CI) at {len(worse)}, significantly better at "
                    f"{len(better)}")
            holds = not worse and not (len(diffs) >= 2 and avg_lo > 0)
            out.append(Claim("estimators", f"beyond the paper: {metric}: {what} never significantly worse than "
                             f"{versus} (paired trials)", text, holds))
    return out


def aol_robustness_claims(fig: dict[str, Points]) -> list[Claim]:
    """Figs. 13a–16a (AOL): where the M = 50 lines begin; ≈5% opt-in for NDCG 0.95; L1 falls with ε."""
    out = []
    if "fig13" in fig or "fig14" in fig:
        pts = fig.get("fig13") or fig["fig14"]
        metric = "l1" if "fig13" in fig else "ndcg"
        first = _first_reached(pts.line("blender", metric, 50))
        if pts.line("blender", metric, 50):
            out.append(Claim("fig13a", "the M = 50 line begins at 4.5% opt-in (smaller fractions: list not created)",
                             f"begins at {x_text('optin', first.x)}" if first
                             else "never begins (M = 50 never reached)",
                             first is not None and abs((first.x or 0) - 0.045) < 1e-9))
    if "fig14" in fig:
        p5 = fig["fig14"].at("blender", "ndcg", 50, 0.05)
        if p5 is not None:
            out.append(Claim("fig14a", f"NDCG ≥ {NDCG_TARGET} needs ≈ 5% opt-in (M = 50)",
                             f"{_f(p5.mean)} at 5%; " + _threshold_text(fig["fig14"].line("blender", "ndcg", 50)),
                             p5.mean is not None and p5.mean >= NDCG_TARGET))
    if "fig15" in fig or "fig16" in fig:
        pts = fig.get("fig15") or fig["fig16"]
        metric = "l1" if "fig15" in fig else "ndcg"
        if pts.line("blender", metric, 50):
            first = _first_reached(pts.line("blender", metric, 50))
            out.append(Claim("fig15a", "the M = 50 line begins at ε = 3 (smaller ε: list not created)",
                             f"begins at {x_text('eps', first.x)}" if first
                             else "never begins (M = 50 never reached)",
                             first is not None and abs((first.x or 0) - 3.0) < 1e-9))
    if "fig15" in fig:
        out += _l1_falls_with_eps(fig["fig15"])
    return out


def _threshold_text(line: list[PointStat]) -> str:
    ok = [p for p in line if p.mean is not None and p.mean >= NDCG_TARGET]
    return f"first ≥ {NDCG_TARGET} at {x_text('optin', ok[0].x)}" if ok else f"never ≥ {NDCG_TARGET}"


def _l1_falls_with_eps(pts: Points) -> list[Claim]:
    parts, ok = [], True
    for m in pts.sizes():
        line = [p for p in pts.line("blender", "l1", m) if p.mean is not None]
        if len(line) >= 2:
            parts.append(f"M={m}: {line[0].mean:.3f} (ε={line[0].x:g}) → {line[-1].mean:.3f} (ε={line[-1].x:g})")
            ok = ok and (line[-1].mean or 0.0) < (line[0].mean or 0.0)
    if not parts:
        return []
    return [Claim("fig15", "L1 declines steadily with ε (every M)", "; ".join(parts), ok)]


def yandex_claims(fig: dict[str, Points], sizes: list[int]) -> list[Claim]:
    """Figs. 13b–16b (Yandex) and ALGORITHM.md §10: NDCG > 0.95 from 1.5% opt-in at M = 500; L1 < 0.1 for ε ≥ 1."""
    out = []
    big = max(sizes) if sizes else 500
    if "fig14" in fig:
        line = [p for p in fig["fig14"].line("blender", "ndcg", big) if (p.x or 0) >= 0.015 - 1e-12]
        holds, text = all_above(line, NDCG_TARGET, "optin")
        if line:
            out.append(Claim("fig14b", f"M = {big}: NDCG > {NDCG_TARGET} from 1.5% opt-in (ALGORITHM.md §10)",
                             text, holds))
        at15 = [fig["fig14"].at("blender", "ndcg", m, 0.015) for m in sizes[:-1]]
        if at15 and all(p is not None for p in at15):
            holds = all(p.mean is not None and p.mean > NDCG_TARGET for p in at15)  # type: ignore[union-attr]
            out.append(Claim("fig14b", f"at 1.5% opt-in NDCG > {NDCG_TARGET} for all but the largest M",
                             ", ".join(f"M={p.head_list_size}: {_f(p.mean)}" for p in at15), holds))  # type: ignore[union-attr]
    if "fig13" in fig:
        p = fig["fig13"].at("blender", "l1", big, 0.025)
        if p is not None:
            out.append(Claim("fig13b", f"2.5% opt-in is enough for a head list of {big}",
                             f"M = {big} reached in {p.n_reached} of {p.n_trials} trials at 2.5%", p.reached))
    if "fig15" in fig:
        line = [p for p in fig["fig15"].line("blender", "l1", big) if (p.x or 0) >= 1.0]
        if line:
            missing = [p for p in line if p.mean is None]
            worst = max((p for p in line if p.mean is not None), key=lambda p: p.mean or 0.0, default=None)
            text = f"max {_f(worst.mean)} at ε={worst.x:g}" if worst else "no point reached"
            if missing:
                text += f"; missing at ε={', '.join(f'{p.x:g}' for p in missing)}"
            out.append(Claim("fig15b", f"M = {big}: L1 < {YANDEX_L1_TARGET} for ε ≥ 1 (ALGORITHM.md §10)", text,
                             not missing and all((p.mean or 0.0) < YANDEX_L1_TARGET for p in line)))
        at1 = [p for m in sizes if (p := fig["fig15"].at("blender", "l1", m, 1.0)) is not None]
        if at1:
            text = ", ".join(f"M={p.head_list_size}: {_f(p.mean)}" for p in at1)
            out.append(Claim("fig15b", f"paper's wording: L1 under {YANDEX_L1_TARGET} already at ε = 1 (for the M "
                             "whose head list is created)", text,
                             any(p.mean is not None and p.mean < YANDEX_L1_TARGET for p in at1)))
    if "fig16" in fig:
        at1 = [fig["fig16"].at("blender", "ndcg", m, 1.0) for m in sizes[:-2]]
        if at1 and all(p is not None for p in at1):
            holds = all(p.mean is not None and p.mean >= NDCG_TARGET for p in at1)  # type: ignore[union-attr]
            out.append(Claim("fig16b", f"ε = 1: NDCG ≥ {NDCG_TARGET} for all but the two largest M",
                             ", ".join(f"M={p.head_list_size}: {_f(p.mean)}" for p in at1), holds))  # type: ignore[union-attr]
    return out

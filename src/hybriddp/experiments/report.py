"""``report.md``: the plots, a table per figure, and the paper's claims against this run's numbers."""

from __future__ import annotations

from typing import Any

from hybriddp.core.estimators import DEFAULT_ESTIMATOR
from hybriddp.experiments.aggregate import PointStat
from hybriddp.experiments.claims import Claim
from hybriddp.experiments.figures import ALGORITHM_ESTIMATORS, DEFAULT_LINE, METRIC_LABELS, X_LABELS, Figure
from hybriddp.experiments.plots import ALGORITHM_LABELS

MISSING = "—"



def _ci(p: PointStat) -> str:
    if p.mean is None:
        return f"{MISSING} ({p.n_reached}/{p.n_trials} reached)"
    if p.n_trials == 1:
        return f"{p.mean:.4f}"
    return f"{p.mean:.4f} [{p.lo:.4f}, {p.hi:.4f}]"


def _xs(fig: Figure, x: float | None) -> str:
    if x is None:
        return ""
    return f"{100 * x:g}%" if fig.x_name == "optin_fraction" else f"{x:g}"


def _verdict(holds: bool | None) -> str:
    return {True: "✅", False: "❌", None: "–"}[holds]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def claims_table(claims: list[Claim]) -> list[str]:
    lines = ["| figure | paper says | here | holds here |", "|---|---|---|:---:|"]
    lines += [f"| {c.figure} | {_cell(c.paper)} | {_cell(c.here)} | {_verdict(c.holds)} |" for c in claims]
    return lines


def figure_table(fig: Figure, points: list[PointStat]) -> list[str]:
    """Rows = x values; columns = (metric, algorithm, M): "mean [95% CI]" or — when missing."""
    def size(p: PointStat) -> int | None:
        return None if fig.sweeps_m else p.head_list_size  # sweeping M: M is the row, not a column

    cols = list(dict.fromkeys((p.metric, p.algorithm, size(p)) for p in points))
    many_m = len({c[2] for c in cols}) > 1
    many_metric = len({c[0] for c in cols}) > 1

    def head(c: tuple[str, str, int | None]) -> str:
        parts = [c[0]] if many_metric else []
        if len(fig.algorithms) > 1:
            parts.append(c[1])
        if many_m:
            parts.append(f"M={c[2]}")
        return " ".join(parts) or c[1]

    by = {(p.metric, p.algorithm, size(p), p.x): p for p in points}
    xs = sorted({p.x for p in points if p.x is not None})
    lines = [f"| {fig.x_name} | " + " | ".join(head(c) for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for x in xs:
        cells = [_ci(by[(*c, x)]) if (*c, x) in by else "" for c in cols]
        lines.append(f"| {_xs(fig, x)} | " + " | ".join(cells) + " |")
    return lines


def lines_table(figs: dict[str, Figure], params: dict[str, Any]) -> list[str]:
    """One row per line drawn: its label, its estimator (``--estimator``) and its knobs."""
    algorithms = dict.fromkeys(a for f in figs.values() for a in f.algorithms)
    defaults = f"paper's (f_O = {params['f_o']:g}, f_C = {params['f_c']:g} unless the x axis is f_C)"
    lines = ["| line | legend | estimator | knobs |", "|---|---|---|---|"]
    for a in algorithms:
        est = ALGORITHM_ESTIMATORS.get(a)
        est_text = "— (not BLENDER: LocalAlg's client estimates)" if est is None else \
            f"`{est}`" + (" (the default)" if est == DEFAULT_ESTIMATOR else "")
        knobs = ("f_O, f_C chosen per trial by `hybriddp tune -M 10` (table under Fig. 12; trials.csv `tuned_f_o`, "
                 "`tuned_f_c`)") if a == "blender-tuned" else (
            "no opt-in group: PEM/OLH discovery, then LocalAlg" if est is None else defaults)
        lines.append(f"| `{a}` | {_cell(ALGORITHM_LABELS.get(a, a))} | {est_text} | {knobs} |")
    return lines


def tuned_knobs_table(rows: list[dict[str, Any]]) -> list[str]:
    """Under Fig. 12: per ε, the estimator ``blender-tuned`` ran and the knobs tune chose (trials each)."""
    if not rows:
        return []
    out = ["", "Knobs `hybriddp tune -M 10` chose for `blender-tuned` (trials per choice):", "",
           "| epsilon | estimator | (f_O, f_C): trials |", "|---|---|---|"]
    for r in rows:
        knobs = ", ".join(f"({k['f_o']:g}, {k['f_c']:g}): {k['trials']}" for k in r["knobs"])
        out.append(f"| {r['x']:g} | {', '.join(r['estimators'])} | {knobs} |")
    return out


def figure9_section(summary: dict[str, Any]) -> list[str]:
    first = summary.get("first_trial")
    if not first:
        return ["No BLENDER run at the defaults completed: no table."]
    cols = [("p_true", "true p_q"), ("p_blended", "blended p̂_q"), ("p_optin_sum", "opt-in Σ_u"),
            ("p_client_direct", "client p̂_C,q"), ("p_client_sum", "client Σ_u")]
    rows = first["rows"]
    cols = [c for c in cols if c[0] in rows[0]]
    lines = [f"Trial {first['trial']} (↑ = regression: larger than the value one row above, i.e. out of the true "
             "order):", "", "| query | " + " | ".join(h for _, h in cols) + " |", "|---|" + "---:|" * len(cols)]
    for r in rows:
        cells = [("↑" if r.get(k + "_regression") else "") + f"{r[k]:.4f}" for k, _ in cols]
        lines.append(f"| {_cell(str(r['query']))} | " + " | ".join(cells) + " |")
    reg = summary["mean_regressions"]
    lines += ["", f"Mean regressions per column over {summary['n_trials']} trial(s): "
              + ", ".join(f"{h} {reg[k]:.2f}" for k, h in cols if k in reg and reg[k] is not None)
              + " (paper Fig. 9: blended 1)."]
    default = summary.get("default")
    if default and default["mean_regressions"].get("p_blended") is not None:
        lines.append(f"The default estimator (`{default['estimator']}`, line `{default['algorithm']}`), same seeds: "
                     f"{default['mean_regressions']['p_blended']:.2f} regressions in its blended column on average "
                     f"over {default['n_trials']} trial(s).")
    return lines


def write_report(meta: dict[str, Any], figs: dict[str, Figure], points: dict[str, list[PointStat]],
                 fig9: dict[str, Any] | None, claims: list[Claim]) -> str:
    """The Markdown text of ``report.md``."""
    p = meta["params"]
    lines = [
        f"# BLENDER evaluation reproduced — dataset `{meta['dataset']}`", "",
        "Reproduces the evaluation of Avent et al., *BLENDER: Enabling Local Search with a Hybrid Differential "
        "Privacy Model* (USENIX Security 2017), §4.2, Figures 9 and 11–16, with `hybriddp experiment`, and one "
        "figure beyond the paper (`sizes`: how long a list each approach delivers).", "",
        f"* data: `{meta['data']}` — {meta['n_users']:,} users, {meta['n_records']:,} records"
        + (" (synthetic, calibrated to the published statistics; ALGORITHM.md §10)" if meta["kind"] != "file" else ""),
        f"* defaults (paper Fig. 10): ε = {p['epsilon']:g}, δ = {p['delta']:g}, opt-in {100 * p['optin_fraction']:g}%, "
        f"M = {p['head_list_size']}, f_O = {p['f_o']:g}, f_C = {p['f_c']:g}, m_O = m_C = {p['m_o']}",
        f"* {meta['trials']} trial{'' if meta['trials'] == 1 else 's'} per point, seed {meta['seed']} "
        "(trial seeds hashed from seed, trial and point); "
        f"means with 95% t-intervals over trials"
        + (" — **quick grids (tests only)**" if meta.get("quick") else ""),
        f"* runs: {meta['runs']['total']} ({meta['runs']['ran']} run now, {meta['runs']['skipped']} reused from "
        f"trials.csv); wall time of this invocation {meta['runs']['seconds_wall']:.0f} s on {meta['runs']['jobs']} "
        f"job(s); compute time of all runs {meta['runs']['seconds_compute']:.0f} s",
        "* a point is **missing** (— in the tables, a gap in the plots) unless every trial's final head list reached "
        "the requested size M, as the paper leaves lines out where \"that size head list was not created\"",
        "* Fig. 12's baselines are purely local: PEM over OLH discovers the head list, then BLENDER's client "
        "algorithm estimates it. `local-only-hashed` has no dictionary (records hashed to 32 bits; false discoveries "
        "stay in the list with true frequency 0); `local-only`'s aggregator holds a dictionary of exactly the "
        "existing records, the strongest local baseline. The paper compares against the numbers *reported* by Qin "
        "et al. (LDPMiner, CCS 2016; NDCG ≈ 0.3), a weaker discovery method than PEM.",
        f"* `blender` is BLENDER as published (estimator `paper`, no check against fake reports), what the paper "
        f"plots; `{DEFAULT_LINE}` is what hybriddp ships by default (estimator `{DEFAULT_ESTIMATOR}`, the server's "
        "check against the opt-in group on, docs/ALGORITHM.md §7.2), run with the same seeds, next to it in every "
        "figure. The table of lines below names every line's estimator and knobs; trials.csv has them per run "
        "(columns `estimator`, `tuned_f_o`, `tuned_f_c`).",
        f"* `blender-tuned` (Fig. 12) is BLENDER with estimator `{ALGORITHM_ESTIMATORS['blender-tuned']}` and the f_O "
        "and f_C that `hybriddp tune -M 10` picks, simulating that estimator, from the DP files of an earlier round "
        "run at the paper's defaults (a second release; tuning reads nothing else).",
        "* `l1_union` (docs/ALGORITHM.md §9) is L1 over the list ∪ the true top-M records, a listed-nowhere record "
        "counting with estimate 0: unlike `l1` (over the algorithm's own list) a list of rare or absent records "
        "cannot score well on it.",
        "* `blender-pooled` (figure `estimators`) is the same BLENDER run blended with pooled weights (both "
        "variances at the blended estimate, docs/ALGORITHM.md §7) instead of the paper's: paired by construction.",
        "* `blender-reuse` (every figure) is BLENDER with `--estimator reuse`, with the same seed as the "
        "point's `blender` run (paired by seed): the noisy S counts CreateHeadList released rank the records for "
        "trimming and enter their opt-in estimates (docs/ALGORITHM.md §4.1); pooled weights.",
        "* `blender-consistent` (figure `estimators`) is the same run as `blender-reuse` with every query's subtree "
        "made consistent (query = the sum of its entries) by generalized least squares (docs/ALGORITHM.md §7.1): "
        "paired by construction.",
    ]
    if p["delta"] >= 1.0 / max(meta["n_users"], 1):
        lines.append(f"* note: δ = {p['delta']:g} is not below 1/n_users = {1.0 / meta['n_users']:.3g} (neither is the "
                     "paper's AOL choice, 1e-5 at 519,371 users); these are seeded simulations, not deployments")
    if meta["kind"] == "file":
        lines.append(f"* log file: AOL defaults with δ = min(1e-5, 1/n_users) = {p['delta']:g}; the paper's AOL "
                     "claims refer to the full AOL log and are shown for comparison only")
    lines += ["", "## Lines", "", *lines_table(figs, p)]
    lines += ["", "## The paper's claims, checked on this run", "",
              "Verdicts are computed from the numbers below (– : the run does not contain what the claim needs).", ""]
    lines += claims_table(claims)
    for name, fig in figs.items():
        lines += ["", f"## {name}: {fig.title}", "", f"![{name}]({name}.png)", ""]
        if name == "fig9":
            lines += figure9_section(fig9 or {})
            continue
        lines.append("y: " + "; ".join(METRIC_LABELS.get(m, m) for m in fig.metrics) + ". x: "
                     + X_LABELS.get(fig.x_name or "", str(fig.x_name)) + ". Lines: "
                     + ", ".join(ALGORITHM_LABELS.get(a, a) for a in fig.algorithms) + ".")
        lines += ["", *figure_table(fig, points[name])]
        if name == "fig12":
            lines += tuned_knobs_table(meta.get("tuned_knobs") or [])
    return "\n".join(lines) + "\n"

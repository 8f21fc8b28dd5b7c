"""The outputs of ``hybriddp experiment poisoning``: ``trials.csv`` (one row per trial, attack, φ and defense),
``summary.csv``, ``poisoning.png`` and ``report.md`` with a verdict per target of issue 28 (ALGORITHM.md §7.2)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.core.atomic import write_text
from hybriddp.experiments.aggregate import csv_text
from hybriddp.experiments.plots import save_figure
from hybriddp.experiments.poisoning import TOP, summarize

HONEST_TRIALS = 200
"""Honest rounds ``experiment poisoning`` runs at least (its false-alarm verdict needs them: 1% of 40 is 0.4)."""

TARGET_RANK = 20
"""The verdicts count targets of true rank ≥ 20 (issue 28's targets); the tables show every target."""


@dataclass(frozen=True)
class Claim:
    """One target of issue 28: the attacks and fractions it covers and the largest success rate it allows."""

    name: str
    attacks: tuple[str, ...]
    max_fraction: float
    limit: float = 0.05


CLAIMS = (
    Claim("output-manipulation fakes (direct, spread) at φ ≤ 10%", ("direct", "spread"), 0.10),
    Claim("the adaptive attack at φ ≤ 5%", ("adaptive",), 0.05),
    Claim("fakes running the honest randomizer at φ ≤ 2%", ("randomizer",), 0.02),
)


def upper_bound(successes: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Clopper–Pearson upper bound of a rate from ``successes`` of ``n`` (bisection on the binomial CDF)."""
    if n == 0:
        return 1.0
    if successes >= n:
        return 1.0
    lo, hi = successes / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        cdf = sum(math.comb(n, i) * mid**i * (1 - mid) ** (n - i) for i in range(successes + 1))
        lo, hi = (mid, hi) if cdf > 1 - confidence else (lo, mid)
    return hi


def verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per claim: the worst (attack, φ) success rate with the defense, its trials and upper bound; plus the honest
    rounds' false alarms and the defense's cost in NDCG and L1."""
    out = []
    for claim in CLAIMS:
        worst: dict[str, Any] | None = None
        for attack in claim.attacks:
            for phi in sorted({r["fraction"] for r in rows if r["attack"] == attack}):
                if phi > claim.max_fraction:
                    continue
                sel = [r for r in rows if r["attack"] == attack and r["fraction"] == phi and r["defended"]
                       and r["target_true_rank"] >= TARGET_RANK]
                if not sel:
                    continue
                k = sum(r["success"] for r in sel)
                cand = {"attack": attack, "fraction": phi, "successes": k, "trials": len(sel)}
                if worst is None or k / len(sel) > worst["successes"] / worst["trials"]:
                    worst = cand
        if worst is None:
            continue
        rate = worst["successes"] / worst["trials"]
        bound = upper_bound(worst["successes"], worst["trials"])
        out.append({"claim": f"a target of true rank ≥ {TARGET_RANK} enters the top {TOP} in ≤ {claim.limit:.0%} of "
                             f"trials against {claim.name}",
                    "measured": f"worst {rate:.1%} ({worst['successes']}/{worst['trials']}, {worst['attack']} at "
                                f"φ = {worst['fraction']:.1%}; 95% upper bound {bound:.1%})",
                    "holds": rate <= claim.limit})
    honest = {d: [r for r in rows if r["attack"] == "honest" and r["defended"] is d] for d in (False, True)}
    floor = [r for r in honest[True] if r.get("floor_rank") is not None and r["target_true_rank"] >= TARGET_RANK]
    if floor:
        k = sum(r["floor_success"] for r in floor)
        out.append({"claim": f"floor: the opt-in estimates alone (κ = 0, whatever the reports) put a target of true "
                             f"rank ≥ {TARGET_RANK} in the top {TOP}",
                    "measured": f"{k}/{len(floor)} rounds ({k / len(floor):.1%}): no defense anchored on the opt-in "
                                "group can do better", "holds": True})
    if honest[True]:
        flags = sum(r["flagged_any"] for r in honest[True])
        n = len(honest[True])
        out.append({"claim": "false alarms on honest rounds ≤ 1%",
                    "measured": f"{flags}/{n} honest rounds flagged ({flags / n:.1%}; 95% upper bound "
                                f"{upper_bound(flags, n):.1%})", "holds": flags / n <= 0.01})
        nd = {d: float(np.mean([r["ndcg"] for r in honest[d]])) for d in (False, True)}
        l1 = {d: float(np.mean([r["l1"] for r in honest[d]])) for d in (False, True)}
        out.append({"claim": "honest NDCG within 0.005 and L1 within 5% of the undefended default",
                    "measured": f"NDCG {nd[True]:.4f} vs {nd[False]:.4f} ({nd[True] - nd[False]:+.4f}); L1 "
                                f"{l1[True]:.5f} vs {l1[False]:.5f} ({l1[True] / l1[False] - 1:+.1%})",
                    "holds": nd[True] >= nd[False] - 0.005 and l1[True] <= 1.05 * l1[False]})
    return out


def write_outputs(out_dir: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[Path]:
    """``trials.csv``, ``summary.csv``, ``poisoning.png`` and ``report.md`` in ``out_dir`` (each written atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    paths = [out_dir / "trials.csv", out_dir / "summary.csv", out_dir / "poisoning.png", out_dir / "report.md"]
    write_text(paths[0], csv_text(rows))
    write_text(paths[1], csv_text(summary))
    _plot(paths[2], summary)
    write_text(paths[3], report(summary, verdicts(rows), meta))
    return paths


def _plot(path: Path, summary: Sequence[dict[str, Any]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attacks = sorted({s["attack"] for s in summary if s["attack"] != "honest"})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, attack in enumerate(attacks):
        for defended, style in ((False, "--"), (True, "-")):
            pts = sorted((s["fraction"], s) for s in summary if s["attack"] == attack and s["defended"] is defended)
            if not pts:
                continue
            x = [100 * p for p, _ in pts]
            label = f"{attack}, {'defended' if defended else 'undefended'}"
            axes[0].plot(x, [s["success_rate"] for _, s in pts], style, color=f"C{i}", marker="o", label=label)
            axes[1].plot(x, [s["mean_target_rank"] for _, s in pts], style, color=f"C{i}", marker="o", label=label)
    for ax, ylabel in zip(axes, (f"success: target enters the top {TOP}", "target's mean published rank"),
                          strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("fake reports (% of honest reports)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].invert_yaxis()
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.suptitle("Fake devices against the published suggestions: undefended (dashed) vs the opt-in anchor (solid)")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def report(summary: Sequence[dict[str, Any]], checks: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """report.md: the set-up, a verdict per claim, and the table of every (attack, φ, defense)."""
    lines = ["# Poisoning: fake devices against the published suggestions", "",
             "Set-up: " + ", ".join(f"{k} = {v}" for k, v in meta.items()) + ".",
             f"A trial is one honest round (fresh seed); a target query of true rank in the configured range is drawn "
             f"and each attack's fakes are added to the same honest reports. Success: the target ranks in the top "
             f"{TOP} published queries. Verdicts count targets of true rank ≥ {TARGET_RANK} "
             "(docs/ALGORITHM.md §7.2 has the defense and its bound).", "", "## Verdicts", "",
             "| claim | measured | verdict |", "|---|---|---|"]
    lines += [f"| {c['claim']} | {c['measured']} | "
              f"{'reference' if c.get('reference') else 'holds' if c['holds'] else 'does not hold'} |" for c in checks]
    lines += ["", "## Every attack and fraction", "",
              "| attack | φ | defended | trials | success | detected | mean rank (true) | flagged rounds |",
              "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if s["attack"] == "honest":
            continue
        lines.append(f"| {s['attack']} | {s['fraction']:.1%} | {'yes' if s['defended'] else 'no'} | {s['trials']} | "
                     f"{s['success_rate']:.0%} | {s['detection_rate']:.0%} | {s['mean_target_rank']:.1f} "
                     f"({s['mean_true_rank']:.1f}) | {s['flag_rate']:.0%} |")
    lines += ["", "## Honest rounds", "", "| defended | trials | flagged | NDCG | NDCG@10 | L1 | L1 (union) |",
              "|---|---|---|---|---|---|---|"]
    for s in summary:
        if s["attack"] == "honest":
            lines.append(f"| {'yes' if s['defended'] else 'no'} | {s['trials']} | {s['flag_rate']:.1%} | "
                         f"{s['ndcg']:.4f} | {s['ndcg_queries_at_10']:.4f} | {s['l1']:.5f} | "
                         f"{s['l1_union'] if s['l1_union'] is None else format(s['l1_union'], '.5f')} |")
    return "\n".join(lines) + "\n"


def run_poisoning(spec: Any, *, trials: int, out_dir: Path | None, quick: bool = False,
                  progress: Any = None, honest_trials: int | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """``hybriddp experiment poisoning``: every attack at every fraction on ``spec``'s data (a preset or a log file,
    :class:`~hybriddp.experiments.datasets.DatasetSpec`) at its paper defaults with the default estimator; writes
    :func:`write_outputs` to ``out_dir`` (default ``experiments-out/<dataset>-poisoning``) and returns it with the
    verdicts. ``quick``: two fractions (tests). ``honest_trials``: honest rounds for the false-alarm rate (default
    :data:`HONEST_TRIALS`; at least ``trials`` are run)."""
    import time

    from hybriddp.core.params import BlenderParams
    from hybriddp.experiments.poisoning import FRACTIONS, PoisoningConfig, poisoning_rows

    log = spec.load()
    base = spec.base_point(log)
    params = BlenderParams(epsilon=base.epsilon, delta=base.delta, optin_fraction=base.optin_fraction,
                           f_c=base.f_c, head_list_size=base.head_list_size)
    config = PoisoningConfig(trials=trials, fractions=(0.01, 0.05) if quick else FRACTIONS, seed=spec.seed,
                             honest_trials=trials if quick else max(trials, honest_trials or HONEST_TRIALS))
    start = time.monotonic()
    rows = list(poisoning_rows(log, params, config,
                               progress=(lambda done: progress(done, config.honest_trials)) if progress else None))
    out = out_dir or Path("experiments-out") / f"{spec.name}-poisoning"
    policy = config.policy
    meta = {"dataset": spec.data_id, "trials": trials, "ε": params.epsilon, "δ": params.delta,
            "opt-in fraction": params.optin_fraction, "M": params.head_list_size, "estimator": params.estimator,
            "defense": f"anchor (α = {policy.alpha}, κ = {policy.kappa}, κ_q = {policy.kappa_query})",
            "target ranks": config.ranks, "seconds": round(time.monotonic() - start)}
    write_outputs(out, rows, meta)
    return out, verdicts(rows)

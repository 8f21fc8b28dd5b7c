"""The outputs of ``hybriddp experiment poisoning``: ``trials.csv`` (one row per trial, attack, φ and defense),
``summary.csv``, ``poisoning.png``, ``honest_cost.csv`` (the defended default's cost on fresh honest populations, when
run) and ``report.md`` with a verdict per target of issues 28 and 40 (ALGORITHM.md §7.2)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.core.atomic import write_text
from hybriddp.core.errors import parameter_error
from hybriddp.experiments.aggregate import csv_text
from hybriddp.experiments.plots import save_figure
from hybriddp.experiments.poisoning import TOP, summarize
from hybriddp.server.anchor import FIXED_KAPPA_QUERY
from hybriddp.simulation.attacks import ATTACKS

HONEST_TRIALS = 200
"""Honest rounds ``experiment poisoning`` runs at least (its false-alarm verdict needs them: 1% of 40 is 0.4)."""

TARGET_RANK = 20
"""The verdicts count targets of true rank ≥ 20 (issue 28's targets); the tables show every target."""

HONEST_COST_ROUNDS = 100
"""Fresh honest rounds per opt-in size of the honest-cost table (issue 40; 0 leaves it out): about a minute."""

ISSUE40_FRACTIONS = (0.01, 0.05, 0.10)
"""Issue 40's fake fractions: target success ≤ 5% there where the opt-in group has ≥ 10,000 users."""
ISSUE40_MIN_OPTIN = 10_000
ISSUE40_RMSE_RATIO = 1.15
"""Issue 40: the defended default's RMSE on honest rounds ≤ 1.15 × the undefended blend's (records, queries)."""
ISSUE40_NDCG = 0.003
"""Issue 40: NDCG@10 within 0.003 of the undefended blend's."""
ISSUE40_L1 = 0.010
"""Issue 40: the aol preset's L1 ≤ 0.010 (the issue takes the mean of ``hybriddp demo`` seeds 11–13)."""
SLACK = 1e-9
"""A shift over its bound counts as within it up to this (float rounding of the clamp)."""


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


def rate_verdict(successes: int, n: int, limit: float) -> dict[str, Any]:
    """A claim "the rate is at most ``limit``" judged from ``successes`` of ``n``: ``holds`` only where the 95%
    upper bound (:func:`upper_bound`) is within the limit; ``does not hold`` where the measured rate is above it;
    otherwise ``not enough trials`` (the rate is within the limit, but so few trials cannot show it)."""
    if n and successes / n > limit:
        return {"holds": False, "verdict": "does not hold"}
    if upper_bound(successes, n) <= limit:
        return {"holds": True, "verdict": "holds"}
    return {"holds": False, "verdict": "not enough trials"}


def verdict_text(check: dict[str, Any]) -> str:
    """What a report prints for a check: ``reference``, or its verdict (``holds`` / ``does not hold`` / ``not
    enough trials``)."""
    if check.get("reference"):
        return "reference"
    return check.get("verdict") or ("holds" if check["holds"] else "does not hold")


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
                    **rate_verdict(worst["successes"], worst["trials"], claim.limit)})
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
                                f"{upper_bound(flags, n):.1%})", **rate_verdict(flags, n, 0.01)})
        nd = {d: float(np.mean([r["ndcg"] for r in honest[d]])) for d in (False, True)}
        l1 = {d: float(np.mean([r["l1"] for r in honest[d]])) for d in (False, True)}
        out.append({"claim": "honest NDCG within 0.005 and L1 within 5% of the undefended default",
                    "measured": f"NDCG {nd[True]:.4f} vs {nd[False]:.4f} ({nd[True] - nd[False]:+.4f}); L1 "
                                f"{l1[True]:.5f} vs {l1[False]:.5f} ({l1[True] / l1[False] - 1:+.1%})",
                    "holds": nd[True] >= nd[False] - 0.005 and l1[True] <= 1.05 * l1[False]})
    return out


def _rate(rows: Sequence[dict[str, Any]], attack: str, phi: float, defended: bool) -> tuple[int, int]:
    sel = [r for r in rows if r["attack"] == attack and r["fraction"] == phi and r["defended"] is defended
           and r["target_true_rank"] >= TARGET_RANK]
    return sum(r["success"] for r in sel), len(sel)


def issue40_verdicts(rows: Sequence[dict[str, Any]], cost: Sequence[dict[str, Any]] = (),
                     l1_target: bool = False) -> list[dict[str, Any]]:
    """Issue 40's targets: per attack, success at φ = 1%, 5%, 10% ≤ 5% where the opt-in group has ≥ 10,000 users
    (else a reference row); defended success below the undefended blend's at every attack and φ; the largest shift
    within the derived bound (ALGORITHM.md §7.2, "The bound") and how close the oracle gets to it; per opt-in size of
    ``cost`` (:func:`~hybriddp.experiments.poisoning.honest_cost`) RMSE ≤ 1.15× and NDCG@10 within 0.003 of the
    undefended blend's; with ``l1_target`` (the aol preset) the honest rounds' defended L1 ≤ 0.010."""
    out: list[dict[str, Any]] = []
    attacked = [r for r in rows if r["attack"] != "honest"]
    optin = [r["optin_users"] for r in rows if r["attack"] == "honest" and r.get("optin_users") is not None]
    n_optin = int(np.mean(optin)) if optin else 0
    fracs = {phi: f"{phi:.0%}" for phi in ISSUE40_FRACTIONS}
    for attack in [a for a in ATTACKS if any(r["attack"] == a for r in attacked)]:
        cells = [(phi, *_rate(rows, attack, phi, True)) for phi in ISSUE40_FRACTIONS]
        cells = [c for c in cells if c[2]]
        if not cells:
            continue
        phi, k, n = max(cells, key=lambda c: c[1] / c[2])
        applies = n_optin >= ISSUE40_MIN_OPTIN
        out.append({"claim": f"{attack}: a target of true rank ≥ {TARGET_RANK} enters the top {TOP} in ≤ 5% of trials "
                             f"at φ = {', '.join(fracs[c[0]] for c in cells)} (opt-in group ≥ {ISSUE40_MIN_OPTIN:,})",
                    "measured": f"worst {k / n:.1%} ({k}/{n} at φ = {phi:.0%}; 95% upper bound "
                                f"{upper_bound(k, n):.1%}); opt-in group {n_optin:,}"
                                + ("" if applies else " (< 10,000: the target does not apply)"),
                    **rate_verdict(k, n, 0.05), "reference": not applies})
    worse = []
    for attack, phi in sorted({(r["attack"], r["fraction"]) for r in attacked}):
        (kd, nd), (ku, nu) = _rate(rows, attack, phi, True), _rate(rows, attack, phi, False)
        if nd and nu and (kd / nd >= ku / nu if ku else kd > 0):
            worse.append(f"{attack} at {phi:.1%}: {kd}/{nd} vs {ku}/{nu}")
    if attacked:
        out.append({"claim": "defended success below the undefended blend's at every attack and φ (where the "
                             "undefended blend lets no target through: none either)",
                    "measured": "; ".join(worse) if worse else "every cell", "holds": not worse})
    defended = [r for r in attacked if r["defended"] and r.get("max_shift_all") is not None]
    if defended:
        worst = max(r["max_shift_all"] for r in defended)
        rank = max((r["rank_excess"] for r in defended if np.isfinite(r.get("rank_excess", np.nan))),
                   default=-math.inf)
        growth = [r["bound_growth"] for r in defended if r.get("bound_growth") is not None]
        rise = [r["bound_rise_all"] for r in defended if r.get("bound_rise_all") is not None]
        out.append({"claim": "the attacker's largest shift within the derived bound: |p̂ − p̂_O| ≤ κ_i·s_i on every "
                             "entry and query, the ranking score within the round's κ_q·s of a = p̂_O in [0, 1], "
                             "every attack and φ",
                    "measured": f"largest |p̂ − p̂_O|/(κ_i·s_i) {worst:.6f}, ranking score's largest excess over "
                                f"p̂_O + κ_q·s {max(rank, 0.0):.6f}·s "
                                f"over {len(defended)} attacked rounds"
                                + (f"; the target's bound under attack {min(growth):.2f}–{max(growth):.2f}× the "
                                   f"honest round's" if growth else "")
                                + (f", any entry's bound rose by at most {max(rise):.2f}·s" if rise else ""),
                    "holds": worst <= 1 + SLACK and rank <= SLACK})
    oracle = [r for r in defended if r["attack"] == "oracle"]
    if oracle:
        top = max(r["fraction"] for r in oracle)
        at = [r for r in oracle if r["fraction"] == top and np.isfinite(r.get("shift", np.nan))]
        reach = sum(r["shift"] >= 0.99 for r in at)
        rank_reach = [r["rank_reach"] for r in at if np.isfinite(r.get("rank_reach", np.nan))]
        out.append({"claim": f"the oracle (knows the bound) at φ = {top:.0%}: its estimate's shift reaches the bound",
                    "measured": f"shift/(κ_i·s_i) ≥ 0.99 in {reach}/{len(at)} rounds (mean "
                                f"{np.mean([r['shift'] for r in at]):.3f}, with "
                                f"{np.mean([r['fakes'] for r in at]):,.0f} fakes on average); ranking score at its "
                                f"maximum p̂_O + min(κ_q, κ_i)·s in {sum(x >= 0.99 for x in rank_reach)}/"
                                f"{len(rank_reach)} (where that is above 0)",
                    "holds": True, "reference": True})
    for c in cost:
        ok = (c["rmse_ratio_records"] <= ISSUE40_RMSE_RATIO and c["rmse_ratio_queries"] <= ISSUE40_RMSE_RATIO
              and c["ndcg10_diff"] >= -ISSUE40_NDCG)
        out.append({"claim": f"honest cost at {c['optin_users']:,} opt-in users: RMSE ≤ {ISSUE40_RMSE_RATIO}× the "
                             f"undefended blend's (records, queries), NDCG@10 within {ISSUE40_NDCG}",
                    "measured": f"RMSE {c['rmse_ratio_records']:.3f}× / {c['rmse_ratio_queries']:.3f}×, NDCG@10 "
                                f"{c['ndcg10_diff']:+.4f} ({c['rounds']} rounds)"
                                + (f"; with the fixed guard κ_q = {FIXED_KAPPA_QUERY:g} {c['ndcg10_diff_fixed']:+.4f}"
                                   if c.get("ndcg10_diff_fixed") is not None else ""), "holds": ok})
    honest = [r for r in rows if r["attack"] == "honest" and r["defended"]]
    if l1_target and honest:
        l1 = float(np.mean([r["l1"] for r in honest]))
        out.append({"claim": f"aol preset: honest L1 ≤ {ISSUE40_L1:.3f} (defended; the issue measures the mean of "
                             "`hybriddp demo` seeds 11–13)",
                    "measured": f"{l1:.5f} over {len(honest)} honest rounds", "holds": l1 <= ISSUE40_L1})
    return out


def write_outputs(out_dir: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any],
                  cost: Sequence[dict[str, Any]] = (), l1_target: bool = False) -> list[Path]:
    """``trials.csv``, ``summary.csv``, ``poisoning.png``, ``report.md`` and, with ``cost``, ``honest_cost.csv`` in
    ``out_dir`` (each written atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    paths = [out_dir / "trials.csv", out_dir / "summary.csv", out_dir / "poisoning.png", out_dir / "report.md"]
    write_text(paths[0], csv_text(rows))
    write_text(paths[1], csv_text(summary))
    _plot(paths[2], summary)
    write_text(paths[3], report(summary, verdicts(rows), meta, issue40_verdicts(rows, cost, l1_target), cost))
    if cost:
        paths.append(out_dir / "honest_cost.csv")
        write_text(paths[4], csv_text(cost))
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


def _claims(checks: Sequence[dict[str, Any]]) -> list[str]:
    return ["| claim | measured | verdict |", "|---|---|---|"] + [
        f"| {c['claim']} | {c['measured']} | "
        f"{verdict_text(c)} |" for c in checks]


def _num(s: dict[str, Any], key: str, fmt: str) -> str:
    return "—" if s.get(key) is None else format(s[key], fmt)


def report(summary: Sequence[dict[str, Any]], checks: Sequence[dict[str, Any]], meta: dict[str, Any],
           checks40: Sequence[dict[str, Any]] = (), cost: Sequence[dict[str, Any]] = ()) -> str:
    """report.md: the set-up, a verdict per claim of issues 28 and 40, the table of every (attack, φ, defense), the
    bound under attack, the honest rounds and the honest-cost table."""
    lines = ["# Poisoning: fake devices against the published suggestions", "",
             "Set-up: " + ", ".join(f"{k} = {v}" for k, v in meta.items()) + ".",
             f"A trial is one honest round (fresh seed); a target query of true rank in the configured range is drawn "
             f"and each attack's fakes are added to the same honest reports. Success: the target ranks in the top "
             f"{TOP} published queries (by the guarded ranking score). Verdicts count targets of true rank ≥ "
             f"{TARGET_RANK} (docs/ALGORITHM.md §7.2 has the defense and its bound).", "",
             "## Verdicts (issue 28)", "", *_claims(checks)]
    if checks40:
        lines += ["", "## Verdicts (issue 40)", "", *_claims(checks40)]
    lines += ["", "## Every attack and fraction", "",
              "| attack | φ | defended | trials | success | detected | mean rank (true) | flagged rounds |",
              "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if s["attack"] == "honest":
            continue
        lines.append(f"| {s['attack']} | {s['fraction']:.1%} | {'yes' if s['defended'] else 'no'} | {s['trials']} | "
                     f"{s['success_rate']:.0%} | {s['detection_rate']:.0%} | {s['mean_target_rank']:.1f} "
                     f"({s['mean_true_rank']:.1f}) | {s['flag_rate']:.0%} |")
    lines += ["", "## The bound under attack (defended rounds)", "",
              "Shifts of the target query from its opt-in estimate p̂_O in units of the round's bound: the published "
              "estimate's over κ_i·s_i (mean, max; the undefended blend's from the same reports for comparison), "
              "the guarded ranking score's in units of s (from a = p̂_O in [0, 1]; mean, max) and the round's guard "
              "κ_q for the target (mean, ALGORITHM.md §7.2, \"The suggestions' ranking\"), the largest "
              "|p̂ − p̂_O|/(κ_i·s_i) over every entry and query (ALGORITHM.md §7.2, \"The bound\": ≤ 1 whatever the "
              "reports); the target's bound over the honest round's; and the largest rise of any entry's bound over "
              "the honest round's, in units of its s.", "",
              "| attack | φ | fakes (mean) | estimate shift / κ_i·s_i | undefended / κ_i·s_i | ranking shift / s "
              "| κ_q | largest, every entry | bound / honest bound: target (max) | every entry: rise / s (max) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if s["attack"] == "honest" or not s["defended"] or s.get("max_shift_all") is None:
            continue
        lines.append(f"| {s['attack']} | {s['fraction']:.1%} | {s['mean_fakes']:,.0f} | {_num(s, 'mean_shift', '.3f')} "
                     f"({_num(s, 'max_shift', '.3f')}) | {_num(s, 'mean_shift_undefended', '.2f')} | "
                     f"{_num(s, 'mean_rank_shift', '.3f')} ({_num(s, 'max_rank_shift', '.3f')}) | "
                     f"{_num(s, 'mean_kappa_rank', '.2f')} | "
                     f"{_num(s, 'max_shift_all', '.6f')} | {_num(s, 'max_bound_growth', '.3f')} | "
                     f"{_num(s, 'max_bound_rise_all', '.3f')} |")
    lines += ["", "## Honest rounds", "", "| defended | trials | flagged | NDCG | NDCG@10 | L1 | L1 (union) |",
              "|---|---|---|---|---|---|---|"]
    for s in summary:
        if s["attack"] == "honest":
            lines.append(f"| {'yes' if s['defended'] else 'no'} | {s['trials']} | {s['flag_rate']:.1%} | "
                         f"{s['ndcg']:.4f} | {s['ndcg_queries_at_10']:.4f} | {s['l1']:.5f} | "
                         f"{s['l1_union'] if s['l1_union'] is None else format(s['l1_union'], '.5f')} |")
    if cost:
        lines += ["", "## Honest cost at other opt-in sizes (issue 40)", "",
                  "Fresh honest populations per round (hybriddp.simulation.defended_calibration: 20 × the opt-in "
                  "group's users, 48 Zipf records over 12 queries, ε = 4, M = 100, the default estimator), the "
                  "defended default and the undefended blend from the same reports; RMSE over the entries listed "
                  "in ≥ 10% of the rounds (published `p_blended`), NDCG@10 of the published ranking; the last "
                  "column the same rounds' with the fixed ranking guard (`--anchor-kappa-query 0.1`).",
                  "",
                  "| opt-in users | users | rounds | RMSE records (undefended) | RMSE queries (undefended) | "
                  "RMSE ratio records / queries | NDCG@10 (undefended) | Δ NDCG@10 | flagged rounds | "
                  "Δ NDCG@10, κ_q = 0.1 |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {c['optin_users']:,} | {c['users']:,} | {c['rounds']} | {c['rmse_records']:.3g} "
                  f"({c['rmse_records_undefended']:.3g}) | {c['rmse_queries']:.3g} "
                  f"({c['rmse_queries_undefended']:.3g}) | {c['rmse_ratio_records']:.3f} / "
                  f"{c['rmse_ratio_queries']:.3f} | {c['ndcg10']:.4f} "
                  f"({c['ndcg10_undefended']:.4f}) | {c['ndcg10_diff']:+.4f} | {c['flagged_rounds']:.1%} | "
                  f"{_num(c, 'ndcg10_diff_fixed', '+.4f')} |"
                  for c in cost]
    return "\n".join(lines) + "\n"


def run_poisoning(spec: Any, *, trials: int, out_dir: Path | None, quick: bool = False,
                  progress: Any = None, honest_trials: int | None = None,
                  honest_cost_rounds: int | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """``hybriddp experiment poisoning``: every attack at every fraction on ``spec``'s data (a preset or a log file,
    :class:`~hybriddp.experiments.datasets.DatasetSpec`) at its paper defaults with the default estimator; writes
    :func:`write_outputs` to ``out_dir`` (default ``experiments-out/<dataset>-poisoning``) and returns it with the
    verdicts (issue 28's, then issue 40's). ``quick``: two fractions and no honest-cost table (tests).
    ``honest_trials``: honest rounds for the false-alarm rate (default :data:`HONEST_TRIALS`; at least ``trials`` are
    run). ``honest_cost_rounds``: fresh honest rounds per opt-in size of the honest-cost table (default
    :data:`HONEST_COST_ROUNDS`, 0 leaves it out)."""
    import time

    from hybriddp.core.params import BlenderParams
    from hybriddp.experiments.poisoning import FRACTIONS, PoisoningConfig, honest_cost, poisoning_rows

    rounds = (0 if quick else HONEST_COST_ROUNDS) if honest_cost_rounds is None else honest_cost_rounds
    if isinstance(rounds, bool) or not (isinstance(rounds, int) and (rounds == 0 or rounds >= 2)):
        raise parameter_error("honest-cost rounds (honest_cost_rounds)", rounds, "0 (no table) or an integer >= 2",
                              f"The default {HONEST_COST_ROUNDS} takes about a minute.")
    log = spec.load()
    base = spec.base_point(log)
    params = BlenderParams(epsilon=base.epsilon, delta=base.delta, optin_fraction=base.optin_fraction,
                           f_c=base.f_c, head_list_size=base.head_list_size)
    config = PoisoningConfig(trials=trials, fractions=(0.01, 0.05) if quick else FRACTIONS, seed=spec.seed,
                             honest_trials=trials if quick else max(trials, honest_trials or HONEST_TRIALS))
    start = time.monotonic()
    rows = list(poisoning_rows(log, params, config,
                               progress=(lambda done: progress(done, config.honest_trials)) if progress else None))
    seconds = round(time.monotonic() - start)
    cost = honest_cost(rounds, spec.seed) if rounds else []
    out = out_dir or Path("experiments-out") / f"{spec.name}-poisoning"
    policy = config.policy
    kappa = f"auto (c = {policy.honest_cost})" if policy.kappa is None else policy.kappa
    kq = f"auto (c_rank = {policy.rank_cost})" if policy.kappa_query is None else policy.kappa_query
    meta = {"dataset": spec.data_id, "trials": trials, "ε": params.epsilon, "δ": params.delta,
            "opt-in fraction": params.optin_fraction, "M": params.head_list_size, "estimator": params.estimator,
            "defense": f"anchor (α = {policy.alpha}, κ = {kappa}, κ_q = {kq})",
            "target ranks": config.ranks, "seconds": seconds}
    if cost:
        meta["honest-cost rounds per size"] = rounds
        meta["honest-cost seconds"] = round(sum(c["seconds"] for c in cost))
    l1_target = spec.is_preset and spec.name == "aol" and spec.scale == 1.0 and params.head_list_size == 50
    write_outputs(out, rows, meta, cost, l1_target)
    return out, verdicts(rows) + issue40_verdicts(rows, cost, l1_target)

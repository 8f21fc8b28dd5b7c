"""``hybriddp experiment trends``: BLENDER over periods of a log whose popularity drifts (ALGORITHM.md §13).

For every participation policy r (each user takes part in one period out of r, chosen at random: a period sees
a 1/r share of the population, and a user's cumulative guarantee is that of ⌈P/r⌉ rounds under basic
composition), every trial runs one BLENDER round per period on a fresh sample of the preset's population with
that period's drifted head (:mod:`hybriddp.datasets.drift`), or on the periods of a real log with times
(``input``, :mod:`hybriddp.experiments.trends_real`), scores each period (NDCG against the period's truth) and
tests the series for rising and falling queries (:mod:`hybriddp.server.trends`). Each period's head list carries
the records the last ``carry`` lists selected (ALGORITHM.md §13.1). Precision and recall are counted against the
plan's changes of at least ``1 + truth_change`` (a real log: its own shares); the same policy on a log without
drift counts the false discoveries alone. Rows are what ``periods.csv`` and ``trends.csv`` hold;
:func:`write_outputs` makes the summary, a plot and ``report.md`` with a verdict per target of issue 30 that these
runs measure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.core.atomic import write_text
from hybriddp.core.errors import EmptyHeadListError
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog, SyntheticVocabulary
from hybriddp.curator.carry import DEFAULT_CARRY, Carry, selected_records
from hybriddp.datasets.drift import Drift, drift_logs, plan_drift
from hybriddp.datasets.generator import QUERY_PREFIX
from hybriddp.datasets.presets import get_preset
from hybriddp.experiments.aggregate import csv_text
from hybriddp.experiments.plots import save_figure
from hybriddp.experiments.trends_real import NO_TRUTH, RealLog, RealTruth
from hybriddp.server.trends import DEFAULT_WINDOW, PeriodEstimates, trends
from hybriddp.simulation.pipeline import run_blender

NDCG_TARGET = 0.95
PRECISION_TARGET = 0.9
RECALL_TARGET = 0.8
TRENDS_F_O = 0.3
"""S's share of each period's opt-in users in ``experiment trends`` (the paper's 0.95 elsewhere): with carried
lists (ALGORITHM.md §13.1) a smaller S still lists the head, and a larger T sharpens every query's ⟨q,*⟩ estimate,
which the trend test needs (docs/RESULTS.md, issue 30)."""
TRENDS_MIN_CHANGE = 0.1
"""The trend test's boundary in ``experiment trends``: a change by 10% or more (the truth counted: 50% or more)."""
LIFETIME_EPSILON = 8.0
LIFETIME_DELTA = 2e-5
"""Issue 30's per-person target: (ε, δ) = (8, 2e-5), two rounds' worth at the paper's ε = 4, δ = 1e-5."""


@dataclass(frozen=True)
class TrendsConfig:
    """What :func:`trend_rows` runs."""

    preset: str = "aol"
    scale: float = 1.0
    periods: int = 12
    rising: int = 10
    falling: int = 10
    change: float = 2.0
    ranks: tuple[int, int] = (5, 40)
    participation: tuple[int, ...] = (1, 2, 6)
    trials: int = 1
    fdr: float = 0.05
    min_change: float = 0.5  # the test's boundary (0: any change)
    window: int = DEFAULT_WINDOW  # periods the trend test pools on each side (the measured default)
    seed: int = 0
    truth_change: float = 0.5  # the changes that count as true: by at least this much (issue 30: 50%)
    carry: int = DEFAULT_CARRY  # periods a selected record stays listed (ALGORITHM.md §13.1; 0: none)
    input: str | None = None  # an AOL-format log with QueryTime: its own periods and truth (trends_real.py)
    period_seconds: int = 7 * 86_400  # with ``input``: the periods' length
    head_queries: int = 100  # with ``input``: recall's truth is among the log's most frequent queries


def trend_rows(config: TrendsConfig, params: BlenderParams,
               progress: Callable[[int, int], None] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(period rows, trend rows): per (policy, drift or not, trial, period) the round's NDCG; per (policy, drift or
    not, trial) the trends found, with precision and recall against the plan."""
    period_rows: list[dict[str, Any]] = []
    trend_rows_: list[dict[str, Any]] = []
    real = None if config.input is None else RealLog.load(config.input, config.periods, config.period_seconds)
    truth_real = None if real is None else real.truth(config.head_queries, config.truth_change, config.min_change,
                                                       config.window)
    jobs = [(r, drifting, trial) for r in config.participation for drifting in (True, False)
            for trial in range(config.trials)]
    for done, (r, drifting, trial) in enumerate(jobs):
        seed = config.seed * 1_000_003 + trial
        truth: Drift | RealTruth
        if real is None:
            truth = plan_drift(config.preset, config.periods, n_rising=config.rising if drifting else 0,
                               n_falling=config.falling if drifting else 0, change=config.change,
                               ranks=config.ranks, seed=seed)
            logs = drift_logs(truth, scale=config.scale / r, seed=seed + 7919 * r)
        else:
            logs = real.periods(r, drifting, seed + 7919 * r)
            truth = truth_real if drifting and truth_real is not None else NO_TRUTH
        estimates = []
        for t, row in _periods(logs, config, params, seed):
            period_rows.append({"participation": r, "drift": drifting, "trial": trial, "period": t + 1, **row[0]})
            estimates.append(row[1])
        trend_rows_.append({"participation": r, "drift": drifting, "trial": trial,
                            **_score_trends(truth, estimates, config)})
        if progress is not None:
            progress(done + 1, len(jobs))
    return period_rows, trend_rows_


def _periods(logs: Sequence[RecordLog], config: TrendsConfig, params: BlenderParams, seed: int
             ) -> Iterator[tuple[int, tuple[dict[str, Any], PeriodEstimates]]]:
    carry = Carry(config.carry)
    for t, log in enumerate(logs):
        label = f"p{t + 1:02d}"
        try:
            run = run_blender(log, params, seed=seed * 131 + t, carry=carry.records(t))
            if config.carry:
                carry.update(t, selected_records(run.head_list, run.release.optin.reused))
            res = run.result()
        except EmptyHeadListError:  # a released outcome: the period publishes nothing (NDCG 0)
            yield t, ({"users": log.n_users, "ndcg": 0.0, "ndcg_queries_at_10": 0.0, "l1": None,
                       "head_list_records": 0},
                      PeriodEstimates(label, [], np.zeros(0), np.zeros(0)))
            continue
        m = res.metrics
        yield t, ({"users": log.n_users, "ndcg": m.get("ndcg"), "ndcg_queries_at_10": m.get("ndcg_queries_at_10"),
                   "l1": m.get("l1"), "head_list_records": run.head_list.n_records},
                  PeriodEstimates.from_result(res.to_json(), label))


def _score_trends(plan: Drift | RealTruth, estimates: list[PeriodEstimates], config: TrendsConfig
                  ) -> dict[str, Any]:
    found = trends(estimates, fdr=config.fdr, min_change=config.min_change, window=config.window)
    got = {(q, int(t), way) for way, hits in (("rising", found.rising), ("falling", found.falling))
           for q, t, hit in zip(found.query, found.period, hits, strict=True) if hit}

    def near(a: tuple[str, int, str], b: tuple[str, int, str]) -> bool:  # a pooled test locates within window − 1
        return a[0] == b[0] and a[2] == b[2] and abs(a[1] - b[1]) < config.window
    if isinstance(plan, RealTruth):
        truth = plan.changes
        true_pos = sum(plan.confirms(g) for g in got)
    else:
        names = SyntheticVocabulary(plan.weights.shape[1], QUERY_PREFIX, get_preset(config.preset).named_queries)
        truth_sets = plan.changes(at_least=1.0 + config.truth_change)
        truth = {(names.decode([q])[0], t, way) for way in ("rising", "falling") for q, t in truth_sets[way]}
        true_pos = sum(any(near(g, c) for c in truth) for g in got)
    found_changes = sum(any(near(g, c) for g in got) for c in truth)
    return {"changes_true": len(truth), "reported": len(got), "true_positives": true_pos,
            "false_positives": len(got) - true_pos, "changes_found": found_changes, "tested": len(found.query),
            "precision": true_pos / len(got) if got else None,
            "recall": found_changes / len(truth) if truth else None}


# ----- summary, verdicts, files -------------------------------------------------------------------
def admitted_rounds(epsilon: float, delta: float, most: int) -> tuple[int, int]:
    """Rounds (at most ``most``) one opt-in user can take part in within (:data:`LIFETIME_EPSILON`,
    :data:`LIFETIME_DELTA`) by basic composition, and by the rule the service enforces (the tighter of basic and PLD
    accounting of the exact per-round mechanism, ALGORITHM.md §14)."""
    from hybriddp.audit.pld import Mechanism
    from hybriddp.audit.pld import admitted_rounds as admitted
    basic, tight = admitted(Mechanism("optin-any", epsilon, delta), LIFETIME_EPSILON, LIFETIME_DELTA, most)
    return min(basic, most), min(tight, most)


def summarize(period_rows: Sequence[dict[str, Any]], trend_rows_: Sequence[dict[str, Any]],
              config: TrendsConfig, epsilon: float, delta: float = 1e-5) -> list[dict[str, Any]]:
    """Per participation policy: the lowest and mean period NDCG (drifting log), precision and recall (pooled
    over trials), false discoveries on the log without drift, and each user's rounds and ε at δ = 2e-5 by basic
    composition and by the service's rule (PLD where it is tighter; opt-in users' mechanisms)."""
    from hybriddp.audit.pld import Mechanism, history_epsilon
    out = []
    for r in config.participation:
        pr = [row for row in period_rows if row["participation"] == r and row["drift"]]
        tr = [row for row in trend_rows_ if row["participation"] == r and row["drift"]]
        null = [row for row in trend_rows_ if row["participation"] == r and not row["drift"]]
        ndcg = [row["ndcg"] for row in pr if row["ndcg"] is not None]
        tp, rep, true, hit = (sum(row[k] for row in tr)
                              for k in ("true_positives", "reported", "changes_true", "changes_found"))
        rounds = math.ceil(len({row["period"] for row in pr}) / r) if pr else math.ceil(config.periods / r)
        out.append({"participation": r, "users_per_period": round(float(np.mean([row["users"] for row in pr]))),
                    "min_ndcg": min(ndcg) if ndcg else None, "mean_ndcg": float(np.mean(ndcg)) if ndcg else None,
                    "precision": tp / rep if rep else None, "recall": hit / true if true else None,
                    "false_discoveries_no_drift": sum(row["reported"] for row in null),
                    "tests_no_drift": sum(row["tested"] for row in null),
                    "rounds_per_user": rounds, "epsilon_basic": rounds * epsilon,
                    "epsilon_pld": history_epsilon([Mechanism("optin-any", epsilon, delta)] * rounds, LIFETIME_DELTA)})
    return out


def verdicts(summary: Sequence[dict[str, Any]], config: TrendsConfig) -> list[dict[str, Any]]:
    """The issue's targets for each policy, and whether the policy meets them all."""
    out = []
    for s in summary:
        checks = {
            f"every period's NDCG ≥ {NDCG_TARGET}": s["min_ndcg"] is not None and s["min_ndcg"] >= NDCG_TARGET,
            f"precision ≥ {PRECISION_TARGET}": s["precision"] is not None and s["precision"] >= PRECISION_TARGET,
            f"recall ≥ {RECALL_TARGET}": s["recall"] is not None and s["recall"] >= RECALL_TARGET,
            f"ε per person ≤ {LIFETIME_EPSILON:g} at δ = {LIFETIME_DELTA:g} (the service's rule)":
                min(s["epsilon_basic"], s["epsilon_pld"]) <= LIFETIME_EPSILON * (1 + 1e-12),
        }
        out.append({"participation": s["participation"], "checks": checks, "all": all(checks.values())})
    return out


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def write_outputs(out_dir: Path, period_rows: Sequence[dict[str, Any]], trend_rows_: Sequence[dict[str, Any]],
                  config: TrendsConfig, params: BlenderParams) -> list[dict[str, Any]]:
    """``periods.csv``, ``trends.csv``, ``summary.csv``, ``trends.png`` and ``report.md`` in ``out_dir``; returns
    the verdicts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(period_rows, trend_rows_, config, params.epsilon, params.delta)
    verdict = verdicts(summary, config)
    write_text(out_dir / "periods.csv", csv_text(period_rows))
    write_text(out_dir / "trends.csv", csv_text(trend_rows_))
    write_text(out_dir / "summary.csv", csv_text(summary))
    _plot(out_dir / "trends.png", period_rows, summary, config)
    n_periods = len({row["period"] for row in period_rows}) or config.periods
    if config.input is None:
        data = (f"Preset {config.preset} at scale {config.scale:g}. "
                f"Drift: {config.rising} rising and {config.falling} falling head queries "
                f"(ranks {config.ranks[0]}–{config.ranks[1] - 1}), ×{config.change:g} at one period each (the truth "
                f"counted: changes of {config.truth_change:.0%} or more; a detection within {config.window - 1} "
                "period(s) of one counts). A log without drift (no planted change) counts false discoveries.")
    else:
        data = (f"Log {Path(config.input).name}, its first {n_periods} periods of {config.period_seconds / 86400:g} "
                "day(s) (QueryTime). The truth is the log's own per-period query shares: recall counts the changes "
                f"of {config.truth_change:.0%} or more among its {config.head_queries} most frequent queries; a "
                "reported trend is correct when its query's share moved that way by at least the test's boundary "
                f"within {config.window - 1} period(s). The log without drift is the same log with every user moved, "
                "whole, to a random period (docs/ALGORITHM.md §13; experiments/trends_real.py).")
    lines = [f"# BLENDER over {n_periods} periods: trends (`hybriddp experiment trends`)", "",
             f"{data} ε = {params.epsilon:g}, δ = {params.delta:g}, "
             f"M = {params.head_list_size}, opt-in {params.optin_fraction:.1%}, f_O = {params.f_o:g} of them in S, "
             f"the default estimator with the opt-in anchor; a record S selected stays listed for {config.carry} "
             "period(s) after (ALGORITHM.md §13.1; 0: every period's list is its own). Trends tested "
             f"with Benjamini–Hochberg at FDR {config.fdr:g} for changes of at least {config.min_change:.0%}, "
             f"pooling {config.window} period(s) on each side (ALGORITHM.md §13). {config.trials} trial(s) per "
             "policy. Participation 1/r: each user takes part in one period out of r (a fresh "
             "1/r share of the population per period); the guarantee per person composes ⌈P/r⌉ rounds, by basic "
             "composition and by privacy-loss-distribution accounting of an opt-in user's exact mechanism "
             f"(ALGORITHM.md §14), at δ = {LIFETIME_DELTA:g}.",
             "",
             "| 1/r | users per period | min NDCG | mean NDCG | precision | recall | false discoveries, no drift "
             "| rounds per user | ε per person (basic) | ε per person (PLD) | all targets |", "|" + "---|" * 11]
    for s, v in zip(summary, verdict, strict=True):
        lines.append(f"| 1/{s['participation']} | {s['users_per_period']:,} | {_fmt(s['min_ndcg'], '.4f')} | "
                     f"{_fmt(s['mean_ndcg'], '.4f')} | {_fmt(s['precision'])} | {_fmt(s['recall'])} | "
                     f"{s['false_discoveries_no_drift']} of {s['tests_no_drift']} tests | {s['rounds_per_user']} | "
                     f"{s['epsilon_basic']:g} | {s['epsilon_pld']:.2f} | {'holds' if v['all'] else 'does not hold'} |")
    basic, tight = admitted_rounds(params.epsilon, params.delta, n_periods)
    lines += ["", f"Within (ε, δ) = ({LIFETIME_EPSILON:g}, {LIFETIME_DELTA:g}) a person can take part in {basic} of "
              f"the {n_periods} periods at ε = {params.epsilon:g} each by basic composition, and in {tight} by "
              "the rule the service enforces (the tighter of basic and PLD accounting).",
              "", "## Targets (issue 30), per policy", ""]
    for v in verdict:
        lines.append(f"* 1/{v['participation']}: " + "; ".join(f"{k}: {'holds' if ok else 'does not hold'}"
                                                           for k, ok in v["checks"].items()))
    lines += ["", "![NDCG per period and trend detection](trends.png)", ""]
    write_text(out_dir / "report.md", "\n".join(lines))
    return verdict


def _plot(path: Path, period_rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]],
          config: TrendsConfig) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in config.participation:
        rows = [x for x in period_rows if x["participation"] == r and x["drift"] and x["ndcg"] is not None]
        by_t: dict[int, list[float]] = {}
        for x in rows:
            by_t.setdefault(x["period"], []).append(x["ndcg"])
        ts = sorted(by_t)
        a.plot(ts, [float(np.mean(by_t[t])) for t in ts], marker="o", ms=3, label=f"1/{r}")
    a.axhline(NDCG_TARGET, color="grey", ls="--", lw=0.8)
    a.set(xlabel="period", ylabel="NDCG", title="NDCG per period")
    a.legend(title="participation", fontsize=7)
    x = np.arange(len(summary))
    b.bar(x - 0.2, [s["precision"] or 0 for s in summary], 0.4, label="precision")
    b.bar(x + 0.2, [s["recall"] or 0 for s in summary], 0.4, label="recall")
    b.axhline(PRECISION_TARGET, color="C0", ls="--", lw=0.8)
    b.axhline(RECALL_TARGET, color="C1", ls="--", lw=0.8)
    b.set_xticks(x, [f"1/{s['participation']}" for s in summary])
    b.set(ylim=(0, 1.05), title="trends detected", xlabel="participation")
    b.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)

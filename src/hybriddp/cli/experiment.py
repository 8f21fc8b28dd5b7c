"""``hybriddp experiment``: reproduce the paper's Figures 9 and 11–16 (§4.2) with trials, CIs and a report."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from hybriddp.cli import render
from hybriddp.cli.options import MAX_SCALE, check_scale, int_range, seed_option
from hybriddp.core.errors import parameter_error
from hybriddp.server.trends import DEFAULT_WINDOW

MAX_TRIALS = 100
"""Largest --trials: `all` on the AOL preset makes 219 runs per trial (657 at --trials 3; docs/RESULTS.md, "Issue
28", has measured times); the Yandex preset takes several times longer per run."""
MAX_JOBS = 256


@contextmanager
def _runs_progress(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A Rich progress bar over runs on stderr (terminals only)."""
    if not enabled or not render.err.is_terminal:
        yield None
        return
    with Progress(TextColumn("runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=render.err, transient=True) as progress:
        task = progress.add_task("runs", total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


@click.command("experiment")
@click.argument("name", metavar="NAME")
@click.option("--dataset", required=True, metavar="aol|yandex|PATH",
              help="Synthetic preset (aol: 519,371 users; yandex: 4,970,073 users) or a log file (AOL TSV, "
                   "items .dat, CSV/TSV/Parquet with columns user, query[, url]).")
@click.option("--trials", type=int, default=5, show_default=True, callback=int_range(1, MAX_TRIALS),
              help=f"Trials per parameter point, 1 to {MAX_TRIALS}. Ctrl-C stops cleanly (finished runs are kept "
                   "in trials.csv and reused).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output directory. Default: experiments-out/<dataset>. Runs already in its trials.csv are reused.")
@seed_option(help="Seed of the synthetic data and of every trial (simulation: no privacy).", default=0,
             show_default=True)
@click.option("--jobs", type=int, default=None, callback=int_range(1, MAX_JOBS),
              help=f"Worker processes, 1 to {MAX_JOBS}. Default: the number of cores.")
@click.option("--scale", type=float, default=1.0, show_default=True,
              help=f"Synthetic datasets: multiply the number of users, in (0, {MAX_SCALE:g}] (e.g. 0.1 for a quick "
                   "look).")
@click.option("--row-per-user", is_flag=True, help="Log file: every record is its own user (small samples).")
@click.option("--honest-trials", type=int, default=None, callback=int_range(1, 10_000),
              help="poisoning only: honest rounds for the false-alarm rate, 1 to 10000 (at least --trials are run). "
                   "Default: 200 (a 1% rate needs them); fewer for a first look at a large preset such as yandex.")
@click.option("--honest-cost-rounds", type=int, default=None, callback=int_range(0, 10_000),
              help="poisoning only: fresh honest rounds per opt-in size (1,000 to 50,000 users) of the honest-cost "
                   "table, 0 to 10000 (0 leaves the table out; 1 is refused). Default: 100 (about a minute).")
@click.option("--periods", type=int, default=None, callback=int_range(2, 104),
              help="trends only: periods of the drifting log, 2 to 104 (a log file: its first ones). Default: 12.")
@click.option("--period", "period", default=None, metavar="DURATION",
              help="trends on a log file only: the periods' length, a number with a unit s, m, h, d or w, cut from "
                   "the first record's day (midnight UTC). Default: 7d.")
@click.option("--head-queries", type=int, default=None, callback=int_range(1, 100_000),
              help="trends on a log file only: recall's truth is the changes of 50%% or more among this many of the "
                   "log's most frequent queries (its own per-period shares). Default: 100.")
@click.option("--participation", default=None, metavar="R[,R…]",
              help="trends only: participation policies: each user takes part in one period out of R (a 1/R share "
                   "of the population per period). Default: 1,2,6.")
@click.option("--window", type=int, default=None, callback=int_range(1, 52),
              help="trends only: periods the trend test pools on each side of a boundary (`hybriddp trends "
                   f"--window`). Default: {DEFAULT_WINDOW}.")
@click.option("--min-change", type=float, default=None,
              help="trends only: the trend test's smallest relative change (`hybriddp trends --min-change`); the "
                   "truth counted is every change of 50% or more. Default: 0.1 (a change by 10% or more).")
@click.option("--carry", type=int, default=None, callback=int_range(0, 52),
              help="trends only: periods a record S selected stays on the next periods' head lists, estimated from T "
                   "(docs/ALGORITHM.md §13.1; 0: every period's list is its own). Default: 4.")
@click.option("--f-o", "f_o", type=float, default=None,
              help="trends only: the share of each period's opt-in users in S (the head list); the rest, T, "
                   "estimate. Default: 0.3 (a series' lists carry over, so S can be smaller than the paper's 0.95).")
@click.option("--quick", is_flag=True, hidden=True, help="Tiny grids (tests).")
def experiment_cmd(name: str, dataset: str, trials: int, out_dir: str | None, seed: int, jobs: int | None,
                   scale: float, row_per_user: bool, honest_trials: int | None, honest_cost_rounds: int | None,
                   periods: int | None,
                   participation: str | None, window: int | None, min_change: float | None, carry: int | None,
                   f_o: float | None, period: str | None, head_queries: int | None, quick: bool) -> None:
    """Reproduce the paper's evaluation: NAME is fig9, fig11, …, fig16, sizes, estimators, all, poisoning or trends.

    \b
    fig9   top-10 query table at the paper defaults
    fig11  L1 / NDCG vs the client budget split f_C (client, opt-in, blended)
    fig12  NDCG@10 vs ε (M = 10): BLENDER at the defaults and with tune's knobs,
           local-only with and without a dictionary
    fig13  L1 vs opt-in percentage, several M     fig14  NDCG, same runs
    fig15  L1 vs ε, several M                     fig16  NDCG, same runs
    sizes  beyond the paper: NDCG vs head-list size M, BLENDER vs both local-only baselines
    estimators  beyond the paper: L1 / NDCG / NDCG@10 vs ε for each estimator: the paper's,
           pooled weights, reuse (the default) and consistent, paired by seed
    trends beyond the paper: BLENDER over --periods periods of a synthetic log whose popularity drifts
           (known rising and falling queries), for each --participation policy: NDCG per period, trends
           found (precision, recall), false discoveries without drift, ε per person; not part of all
    poisoning   beyond the paper: fake devices (direct, spread, honest randomizer, adaptive; 0.1%–10% of
           the reports) against a target query of true rank 11–50, undefended vs the opt-in anchor
           (docs/ALGORITHM.md §7.2): success, detection, false alarms, honest cost; not part of all

    Every figure's BLENDER lines: the paper's estimator and the default
    (reuse), paired by seed; every L1 panel has its union form (l1_union, over the
    list and the true top M).

    Writes trials.csv, figN.csv, figN.png, summary.json and report.md (claims of the paper
    checked against the numbers) to --out.
    """
    from hybriddp.experiments import DatasetSpec, run_experiment
    from hybriddp.experiments.figures import select

    if name == "poisoning":
        return _poisoning(dataset, trials, out_dir, seed, scale, row_per_user, quick, honest_trials,
                          honest_cost_rounds)
    if name == "trends":
        return _trends(dataset, trials, out_dir, seed, scale, periods, participation, window, min_change, carry, f_o,
                       period, head_queries, quick)
    for flag, value in (("--periods", periods), ("--participation", participation), ("--window", window),
                        ("--min-change", min_change), ("--carry", carry), ("--f-o", f_o), ("--period", period),
                        ("--head-queries", head_queries)):
        if value is not None:
            raise parameter_error(flag, value, "left out: it applies to `experiment trends` only")
    for flag, value in (("--honest-trials", honest_trials), ("--honest-cost-rounds", honest_cost_rounds)):
        if value is not None:
            raise parameter_error(flag, value, "left out: it applies to `experiment poisoning` only")
    select(name)  # unknown NAME: one-line error before any work
    spec = DatasetSpec(dataset, seed=seed, scale=scale, row_per_user=row_per_user)
    spec.validate()
    if spec.is_preset:
        check_scale(scale)
    with render.interruptible(), _runs_progress(True) as progress:
        res = run_experiment(name, spec, trials=trials, out_dir=Path(out_dir) if out_dir else None,
                             jobs=jobs if jobs is not None else (os.cpu_count() or 1), quick=quick,
                             progress=progress)
    render.out.print(f"{res.n_runs} runs ({res.n_ran} new, {res.n_runs - res.n_ran} reused) in {res.seconds:.0f} s; "
                     f"figures {', '.join(res.figures)}")
    render.out.print(f"wrote {res.out_dir}/: trials.csv, summary.json, report.md and figN.csv/.png")


def _poisoning(dataset: str, trials: int, out_dir: str | None, seed: int, scale: float, row_per_user: bool,
               quick: bool, honest_trials: int | None, honest_cost_rounds: int | None) -> None:
    """``experiment poisoning``: every attack and fraction, undefended vs defended (docs/ALGORITHM.md §7.2)."""
    from hybriddp.experiments import DatasetSpec
    from hybriddp.experiments.poisoning_report import run_poisoning, verdict_text

    spec = DatasetSpec(dataset, seed=seed, scale=scale, row_per_user=row_per_user)
    spec.validate()
    if spec.is_preset:
        check_scale(scale)
    with render.interruptible(), _runs_progress(True) as progress:
        out, checks = run_poisoning(spec, trials=trials, out_dir=Path(out_dir) if out_dir else None, quick=quick,
                                    progress=progress, honest_trials=honest_trials,
                                    honest_cost_rounds=honest_cost_rounds)
    colour = {"holds": "green", "does not hold": "red", "not enough trials": "yellow"}
    for c in checks:
        text = verdict_text(c)
        mark = f"[{colour[text]}]{text}[/{colour[text]}]" if text in colour else text
        render.out.print(f"{mark}: {c['claim']} — {c['measured']}")
    render.out.print(f"wrote {out}/: trials.csv, summary.csv, poisoning.png, report.md")


def _trends(dataset: str, trials: int, out_dir: str | None, seed: int, scale: float, periods: int | None,
            participation: str | None, window: int | None, min_change: float | None, carry: int | None,
            f_o: float | None, period: str | None, head_queries: int | None, quick: bool) -> None:
    """``experiment trends``: BLENDER over the periods of a drifting synthetic log, or of an AOL-format log with
    QueryTime (docs/ALGORITHM.md §13)."""
    from hybriddp.core.params import BlenderParams
    from hybriddp.curator.carry import DEFAULT_CARRY
    from hybriddp.experiments.trends import TRENDS_F_O, TRENDS_MIN_CHANGE, TrendsConfig, trend_rows, write_outputs
    from hybriddp.service.series import parse_duration

    preset = dataset in ("aol", "yandex")
    if not preset and not Path(dataset).is_file():
        raise parameter_error("--dataset", dataset, "aol, yandex (a synthetic preset with planted drift) or an "
                              "AOL-format log file with its QueryTime column (AnonID Query QueryTime ItemRank "
                              "ClickURL)")
    if preset and (period is not None or head_queries is not None):
        raise parameter_error("--period" if period is not None else "--head-queries", period or head_queries,
                              "left out: it applies to a log file (a preset's periods are its own)")
    seconds = 7 * 86_400 if period is None else parse_duration(period, "--period")
    if not (seconds >= 3600 and seconds == int(seconds)):
        raise parameter_error("--period", period, "a whole number of seconds, an hour or more (e.g. 7d, 1d, 12h)")
    check_scale(scale)
    try:
        policies = tuple(int(x) for x in (participation or "1,2,6").split(","))
    except ValueError:
        policies = ()
    if not policies or any(r < 1 or r > 104 for r in policies):
        raise parameter_error("--participation", participation, "integers from 1 to 104, comma-separated, e.g. 1,2,6")
    cfg = TrendsConfig(preset=dataset if preset else "aol", scale=scale * (0.05 if quick else 1.0),
                       periods=periods or (3 if quick else 12), participation=policies, trials=trials, seed=seed,
                       window=window or DEFAULT_WINDOW,
                       min_change=TRENDS_MIN_CHANGE if min_change is None else min_change,
                       carry=DEFAULT_CARRY if carry is None else carry, input=None if preset else dataset,
                       period_seconds=int(seconds), head_queries=head_queries or 100)
    params = BlenderParams.paper_defaults(dataset if preset else "aol")
    params = dataclasses.replace(params, f_o=TRENDS_F_O if f_o is None else f_o)
    name = dataset if preset else Path(dataset).name.split(".")[0]
    out = Path(out_dir) if out_dir else Path("experiments-out") / f"trends-{name}"
    with render.interruptible(), _runs_progress(True) as progress:
        period_rows, rows = trend_rows(cfg, params, progress)
    verdict = write_outputs(out, period_rows, rows, cfg, params)
    for v in verdict:
        mark = "[green]holds[/green]" if v["all"] else "[red]does not hold[/red]"
        render.out.print(f"{mark}: participation 1/{v['participation']}: "
                         + "; ".join(f"{k}: {'yes' if ok else 'no'}" for k, ok in v["checks"].items()))
    render.out.print(f"wrote {out}/: periods.csv, trends.csv, summary.csv, trends.png, report.md")

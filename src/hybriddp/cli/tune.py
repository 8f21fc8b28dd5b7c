"""``hybriddp tune``: recommend f_O, f_C and M for a population, from privatized information only."""

from __future__ import annotations

import math

import click
from rich.table import Table

from hybriddp.cli import render
from hybriddp.cli.options import estimator_option, noise_option, seed_option
from hybriddp.core.errors import ParameterError
from hybriddp.core.params import DEFAULT_ESTIMATOR
from hybriddp.tune import (
    PrivatizedInputs,
    TuneResult,
    check_inputs_consistent,
    check_tune_inputs,
    default_delta,
    load_privatized,
    tune,
)
from hybriddp.tune.constants import MAX_POPULATION, MAX_POPULATION_TRIALS
from hybriddp.tune.search import MAX_EPSILON


def _interval(iv: dict[str, float | None], digits: int = 4) -> str:
    mean, lo, hi = iv["mean"], iv["lo"], iv["hi"]
    if mean is None:
        return "n/a"
    if lo is None or hi is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def print_tune(res: TuneResult) -> None:
    """The recommendation table, the fit's source, and the one-line recommendation."""
    obj = res.to_json()
    t = Table(title=f"hybriddp tune: {res.population:,} users, {res.optin_fraction:g} opt-in, "
                    f"ε = {res.epsilon:g}, δ = {res.delta:g}, target NDCG {res.target_ndcg:g}",
              title_justify="left")
    for col, just in (("setting", "left"), ("f_O", "right"), ("f_C", "right"), ("M", "right"),
                      ("NDCG (95% interval)", "right"), ("L1 (95% interval)", "right"), ("formed", "right")):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for label, row in (("recommended", obj), ("paper defaults", obj["paper_defaults"])):
        t.add_row(label, f"{row['f_o']:g}", f"{row['f_c']:g}", str(row["head_list_size"]), _interval(row["ndcg"]),
                  _interval(row["l1"]), "yes" if row["reached"] else "no")
    render.out.print(t)
    fit = obj["fit"]
    render.out.print(f"fit source: {fit['source']} — {fit['description']}")
    p = fit["parameters"]
    if fit["source"] == "privatized":
        render.out.print(
            f"  law p(r) = {p['amplitude']:.4g}·r^-{p['alpha_head']:.3f} to rank {p['break_rank']}, then slope "
            f"-{p['alpha_tail']:.3f}; |HL_S| {p['head_list_s_records']} published, {p['head_list_s_records_fitted']} "
            f"fitted; mass outside the listed queries {p['mass_outside_listed_queries']['estimated']:.3f} "
            f"estimated, {p['mass_outside_listed_queries']['model']:.3f} in the model")
    else:
        render.out.print(f"  {p['head_records']:,} head records carrying {p['head_mass']:.3f} of the mass; pass "
                         "--headlist and --optin-estimates from `hybriddp headlist` to fit your own population")
    render.out.print(f"privacy: {obj['privacy']}")
    s = obj["search"]
    render.out.print(f"search: {s['simulations']} BLENDER simulations in {s['seconds']:.0f} s "
                     f"({s['workers']} workers), M grid {s['m_grid']}; intervals: Student-t over {res.trials} "
                     "fresh simulated populations")
    for knob in obj.get("knobs", {}).values():
        render.out.print(f"  with {knob['label']}: NDCG {_interval(knob['ndcg'])}")
    style = "green" if res.met else "yellow"
    render.out.print(f"[{style}]{res.recommendation}[/{style}]")


@click.command("tune")
@click.option("--population", "-N", type=int, required=True,
              help=f"Number of users of your deployment, 1,000 to {MAX_POPULATION:,}.")
@click.option("--optin-fraction", type=float, required=True,
              help="Share of them in the opt-in group, in (0, 1) (0.05 = 5%).")
@click.option("--epsilon", type=float, required=True,
              help=f"Privacy loss ε per user; must be > ln 2 and <= {MAX_EPSILON:.2f}.")
@click.option("--delta", type=float, default=None,
              help="δ in (0, 1). Default: the curator's δ from --optin-estimates, else 1e-5 below a million "
                   "users and 1e-7 above (the paper's choices).")
@click.option("--target-ndcg", type=float, default=0.95, show_default=True,
              help="Generalized NDCG the head list must reach, in (0, 1].")
@click.option("--headlist", "headlist_path", type=click.Path(dir_okay=False), default=None,
              help="Head-list JSON written by `hybriddp headlist` (DP output). With --optin-estimates.")
@click.option("--optin-estimates", "estimates_path", type=click.Path(dir_okay=False), default=None,
              help="Opt-in estimates JSON written by `hybriddp headlist` (DP output). Without both files a "
                   "built-in prior (the aol preset's shape) is used.")
@click.option("--head-list-size", "-M", "head_list_size", type=int, default=None,
              help="Fix M, the number of (query, URL) records in the final list (e.g. what a device can hold), "
                   "and choose only f_O and f_C for it. Default: search the largest M that reaches the target.")
@click.option("--trials", type=int, default=3, show_default=True,
              help="Simulated populations per candidate (and as many fresh ones for the reported intervals), 2 to "
                   f"100, with trials × population <= {MAX_POPULATION_TRIALS:,} (the populations are held in memory).")
@seed_option(help="Seed of the fit and the simulations (tuning reads DP outputs only, so seeding costs no "
                  "privacy). Default: OS randomness.")
@noise_option()
@estimator_option
@click.option("--workers", type=int, default=None, help="Worker processes for the simulations (default: CPUs).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def tune_cmd(population: int, optin_fraction: float, epsilon: float, delta: float | None, target_ndcg: float,
             headlist_path: str | None, estimates_path: str | None, head_list_size: int | None, trials: int,
             seed: int | None, noise: str, estimator: str | None, workers: int | None, as_json: bool) -> None:
    """Recommend f_O, f_C and the largest head-list size M whose expected generalized NDCG reaches
    --target-ndcg, by simulating BLENDER on a synthetic population fitted only to the curator's
    differentially private outputs (post-processing: no extra privacy cost). Prints the expected
    NDCG and L1 with 95% intervals next to the paper's defaults (f_O = 0.95, f_C = 0.85)."""
    if (headlist_path is None) != (estimates_path is None):
        missing = "--optin-estimates" if estimates_path is None else "--headlist"
        raise ParameterError(f"{missing} is missing: --headlist and --optin-estimates go together (both written by "
                             "`hybriddp headlist`); give both, or neither to use the built-in prior.")
    if workers is not None and workers < 1:
        raise ParameterError(f"workers (--workers) = {workers} is not allowed: it must be an integer >= 1.")
    check_tune_inputs(population, optin_fraction, epsilon, default_delta(population) if delta is None else delta,
                      target_ndcg, trials, head_list_size)
    inputs: PrivatizedInputs | None = None
    if headlist_path is not None and estimates_path is not None:
        inputs = load_privatized(headlist_path, estimates_path)
        check_inputs_consistent(inputs, population)
    if delta is None:
        file_delta = inputs.params.get("delta") if inputs is not None else None
        delta = float(file_delta) if isinstance(file_delta, (int, float)) and math.isfinite(file_delta) \
            else default_delta(population)
    render.warn_delta(delta, population)
    with render.interruptible(), render.stage_progress(not as_json) as on_stage:
        res = tune(population, optin_fraction, epsilon, delta, target_ndcg=target_ndcg, inputs=inputs, trials=trials,
                   seed=seed, noise=noise, workers=workers, progress=on_stage, head_list_size=head_list_size,
                   estimator=estimator or DEFAULT_ESTIMATOR)
    if as_json:
        render.print_json(res.to_json())
        return
    print_tune(res)

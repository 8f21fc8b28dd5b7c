"""``hybriddp mean``: hybrid mean estimation (ALGORITHM.md §11; Dubey & Korolova 2018).

* ``mean estimate`` — simulate the hybrid model on your data (one numeric value per user):
  the three mechanisms' estimates (plus the Hybrid with a privately estimated variance), the
  true sample mean, and each analytic RMSE.
* ``mean simulate`` — analytic vs Monte Carlo MSE of every mechanism, w* and R.
* ``mean plot`` — the paper's Figures 1 and 2 as PNG files.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import click

from hybriddp.cli import render
from hybriddp.cli.options import seed_option
from hybriddp.core.atomic import check_output_dir
from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.rng import SEED_WARNING
from hybriddp.io.values import TABLE_FORMATS, read_value_column
from hybriddp.mean import (
    VARIANCE_SHARE,
    DataRun,
    Distribution,
    MeanSetting,
    SimulationResult,
    group_sizes,
    plot_improvement_vs_n,
    plot_mse_vs_n,
    simulate,
    simulate_on_data,
)
from hybriddp.mean.inputs import MAX_USERS, check_noise_scales
from hybriddp.mean.simulation import MAX_SIMULATED_VALUES, MAX_TRIALS

logger = logging.getLogger(__name__)

def _epsilon_option(f: Any) -> Any:
    return click.option("--epsilon", type=float, required=True,
                        help="Privacy loss ε > 0 of every user (opt-in and local alike).")(f)


def _optin_option(f: Any) -> Any:
    return click.option("--optin-fraction", type=float, required=True,
                        help="Opt-in rate c in (0, 1): round(c·n) users trust the curator (0.05 = 5%).")(f)


def _range_options(required: bool) -> Any:
    def wrap(f: Any) -> Any:
        extra: dict[str, Any] = {"required": True} if required else {"show_default": True}
        f = click.option("--upper", type=float, default=None if required else 1.0,
                         help="Upper end of the public value range; larger values are clamped.", **extra)(f)
        f = click.option("--lower", type=float, default=None if required else 0.0,
                         help="Lower end of the public value range; smaller values are clamped.", **extra)(f)
        return f
    return wrap


def _variance_share_option(f: Any) -> Any:
    return click.option("--variance-share", type=float, default=VARIANCE_SHARE, show_default=True,
                        help="ρ: share of the opt-in budget the unknown-variance Hybrid spends on a private "
                             "variance (the rest on the mean).")(f)


def _distribution_option(f: Any) -> Any:
    return click.option("--distribution", default="uniform", show_default=True,
                        help="Value distribution on [lower, upper]: uniform, beta:A,B or bernoulli:P.")(f)


_seed_option = seed_option()


def _json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")(f)


def _g(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


# ----- commands -----------------------------------------------------------------------------
@click.group("mean")
def mean_group() -> None:
    """Hybrid mean estimation (ALGORITHM.md §11; Dubey & Korolova 2018).

    Estimate the mean of a bounded numeric value (session length, latency, a rating) when a
    fraction c of users opts in to the trusted curator and everyone else adds Laplace noise on
    their own device. Compares FullLM (everyone local), OnlyTCM (opt-in users only) and the
    optimally weighted Hybrid.
    """


@mean_group.command("estimate", short_help="Simulate the hybrid model on your data (one value per user).")
@click.option("--input", "input_path", type=click.Path(dir_okay=False), required=True,
              help="CSV / TSV (.gz ok) or Parquet file, one row per user.")
@click.option("--column", required=True, help="Name of the numeric column holding each user's value.")
@click.option("--format", "fmt", type=click.Choice(TABLE_FORMATS), default=None,
              help="Input format. Default: from the extension.")
@_range_options(required=True)
@_epsilon_option
@_optin_option
@_variance_share_option
@_seed_option
@_json_option
def estimate_cmd(input_path: str, column: str, fmt: str | None, lower: float, upper: float, epsilon: float,
                 optin_fraction: float, variance_share: float, seed: int | None, as_json: bool) -> None:
    """Simulate the hybrid model on your data: a random round(c·n) users opt in, the rest randomize.

    Prints each mechanism's estimate, the true sample mean and each analytic RMSE (expected over
    the random opt-in group and the noise, for this data).
    """
    MeanSetting(lower, upper, epsilon)  # check the parameters before reading the file
    values = read_value_column(input_path, column, fmt)
    n, c = len(values), optin_fraction
    if 0 < c < 1 and not (1 <= round(c * n) < n):
        raise DataError(f"{input_path} has {n:,} users (rows): with --optin-fraction {c:g} that is {round(c * n)} "
                        f"opt-in and {n - round(c * n)} local users; both groups must be non-empty. Use more rows or "
                        "another --optin-fraction")
    run = simulate_on_data(values, lower=lower, upper=upper, epsilon=epsilon, optin_fraction=optin_fraction,
                           seed=seed, variance_share=variance_share)
    if as_json:
        obj = run.to_json()
        obj.update({"input": input_path, "column": column})
        render.print_json(obj)
        return
    _print_data_run(run, input_path, column)


_LABELS = {"full_lm": "FullLM (everyone local)", "only_tcm": "OnlyTCM (opt-in only)",
           "hybrid_oracle": "Hybrid, w* with oracle σ²", "hybrid_unknown_variance": "Hybrid, private σ̂²"}


def _print_data_run(run: DataRun, path: str, column: str) -> None:
    from rich.table import Table

    out = render.out
    out.print(f"{path}, column {column!r}: n = {run.n:,} users ({run.n_optin:,} opt-in, {run.n_local:,} local), "
              f"ε = {run.epsilon:g}, range [{run.lower:g}, {run.upper:g}]")
    line = f"true sample mean {run.true_mean:.6g}"
    if run.clamped.total:
        line += (f"   ({run.clamped.total:,} values clamped: {run.clamped.below:,} below, {run.clamped.above:,} above; "
                 f"clamped mean {run.clamped_mean:.6g})")
    out.print(line)
    t = Table(title="Hybrid mean estimation (ALGORITHM.md §11)", title_justify="left")
    for head in ("mechanism", "estimate", "error", "analytic RMSE", "weight on opt-in"):
        t.add_column(head, justify="left" if head == "mechanism" else "right")
    for key, est in run.estimates.items():
        t.add_row(_LABELS[key], f"{est.estimate:.6g}", f"{est.estimate - run.clamped_mean:+.3g}", f"{est.rmse:.4g}",
                  _g(est.weight, 3))
    out.print(t)
    unk = run.estimates["hybrid_unknown_variance"]
    out.print(f"data variance s² = {run.sample_variance:.4g}; private estimate σ̂² = {_g(unk.private_sigma2)} "
              f"(ρ = {run.variance_share:g} of the opt-in budget)")
    out.print(f"privacy, Hybrid: {run.estimates['hybrid_oracle'].guarantee}")
    out.print(f"privacy, Hybrid with private σ̂²: {unk.guarantee}")
    for note in run.notes:
        out.print(f"note: {note}")
    if run.seed is not None:
        render.err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


@mean_group.command("simulate", short_help="Analytic vs Monte Carlo MSE of every mechanism, w* and R.")
@click.option("--n", "n", type=int, required=True, help=f"Number of users n, 2 to {MAX_USERS:.0e}.")
@_optin_option
@_epsilon_option
@_range_options(required=False)
@_distribution_option
@click.option("--trials", type=int, default=10_000, show_default=True,
              help=f"Monte Carlo trials, 2 to {MAX_TRIALS:,}, and at most {MAX_SIMULATED_VALUES:.0e} simulated values "
                   "in all (uniform: n_T per trial, beta: n; bernoulli: 1). Ctrl-C stops cleanly.")
@_variance_share_option
@_seed_option
@_json_option
def simulate_cmd(n: int, optin_fraction: float, epsilon: float, lower: float, upper: float, distribution: str,
                 trials: int, variance_share: float, seed: int | None, as_json: bool) -> None:
    """Analytic vs Monte Carlo MSE of FullLM, OnlyTCM and Hybrid(w*), with w* and R.

    Each trial draws n values i.i.d. from --distribution on [lower, upper]; round(c·n) random
    users opt in; the error is measured against the sample mean of all n values.
    """
    group_sizes(n, optin_fraction)
    with render.interruptible(), render.count_progress("simulating", trials, not as_json) as progress:
        res = simulate(n, optin_fraction, epsilon, lower=lower, upper=upper, distribution=distribution,
                       trials=trials, seed=seed, variance_share=variance_share, progress=progress)
    if as_json:
        render.print_json(res.to_json())
        return
    _print_simulation(res)


def _print_simulation(res: SimulationResult) -> None:
    from rich.table import Table

    out = render.out
    out.print(f"n = {res.n:,} ({res.n_optin:,} opt-in, {res.n_local:,} local), ε = {res.epsilon:g}, "
              f"c = {res.optin_fraction:g}, values {res.distribution} on [{res.lower:g}, {res.upper:g}] "
              f"(σ² = {res.sigma2:.4g}), {res.trials:,} trials in {res.seconds:.2f} s")
    t = Table(title="Expected squared error: analytic (ALGORITHM.md §11) vs Monte Carlo", title_justify="left")
    for head in ("mechanism", "analytic MSE", "simulated MSE", "± SE", "z", "RMSE"):
        t.add_column(head, justify="left" if head == "mechanism" else "right")
    labels = {"mse_full_lm": "FullLM", "mse_only_tcm": "OnlyTCM", "mse_hybrid": f"Hybrid (w* = {res.w_star:.3f})",
              "mse_hybrid_unknown_variance": f"Hybrid, private σ̂² (ρ = {res.variance_share:g})"}
    for key, m in res.mse.items():
        ideal = key == "mse_hybrid_unknown_variance"
        t.add_row(labels[key], f"{m.analytic:.4e}" + ("*" if ideal else ""), f"{m.simulated:.4e}",
                  f"{m.simulated_se:.1e}", "" if ideal else f"{m.z:+.2f}", f"{math.sqrt(m.simulated):.4g}")
    out.print(t)
    out.print("* ideal: MSE_H(w*) with the opt-in mean's budget (1 − ρ)ε, as if σ̂² were exact; the simulated "
              "value includes the cost of estimating σ²")
    out.print(f"w* = {res.w_star:.4f}   R = min(MSE_F, MSE_T)/MSE_H(w*) = {res.r:.3f} "
              f"(simulated {res.r_simulated:.3f})")


@mean_group.command("plot", short_help="The paper's Figures 1-2 (MSE vs n, R vs n) as PNG files.")
@_epsilon_option
@_optin_option
@_range_options(required=False)
@_distribution_option
@click.option("--sigma2", type=float, default=None,
              help="Variance σ² of the values; default: that of --distribution on [lower, upper].")
@click.option("--compare-fractions", default="0.01,0.02,0.05,0.1,0.2", show_default=True,
              help="Opt-in rates drawn in Fig. 2 (comma-separated; --optin-fraction is added and highlighted).")
@click.option("--n-min", type=float, default=10.0, show_default=True, help="Smallest n on the x axis (>= 1).")
@click.option("--n-max", type=float, default=1e6, show_default=True,
              help=f"Largest n on the x axis (at most {MAX_USERS:.0e}).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Directory for mean-mse-vs-n.png (Fig. 1) and mean-improvement-vs-n.png (Fig. 2).")
@_json_option
def plot_cmd(epsilon: float, optin_fraction: float, lower: float, upper: float, distribution: str,
             sigma2: float | None, compare_fractions: str, n_min: float, n_max: float, out_dir: str,
             as_json: bool) -> None:
    """Draw the paper's Figures 1–2: the three MSEs vs n (log axes) and R vs n for several opt-in rates."""
    setting = MeanSetting(lower, upper, epsilon)
    width = setting.width
    dist = Distribution.parse(distribution)
    s2 = width * width * dist.variance if sigma2 is None else sigma2
    source = f"{dist} on [{lower:g}, {upper:g}]" if sigma2 is None else "given"
    try:
        fractions = [float(v) for v in compare_fractions.split(",") if v.strip()]
    except ValueError:
        raise parameter_error("--compare-fractions", compare_fractions,
                              "comma-separated numbers strictly between 0 and 1") from None
    bad = [c for c in fractions if not 0 < c < 1]
    if bad:
        raise parameter_error("--compare-fractions", compare_fractions,
                              f"comma-separated numbers strictly between 0 and 1 ({bad[0]:g} is not)")
    if not 1 <= n_min < MAX_USERS:
        raise parameter_error("--n-min", n_min, f"a number of users from 1 to below {MAX_USERS:.0e}")
    if not (n_min < n_max <= MAX_USERS):
        raise parameter_error("--n-max", n_max, f"a number > --n-min = {n_min:g} and <= {MAX_USERS:.0e}")
    if s2 > width * width / 4.0:
        raise parameter_error("sigma2 (--sigma2)", s2, f"<= (upper - lower)^2/4 = {width * width / 4.0:g}: no "
                              "distribution on [lower, upper] has a larger variance (Popoviciu's inequality)")
    rates = [(c, "optin_fraction") for c in (optin_fraction,) if 0 < c < 1]  # (else refused by the plot, naming it)
    for c, name in [*rates, *((c, "--compare-fractions") for c in fractions)]:
        for n in (n_min, n_max):  # the noise at both ends of the x axis, for every drawn rate
            check_noise_scales(epsilon, c * n, (1.0 - c) * n, fraction_name=name)
    out = check_output_dir(Path(out_dir), "--out", ("mean-mse-vs-n.png", "mean-improvement-vs-n.png"))
    fig1 = plot_mse_vs_n(out / "mean-mse-vs-n.png", epsilon=epsilon, optin_fraction=optin_fraction, sigma2=s2,
                         width=width, n_min=n_min, n_max=n_max, subtitle=f"σ² from {source}")
    peaks = plot_improvement_vs_n(out / "mean-improvement-vs-n.png", epsilon=epsilon,
                                  optin_fractions=[*fractions, optin_fraction], sigma2=s2, width=width,
                                  n_min=n_min, n_max=n_max, highlight=optin_fraction, subtitle=f"σ² from {source}")
    fig2 = str(out / "mean-improvement-vs-n.png")
    if as_json:
        render.print_json({"figure1": fig1, "figure2": {"path": fig2, "peaks": peaks}, "sigma2": s2,
                           "epsilon": epsilon, "optin_fraction": optin_fraction})
        return
    render.out.print(f"wrote {fig1['path']} (Fig. 1): R peaks at {fig1['r_max']:.3f} near n ≈ {fig1['n_at_r_max']:,.0f}"
                     + (f"; OnlyTCM beats FullLM from n ≈ {fig1['n_tcm_beats_lm']:,.0f}"
                        if fig1["n_tcm_beats_lm"] else ""))
    render.out.print(f"wrote {fig2} (Fig. 2):")
    for p in peaks:
        where = (f"peaks at {p['r_max']:.3f} near n ≈ {p['n_at_r_max']:,.0f}" if p["interior"]
                 else f"still rising at n = {p['n_at_r_max']:,.0f}: {p['r_max']:.3f}")
        render.out.print(f"  c = {p['optin_fraction']:g}: R {where}")


"""``hybriddp run`` and ``hybriddp demo``: the whole pipeline in one process (simulation)."""

from __future__ import annotations

import click

from hybriddp.algorithms import ALGORITHMS, run_algorithm
from hybriddp.cli import render
from hybriddp.cli.options import (
    input_options,
    load_input,
    make_params,
    noise_option,
    privacy_options,
    seed_option,
)
from hybriddp.cli.privacy import charge_round, ledger_options
from hybriddp.noise import noise_factory
from hybriddp.pipeline import Stages, result_from_run, round_charges, run_blender
from hybriddp.records import RecordLog


def output_options(f):
    f = click.option("--json", "as_json", is_flag=True,
                     help="Print one JSON object (metrics, parameters, Fig. 9 rows, tables) instead of tables.")(f)
    f = click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
                     help="Also write the result: .json (everything), .csv or .parquet (one row per "
                          "head-list record).")(f)
    f = click.option("--top", type=int, default=10, show_default=True, help="Rows of the Fig. 9 table.")(f)
    f = click.option("--no-project", is_flag=True,
                     help="Skip the projection of blended record estimates onto the probability simplex.")(f)
    return f


def simulate_and_report(log: RecordLog, *, seed: int | None, as_json: bool, output: str | None, top: int,
                        algorithm: str = "blender", noise: str = "discrete",
                        ledger: tuple[str, str | None, float | None, float | None] | None = None,
                        **knobs: object) -> None:
    """Run BLENDER (or a baseline) on a loaded log and print/write the result."""
    if output:  # fail before any work (and before a ledger is charged)
        from hybriddp.io.atomic import check_output_path
        from hybriddp.result import OUTPUT_SUFFIXES
        check_output_path(output, "--output", OUTPUT_SUFFIXES)
    no_project = bool(knobs.pop("no_project", False))
    factory = noise_factory(noise)
    params = make_params(project=not no_project, **knobs)  # type: ignore[arg-type]
    if algorithm != "blender":
        if ledger:
            raise click.BadParameter("--ledger is supported with --algorithm blender", param_hint="--ledger")
        with render.stage_progress(not as_json) as on_stage:
            alg = run_algorithm(algorithm, log, params, seed=seed, noise_factory=factory, stages=Stages(on_stage))
        if output:
            alg.write(output)
        if as_json:
            render.print_json(alg.to_json())
            return
        render.print_algorithm(alg, top)
        if output:
            render.out.print(f"wrote {output}")
        return
    with render.stage_progress(not as_json) as on_stage:
        run = run_blender(log, params, seed=seed, noise_factory=factory, stages=Stages(on_stage))
        res = result_from_run(run)
    if ledger:  # simulation: every user is charged for the round before the result is shown
        charged = charge_round(*ledger, round_charges(run))
        res.sizes["ledger_round"] = charged  # type: ignore[assignment]
    if output:
        res.write(output)
    if as_json:
        obj = res.to_json()
        obj["stage_seconds"] = run.stages.seconds
        render.print_json(obj)
        return
    render.print_figure9(res, top)
    render.print_summary(res)
    if output:
        render.out.print(f"wrote {output}")


algorithm_option = click.option(
    "--algorithm", type=click.Choice(ALGORITHMS), default="blender", show_default=True,
    help="blender (hybrid); optin-only (curator alone); client-only (clients over the opt-in head list, no "
         "blending); local-only (no opt-in group: PEM discovery + LocalAlg, aggregator holds a dictionary of the "
         "existing records); local-only-hashed (the same without a dictionary: 32-bit hashed records, false "
         "discoveries listed as '<no record k>'); central (everyone trusts the curator).")


@click.command("run")
@algorithm_option
@input_options()
@privacy_options()
@noise_option()
@seed_option()
@output_options
@ledger_options
def run_cmd(algorithm: str, input_path: str, fmt: str | None, user_col: str | None, query_col: str, url_col: str | None,
            row_per_user: bool, skip_bad_rows: bool, seed: int | None, as_json: bool, output: str | None,
            top: int, ledger_path: str | None, round_name: str | None, lifetime_epsilon: float | None,
            lifetime_delta: float | None, **knobs: object) -> None:
    """Simulate BLENDER on your log (ALGORITHM.md §2): users are assigned to the opt-in group at random,
    clients run LocalAlg; prints the Fig. 9 table, L1 and NDCG against the non-private truth."""
    with render.bytes_progress("loading", not as_json) as progress:
        log = load_input(input_path, fmt, user_col, query_col, url_col, row_per_user, skip_bad_rows, progress)
    st = log.stats
    if st.rows_skipped_bad and not as_json:
        render.err.print(f"skipped {st.rows_skipped_bad:,} malformed rows of {input_path}")
    ledger = (ledger_path, round_name, lifetime_epsilon, lifetime_delta) if ledger_path else None
    simulate_and_report(log, seed=seed, as_json=as_json, output=output, top=top, algorithm=algorithm, ledger=ledger,
                        **knobs)


@click.command("demo")
@click.option("--preset", type=click.Choice(["aol", "yandex"]), default="aol", show_default=True,
              help="Built-in synthetic log: aol (519,371 users) or yandex (4,970,073 users).")
@click.option("--scale", type=float, default=1.0, show_default=True,
              help="Multiply the preset's number of users (e.g. 0.1 for a quick look).")
@algorithm_option
@privacy_options()
@noise_option()
@seed_option()
@output_options
def demo_cmd(preset: str, scale: float, algorithm: str, seed: int | None, as_json: bool, output: str | None, top: int,
             **knobs: object) -> None:
    """Run BLENDER on a built-in synthetic search log calibrated to AOL (paper defaults: ε = 4,
    δ = 1e-5, 5% opt-in, M = 50). Takes well under a minute."""
    from hybriddp.io.synth import generate
    ctx = click.get_current_context()
    if preset == "yandex":  # paper Fig. 10 Yandex defaults unless given on the command line
        for name, value in (("delta", 1e-7), ("optin_fraction", 0.025), ("head_list_size", 500)):
            if ctx.get_parameter_source(name) == click.core.ParameterSource.DEFAULT:
                knobs[name] = value
    if scale <= 0:
        raise click.BadParameter(f"--scale = {scale} must be > 0", param_hint="--scale")
    with render.stage_progress(not as_json) as on_stage:
        if on_stage:
            on_stage(f"generating the {preset} preset")
        log = generate(preset, seed=seed, scale=scale)
    simulate_and_report(log, seed=seed, as_json=as_json, output=output, top=top, algorithm=algorithm, **knobs)

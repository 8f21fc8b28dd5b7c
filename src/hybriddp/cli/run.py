"""``hybriddp run`` and ``hybriddp demo``: the whole pipeline in one process (simulation)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import click

from hybriddp.cli import render
from hybriddp.cli.engine import engine_options, make_backend
from hybriddp.cli.options import (
    MAX_SCALE,
    check_output,
    check_scale,
    defense_from,
    defense_options,
    estimator_option,
    input_options,
    int_range,
    load_input,
    make_params,
    noise_option,
    privacy_options,
    seed_option,
)
from hybriddp.cli.privacy import charge_empty_run, charge_round, ledger_options
from hybriddp.core.counting import CountingBackend
from hybriddp.core.errors import EmptyHeadListError, HeadListError, parameter_error
from hybriddp.core.noise import noise_factory
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog
from hybriddp.server.party import DEFAULT_DEFENSE
from hybriddp.simulation.algorithms import ALGORITHMS, run_algorithm
from hybriddp.simulation.groups import check_algorithm_params, check_group_sizes
from hybriddp.simulation.pipeline import Stages, result_from_run, round_charges, run_blender


def output_options(f):
    f = click.option("--json", "as_json", is_flag=True,
                     help="Print one JSON object (metrics, parameters, Fig. 9 rows, tables) instead of tables.")(f)
    f = click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
                     help="Also write the result: .json (everything), .csv or .parquet (one row per "
                          "head-list record).")(f)
    f = click.option("--top", type=int, default=10, show_default=True, callback=int_range(1),
                     help="Rows of the Fig. 9 table (>= 1).")(f)
    f = click.option("--no-project", is_flag=True,
                     help="Skip the projection of blended record estimates onto the probability simplex.")(f)
    f = estimator_option(f)
    return f


def params_from_knobs(knobs: dict[str, object]) -> BlenderParams:
    """Validated parameters from the command's knobs (``no_project`` and ``estimator`` are popped)."""
    no_project = bool(knobs.pop("no_project", False))
    estimator = knobs.pop("estimator", None)
    return make_params(project=not no_project, estimator=estimator, **knobs)  # type: ignore[arg-type]


def simulate_and_report(log: RecordLog, params: BlenderParams, *, seed: int | None, as_json: bool,
                        output: str | None, top: int, algorithm: str = "blender", noise: str = "discrete",
                        ledger: tuple[str, str | None, float | None, float | None] | None = None,
                        source: str = "the log", backend: CountingBackend | None = None,
                        defense: Any = DEFAULT_DEFENSE) -> None:
    """Run BLENDER (or a baseline) on a loaded log and print/write the result.

    ``backend`` counts (NumPy by default; :class:`~hybriddp.spark.backend.SparkBackend`
    for ``--engine spark``): same seed, same counts, same result."""
    check_output(output)  # fail before any work (and before a ledger is charged)
    check_algorithm_params(algorithm, params, log)
    check_group_sizes(log, params, algorithm, noise, source)
    render.warn_delta(params.delta, log.n_users)
    factory = noise_factory(noise)
    if algorithm != "blender":
        if ledger:
            raise parameter_error("--ledger", ledger[0], f"unset with --algorithm {algorithm}",
                                  "The privacy ledger is supported with --algorithm blender.")
        with render.interruptible(), render.stage_progress(not as_json) as on_stage, _row_per_user_hint(log):
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
    try:
        with render.interruptible(), render.stage_progress(not as_json) as on_stage, _row_per_user_hint(log):
            run = run_blender(log, params, seed=seed, noise_factory=factory, stages=Stages(on_stage), backend=backend,
                              with_charges=ledger is not None, defense=defense)
            res = result_from_run(run)
    except EmptyHeadListError as exc:  # an output of the curator's mechanism: its opt-in users are charged
        raise charge_empty_run(exc, *(ledger or (None, None, None, None))) from None
    if ledger:  # simulation: every user is charged for the round before the result is shown
        charges = round_charges(run)
        if seed is not None:  # a seeded run gives no privacy: recorded as non-private
            charges = [replace(c, private=False) for c in charges]
        charged = charge_round(*ledger, charges)
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


@contextmanager
def _row_per_user_hint(log: RecordLog) -> Iterator[None]:
    """An empty head list from a log with many rows per user: add the --row-per-user hint to the error
    (the error keeps its type and the run's charges)."""
    try:
        yield
    except HeadListError as exc:
        if log.n_records < 2 * log.n_users:
            raise
        exc.args = (f"{exc} If every row of the log is its own user, pass --row-per-user (the log has "
                    f"{log.n_records:,} rows for {log.n_users:,} users).",)
        raise


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
@defense_options
@ledger_options
@engine_options("opt-in records, head-list entries and reports")
def run_cmd(algorithm: str, input_path: str, fmt: str | None, user_col: str | None, query_col: str, url_col: str | None,
            row_per_user: bool, skip_bad_rows: bool, seed: int | None, as_json: bool, output: str | None,
            top: int, ledger_path: str | None, round_name: str | None, lifetime_epsilon: float | None,
            lifetime_delta: float | None, noise: str, engine: str, spark_master: str | None,
            **knobs: object) -> None:
    """Simulate BLENDER on your log (ALGORITHM.md §2): users are assigned to the opt-in group at random,
    clients run LocalAlg; prints the Fig. 9 table, L1 and NDCG against the non-private truth.

    With --engine spark every count (distinct opt-in records, head-list entries, client reports) runs
    on Spark and the noise is drawn here, on the driver; the log itself is still loaded here."""
    check_output(output)  # before loading: nothing is read or computed for an unwritable --output
    defense = defense_from(knobs)
    params = params_from_knobs(knobs)
    if engine == "spark" and algorithm != "blender":
        raise click.BadParameter(f"--engine spark runs --algorithm blender only, not {algorithm}",
                                 param_hint="--engine")
    backend = make_backend(engine, spark_master)
    with render.interruptible(), render.bytes_progress("loading", not as_json) as progress:
        log = load_input(input_path, fmt, user_col, query_col, url_col, row_per_user, skip_bad_rows, progress)
    st = log.stats
    if st.rows_skipped_bad and not as_json:
        render.err.print(f"skipped {st.rows_skipped_bad:,} malformed rows of {input_path}")
    ledger = (ledger_path, round_name, lifetime_epsilon, lifetime_delta) if ledger_path else None
    simulate_and_report(log, params, seed=seed, as_json=as_json, output=output, top=top, algorithm=algorithm,
                        ledger=ledger, noise=noise, source=input_path, backend=backend, defense=defense)


@click.command("demo")
@click.option("--preset", type=click.Choice(["aol", "yandex"]), default="aol", show_default=True,
              help="Built-in synthetic log: aol (519,371 users) or yandex (4,970,073 users).")
@click.option("--scale", type=float, default=1.0, show_default=True,
              help=f"Multiply the preset's number of users, in (0, {MAX_SCALE:g}] (e.g. 0.1 for a quick look).")
@algorithm_option
@privacy_options()
@noise_option()
@seed_option()
@output_options
@click.option("--service", is_flag=True, help="Run the round through a real local collection server (HTTP, a "
              "temporary SQLite database): opt-in uploads, head list, device reports, close. With --seed the "
              "estimates equal those without --service.")
def demo_cmd(preset: str, scale: float, algorithm: str, seed: int | None, as_json: bool, output: str | None, top: int,
             noise: str, service: bool, **knobs: object) -> None:
    """Run BLENDER on a built-in synthetic search log calibrated to AOL (paper defaults: ε = 4,
    δ = 1e-5, 5% opt-in, M = 50). Takes well under a minute."""
    from hybriddp.datasets.synth import generate
    ctx = click.get_current_context()
    if preset == "yandex":  # paper Fig. 10 Yandex defaults unless given on the command line
        for name, value in (("delta", 1e-7), ("optin_fraction", 0.025), ("head_list_size", 500)):
            if ctx.get_parameter_source(name) == click.core.ParameterSource.DEFAULT:
                knobs[name] = value
    check_scale(scale)
    check_output(output)
    params = params_from_knobs(knobs)
    with render.interruptible(), render.stage_progress(not as_json) as on_stage:
        if on_stage:
            on_stage(f"generating the {preset} preset")
        log = generate(preset, seed=seed, scale=scale)
    if service:
        from hybriddp.cli.servicedemo import demo_through_service
        return demo_through_service(log, params, seed=seed, as_json=as_json, output=output, top=top, noise=noise,
                                    algorithm=algorithm, source=f"the {preset} preset at --scale {scale:g}")
    simulate_and_report(log, params, seed=seed, as_json=as_json, output=output, top=top, algorithm=algorithm,
                        noise=noise, source=f"the {preset} preset at --scale {scale:g}")

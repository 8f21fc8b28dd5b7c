"""``hybriddp synth``: write a synthetic search log calibrated to AOL or Yandex."""

from __future__ import annotations

import os

import click

from hybriddp.cli import render
from hybriddp.cli.options import check_scale, int_range, seed_option


@click.command("synth")
@click.option("--preset", type=click.Choice(["aol", "yandex"]), default="aol", show_default=True,
              help="aol: 519,371 users, ~4.8M queries, ~1.6M URLs; yandex: 4,970,073 users, ~13.2M queries.")
@click.option("--scale", type=float, default=1.0, show_default=True, help="Multiply the number of users.")
@seed_option(help="Seed (reproducible); default: OS randomness.")
@click.option("--output", "-o", type=click.Path(), required=True,
              help="Output file: .parquet (columns user, query, url) or .tsv / .tsv.gz (AOL's own format); "
                   "with --partitioned, a directory of Parquet files.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "aol"]), default=None,
              help="Output format. Default: from the extension.")
@click.option("--partitioned", is_flag=True,
              help="Write a directory of Parquet files (part-00000.parquet, …), generating --users-per-file "
                   "users at a time: any --scale (e.g. 200 for ~100 M AOL users) in the memory of one part. "
                   "Each part is an independent draw of the preset (docs/SCALE.md).")
@click.option("--users-per-file", type=int, default=200_000, show_default=True, callback=int_range(1),
              help="With --partitioned: users per Parquet file (AOL: ~37 records per user, ~0.5 GB of memory "
                   "per 200,000 users while a part is generated).")
def synth_cmd(preset: str, scale: float, seed: int | None, output: str, fmt: str | None, partitioned: bool,
              users_per_file: int) -> None:
    """Generate a synthetic search log (calibration: docs/ALGORITHM.md §10 and docs/DECISIONS.md).

    The file (or, with --partitioned, the directory) is written under a temporary name and renamed
    at the end: an interrupted run leaves an earlier output at --output as it was.
    """
    from hybriddp.core.atomic import check_output_path
    from hybriddp.datasets.synth import generate, write_log
    if partitioned:
        return _synth_partitioned(preset, scale, seed, output, fmt, users_per_file)
    check_scale(scale)
    check_output_path(output, "--output")  # before generating: a bad path fails in a second
    if fmt is None:
        fmt = "parquet" if output.endswith(".parquet") else "aol"
    with render.stage_progress(True) as on_stage:
        if on_stage:
            on_stage(f"generating {preset}")
        log = generate(preset, seed=seed, scale=scale)
        if on_stage:
            on_stage(f"writing {output}")
        write_log(log, output, format=fmt, seed=seed)
    render.out.print(f"wrote {output}: {log.n_users:,} users, {log.n_records:,} records")


def _synth_partitioned(preset: str, scale: float, seed: int | None, output: str, fmt: str | None,
                       users_per_file: int) -> None:
    """``synth --partitioned``: a Parquet directory written part by part (no --scale limit)."""
    from rich.progress import Progress

    from hybriddp.core.errors import parameter_error
    from hybriddp.datasets.synth_parts import write_partitioned_log
    if fmt not in (None, "parquet"):
        raise parameter_error("--format", fmt, "parquet with --partitioned")
    if not (scale > 0):
        raise parameter_error("--scale", scale, "a positive number")
    if os.path.exists(output) and not os.path.isdir(output):
        raise parameter_error("--output", output, "a directory (or a new name) with --partitioned",
                              "An existing file is not replaced by a directory; choose another name.")
    with Progress(console=render.err, transient=True) as bar:
        task = bar.add_task(f"generating {preset} in parts", total=None)
        n_users, n_records, n_files = write_partitioned_log(
            output, preset, seed=seed, scale=scale, users_per_file=users_per_file,
            progress=lambda done, total: bar.update(task, completed=done, total=total))
    render.out.print(f"wrote {output}/: {n_users:,} users, {n_records:,} records in {n_files:,} Parquet files")

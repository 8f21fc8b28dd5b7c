"""``hybriddp synth``: write a synthetic search log calibrated to AOL or Yandex."""

from __future__ import annotations

import click

from hybriddp.cli import render
from hybriddp.cli.options import check_scale, seed_option


@click.command("synth")
@click.option("--preset", type=click.Choice(["aol", "yandex"]), default="aol", show_default=True,
              help="aol: 519,371 users, ~4.8M queries, ~1.6M URLs; yandex: 4,970,073 users, ~13.2M queries.")
@click.option("--scale", type=float, default=1.0, show_default=True, help="Multiply the number of users.")
@seed_option(help="Seed (reproducible); default: OS randomness.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True,
              help="Output file: .parquet (columns user, query, url) or .tsv / .tsv.gz (AOL's own format).")
@click.option("--format", "fmt", type=click.Choice(["parquet", "aol"]), default=None,
              help="Output format. Default: from the extension.")
def synth_cmd(preset: str, scale: float, seed: int | None, output: str, fmt: str | None) -> None:
    """Generate a synthetic search log (calibration: docs/ALGORITHM.md §10 and docs/DECISIONS.md).

    The file is written under a temporary name and renamed at the end: an interrupted run leaves
    an earlier file at --output as it was.
    """
    from hybriddp.io.atomic import check_output_path
    from hybriddp.io.synth import generate, write_log
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

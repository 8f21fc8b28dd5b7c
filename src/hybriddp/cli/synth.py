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
@click.option("--periods", type=int, default=None, callback=int_range(2, 520),
              help="Write a log of this many periods whose popularity drifts: a directory with one file per period "
                   "(period-01.tsv, …; QueryTime inside the period) and drift.json, the truth: which queries rose or "
                   "fell at which period (docs/ALGORITHM.md §13). Each period is a fresh sample of the population.")
@click.option("--period-days", type=int, default=7, show_default=True, callback=int_range(1, 366),
              help="With --periods: days per period; the first starts on 2006-03-01 (AOL's first day).")
@click.option("--rising", type=int, default=10, show_default=True, callback=int_range(0),
              help="With --periods: head queries (ranks 5–59) whose popularity rises by --change at one period.")
@click.option("--falling", type=int, default=10, show_default=True, callback=int_range(0),
              help="With --periods: head queries whose popularity falls by --change at one period.")
@click.option("--change", type=float, default=2.0, show_default=True,
              help="With --periods: the factor of a rise (a fall divides by it); > 1.")
def synth_cmd(preset: str, scale: float, seed: int | None, output: str, fmt: str | None, partitioned: bool,
              users_per_file: int, periods: int | None, period_days: int, rising: int, falling: int,
              change: float) -> None:
    """Generate a synthetic search log (calibration: docs/ALGORITHM.md §10 and docs/DECISIONS.md).

    The file (or, with --partitioned, the directory) is written under a temporary name and renamed
    at the end: an interrupted run leaves an earlier output at --output as it was.
    """
    from hybriddp.core.atomic import check_output_path
    from hybriddp.datasets.synth import generate, write_log
    if partitioned:
        return _synth_partitioned(preset, scale, seed, output, fmt, users_per_file)
    if periods is not None:
        return _synth_periods(preset, scale, seed, output, fmt, periods, period_days, rising, falling, change)
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


def _synth_periods(preset: str, scale: float, seed: int | None, output: str, fmt: str | None, periods: int,
                   period_days: int, rising: int, falling: int, change: float) -> None:
    """``synth --periods N``: a directory of one log per period and ``drift.json`` (the truth), renamed into place
    at the end."""
    import json
    import shutil
    import tempfile

    from hybriddp.core.errors import parameter_error
    from hybriddp.core.periods import DAY
    from hybriddp.core.rng import make_rng
    from hybriddp.datasets.drift import drift_logs, plan_drift
    from hybriddp.datasets.synth import write_log
    from hybriddp.datasets.writers import AOL_START
    check_scale(scale)
    fmt = fmt or "aol"
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise parameter_error("--output", output, "a new directory (or an empty one) with --periods",
                              "Nothing is overwritten; choose another name.")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise parameter_error("--output", output, "a path in an existing, writable directory")
    seeds = make_rng(seed).integers(0, 2**63 - 1, size=3).tolist()
    drift = plan_drift(preset, periods, n_rising=rising, n_falling=falling, change=change, seed=seeds[0])
    tmp = tempfile.mkdtemp(prefix=".synth-periods-", dir=parent)
    try:
        with render.stage_progress(True) as on_stage:
            if on_stage:
                on_stage(f"generating {periods} periods of {preset}")
            logs = drift_logs(drift, scale=scale, seed=seeds[1])
            files = []
            for t, log in enumerate(logs):
                name = f"period-{t + 1:02d}." + ("parquet" if fmt == "parquet" else "tsv")
                if on_stage:
                    on_stage(f"writing {name}")
                start = AOL_START + t * period_days * DAY
                write_log(log, os.path.join(tmp, name), format=fmt, seed=seeds[2] + t,
                          window=(start, period_days * DAY))
                files.append({"file": name, "period": t + 1, "start": start, "users": log.n_users,
                              "records": log.n_records})
        names = logs[0].queries
        truth = {"preset": preset, "scale": scale, "periods": periods, "period_days": period_days,
                 "change": change, "files": files,
                 "rising": [{"query": names.decode([q])[0], "period": t + 1} for q, t in drift.rising],
                 "falling": [{"query": names.decode([q])[0], "period": t + 1} for q, t in drift.falling],
                 "note": "period p's change is from period p-1 to p; every other head query moves by < 5%"}
        with open(os.path.join(tmp, "drift.json"), "w", encoding="utf-8") as fh:
            json.dump(truth, fh, indent=2)
        if os.path.isdir(output):
            os.rmdir(output)  # empty (checked above)
        os.rename(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    where = os.path.normpath(output)
    render.out.print(f"wrote {where}/: {periods} periods of {period_days} days, "
                     f"{sum(f['records'] for f in files):,} records; the truth in {where}/drift.json")

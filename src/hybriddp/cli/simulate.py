"""``hybriddp simulate``: drive a real round on a running ``hybriddp serve`` with a simulated population — opt-in
users enrolling and uploading, or devices reporting — concurrently through the SDK; also the service's load
generator (``--rate``, ``--duration``). The engine is :mod:`hybriddp.service.simulate`."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hybriddp.cli import render
from hybriddp.cli.options import MAX_SCALE, check_scale, input_options, int_range, load_input, seed_option
from hybriddp.cli.remote import admin_options, read_token
from hybriddp.core.errors import parameter_error
from hybriddp.service.simulate import DEFAULT_USER_PREFIX, Population, Settings, Summary, Tally, simulate


def _positive(name: str, flag: str) -> Any:
    def check(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise parameter_error(f"{name} ({flag})", value, "a finite number > 0", f"E.g. {flag} 10.")
        return value
    return check


@click.command("simulate")
@click.argument("round_id", required=False, metavar="[ROUND]")
@click.option("--series", default=None, metavar="SERIES", help="Drive the round of this series' current period "
              "instead of ROUND.")
@admin_options
@click.option("--optin-users", type=int, default=None, callback=int_range(1), metavar="N",
              help="Opt-in users to enrol, each uploading their records (round collecting-optin). Default: 500, or "
                   "RATE x DURATION.")
@click.option("--devices", type=int, default=None, callback=int_range(1), metavar="M",
              help="Devices to take part, one credential and one report each (round headlist-published or "
                   "collecting-reports). Default: 500, or RATE x DURATION.")
@click.option("--preset", type=click.Choice(["aol", "yandex"]), default="aol", show_default=True,
              help="Synthetic population (unless --input).")
@click.option("--scale", type=float, default=0.02, show_default=True,
              help=f"Size of the --preset population, in (0, {MAX_SCALE:g}]: 0.02 is about 10,400 AOL-like users.")
@input_options(required=False)
@seed_option(help="Pick the users (and draw the synthetic population) with this seed. Default: derived from the "
                  "round id, so both phases of a round use one population and disjoint users. It never seeds a "
                  "privacy mechanism.")
@click.option("--concurrency", type=int, default=8, show_default=True, callback=int_range(1, 256),
              help="Worker threads (users or devices in flight at once).")
@click.option("--rate", type=float, default=None, callback=_positive("rate", "--rate"), metavar="R",
              help="Start at most R uploads or devices a second (a token bucket holding one token). Default: as "
                   "fast as --concurrency allows.")
@click.option("--duration", type=float, default=None, callback=_positive("duration", "--duration"), metavar="S",
              help="Spread the work over S seconds (the rule: see above); nothing starts after S seconds.")
@click.option("--spread", is_flag=True, help="Devices send at a uniformly random time in the round's report window, "
              "as real devices do (the command runs until the last one is sent). Default: at once.")
@click.option("--user-prefix", default=DEFAULT_USER_PREFIX, show_default=True,
              help="Opt-in users are enrolled as PREFIX + their id in the population.")
@click.option("--retries", type=int, default=5, show_default=True, callback=int_range(0, 100),
              help="Retries of a request on connection errors, timeouts, HTTP 429 and 5xx (with backoff).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object instead of a table.")
@click.pass_context
def simulate_cmd(ctx: click.Context, round_id: str | None, series: str | None, server: str,
                 admin_token_file: str | None, optin_users: int | None, devices: int | None, preset: str,
                 scale: float, input_path: str | None, fmt: str | None, user_col: str | None, query_col: str,
                 url_col: str | None, row_per_user: bool, skip_bad_rows: bool, seed: int | None, concurrency: int,
                 rate: float | None, duration: float | None, spread: bool, user_prefix: str, retries: int,
                 as_json: bool) -> None:
    """Drive a real round on a running `hybriddp serve` with a simulated population, concurrently through the SDK
    (admin token needed). What it does depends on the round's state:

    \b
    * collecting-optin: --optin-users N users are enrolled (one call), and each
      uploads their records with their own token; next: `hybriddp round publish ROUND`.
    * headlist-published / collecting-reports: --devices M device credentials are
      made (one call), and each device fetches and verifies the head list, gets
      its report token, randomizes its records and reports once (no device
      ledger: a simulation); next: `hybriddp round close ROUND`.
    * any other state is refused, saying what to run instead.

    Both --optin-users and --devices may be given: the phase's one is used. The population is --preset at --scale,
    or --input LOG (the formats and column options of `hybriddp run --input`). Users come from one shuffle of it:
    opt-in users from its front, devices from its back past the round's opt-in users, so with the same population
    and --seed (by default derived from the round id) the two phases use disjoint users.

    \b
    Pace: --rate R starts at most R items a second (n items take at least
    (n-1)/R seconds). --duration S: with --rate and no count, the count is
    R x S; without --rate, the count is spread evenly over S seconds (rate
    count/S); in every case nothing starts after S seconds (counted as "not
    started", not as failures).

    Devices report at once (TESTS AND SIMULATIONS ONLY: the server can then link a report to its token's issuance)
    unless --spread. Prints a progress bar on stderr (terminals, not with --json) and a summary: acknowledged,
    duplicates, refused by HTTP status and code, errors, elapsed seconds, achieved rate, and latency p50/p95/p99
    per item (a device: its head-list, token-key, token and report requests; an opt-in user: their upload).
    Exit status 0 when every started item was acknowledged, 1 when some failed (the reason on one line), 2 on
    bad input.
    """
    source = ctx.get_parameter_source
    if input_path is not None:
        given = [f"--{p}" for p in ("preset", "scale") if source(p) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise parameter_error(given[0], ctx.params[given[0][2:]], "left out with --input",
                                  "The population is the --input log; --preset/--scale make a synthetic one.")
    else:
        check_scale(scale)
    if (round_id is None) == (series is None):
        raise parameter_error("ROUND/--series", round_id or series, "exactly one of them",
                              "Give the round's id (`hybriddp round list`), or --series SERIES for the round of "
                              "its current period.")
    if not user_prefix.strip():
        raise parameter_error("user prefix (--user-prefix)", user_prefix, "a non-empty string", "E.g. sim-.")
    token = read_token(admin_token_file, "HYBRIDDP_ADMIN_TOKEN", "admin token", "--admin-token-file")
    if input_path is not None:
        log = load_input(input_path, fmt, user_col, query_col, url_col, row_per_user, skip_bad_rows)
        population = Population(log=log, source=f"--input {input_path}")
    else:
        population = Population(preset=preset, scale=scale)
    settings = Settings(concurrency=concurrency, rate=rate, duration=duration, retries=retries, spread=spread,
                        user_prefix=user_prefix)
    with render.interruptible(), _Bar(enabled=not as_json) as bar:
        summary = simulate(server, token, population, round_id=round_id, series=series, optin_users=optin_users,
                           devices=devices, seed=seed, settings=settings, on_start=bar.start)
    if as_json:
        render.print_json(summary.to_json())
    else:
        print_summary(summary)
    failure = summary.failure()
    if failure:
        click.echo(f"error: {failure}", err=True)
        sys.exit(1)


class _Bar:
    """The progress bar on stderr (terminals only): done of planned, rate, elapsed."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and render.err.is_terminal
        self.progress: Progress | None = None

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def start(self, phase: str, planned: int, rnd: dict[str, Any]) -> Any:
        if not self.enabled:
            return None
        what = "opt-in uploads" if phase == "optin" else "devices"
        self.progress = Progress(TextColumn(f"round {rnd['id']}: {what}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}/s"), TextColumn("{task.fields[bad]}"),
                                 TimeElapsedColumn(), console=render.err, transient=True)
        self.progress.start()
        task = self.progress.add_task(what, total=planned, rate="-", bad="")
        t0 = time.monotonic()
        progress = self.progress

        def update(tally: Tally) -> None:
            done, bad = tally.done, tally.done - tally.acknowledged
            progress.update(task, completed=done + tally.not_started,
                            rate=f"{done / max(time.monotonic() - t0, 1e-9):,.1f}",
                            bad=f"[red]{bad:,} failed[/red]" if bad else
                            (f"{tally.waiting:,} waiting" if tally.waiting else ""))
        return update


def print_summary(s: Summary) -> None:
    """The run as a table, then what to run next."""
    d = s.to_json()
    what = "opt-in users" if s.phase == "optin" else "devices"
    t = Table(title=f"round {s.round} ({s.state}): {what}", title_justify="left", show_header=False)
    t.add_column("", style="bold")
    t.add_column("", overflow="fold")
    lat = d["latency_ms"]
    rows = [("population", f"{s.population} ({s.users:,} users)"), ("planned", f"{s.planned:,}"),
            ("acknowledged", f"{d['acknowledged']:,}"),
            ("duplicates", f"{d['duplicates']:,}")]
    if s.phase == "optin":
        rows.append(("records stored", f"{d['records']:,}"))
    rows += [("refused", _reasons(d["refused"])), ("errors", _reasons(d["errors"])),
             ("not started", f"{d['not_started']:,}" + (" (past --duration)" if d["not_started"] else "")),
             ("elapsed", f"{d['elapsed_seconds']:.2f} s (+ {d['setup_seconds']:.2f} s "
                         f"{'enrolment' if s.phase == 'optin' else 'credentials'})"),
             ("rate", f"{d['rate_per_second'] or 0:,.1f}/s" + (f" (target {s.target_rate:,.1f}/s)"
                                                                if s.target_rate else "")),
             ("latency p50 / p95 / p99", " / ".join("-" if lat[k] is None else f"{lat[k]:,.1f} ms"
                                                     for k in ("p50", "p95", "p99")) + " per item"),
             ("concurrency", str(s.concurrency))]
    counts = s.counts
    if counts:
        rows.append(("round counts now", ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in counts.items()
                                                     if v is not None)))
    for k, v in rows:
        t.add_row(k, v)
    render.out.print(t)
    render.out.print(f"next: {s.next_step}")


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {r}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "0"

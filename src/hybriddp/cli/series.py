"""``hybriddp series …``: round series on a running ``hybriddp serve`` (docs/SERIES.md): a round per period, opened,
published and closed on schedule, with trends over the published periods.

Every command talks to the server through the SDK (:meth:`hybriddp.sdk.AdminClient.create_series` and the rest);
``status`` and ``trends`` need no token (unless the server hides round details).
"""

from __future__ import annotations

import os
from typing import Any

import click

from hybriddp.cli import render
from hybriddp.cli.remote import admin_client, admin_options, json_option, server_option
from hybriddp.cli.rounds import round_param_options, round_params
from hybriddp.cli.sizing import forecast, print_dry_run, print_forecast, sizing_options
from hybriddp.server.trends import DEFAULT_WINDOW


@click.group("series")
def series_group() -> None:
    """Round series: one round per period on a schedule (weekly trends), each user's spend carried across them.

    `create` a series; `hybriddp serve` opens each period's round when it starts, builds the head list from that
    period's opt-in data when the opt-in window ends, and closes the round when the period ends. `status` shows
    the periods, `trends` the queries that rose or fell, `advance` does what is due now (for a cron job, or
    `--step` to move on at once), `cancel` opens no more periods.
    """


@series_group.command("create")
@admin_options
@click.option("--name", default=None, help="A label for people (each period's round is named after it).")
@click.option("--period", "period", required=True, metavar="DURATION",
              help="Length of a period: a number with a unit s, m, h, d or w (7d: weekly). It must leave at least "
                   "600 s after the opt-in window (--period 20m or more with the default opt-in window) for the head "
                   "list, report tokens and reports, or the series is refused; it should also hold the rounds' "
                   "issuance and report windows (3600 s each) and a tenth more, or they are shrunk to fit (a "
                   "warning).")
@click.option("--periods", type=click.IntRange(1, 1000), required=True, help="Number of periods, 1 to 1000.")
@click.option("--optin-window", default=None, metavar="DURATION",
              help="Each period's opt-in window from its start; its head list is built when it ends and devices "
                   "report in the rest of the period. Default: half the period.")
@click.option("--start", default=None, metavar="ISO-TIME",
              help="Start of the first period, ISO 8601 (e.g. 2026-12-07T00:00:00+00:00; no zone: UTC). Default: now.")
@click.option("--flagged", type=click.Choice(["hold", "publish", "remove"]), default="hold", show_default=True,
              help="What each period's close does when the anchor check flags its results (as `round close`).")
@click.option("--retention-hours", type=float, default=None,
              help="Hours after a period's round opens at which its raw opt-in data are purged at the latest. "
                   "Default: the period's length, at least 1.")
@click.option("--first-round", default=None, metavar="ROUND",
              help="A round still collecting opt-in data, with the series' parameters, that becomes period 1.")
@click.option("--carry", type=click.IntRange(0, 1000), default=None, metavar="PERIODS",
              help="Periods a record the head list selected stays on the next periods' lists, estimated there from T "
                   "(docs/ALGORITHM.md §13.1): a query that falls keeps an estimate, so its fall shows in the trends. "
                   "Default: 4 for BLENDER with the reuse or consistent estimator, else 0.")
@round_param_options
@sizing_options
@json_option
def create_cmd(server: str, admin_token_file: str | None, name: str | None, period: str, periods: int,
               optin_window: str | None, start: str | None, flagged: str, retention_hours: float | None,
               first_round: str | None, carry: int | None, expect_optin: int | None, expect_devices: int | None,
               like: str | None, dry_run: bool, as_json: bool, **knobs: Any) -> None:
    """Create a series of PERIODS rounds, one per period, with the round parameters given (as `round create`).
    Prints the series, its schedule, how many periods the lifetime budget lets each opt-in user join and a
    BLENDER period's forecast (--expect-optin/--expect-devices: per period; --dry-run: the forecast only)."""
    from datetime import datetime

    from hybriddp.core.errors import parameter_error
    from hybriddp.service.series import parse_duration

    seconds = parse_duration(period, "period (--period)")
    optin = None if optin_window is None else parse_duration(optin_window, "opt-in window (--optin-window)")
    if start is not None:
        try:
            datetime.fromisoformat(start)
        except ValueError:
            raise parameter_error("start (--start)", start, "an ISO 8601 time",
                                  "E.g. 2026-12-07T00:00:00+00:00.") from None
    params = round_params(**knobs)
    fc = forecast(knobs["kind"], params, expect_optin, expect_devices, like, server, admin_token_file)
    if dry_run:
        print_dry_run(fc, params, as_json)
        return
    with admin_client(server, admin_token_file) as admin:
        doc = admin.create_series(knobs["kind"], params, period_seconds=seconds, periods=periods,
                                  optin_seconds=optin, start=start, name=name, flagged=flagged,
                                  retention_hours=retention_hours, first_round=first_round, carry=carry)
    show_series({**doc, "forecast": None if fc is None else fc.to_json()} if as_json else doc, as_json)
    if not as_json:
        print_forecast(fc)
        render.out.print(f"series id: {doc['id']}")


@series_group.command("list")
@admin_options
@json_option
def list_cmd(server: str, admin_token_file: str | None, as_json: bool) -> None:
    """Every series on the server, one line each."""
    with admin_client(server, admin_token_file) as admin:
        items = admin.series_list()
    if as_json:
        render.print_json({"series": items})
        return
    cols = (render.Col("id"), render.Col("name", wrap=10, drop=1), render.Col("kind"), render.Col("state"),
            render.Col("start (UTC)", wrap=10), render.Col("period"), render.Col("periods", justify="right"))
    rows = [[s["id"], s.get("name") or "", s["kind"], s["state"], _utc(s["start"]), _duration(s["period_seconds"]),
             str(s["periods"])] for s in items]
    t, left_out = render.fit_table(cols, rows, render.out.width, title=f"{len(items)} series")
    if left_out:
        t.caption = f"left out at this width: {', '.join(left_out)} (--json has every column)"
    render.out.print(t)


@series_group.command("status")
@click.argument("series_id")
@server_option
@json_option
def status_cmd(series_id: str, server: str, as_json: bool) -> None:
    """A series' schedule and each period's round (no token needed; with HYBRIDDP_ADMIN_TOKEN set, the
    administrators' view with the opt-in counts)."""
    from hybriddp.sdk.http import fetch_series
    show_series(_reader(server, lambda http: fetch_series(http, series_id)), as_json)


@series_group.command("advance")
@click.argument("series_id")
@admin_options
@click.option("--step", is_flag=True, help="Do the next action now whatever the clock says: build the current "
              "period's head list, close its round, or open the next period.")
@json_option
def advance_cmd(series_id: str, server: str, admin_token_file: str | None, step: bool, as_json: bool) -> None:
    """Do what the series' schedule says is due now (the server does it every --series-tick seconds; call this
    from cron when it runs with --series-tick 0). Prints what was done."""
    with admin_client(server, admin_token_file) as admin:
        doc = admin.advance_series(series_id, step=step)
    if as_json:
        render.print_json(doc)
        return
    for line in doc.get("actions") or ["nothing was due"]:
        render.out.print(line)


@series_group.command("cancel")
@click.argument("series_id")
@admin_options
@json_option
def cancel_cmd(series_id: str, server: str, admin_token_file: str | None, as_json: bool) -> None:
    """Open no more periods; the current period's round is left as it is (close or abort it as any round)."""
    with admin_client(server, admin_token_file) as admin:
        show_series(admin.cancel_series(series_id), as_json)


@series_group.command("trends")
@click.argument("series_id")
@server_option
@click.option("--window", type=click.IntRange(1, 52), default=DEFAULT_WINDOW, show_default=True,
              help="Periods pooled on each side of a boundary (as `hybriddp trends --window`).")
@click.option("--fdr", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05, show_default=True,
              help="Expected share of false trends among those reported (Benjamini–Hochberg).")
@click.option("--min-change", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Smallest relative change that counts (0.5: to 1.5× or from it); 0: any change.")
@click.option("--all", "show_all", is_flag=True, help="Print every tested change, not only the trends.")
@json_option
def trends_cmd(series_id: str, server: str, window: int, fdr: float, min_change: float, show_all: bool,
               as_json: bool) -> None:
    """Rising and falling queries across the series' published periods (post-processing: no privacy spent)."""
    from hybriddp.sdk.http import fetch_series_trends
    doc = _reader(server, lambda http: fetch_series_trends(http, series_id, window=window, fdr=fdr,
                                                           min_change=min_change))
    if as_json:
        render.print_json(doc)
        return
    from hybriddp.cli.trends import nothing_found_hint, print_trend_table
    print_trend_table(doc, show_all, f"series {series_id}: {doc['rising']} rising, {doc['falling']} falling of "
                                     f"{doc['tested']} changes tested over {len(doc['periods'])} published periods "
                                     f"(FDR {fdr:g}, window {doc.get('window', window)})")
    if doc.get("note"):
        render.out.print(doc["note"])
    hint = nothing_found_hint(doc)
    if hint:
        render.out.print(hint)


def _reader(server: str, call: Any) -> Any:
    """``call(http)`` with the administrator's client when HYBRIDDP_ADMIN_TOKEN is set, else anonymously."""
    from hybriddp.sdk.http import ServiceHttp
    if os.environ.get("HYBRIDDP_ADMIN_TOKEN", "").strip():
        with admin_client(server, None) as admin:
            return call(admin)
    with ServiceHttp(server) as http:
        return call(http)


def _duration(seconds: float) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _utc(iso: str) -> str:
    """``2026-12-07T00:00:00+00:00`` → ``2026-12-07 00:00:00`` (the API's times are UTC)."""
    return iso.replace("T", " ").removesuffix("+00:00")


def show_series(doc: dict[str, Any], as_json: bool) -> None:
    """A series as JSON, or its schedule and budget line and a table of its periods."""
    if as_json:
        render.print_json(doc)
        return
    b = doc.get("budget") or {}
    render.out.print(f"series {doc['id']} ({doc.get('name') or 'unnamed'}): {doc['kind']}, {doc['state']}, "
                     f"{doc['periods']} periods of {_duration(doc['period_seconds'])} from {doc['start']} "
                     f"(opt-in window {_duration(doc['optin_seconds'])}); current period: "
                     f"{doc.get('current_period') or '-'}")
    if doc["kind"] == "blender":
        render.out.print(f"head lists: a record selected stays listed for {doc.get('carry', 0)} period(s) after "
                         "(--carry; docs/ALGORITHM.md §13.1)")
    if b:
        render.out.print(f"budget: each round charges its opt-in users epsilon {b['round_epsilon']:g}, delta "
                         f"{b['round_delta']:g}; the lifetime budget (epsilon {b['lifetime_epsilon']:g}, delta "
                         f"{b['lifetime_delta']:g}) lets a user join {b['periods_per_user']} period(s) (basic "
                         f"composition alone: {b['periods_per_user_basic']}; the ledger enforces the tighter of it "
                         "and PLD accounting)")
    print_periods(doc)
    for w in doc.get("warnings") or []:  # the schedule's risks (the server refused none of it)
        render.err.print(f"[yellow]warning: {w}[/yellow]")


PERIOD_COLUMNS = (render.Col("period"), render.Col("starts", wrap=10), render.Col("opt-in until", wrap=10, drop=3),
                  render.Col("ends", wrap=10, drop=2), render.Col("round"), render.Col("state"),
                  render.Col("reports", justify="right"), render.Col("note", wrap=20, drop=1))
"""The periods table's columns: the period, its start, round id, state and reports are always shown whole; at a
narrow width the opt-in end and the period's end (both follow from the start) go first, then the notes, which
are printed under the table instead."""


def print_periods(doc: dict[str, Any]) -> None:
    """A series' periods table (:data:`PERIOD_COLUMNS`) fitted to the console's width (:func:`render.fit_table`):
    every period's number, start, round id, state and report count are printed whole at 80 columns and more; a
    column left out is named under the table, and the notes it would have held follow it one line each."""
    periods = doc.get("periods_table") or []
    rows = []
    for row in periods:
        r = row.get("round") or {}
        rows.append([str(row["period"]), _utc(row["starts"]), _utc(row["optin_until"]), _utc(row["ends"]),
                     r.get("id", ""), r.get("state", ""), f"{r['reports']:,}" if r else "", row.get("note") or ""])
    t, left_out = render.fit_table(PERIOD_COLUMNS, rows, render.out.width)
    caption = "times in UTC"
    if {"opt-in until", "ends"} & set(left_out):
        caption += (f"; a period ends when the next starts and takes opt-in data for its first "
                    f"{_duration(doc['optin_seconds'])}")
    if left_out:
        caption += f"; left out at this width: {', '.join(left_out)} (--json has every column)"
    t.caption = caption
    render.out.print(t)
    if "note" in left_out:
        for row in periods:
            if row.get("note"):
                render.out.print(f"period {row['period']}: {row['note']}")

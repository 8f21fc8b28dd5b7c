"""The file workflow across machines: ``headlist`` (curator) → ``randomize`` (devices) →
``estimate`` (server). Each command parses options, calls one party of
:func:`hybriddp.curate`, :func:`hybriddp.serve_estimates`, and renders. With the same log, ``--optin-fraction`` and
``--seed`` as
``run``, the three commands reproduce ``run``'s estimates exactly (same code, same streams)."""

from __future__ import annotations

import os
from typing import Any

import click
import numpy as np

from hybriddp.cli import render
from hybriddp.cli.engine import engine_options
from hybriddp.cli.options import (
    defense_from,
    defense_options,
    estimator_option,
    input_options,
    load_input,
    make_params,
    noise_option,
    privacy_options,
    seed_option,
)
from hybriddp.cli.privacy import charge_empty_run, charge_round, ledger_options
from hybriddp.cli.run import output_options
from hybriddp.core.atomic import check_output_path
from hybriddp.core.errors import DataError, EmptyHeadListError, parameter_error
from hybriddp.core.headlist import read_device_json
from hybriddp.core.noise import noise_factory
from hybriddp.core.records import RecordLog
from hybriddp.core.rng import SEED_WARNING
from hybriddp.curator.party import curate
from hybriddp.curator.release import CuratorRelease, check_headlist_budget, release_from_documents
from hybriddp.device.ledger import DeviceLedger
from hybriddp.device.localalg import DeviceHeadList
from hybriddp.device.party import log_messages
from hybriddp.io.exchange import read_messages, read_release_files, write_release_files, write_reports
from hybriddp.io.parquet_reports import is_parquet_reports, read_parquet_messages, write_reports_parquet
from hybriddp.server.party import MessageCounter, ReportCounts, serve_estimates
from hybriddp.server.result import OUTPUT_SUFFIXES
from hybriddp.simulation.pipeline import Stages, split_optin

optin_fraction_option = click.option(
    "--optin-fraction", type=float, default=None,
    help="Simulation only: take the opt-in group out of a full log exactly as `run` does (with the same "
         "--seed). Default: every user in --input is opt-in (headlist) / a device (randomize).")


@click.command("headlist")
@input_options()
@privacy_options(with_optin=False)
@optin_fraction_option
@noise_option()
@estimator_option
@seed_option()
@click.option("--out-headlist", type=click.Path(dir_okay=False), default="headlist.json", show_default=True,
              help="Head-list JSON for devices (lists, ε, δ, f_C, m_C, content hash; no estimates).")
@click.option("--out-estimates", type=click.Path(dir_okay=False), default="optin-estimates.json",
              show_default=True, help="The curator's DP estimates over the head list, for `estimate`.")
@ledger_options
def headlist_cmd(input_path: str, fmt: str | None, user_col: str | None, query_col: str, url_col: str | None,
                 row_per_user: bool, skip_bad_rows: bool, optin_fraction: float | None, noise: str,
                 estimator: str | None, seed: int | None, out_headlist: str, out_estimates: str,
                 ledger_path: str | None,
                 round_name: str | None, lifetime_epsilon: float | None, lifetime_delta: float | None,
                 **knobs: Any) -> None:
    """Curator: build the head list from opt-in users' raw records (ALGORITHM.md §3, §4).

    Reads opt-in records, writes only differentially private outputs: the head list for devices
    and the opt-in estimates for the server. With --ledger the round is charged to the opt-in
    users in the same step that makes both files visible: a refused round writes nothing. Every
    run is charged, whatever it outputs: a run whose head list is empty writes no file but is
    charged too (the empty outcome is a release), so a rerun is a new release, charged again.
    Keep the raw opt-in log under access control and delete it when no longer needed.
    """
    params = make_params(optin_fraction=optin_fraction if optin_fraction is not None else 0.05,
                         estimator=estimator, **knobs)
    check_output_path(out_headlist, "--out-headlist")
    check_output_path(out_estimates, "--out-estimates")
    if render.same_file(out_headlist, out_estimates):
        raise DataError(f"--out-headlist and --out-estimates are the same file ({out_headlist}); give two names")
    with render.bytes_progress("loading", True) as progress:
        log = load_input(input_path, fmt, user_col, query_col, url_col, row_per_user, skip_bad_rows, progress)
    render.warn_delta(params.delta, log.n_users)
    optin_users = None if optin_fraction is None else split_optin(log.n_users, optin_fraction, seed)[0]
    try:
        with render.stage_progress(True) as on_stage:
            rel, _ = curate(log, params, optin_users=optin_users, seed=seed, noise_factory=noise_factory(noise),
                            stages=Stages(on_stage), with_charges=ledger_path is not None)
    except EmptyHeadListError as exc:  # an output of the mechanism: charged like a head list (ALGORITHM.md §3.4)
        raise charge_empty_run(exc, ledger_path, round_name, lifetime_epsilon, lifetime_delta) from None
    charged: list[str | None] = [None]

    def charge() -> None:  # inside the write: the ledger is charged only if both files can appear
        charged[0] = charge_round(ledger_path, round_name or rel.hash, lifetime_epsilon, lifetime_delta,
                                  rel.charges)

    write_release_files(out_headlist, out_estimates, rel.headlist, rel.estimates, commit=charge)
    s = rel.sizes
    render.out.print(f"head list: {render.head_list_size(rel.head_list, rel.url_level)} from "
                     f"{s['optin_users']:,} opt-in users ({s['optin_users_s']:,} in S, {s['optin_users_t']:,} in T)")
    render.out.print(f"wrote {out_headlist} ({rel.hash[:19]}…) and {out_estimates}")
    if charged[0]:
        seeded = " as non-private (seeded: no privacy guarantee)" if rel.non_private else ""
        render.out.print(f"charged round {charged[0][:27]} to the ledger {ledger_path}{seeded}")
    if seed is not None:
        render.err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


@click.command("randomize")
@click.option("--headlist", "headlist_path", type=click.Path(dir_okay=False), required=True,
              help="Head-list JSON written by `hybriddp headlist`.")
@input_options()
@optin_fraction_option
@click.option("--single-device", is_flag=True,
              help="All records in --input belong to one device (no --user-col needed).")
@click.option("--device-ledger", type=click.Path(dir_okay=False), default=None,
              help="With --single-device: the device's own ledger (JSON); refuses a second report for the same "
                   "head list and reports beyond the lifetime budget (--lifetime-epsilon/--lifetime-delta).")
@click.option("--lifetime-epsilon", type=float, default=None, help="Lifetime ε of a new --device-ledger.")
@click.option("--lifetime-delta", type=float, default=None, help="Lifetime δ of a new --device-ledger.")
@seed_option()
@click.option("--output", "-o", type=click.Path(), default="reports.jsonl", show_default=True,
              help="Reports file: a header line, one JSON line per device message, an end line (.gz ok); or, "
                   "for a name ending in .parquet, a directory of Parquet files with one row per report "
                   "(docs/FORMATS.md), for `estimate --engine spark`.")
def randomize_cmd(headlist_path: str, input_path: str, fmt: str | None, user_col: str | None, query_col: str,
                  url_col: str | None, row_per_user: bool, skip_bad_rows: bool, optin_fraction: float | None,
                  single_device: bool, device_ledger: str | None, lifetime_epsilon: float | None,
                  lifetime_delta: float | None, seed: int | None, output: str) -> None:
    """Devices: run LocalAlg (ALGORITHM.md §5) on each device's records with the device randomizer.

    Every device samples at most m_C of its records and randomizes each over the head list;
    its message carries a random id so the server counts a resent message once. Randomness
    comes from the OS unless --seed is given. The reports file appears only when every device
    has reported (and the device ledger, if any, has been charged).
    """
    doc = read_device_json(headlist_path)
    check_headlist_budget(doc, headlist_path)
    parquet_out = output.endswith(".parquet")
    if parquet_out and os.path.exists(output) and not os.path.isdir(output):
        raise parameter_error("--output", output, "a directory (or a new name) for Parquet reports",
                              "An existing file is not replaced by a directory; choose another name.")
    if not parquet_out:
        check_output_path(output, "--output", (".jsonl", ".jsonl.gz", ".json", ".ndjson", ".gz", ".parquet"))
    if device_ledger is not None and not single_device:
        raise click.BadParameter("--device-ledger needs --single-device (one device, one ledger)",
                                 param_hint="--device-ledger")
    from hybriddp.audit.pld import device_accountant
    ledger = DeviceLedger(device_ledger, lifetime_epsilon=lifetime_epsilon, lifetime_delta=lifetime_delta,
                          accountant=device_accountant()) if device_ledger else None
    shape = DeviceHeadList.from_json(doc).shape  # for the ledger's PLD accounting (ALGORITHM.md §15)
    if ledger is not None:
        ledger.check(doc["content_hash"], float(doc["epsilon"]), float(doc["delta"]), shape)
    per_row = row_per_user or (single_device and user_col is None)
    with render.bytes_progress("loading", True) as progress:
        log = load_input(input_path, fmt, user_col, query_col, url_col, per_row, skip_bad_rows, progress)
    if single_device:
        log = RecordLog(np.array([0, log.n_records]), log.query, log.url, log.queries, log.urls, log.has_urls)
    devices = (np.arange(log.n_users) if optin_fraction is None
               else split_optin(log.n_users, optin_fraction, seed)[1])
    render.warn_delta(float(doc["delta"]), len(devices))

    def charge() -> None:
        if ledger is not None:
            ledger.record(doc["content_hash"], float(doc["epsilon"]), float(doc["delta"]), shape=shape)

    with render.stage_progress(True) as on_stage:
        if on_stage:
            on_stage(f"randomizing {len(devices):,} devices")
        messages = log_messages(log, devices, doc, seed=seed)
        if parquet_out:
            n_msg, n_rep = write_reports_parquet(output, messages, commit=charge)
        else:
            n_msg, n_rep = write_reports(output, doc["content_hash"], messages, commit=charge)
    render.out.print(f"wrote {n_rep:,} reports from {n_msg:,} devices to {output}")
    if seed is not None:
        render.err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


@click.command("estimate")
@click.option("--headlist", "headlist_path", type=click.Path(dir_okay=False), required=True,
              help="Head-list JSON the devices randomized over.")
@click.option("--optin-estimates", "optin_path", type=click.Path(dir_okay=False), required=True,
              help="Opt-in estimates written by `hybriddp headlist`.")
@click.option("--reports", "reports_path", type=click.Path(), required=True, multiple=True,
              help="Reports written by `hybriddp randomize`: a JSON Lines file (.gz ok) or a Parquet reports "
                   "directory (or file); repeat for several. A message id seen twice is counted once. "
                   "--engine spark reads Parquet only.")
@click.option("--strict-ids", is_flag=True,
              help="With --engine spark: also check that every message id is URL-safe base64, as the numpy engine "
                   "and the service do (a regular expression per report, ~60% more time). Default: ids are "
                   "checked for their length (22 bytes) only.")
@output_options
@defense_options
@engine_options("the reports")
def estimate_cmd(headlist_path: str, optin_path: str, reports_path: tuple[str, ...], strict_ids: bool,
                 as_json: bool, output: str | None, top: int, no_project: bool, estimator: str | None, engine: str,
                 spark_master: str | None, **defense_knobs: object) -> None:
    """Server: estimate from client reports (ALGORITHM.md §6) and blend with the opt-in estimates (§7).

    With --engine spark the reports (Parquet, one row per report) are checked and counted per
    head-list entry by Spark; only those counts come back to this process."""
    if strict_ids and engine != "spark":
        raise click.BadParameter("--strict-ids is for --engine spark (the numpy engine always checks ids "
                                 "in full)", param_hint="--strict-ids")
    if output:
        check_output_path(output, "--output", OUTPUT_SUFFIXES)
    defense = defense_from(defense_knobs)
    hdoc, edoc = read_release_files(headlist_path, optin_path)
    rel = release_from_documents(hdoc, edoc, headlist_source=headlist_path, estimates_source=optin_path)
    counts = count_report_paths(rel, reports_path, engine, spark_master, strict_ids=strict_ids)
    res = serve_estimates(rel, counts, project=False if no_project else None, estimator=estimator,
                          defense=defense)  # type: ignore[arg-type]
    render.warn_delta(rel.params.delta, counts.messages)
    if output:
        res.write(output)
    if as_json:
        render.print_json(res.to_json())
        return
    render.print_figure9(res, top)
    render.print_summary(res)
    line = f"reports: {counts.reports:,} from {counts.messages:,} device messages"
    if counts.duplicates:
        line += f" ({counts.duplicates:,} repeated message ids counted once)"
    render.out.print(line)
    if output:
        render.out.print(f"wrote {output}")


def count_report_paths(rel: CuratorRelease, paths: tuple[str, ...], engine: str,
                       spark_master: str | None, *, strict_ids: bool = False) -> ReportCounts:
    """Counts of the reports at ``paths`` (JSON Lines or Parquet) for ``rel``, on the chosen engine."""
    if engine == "spark":
        from hybriddp.spark.backend import SparkBackend
        from hybriddp.spark.reports import count_reports_spark
        not_parquet = [p for p in paths if not is_parquet_reports(p)]
        if not_parquet:
            raise DataError(f"--reports {not_parquet[0]}: --engine spark reads Parquet reports (a directory or "
                            ".parquet file); write them with `hybriddp randomize --output DIR.parquet`, or use "
                            "--engine numpy for JSON Lines")
        with render.stage_progress(True) as on_stage:
            if on_stage:
                on_stage("counting reports with Spark")
            return count_reports_spark(SparkBackend(master=spark_master).spark, rel, list(paths),
                                       strict_ids=strict_ids)
    counter = MessageCounter(rel)
    for path in paths:
        reader = read_parquet_messages(path) if is_parquet_reports(path) else read_messages(path)
        for where, msg in reader:
            counter.add(msg, where)
    return counter.result

"""The real workflow across machines: ``headlist`` (curator) → ``randomize`` (devices) →
``estimate`` (server). With the same log, ``--optin-fraction`` and ``--seed`` as ``run``, the
three commands reproduce ``run``'s estimates exactly (same code, same random streams)."""

from __future__ import annotations

from typing import Any

import click
import numpy as np

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
from hybriddp.cli.run import output_options
from hybriddp.client_estimates import estimate_client_probabilities
from hybriddp.device import DeviceHeadList, DeviceLedger, UniformReplay, local_alg, randomize_records
from hybriddp.errors import DataError
from hybriddp.headlist import from_device_json, read_device_json
from hybriddp.io.exchange import (
    curator_release,
    read_optin_estimates,
    read_report_counts,
    write_curator_files,
    write_reports,
)
from hybriddp.noise import noise_factory
from hybriddp.params import BlenderParams
from hybriddp.pipeline import (
    Stages,
    blend_estimates,
    curator_side,
    ledger_charges,
    sample_clients,
    split_optin,
)
from hybriddp.randomizer import LocalAlgParams, chunk_uniforms
from hybriddp.records import NO_URL, RecordLog
from hybriddp.result import BlenderResult
from hybriddp.rng import SEED_WARNING, stage_rng

optin_fraction_option = click.option(
    "--optin-fraction", type=float, default=None,
    help="Simulation only: take the opt-in group out of a full log exactly as `run` does (with the same "
         "--seed). Default: every user in --input is opt-in (headlist) / a device (randomize).")


@click.command("headlist")
@input_options()
@privacy_options(with_optin=False)
@optin_fraction_option
@noise_option()
@seed_option()
@click.option("--out-headlist", type=click.Path(dir_okay=False), default="headlist.json", show_default=True,
              help="Head-list JSON for devices (lists, ε, δ, f_C, m_C, content hash; no estimates).")
@click.option("--out-estimates", type=click.Path(dir_okay=False), default="optin-estimates.json",
              show_default=True, help="The curator's DP estimates over the head list, for `estimate`.")
@ledger_options
def headlist_cmd(input_path: str, fmt: str | None, user_col: str | None, query_col: str, url_col: str | None,
                 row_per_user: bool, skip_bad_rows: bool, optin_fraction: float | None, noise: str,
                 seed: int | None, out_headlist: str, out_estimates: str, ledger_path: str | None,
                 round_name: str | None, lifetime_epsilon: float | None, lifetime_delta: float | None,
                 **knobs: Any) -> None:
    """Curator: build the head list from opt-in users' raw records (ALGORITHM.md §3, §4).

    Reads opt-in records, writes only differentially private outputs: the head list for devices
    and the opt-in estimates for the server. Keep the raw opt-in log under access control and
    delete it when no longer needed.
    """
    params = make_params(optin_fraction=optin_fraction if optin_fraction is not None else 0.05, **knobs)
    with render.bytes_progress("loading", True) as progress:
        log = load_input(input_path, fmt, user_col, query_col, url_col, row_per_user, skip_bad_rows, progress)
    render.warn_delta(params.delta, log.n_users)
    if optin_fraction is not None:
        optin_users, _ = split_optin(log.n_users, optin_fraction, seed)
    else:
        optin_users = np.arange(log.n_users)
    with render.stage_progress(True) as on_stage:
        cur = curator_side(log, optin_users, params, seed=seed, noise_factory=noise_factory(noise),
                           stages=Stages(on_stage))
    hl = cur.optin.head_list
    doc, extra = curator_release(log, params, cur, len(optin_users), seed)
    # charge the opt-in users before anything is released (refused rounds write nothing)
    charged = charge_round(ledger_path, round_name or doc["content_hash"], lifetime_epsilon, lifetime_delta,
                           ledger_charges(log, params, cur))
    write_curator_files(out_headlist, out_estimates, doc, cur.optin, extra)
    render.out.print(f"head list: {hl.n_records} records over {hl.n_queries} queries from {len(optin_users):,} "
                     f"opt-in users ({cur.n_users_s:,} in S, {cur.n_users_t:,} in T)")
    render.out.print(f"wrote {out_headlist} ({doc['content_hash'][:19]}…) and {out_estimates}")
    if charged:
        render.out.print(f"charged round {charged[:27]} to the ledger {ledger_path}")
    if seed is not None:
        render.err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


def _device_records(log: RecordLog, rows: np.ndarray) -> list[tuple[str, str | None]]:
    queries = log.queries.decode(log.query[rows])
    if not log.has_urls:
        return [(q, None) for q in queries]
    urls = log.urls.decode(log.url[rows])
    return [(q, None if uid == NO_URL else u) for q, u, uid in zip(queries, urls, log.url[rows].tolist(),
                                                                    strict=True)]


@click.command("randomize")
@click.option("--headlist", "headlist_path", type=click.Path(dir_okay=False), required=True,
              help="Head-list JSON written by `hybriddp headlist`.")
@input_options()
@optin_fraction_option
@click.option("--single-device", is_flag=True, help="All records in --input belong to one device.")
@click.option("--device-ledger", type=click.Path(dir_okay=False), default=None,
              help="With --single-device: the device's own ledger (JSON); refuses a second report for the same "
                   "head list and reports beyond the lifetime budget (--lifetime-epsilon/--lifetime-delta).")
@click.option("--lifetime-epsilon", type=float, default=None, help="Lifetime ε of a new --device-ledger.")
@click.option("--lifetime-delta", type=float, default=None, help="Lifetime δ of a new --device-ledger.")
@seed_option()
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="reports.jsonl", show_default=True,
              help="Device messages, JSON Lines (.gz ok): one line per device.")
def randomize_cmd(headlist_path: str, input_path: str, fmt: str | None, user_col: str | None, query_col: str,
                  url_col: str | None, row_per_user: bool, skip_bad_rows: bool, optin_fraction: float | None,
                  single_device: bool, device_ledger: str | None, lifetime_epsilon: float | None,
                  lifetime_delta: float | None, seed: int | None, output: str) -> None:
    """Devices: run LocalAlg (ALGORITHM.md §5) on each device's records with the device randomizer.

    Every device samples at most m_C of its records and randomizes each over the head list;
    it reports nothing else. Randomness comes from the OS unless --seed is given.
    """
    doc = read_device_json(headlist_path)
    dhl = DeviceHeadList.from_json(doc)
    if device_ledger is not None and not single_device:
        raise click.BadParameter("--device-ledger needs --single-device (one device, one ledger)",
                                 param_hint="--device-ledger")
    ledger = DeviceLedger(device_ledger, lifetime_epsilon=lifetime_epsilon,
                          lifetime_delta=lifetime_delta) if device_ledger else None
    with render.bytes_progress("loading", True) as progress:
        log = load_input(input_path, fmt, user_col, query_col, url_col, row_per_user, skip_bad_rows, progress)
    if single_device:
        log = RecordLog(np.array([0, log.n_records]), log.query, log.url, log.queries, log.urls, log.has_urls)
    if optin_fraction is not None:
        _, devices = split_optin(log.n_users, optin_fraction, seed)
    else:
        devices = np.arange(log.n_users)
    if seed is None:  # production path: each device samples and randomizes with OS randomness
        def messages() -> Any:
            off = log.user_offsets
            for user in devices.tolist():
                rows = np.arange(off[user], off[user + 1])
                if len(rows):
                    yield randomize_records(dhl, _device_records(log, rows), ledger=ledger)
    else:  # experiments: the same samples and uniforms as the batch randomizer in `run`
        d_c = sample_clients(log, devices, dhl.m_c, seed)
        uniforms = np.concatenate([np.empty((3, 0))] + [v for _, v in chunk_uniforms(
            stage_rng(seed, "randomizer"), len(d_c))], axis=1)
        records = _device_records(log, d_c.rows)
        reports = [dhl.decode(*local_alg(*dhl.encode(*rec), dhl, UniformReplay(uniforms[:, i].tolist())))
                   for i, rec in enumerate(records)]
        bounds = np.flatnonzero(np.diff(d_c.user)) + 1

        def messages() -> Any:
            for chunk in np.split(np.arange(len(reports)), bounds):
                if len(chunk):
                    yield {"headlist": doc["content_hash"], "reports": [reports[i] for i in chunk.tolist()]}
    with render.stage_progress(True) as on_stage:
        if on_stage:
            on_stage(f"randomizing {len(devices):,} devices")
        n = write_reports(output, messages())
    render.out.print(f"wrote {n:,} reports from {len(devices):,} devices to {output}")
    if seed is not None:
        render.err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


@click.command("estimate")
@click.option("--headlist", "headlist_path", type=click.Path(dir_okay=False), required=True,
              help="Head-list JSON the devices randomized over.")
@click.option("--optin-estimates", "optin_path", type=click.Path(dir_okay=False), required=True,
              help="Opt-in estimates written by `hybriddp headlist`.")
@click.option("--reports", "reports_path", type=click.Path(dir_okay=False), required=True,
              help="Device messages (JSON Lines, .gz ok) written by `hybriddp randomize`.")
@output_options
def estimate_cmd(headlist_path: str, optin_path: str, reports_path: str, as_json: bool, output: str | None,
                 top: int, no_project: bool) -> None:
    """Server: estimate from client reports (ALGORITHM.md §6) and blend with the opt-in estimates (ALGORITHM.md §7)."""
    doc = read_device_json(headlist_path)
    hl, qv, uv = from_device_json(doc)
    optin, odoc = read_optin_estimates(optin_path, hl, doc)
    counts = read_report_counts(reports_path, doc, hl)
    if counts.sum() == 0:
        raise DataError(f"{reports_path}: no reports; nothing to estimate from the clients")
    pdict = dict(odoc.get("params", {}))
    pdict["project"] = not no_project
    params = BlenderParams(**pdict)
    lp = LocalAlgParams.build(hl, doc["epsilon"], doc["delta"], doc["f_c"], doc["m_c"])
    client = estimate_client_probabilities(counts, hl, lp, doc["m_c"])
    blended = blend_estimates(optin, client, params.project)
    sizes = dict(odoc.get("sizes", {}))
    sizes["reports"] = client.n
    res = BlenderResult(params, hl, qv, uv, optin, client, blended, sizes, str(odoc.get("noise", "laplace")),
                        odoc.get("seed"), bool(doc.get("url_level", True)), float(doc["f_c"]))
    if output:
        res.write(output)
    if as_json:
        render.print_json(res.to_json())
        return
    render.print_figure9(res, top)
    render.print_summary(res)

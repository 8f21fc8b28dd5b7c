"""``hybriddp round …``: the operator's commands on a running ``hybriddp serve`` (admin token needed, except
``status``, ``results`` and an opt-in user's ``upload``).

Every command talks to the server through the SDK (:mod:`hybriddp.sdk`); the options and tokens are in
:mod:`hybriddp.cli.remote`, the tables in :mod:`hybriddp.cli.roundviews`. ``round upload`` is an opt-in
user's command (:mod:`hybriddp.cli.participate`), ``round export`` reads the database
(:mod:`hybriddp.cli.export`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from hybriddp.cli import render
from hybriddp.cli.options import estimator_option, make_params, noise_option, privacy_options, seed_option
from hybriddp.cli.participate import upload_cmd
from hybriddp.cli.remote import admin_client, admin_options, json_option, server_option
from hybriddp.cli.roundviews import print_result_json, print_round, print_rounds, show_round
from hybriddp.cli.sizing import forecast, print_dry_run, print_forecast, sizing_options
from hybriddp.core.atomic import write_private_text
from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.rng import SEED_WARNING

RESULT_SUFFIXES = (".json", ".csv", ".parquet")


@click.group("round")
def round_group() -> None:
    """Operate collection rounds on a running `hybriddp serve` (admin token needed, except `upload`).

    A round goes collecting-optin → headlist-published → collecting-reports → closed →
    results-published: `create`, `enrol` opt-in users (each then runs `upload`), `publish` the
    head list, devices run `hybriddp participate`, then `close` and `results`.
    """


def round_param_options(f: Any) -> Any:
    """The options of a round's parameters (``round create``, ``series create``): kind, privacy, noise,
    projection, estimator, and a mean round's range; :func:`round_params` turns them into the API's ``params``."""
    for option in reversed((
            click.option("--kind", type=click.Choice(["blender", "mean"]), default="blender", show_default=True,
                         help="blender: heavy hitters (queries and URLs); mean: the mean of one numeric value per "
                              "user."),
            privacy_options(with_optin=False),
            noise_option(),
            click.option("--no-project", is_flag=True,
                         help="Skip the projection of blended record estimates onto the probability simplex."),
            estimator_option,
            click.option("--lower", type=float, default=None, help="--kind mean: lower bound of the values (values "
                                                                   "below are clamped to it), in the values' unit."),
            click.option("--upper", type=float, default=None, help="--kind mean: upper bound of the values, in their "
                                                                   "unit."),
            click.option("--sigma2", type=float, default=None, help="--kind mean: the values' variance σ², if known "
                         "(in the unit squared). Default: estimated privately from the opt-in group with part of its "
                         "budget."))):
        f = option(f)
    return f


def round_params(kind: str, noise: str, no_project: bool, estimator: str | None, lower: float | None,
                 upper: float | None, sigma2: float | None, **knobs: Any) -> dict[str, Any]:
    """The API's ``params`` of a round from :func:`round_param_options`, checked (errors name the option)."""
    if kind == "blender":
        if lower is not None or upper is not None or sigma2 is not None:
            raise parameter_error("--lower/--upper/--sigma2", next(v for v in (lower, upper, sigma2) if v is not None),
                                  "unset with --kind blender", "They describe the values of a --kind mean round.")
        p = make_params(project=not no_project, estimator=estimator, **knobs)
        return {"epsilon": p.epsilon, "delta": p.delta, "head_list_size": p.head_list_size, "m_o": p.m_o,
                "m_c": p.m_c, "f_o": p.f_o, "f_c": p.f_c, "noise": noise, "project": p.project,
                "estimator": p.estimator}
    if lower is None or upper is None:
        raise parameter_error("--lower/--upper", None, "given with --kind mean (the public range of the values)",
                              "E.g. --lower 0 --upper 100.")
    from hybriddp.device.mean import NumericRandomizer
    NumericRandomizer(lower=lower, upper=upper, epsilon=knobs["epsilon"])  # refuses a bad range or ε
    params: dict[str, Any] = {"epsilon": knobs["epsilon"], "lower": lower, "upper": upper}
    if sigma2 is not None:
        if not (0 <= sigma2 < float("inf")):
            raise parameter_error("sigma2 (--sigma2)", sigma2, "a finite number >= 0 (the values' variance)")
        params["sigma2"] = sigma2
    return params


@round_group.command("create")
@admin_options
@click.option("--name", default=None, help="A label for people; the round's id is what commands take.")
@round_param_options
@click.option("--retention-hours", type=float, default=None,
              help="Hours after creation at which the round's raw opt-in data are purged at the latest, whatever its "
                   "state (a round still collecting opt-in data is then aborted). Default: the server's, 168 (a week).")
@click.option("--issuance-window", type=float, default=None, metavar="SECONDS",
              help="Seconds after the head list's publication in which devices get their report tokens; the report "
                   "window starts after it (docs/TOKENS.md). Default: 3600.")
@click.option("--report-window", type=float, default=None, metavar="SECONDS",
              help="Seconds of the report window: every device sends at a uniformly random time in it, so report "
                   "times say nothing about token issuance. 0 (with --issuance-window 0): devices send at once, "
                   "which lets the operator link reports to credentials. Default: 3600.")
@click.option("--min-tokens", type=int, default=None,
              help="Reports are refused (and kept by devices to send again) until this many report tokens were "
                   "issued in the round: the smallest anonymity set it accepts. Default: 0.")
@seed_option(help="EXPERIMENTS ONLY: the server's curator uses this seed, so the round has NO privacy; refused unless "
                  "the server runs with --insecure-testing-seeds.")
@sizing_options
@json_option
def create_cmd(server: str, admin_token_file: str | None, kind: str, name: str | None, noise: str, no_project: bool,
               estimator: str | None, lower: float | None, upper: float | None, sigma2: float | None,
               retention_hours: float | None, issuance_window: float | None, report_window: float | None,
               min_tokens: int | None, seed: int | None, expect_optin: int | None, expect_devices: int | None,
               like: str | None, dry_run: bool, as_json: bool, **knobs: Any) -> None:
    """Create a round (state collecting-optin) with all BLENDER parameters (ALGORITHM.md §2), or a mean round
    (--kind mean --epsilon --lower --upper; ALGORITHM.md §11). Prints the round, its id and a BLENDER round's
    forecast: τ, the opt-in users it needs and, with --expect-optin/--expect-devices, the head list's likely size
    and NDCG (--dry-run: the forecast only)."""
    params = round_params(kind, noise, no_project, estimator, lower, upper, sigma2, **knobs)
    fc = forecast(kind, params, expect_optin, expect_devices, like, server, admin_token_file)
    if dry_run:
        print_dry_run(fc, params, as_json)
        return
    for key, v in (("issuance_seconds", issuance_window), ("report_seconds", report_window),
                   ("min_tokens", min_tokens)):
        if v is not None:
            params[key] = v
    with admin_client(server, admin_token_file) as admin:
        rnd = admin.create_round(kind, params, name=name, seed=seed, retention_hours=retention_hours)
    if as_json:
        render.print_json({**rnd, "forecast": None if fc is None else fc.to_json()})
        return
    print_round(rnd)
    print_forecast(fc)
    render.out.print(f"round id: {rnd['id']}")
    if seed is not None:
        render.err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


@round_group.command("status")
@click.argument("round_id")
@server_option
@json_option
def status_cmd(round_id: str, server: str, as_json: bool) -> None:
    """A round's state, parameters and counts (no token needed). With HYBRIDDP_ADMIN_TOKEN set, the
    administrators' view: the live opt-in counts too."""
    from hybriddp.sdk import DeviceClient
    if os.environ.get("HYBRIDDP_ADMIN_TOKEN", "").strip():
        with admin_client(server, None) as admin:
            rnd = admin.round(round_id)
    else:
        with DeviceClient(server, round_id) as dev:
            rnd = dev.round()
    show_round(rnd, as_json)


@round_group.command("list")
@admin_options
@json_option
def list_cmd(server: str, admin_token_file: str | None, as_json: bool) -> None:
    """Every round on the server, one line each."""
    with admin_client(server, admin_token_file) as admin:
        rounds = admin.rounds()
    if as_json:
        render.print_json({"rounds": rounds})
    else:
        print_rounds(rounds)


@round_group.command("enrol")
@click.argument("round_id")
@admin_options
@click.option("--user", "users", multiple=True, help="An opt-in user's identifier (repeat for several). The "
              "server keeps only a keyed pseudonym of it, for the privacy ledger.")
@click.option("--users-file", type=click.Path(dir_okay=False), default=None,
              help="A file with one user identifier per line (in addition to --user).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write each user's token to DIR/<user>.token (mode 0600; the identifier percent-encoded, a "
                   "leading dot too, so any identifier is a safe, visible file name) for `round upload "
                   "--token-file`, instead of printing the tokens. DIR is created if missing; refused before "
                   "enrolling anyone if a file would be replaced.")
@json_option
def enrol_cmd(round_id: str, server: str, admin_token_file: str | None, users: tuple[str, ...],
              users_file: str | None, out_dir: str | None, as_json: bool) -> None:
    """Enrol opt-in users; prints each user's upload token (shown once: the server stores only its hash), or writes
    one token file per user with --out (`--json` prints them as one object)."""
    names = list(users)
    if users_file is not None:
        try:
            with open(users_file, encoding="utf-8") as fh:
                names += [line.strip() for line in fh if line.strip()]
        except (FileNotFoundError, UnicodeDecodeError) as exc:
            raise DataError(f"--users-file {users_file}: cannot read it ({exc})") from None
    if not names:
        raise parameter_error("--user", None, "given at least once (or --users-file)")
    paths = token_paths(Path(out_dir), names) if out_dir is not None else None
    with admin_client(server, admin_token_file) as admin:
        tokens = [admin.enrol(round_id, u) for u in names] if len(names) == 1 else admin.enrol_many(round_id, names)
    if paths is not None:
        for path, token in zip(paths, tokens, strict=True):
            write_private_text(path, token + "\n")
        if as_json:
            files = {u: str(p) for u, p in zip(names, paths, strict=True)}
            render.print_json({"round": round_id, "token_files": files})
        else:
            render.out.print(f"wrote {len(paths)} token files to {out_dir}/ (one per user, mode 0600; each user "
                             f"uploads with `hybriddp round upload {round_id} --token-file <file>`)")
        return
    if as_json:
        render.print_json({"round": round_id, "tokens": dict(zip(names, tokens, strict=True))})
        return
    t = Table(title=f"opt-in tokens for round {round_id} (give each user theirs; they are not shown again)",
              title_justify="left")
    t.add_column("user", overflow="fold")
    t.add_column("token", overflow="fold")
    for u, tok in zip(names, tokens, strict=True):
        t.add_row(u, tok)
    render.out.print(t)



def token_paths(directory: Path, names: list[str]) -> list[Path]:
    """DIR/<percent-encoded user>.token for every user: checked before anything is enrolled (the directory is made
    if missing; a name given twice, or a file that exists, is refused: a token file is never replaced)."""
    from urllib.parse import quote

    dup = next((u for u, n in Counter(names).items() if n > 1), None)
    if dup is not None:
        raise parameter_error("--user/--users-file", dup, "each user once", "A user enrolled twice gets one token.")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise DataError(f"--out {directory}: cannot create the directory ({exc.strerror})") from None
    encoded = [quote(u, safe="") for u in names]  # no "/" survives; a leading "." would hide the file
    paths = [directory / f"{'%2E' + e[1:] if e.startswith('.') else e}.token" for e in encoded]
    existing = [p for p in paths if p.exists()]
    if existing:
        raise DataError(f"--out {directory}: {existing[0].name} exists ({len(existing)} of the users' token files "
                        "do). Token files are never replaced: use an empty directory, or remove the old files first.")
    return paths


round_group.add_command(upload_cmd)


@round_group.command("publish")
@click.argument("round_id")
@admin_options
@json_option
def publish_cmd(round_id: str, server: str, admin_token_file: str | None, as_json: bool) -> None:
    """Build the head list from the opt-in records (ALGORITHM.md §3, §4), charge the privacy ledger, publish it
    to devices and delete the raw opt-in records (a round over a user's lifetime budget is refused)."""
    with admin_client(server, admin_token_file) as admin:
        rnd = admin.publish_headlist(round_id)
    show_round(rnd, as_json)
    if rnd.get("state") == "headlist-empty":
        render.err.print("[yellow]the head list is empty: no opt-in record passed the privacy threshold. That "
                         "outcome is a release: it was charged to the opt-in users and the round has ended "
                         f"(hybriddp round results {round_id} says why); a new round is a new release[/yellow]")


@round_group.command("abort")
@click.argument("round_id")
@admin_options
@json_option
def abort_cmd(round_id: str, server: str, admin_token_file: str | None, as_json: bool) -> None:
    """End a round that is still collecting opt-in data: its raw opt-in records (or values), upload tokens and
    upload keys are deleted from the database and its files. Nothing was released, so nothing is charged."""
    with admin_client(server, admin_token_file) as admin:
        rnd = admin.abort(round_id)
    show_round(rnd, as_json)


@round_group.command("delete")
@click.argument("round_id")
@admin_options
@click.option("--yes", is_flag=True, help="Confirm: the round's reports, documents and results are deleted for good.")
@json_option
def delete_cmd(round_id: str, server: str, admin_token_file: str | None, yes: bool, as_json: bool) -> None:
    """Delete a round in any state but building-headlist: its raw opt-in data, tokens, device reports, head list,
    estimates and results. Its id, parameters and ledger charges stay (what was released stays spent)."""
    if not yes:
        raise parameter_error("--yes", False, "given", f"`hybriddp round delete {round_id} --yes` deletes the round's "
                              "reports and results for good; `round abort` ends a round still collecting opt-in data")
    with admin_client(server, admin_token_file) as admin:
        rnd = admin.delete_round(round_id)
    show_round(rnd, as_json)


@round_group.command("close")
@click.argument("round_id")
@admin_options
@json_option
@click.option("--flagged", type=click.Choice(["hold", "publish", "remove"]), default="hold", show_default=True,
              help="When the check against the opt-in group flags the results (fake device reports, "
                   "docs/ALGORITHM.md §7.2): hold them unpublished for `round publish-results`, publish them "
                   "(flagged entries carry their opt-in estimates), or publish them without the flagged entries.")
def close_cmd(round_id: str, server: str, admin_token_file: str | None, as_json: bool, flagged: str) -> None:
    """Close the round (reports are refused from now on), compute the results and check them against the opt-in
    group (ALGORITHM.md §6, §7, §7.2). Held results are shown for judging: each flagged entry with its opt-in and
    device estimates, the test, the fake reports that would explain the gap and what keeping or removing it
    publishes (with --json, as the round's ``anchor_check``)."""
    with admin_client(server, admin_token_file) as admin:
        rnd = admin.close(round_id, flagged)
        check = admin.results(round_id).get("anchor_check") if rnd["state"] == "results-held" else None
    if as_json:
        render.print_json({**rnd, "anchor_check": check} if check else rnd)
        return
    show_round(rnd, as_json)
    if check:
        render.print_held(check)
        fakes = check.get("estimated_fake_values")
        evidence = (f"at least {check.get('excess_reports', 0):,.0f} fake reports" if "optin_mean" not in check
                    else "" if fakes is None else f"about {fakes:,.1f} extreme values")
        render.err.print(f"[red]the results are held: {check['verdict']}; {evidence}. Publish them with "
                         f"`hybriddp round publish-results {round_id}` (--flagged remove leaves the flagged entries "
                         "out), or delete the round[/red]")


@round_group.command("publish-results")
@click.argument("round_id")
@admin_options
@json_option
@click.option("--flagged", type=click.Choice(["keep", "remove"]), default="keep", show_default=True,
              help="keep: publish the held results as they are (flagged entries carry their opt-in estimates); "
                   "remove: publish them without the flagged entries.")
def publish_results_cmd(round_id: str, server: str, admin_token_file: str | None, as_json: bool,
                        flagged: str) -> None:
    """Publish the results a close held because the check against the opt-in group flagged them
    (docs/ALGORITHM.md §7.2)."""
    with admin_client(server, admin_token_file) as admin:
        rnd = admin.publish_results(round_id, flagged)
    show_round(rnd, as_json)


@round_group.command("results")
@click.argument("round_id")
@server_option
@json_option
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Also write the results: .json (everything, as the server serves it), .csv or .parquet (one row "
                   "per head-list record).")
@click.option("--top", type=int, default=10, show_default=True, help="Rows of the top-queries table (>= 1).")
def results_cmd(round_id: str, server: str, as_json: bool, output: str | None, top: int) -> None:
    """The round's published results: blended, opt-in and client estimates with variances (no token needed)."""
    from hybriddp.core.atomic import check_output_path, write_bytes
    from hybriddp.sdk import DeviceClient
    if top < 1:
        raise parameter_error("top (--top)", top, "an integer >= 1")
    if output:
        check_output_path(output, "--output", RESULT_SUFFIXES)
    with DeviceClient(server, round_id) as dev:
        obj = dev.results("json")
        if output:
            suffix = os.path.splitext(output)[1].lower()
            data = (json.dumps(obj, indent=2).encode("utf-8") if suffix == ".json"
                    else dev.results(suffix.lstrip(".")))
            write_bytes(output, data)
    if as_json:
        render.print_json(obj)
    else:
        print_result_json(obj, top)
    if output and not as_json:
        render.out.print(f"wrote {output}")


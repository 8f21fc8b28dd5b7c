"""``hybriddp round …`` and ``hybriddp participate``: the collection service from the command line.

Every command talks to a running ``hybriddp serve`` through the SDK (:mod:`hybriddp.client`):
the operator's commands need the admin token (``--admin-token-file`` or ``HYBRIDDP_ADMIN_TOKEN``),
an opt-in user's upload needs the token from enrolment, a device needs nothing but the round id.
``demo_through_service`` is ``hybriddp demo --service``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from hybriddp.cli import render
from hybriddp.cli.options import (
    estimator_option,
    input_options,
    load_input,
    make_params,
    noise_option,
    privacy_options,
    seed_option,
)
from hybriddp.errors import DataError, parameter_error
from hybriddp.rng import SEED_WARNING

DEFAULT_SERVER = "http://127.0.0.1:8000"
RESULT_SUFFIXES = (".json", ".csv", ".parquet")


# ----- shared options -------------------------------------------------------------------------------
def server_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--server", envvar="HYBRIDDP_SERVER", default=DEFAULT_SERVER, show_default=True,
                        help="Base URL of `hybriddp serve` (environment: HYBRIDDP_SERVER).")(f)


def admin_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--admin-token-file", type=click.Path(dir_okay=False), default=None,
                     help="File holding the admin token `hybriddp serve` was started with. Default: the "
                          "HYBRIDDP_ADMIN_TOKEN environment variable.")(f)
    return server_option(f)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print the server's JSON instead of a table.")(f)


def read_token(path: str | None, env: str, what: str, option: str) -> str:
    """A bearer token from a file (first line) or the environment; a clear error when neither has one."""
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.readline().strip()
        except FileNotFoundError:
            raise DataError(f"{option} {path}: no such file; give the file holding the {what}") from None
        except UnicodeDecodeError:
            raise DataError(f"{option} {path} is not a text file; it must hold the {what} on its first line") from None
        if not token:
            raise DataError(f"{option} {path} is empty; it must hold the {what} on its first line")
        return token
    token = os.environ.get(env, "").strip()
    if not token:
        raise DataError(f"no {what}: give {option} FILE or set the environment variable {env}")
    return token


def _admin(server: str, token_file: str | None) -> Any:
    from hybriddp.client import AdminClient
    return AdminClient(server, read_token(token_file, "HYBRIDDP_ADMIN_TOKEN", "admin token", "--admin-token-file"))


# ----- rendering --------------------------------------------------------------------------------------
def print_round(rnd: dict[str, Any]) -> None:
    """One round as a two-column table."""
    t = Table(title=f"round {rnd.get('id')}", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    counts = rnd.get("counts") or {}
    rows = [("name", rnd.get("name") or ""), ("kind", rnd.get("kind")), ("state", rnd.get("state")),
            ("created", rnd.get("created")), ("head list", rnd.get("headlist_hash") or "(not published)")]
    rows += [(k.replace("_", " "), f"{v:,}" if isinstance(v, int) else "(administrators only)" if v is None
              else str(v)) for k, v in counts.items()]
    rows += [("params", json.dumps(rnd.get("params"), sort_keys=True))]
    if rnd.get("retention_deadline"):
        rows.append(("raw data", f"purged {rnd['raw_data_purged']}" if rnd.get("raw_data_purged")
                     else f"kept until {rnd['retention_deadline']} at the latest"))
    seed = (rnd.get("params") or {}).get("seed")
    if seed is not None or rnd.get("non_private"):
        shown = "" if seed is None else f"{seed} — "
        rows.append(("NON-PRIVATE", f"{shown}{rnd.get('warning') or SEED_WARNING}"))
    for k, v in rows:
        t.add_row(str(k), str(v))
    render.out.print(t)


def show_round(rnd: dict[str, Any], as_json: bool) -> None:
    """One round as JSON (``--json``) or as the table of :func:`print_round`."""
    if as_json:
        render.print_json(rnd)
    else:
        print_round(rnd)


def print_rounds(rounds: list[dict[str, Any]]) -> None:
    """Every round, one row each."""
    t = Table(title=f"{len(rounds)} round{'s' * (len(rounds) != 1)}", title_justify="left")
    t.add_column("id", no_wrap=True)  # copied into other commands: never folded
    for col in ("name", "kind", "state", "created (UTC)", "opt-in users", "reports"):
        t.add_column(col, justify="right" if col in ("opt-in users", "reports") else "left", overflow="fold")
    for r in rounds:
        c = r.get("counts") or {}
        created = str(r.get("created") or "")[:16].replace("T", " ")
        t.add_row(str(r.get("id")), str(r.get("name") or ""), str(r.get("kind")), str(r.get("state")),
                  created, f"{c.get('optin_users', 0):,}", f"{c.get('reports', 0):,}")
    render.out.print(t)


def _num(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) and math.isfinite(x) else "—"


def print_result_json(obj: dict[str, Any], top: int) -> None:
    """A round's results (the server's JSON): the top queries by blended estimate, then the guarantee."""
    if "queries" not in obj:  # a mean round: the opt-in, client and hybrid estimates (ALGORITHM.md §11)
        t = Table(title="mean estimates", title_justify="left")
        for col in ("estimator", "estimate", "variance", "n", "weight opt-in"):
            t.add_column(col, justify="left" if col == "estimator" else "right")
        for key in ("optin", "client", "hybrid"):
            e = obj.get(key) or {}
            t.add_row(key, _num(e.get("estimate")), _num(e.get("variance")), f"{e.get('n', 0):,}",
                      _num(e.get("weight_optin")))
        render.out.print(t)
        render.out.print(f"variance of the values: {_num(obj.get('sigma2'))} ({obj.get('sigma2_source')}); "
                         f"privacy: {obj.get('guarantee')}")
        if obj.get("seed") is not None or (obj.get("params") or {}).get("seed") is not None:
            render.err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")
        return
    queries = [q for q in obj["queries"] if q.get("query") != "*"]
    queries.sort(key=lambda q: -(q.get("p_blended") if isinstance(q.get("p_blended"), (int, float)) else -1.0))
    t = Table(title="Top queries by blended estimate (paper Fig. 9 columns)", title_justify="left")
    t.add_column("query", overflow="fold", max_width=40)
    cols = [("p_blended", "blended p̂_q"), ("p_optin_sum", "opt-in Σ_u"), ("p_client_direct", "client p̂_C,q"),
            ("p_client_sum", "client Σ_u")]
    for _, head in cols:
        t.add_column(head, justify="right")
    for q in queries[:top]:
        t.add_row(str(q["query"]), *(_num(q.get(k)) for k, _ in cols))
    render.out.print(t)
    render.out.print(f"head list: {obj.get('head_list_records')} records over {obj.get('head_list_queries')} queries")
    s = obj.get("sizes") or {}
    if "reports" in s:
        render.out.print(f"reports: {s['reports']:,}; opt-in users: {s.get('optin_users', 0):,}")
    g = obj.get("privacy") or {}
    for key, label in (("optin_users", "opt-in users"), ("clients", "clients")):
        if key in g:
            render.out.print(f"privacy, {label}: {g[key]}")
    if obj.get("seed") is not None:
        render.err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


# ----- hybriddp round ---------------------------------------------------------------------------------
@click.group("round")
def round_group() -> None:
    """Operate collection rounds on a running `hybriddp serve` (admin token needed, except `upload`).

    A round goes collecting-optin → headlist-published → collecting-reports → closed →
    results-published: `create`, `enrol` opt-in users (each then runs `upload`), `publish` the
    head list, devices run `hybriddp participate`, then `close` and `results`.
    """


@round_group.command("create")
@admin_options
@click.option("--kind", type=click.Choice(["blender", "mean"]), default="blender", show_default=True,
              help="blender: heavy hitters (queries and URLs); mean: the mean of one numeric value per user.")
@click.option("--name", default=None, help="A label for people; the round's id is what commands take.")
@privacy_options(with_optin=False)
@noise_option()
@click.option("--no-project", is_flag=True,
              help="Skip the projection of blended record estimates onto the probability simplex.")
@estimator_option
@click.option("--lower", type=float, default=None, help="--kind mean: lower bound of the values (values below are "
                                                        "clamped to it), in the values' unit.")
@click.option("--upper", type=float, default=None, help="--kind mean: upper bound of the values, in their unit.")
@click.option("--sigma2", type=float, default=None, help="--kind mean: the values' variance σ², if known (in the "
              "unit squared). Default: estimated privately from the opt-in group with part of its budget.")
@click.option("--retention-hours", type=float, default=None,
              help="Hours after creation at which the round's raw opt-in data are purged at the latest, whatever its "
                   "state (a round still collecting opt-in data is then aborted). Default: the server's, 168 (a week).")
@seed_option(help="EXPERIMENTS ONLY: the server's curator uses this seed, so the round has NO privacy; refused unless "
                  "the server runs with --insecure-testing-seeds.")
@json_option
def create_cmd(server: str, admin_token_file: str | None, kind: str, name: str | None, noise: str, no_project: bool,
               estimator: str | None, lower: float | None, upper: float | None, sigma2: float | None,
               retention_hours: float | None, seed: int | None, as_json: bool, **knobs: Any) -> None:
    """Create a round (state collecting-optin) with all BLENDER parameters (ALGORITHM.md §2), or a mean round
    (--kind mean --epsilon --lower --upper; ALGORITHM.md §11). Prints the round and its id."""
    if kind == "blender":
        if lower is not None or upper is not None or sigma2 is not None:
            raise parameter_error("--lower/--upper/--sigma2", next(v for v in (lower, upper, sigma2) if v is not None),
                                  "unset with --kind blender", "They describe the values of a --kind mean round.")
        p = make_params(project=not no_project, estimator=estimator, **knobs)
        params: dict[str, Any] = {"epsilon": p.epsilon, "delta": p.delta, "head_list_size": p.head_list_size,
                                  "m_o": p.m_o, "m_c": p.m_c, "f_o": p.f_o, "f_c": p.f_c, "noise": noise,
                                  "project": p.project, "estimator": p.estimator}
    else:
        if lower is None or upper is None:
            raise parameter_error("--lower/--upper", None, "given with --kind mean (the public range of the values)",
                                  "E.g. --lower 0 --upper 100.")
        from hybriddp.mean_device import NumericRandomizer
        NumericRandomizer(lower=lower, upper=upper, epsilon=knobs["epsilon"])  # refuses a bad range or ε
        params = {"epsilon": knobs["epsilon"], "lower": lower, "upper": upper}
        if sigma2 is not None:
            if not (0 <= sigma2 < float("inf")):
                raise parameter_error("sigma2 (--sigma2)", sigma2, "a finite number >= 0 (the values' variance)")
            params["sigma2"] = sigma2
    with _admin(server, admin_token_file) as admin:
        rnd = admin.create_round(kind, params, name=name, seed=seed, retention_hours=retention_hours)
    if as_json:
        render.print_json(rnd)
        return
    print_round(rnd)
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
    from hybriddp.client import DeviceClient
    if os.environ.get("HYBRIDDP_ADMIN_TOKEN", "").strip():
        with _admin(server, None) as admin:
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
    with _admin(server, admin_token_file) as admin:
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
@json_option
def enrol_cmd(round_id: str, server: str, admin_token_file: str | None, users: tuple[str, ...],
              users_file: str | None, as_json: bool) -> None:
    """Enrol opt-in users; prints each user's upload token (shown once: the server stores only its hash)."""
    names = list(users)
    if users_file is not None:
        try:
            with open(users_file, encoding="utf-8") as fh:
                names += [line.strip() for line in fh if line.strip()]
        except (FileNotFoundError, UnicodeDecodeError) as exc:
            raise DataError(f"--users-file {users_file}: cannot read it ({exc})") from None
    if not names:
        raise parameter_error("--user", None, "given at least once (or --users-file)")
    with _admin(server, admin_token_file) as admin:
        tokens = [admin.enrol(round_id, u) for u in names] if len(names) == 1 else admin.enrol_many(round_id, names)
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


@round_group.command("upload")
@click.argument("round_id")
@server_option
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="File holding this opt-in user's token (from `round enrol`). Default: the HYBRIDDP_OPTIN_TOKEN "
                   "environment variable.")
@input_options(required=False)
@click.option("--value", "values", type=float, multiple=True,
              help="Mean rounds: a raw value to upload (repeat for several), in the round's unit.")
def upload_cmd(round_id: str, server: str, token_file: str | None, input_path: str | None, fmt: str | None,
               user_col: str | None, query_col: str, url_col: str | None, row_per_user: bool, skip_bad_rows: bool,
               values: tuple[float, ...]) -> None:
    """An opt-in user uploads their raw records (--input: all rows are this user's) or values (--value).

    Raw data goes only over this authenticated path; the server deletes it when it publishes the head list.
    """
    from hybriddp.client import OptinUploader
    if (input_path is None) == (not values):
        raise parameter_error("--input/--value", None, "exactly one of them: --input RECORDS for a blender round, "
                              "--value X (repeatable) for a mean round")
    token = read_token(token_file, "HYBRIDDP_OPTIN_TOKEN", "opt-in token", "--token-file")
    with OptinUploader(server, round_id, token) as up:
        if values:
            n = up.upload_values(values)
        else:
            records = _device_records(input_path, fmt, user_col, query_col, url_col, skip_bad_rows)
            n = up.upload(records)
    what = "values" if values else "records"
    render.out.print(f"uploaded {n:,} new {what} to round {round_id}"
                     + ("" if n else f" (the server had these {what} from an earlier upload: a repeat is acknowledged "
                                     "and not stored again)"))


@round_group.command("publish")
@click.argument("round_id")
@admin_options
@json_option
def publish_cmd(round_id: str, server: str, admin_token_file: str | None, as_json: bool) -> None:
    """Build the head list from the opt-in records (ALGORITHM.md §3, §4), charge the privacy ledger, publish it
    to devices and delete the raw opt-in records (a round over a user's lifetime budget is refused)."""
    with _admin(server, admin_token_file) as admin:
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
    with _admin(server, admin_token_file) as admin:
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
    with _admin(server, admin_token_file) as admin:
        rnd = admin.delete_round(round_id)
    show_round(rnd, as_json)


@round_group.command("close")
@click.argument("round_id")
@admin_options
@json_option
def close_cmd(round_id: str, server: str, admin_token_file: str | None, as_json: bool) -> None:
    """Close the round (reports are refused from now on) and compute the results (ALGORITHM.md §6, §7)."""
    with _admin(server, admin_token_file) as admin:
        rnd = admin.close(round_id)
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
    from hybriddp.client import DeviceClient
    from hybriddp.io.atomic import check_output_path, write_bytes
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


# ----- hybriddp participate ---------------------------------------------------------------------------
def _device_records(input_path: str, fmt: str | None, user_col: str | None, query_col: str, url_col: str | None,
                    skip_bad_rows: bool) -> list[tuple[str, str | None]]:
    """Every record of the file, as one device's (query, url) records."""
    import numpy as np

    from hybriddp.parties.device import device_records
    log = load_input(input_path, fmt, user_col, query_col, url_col, user_col is None, skip_bad_rows)
    return device_records(log, np.arange(log.n_records))


@click.command("participate")
@server_option
@click.option("--round", "round_id", required=True, help="The round's id (from the operator).")
@input_options(required=False)
@click.option("--value", type=float, default=None, help="Mean rounds: this device's value, in the round's unit "
              "(clamped to the round's bounds, then randomized on the device).")
@click.option("--device-ledger", type=click.Path(dir_okay=False), default=None,
              help="This device's own privacy ledger (JSON); charged before anything is sent, it refuses a second "
                   "report for the same round and reports beyond the lifetime budget. Default: device-ledger.json "
                   "in hybriddp's data directory ($HYBRIDDP_DATA_HOME, else $XDG_DATA_HOME/hybriddp, else "
                   "~/.local/share/hybriddp).")
@click.option("--no-device-ledger", is_flag=True,
              help="TESTS AND SIMULATIONS ONLY: keep no device ledger, so every run is charged by nobody: nothing "
                   "stops a second report in the same round or reports past the lifetime budget.")
@click.option("--lifetime-epsilon", type=float, default=None,
              help="Lifetime ε of a new device ledger [default: 16]; an existing ledger keeps its own.")
@click.option("--lifetime-delta", type=float, default=None,
              help="Lifetime δ of a new device ledger [default: 1e-4]; an existing ledger keeps its own.")
@click.option("--outbox", type=click.Path(dir_okay=False), default=None,
              help="File keeping the message until the server acknowledges it; if a run fails, running the same "
                   "command again resends it unchanged (counted once, not charged again). Default: next to the "
                   "device ledger (none with --no-device-ledger).")
@click.option("--retries", type=int, default=5, show_default=True,
              help="Retries after the first try on connection errors, timeouts, HTTP 429 and 5xx (exponential "
                   "backoff from 0.2 s to 10 s, with jitter); 0 = no retry.")
@json_option
def participate_cmd(server: str, round_id: str, input_path: str | None, fmt: str | None, user_col: str | None,
                    query_col: str, url_col: str | None, row_per_user: bool, skip_bad_rows: bool, value: float | None,
                    device_ledger: str | None, no_device_ledger: bool, lifetime_epsilon: float | None,
                    lifetime_delta: float | None, outbox: str | None, retries: int, as_json: bool) -> None:
    """One device takes part in a round: fetch and verify the head list, randomize its records on the device
    (LocalAlg, ALGORITHM.md §5; every row of --input is this device's) and submit the message.

    The device ledger (by default the per-user one) is charged before the message leaves: a second report in
    the same round, or one past the lifetime budget, is refused with nothing sent (exit status 2); a message
    resent from the outbox is the same report and is not charged again."""
    from hybriddp.client import DeviceClient, RetryPolicy
    from hybriddp.device import DeviceLedgerRefusal, open_device_ledger
    if (input_path is None) == (value is None):
        raise parameter_error("--input/--value", None, "exactly one of them: --input RECORDS for a blender round, "
                              "--value X for a mean round")
    if retries < 0 or retries > 100:
        raise parameter_error("retries (--retries)", retries, "an integer from 0 to 100")
    given = [flag for flag, v in (("--device-ledger", device_ledger), ("--lifetime-epsilon", lifetime_epsilon),
                                  ("--lifetime-delta", lifetime_delta)) if v is not None]
    if no_device_ledger and given:
        raise click.BadParameter(f"{given[0]} and --no-device-ledger contradict each other; give one of them",
                                 param_hint="--no-device-ledger")
    if no_device_ledger:
        render.err.print("[yellow]warning: --no-device-ledger: this report is charged to no device ledger, so "
                         "nothing stops a second report in this round or one past the lifetime budget (tests and "
                         "simulations only)[/yellow]")
    ledger = DeviceClient.NO_LEDGER if no_device_ledger else open_device_ledger(
        device_ledger, lifetime_epsilon=lifetime_epsilon, lifetime_delta=lifetime_delta)
    records = None if input_path is None else _device_records(input_path, fmt, user_col, query_col, url_col,
                                                                skip_bad_rows)
    where = {"outbox": outbox} if outbox is not None else {}  # default: next to the device ledger
    try:
        with DeviceClient(server, round_id, ledger, retry=RetryPolicy(attempts=retries + 1), **where) as dev:
            ack = dev.participate_value(value) if records is None else dev.participate(records)
    except DeviceLedgerRefusal as exc:
        raise exc.explained("pass --no-device-ledger only for tests and simulations") from None
    if as_json:
        render.print_json({"round": round_id, "acknowledged": ack.acknowledged, "counted": ack.counted,
                           "duplicates": ack.duplicates})
        return
    state = "counted" if ack.counted else "already counted (a resent message)"
    render.out.print(f"round {round_id}: message acknowledged, {state}")


# ----- hybriddp demo --service ---------------------------------------------------------------------------
def demo_through_service(log: Any, params: Any, *, seed: int | None, as_json: bool, output: str | None, top: int,
                         algorithm: str, noise: str, source: str) -> None:
    """``hybriddp demo --service``: the same round as ``demo``, through a real local server
    (:func:`hybriddp.service.demo.service_demo`); prints the same tables (or JSON)."""
    from hybriddp.cli.run import check_output
    from hybriddp.groups import check_algorithm_params, check_group_sizes
    from hybriddp.pipeline import Stages
    from hybriddp.service.demo import service_demo

    if algorithm != "blender":
        raise parameter_error("--algorithm", algorithm, "blender with --service",
                              "The collection service runs BLENDER rounds; drop --service to simulate the baselines.")
    check_output(output)
    check_algorithm_params(algorithm, params, log)
    check_group_sizes(log, params, algorithm, noise, source)
    render.warn_delta(params.delta, log.n_users)
    with render.interruptible(), render.stage_progress(not as_json) as on_stage:
        stages = Stages(on_stage)
        done = service_demo(log, params, seed=seed, noise=noise, stages=stages)
    res = done.result
    if output:
        res.write(output)
    service = {"round": done.round["id"], "state": done.round["state"], "messages_acknowledged":
               done.reports.acknowledged, "messages_counted": done.reports.counted,
               "duplicates": done.reports.duplicates, "database": "temporary SQLite"}
    if as_json:
        obj = res.to_json()
        obj["stage_seconds"] = stages.seconds
        obj["service"] = service
        render.print_json(obj)
        return
    render.print_figure9(res, top)
    render.print_summary(res)
    render.out.print(f"service: round {service['round']} on a local server with a temporary SQLite database; "
                     f"{done.reports.acknowledged:,} device messages acknowledged ({done.reports.counted:,} counted)")
    if output:
        render.out.print(f"wrote {output}")


# ----- hybriddp serve --demo -------------------------------------------------------------------------------
DEMO_SCALE = 0.1
"""`serve --demo`: the aol preset at this scale (52k users, 2.6k opt-in) runs in well under a minute."""


def populate_demo_round(db_url: str, lifetime_epsilon: float | None,
                        lifetime_delta: float | None) -> tuple[str, str | None]:
    """``hybriddp serve --demo``: run a demo round into the database before serving and leave a second one
    collecting reports; returns their ids (finished, collecting)."""
    from hybriddp.pipeline import Stages
    from hybriddp.service.demo import populate_demo

    render.err.print(f"running a demo round (the aol preset at --scale {DEMO_SCALE:g}, paper defaults) through the "
                     "service into the database, then opening a second one for reports …")
    with render.interruptible(), render.stage_progress(True) as on_stage:
        done = populate_demo(db_url, scale=DEMO_SCALE, lifetime_epsilon=lifetime_epsilon,
                             lifetime_delta=lifetime_delta, stages=Stages(on_stage))
    res = done.result
    click.echo(f"demo round {done.round['id']}: {render.head_list_size(res.head_list, res.url_level)}, "
               f"{done.reports.counted:,} device reports, results published")
    if done.collecting is not None:
        click.echo(f"demo round {done.collecting['id']}: head list published, collecting reports")
    return str(done.round["id"]), None if done.collecting is None else str(done.collecting["id"])

"""The data owners' commands: an opt-in user's ``hybriddp round upload`` and a device's ``hybriddp participate``.

Both read the owner's own records with the loaders' options (:func:`hybriddp.cli.options.input_options`) and
talk to a running ``hybriddp serve`` through the SDK (:mod:`hybriddp.sdk`): the upload with the token from
enrolment (ALGORITHM.md §3's opt-in group), the device with the round id and its device credential, for the report
token its message needs (LocalAlg on the device, ALGORITHM.md §5; docs/TOKENS.md).
"""

from __future__ import annotations

import os

import click

from hybriddp.cli import render
from hybriddp.cli.options import input_options, load_input
from hybriddp.cli.remote import json_option, read_token, server_option
from hybriddp.core.errors import parameter_error


def _device_records(input_path: str, fmt: str | None, user_col: str | None, query_col: str, url_col: str | None,
                    skip_bad_rows: bool) -> list[tuple[str, str | None]]:
    """Every record of the file, as one device's (query, url) records."""
    import numpy as np

    from hybriddp.device.party import device_records
    log = load_input(input_path, fmt, user_col, query_col, url_col, user_col is None, skip_bad_rows)
    return device_records(log, np.arange(log.n_records))



def _when(seconds: float | None) -> str:
    from hybriddp.core.tokens import format_time
    return format_time(seconds or 0.0)


def _announce(round_id: str, send_at: float | None) -> None:
    """Say on stderr when the waiting device will send (a random time in the report window)."""
    render.err.print(f"round {round_id}: token got; the message will be sent at {_when(send_at)} (a uniformly random "
                     "time in the round's report window; --no-wait to exit and send later, --report-now for tests)")


@click.command("upload")
@click.argument("round_id")
@server_option
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="File holding this opt-in user's token (from `round enrol`). Default: the HYBRIDDP_OPTIN_TOKEN "
                   "environment variable.")
@input_options(required=False)
@click.option("--value", "values", type=float, multiple=True,
              help="Mean rounds: a raw value to upload (repeat for several), in the round's unit.")
@click.option("--device-ledger", type=click.Path(dir_okay=False), default=None,
              help="This person's device ledger (as `participate --device-ledger`): the round's (ε, δ) is recorded "
                   "there before the upload, so the ledger counts this person's opt-in rounds and device reports "
                   "together (docs/SERIES.md). Default: none (the service's ledger charges the round either way).")
def upload_cmd(round_id: str, server: str, token_file: str | None, input_path: str | None, fmt: str | None,
               user_col: str | None, query_col: str, url_col: str | None, row_per_user: bool, skip_bad_rows: bool,
               values: tuple[float, ...], device_ledger: str | None) -> None:
    """An opt-in user uploads their raw records (--input: all rows are this user's) or values (--value).

    Raw data goes only over this authenticated path; the server deletes it when it publishes the head list.
    """
    from hybriddp.sdk import OptinUploader
    if (input_path is None) == (not values):
        raise parameter_error("--input/--value", None, "exactly one of them: --input RECORDS for a blender round, "
                              "--value X (repeatable) for a mean round")
    token = read_token(token_file, "HYBRIDDP_OPTIN_TOKEN", "opt-in token", "--token-file")
    from hybriddp.audit.pld import device_accountant
    from hybriddp.device.ledger import open_device_ledger
    ledger = None if device_ledger is None else open_device_ledger(device_ledger, accountant=device_accountant())
    with OptinUploader(server, round_id, token, device_ledger=ledger) as up:
        if values:
            n = up.upload_values(values)
        else:
            records = _device_records(input_path, fmt, user_col, query_col, url_col, skip_bad_rows)
            n = up.upload(records)
    what = "values" if values else "records"
    render.out.print(f"uploaded {n:,} new {what} to round {round_id}"
                     + ("" if n else f" (the server had these {what} from an earlier upload: a repeat is acknowledged "
                                     "and not stored again)"))


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
@click.option("--credential-file", type=click.Path(dir_okay=False), default=None,
              help="File holding this device's credential (first line; from `hybriddp credentials create`), with "
                   "which it gets the report token its message needs (docs/TOKENS.md). Default: the "
                   "HYBRIDDP_DEVICE_CREDENTIAL environment variable; none is needed by a server run with "
                   "--open-admission.")
@click.option("--one-in", "one_in", type=click.IntRange(1), default=None, metavar="R",
              help="Rounds of a series (docs/SERIES.md): report in one period out of R, drawn on this device for "
                   "each block of R periods and kept in its ledger; other periods are sat out (nothing sent or "
                   "charged). Default: every round.")
@click.option("--report-now", is_flag=True,
              help="TESTS AND SIMULATIONS ONLY: send at once instead of at a uniformly random time in the round's "
                   "report window. The server then sees this device's token issuance and its report together and "
                   "can link them (docs/TOKENS.md).")
@click.option("--no-wait", is_flag=True,
              help="Get the token, randomize and keep the message in the outbox, then exit; run `hybriddp "
                   "participate` again (same --round and --outbox) once its send time has come to send it. Default: "
                   "wait until the send time (a time uniformly random in the round's report window).")
@click.option("--mirror", default=None, metavar="URL",
              help="A second path to the round's documents (e.g. a relay run by another party): the head list is "
                   "fetched there too, and nothing is sent unless both copies are the same (a server cannot hand "
                   "this device its own key unnoticed). Default: the relay, if --relay is given; else none.")
@click.option("--relay", default=None, metavar="URL",
              help="An Oblivious HTTP relay (`hybriddp relay`, run by someone other than the server's operator): "
                   "every request of this device goes through it encapsulated (RFC 9458), so the server never sees "
                   "this device's address or connection. Default: none (direct).")
@click.option("--retries", type=int, default=5, show_default=True,
              help="Retries after the first try on connection errors, timeouts, HTTP 429 and 5xx (exponential "
                   "backoff from 0.2 s to 10 s, with jitter); 0 = no retry.")
@json_option
def participate_cmd(server: str, round_id: str, input_path: str | None, fmt: str | None, user_col: str | None,
                    query_col: str, url_col: str | None, row_per_user: bool, skip_bad_rows: bool, value: float | None,
                    device_ledger: str | None, no_device_ledger: bool, lifetime_epsilon: float | None,
                    lifetime_delta: float | None, outbox: str | None, credential_file: str | None,
                    one_in: int | None, report_now: bool, no_wait: bool, mirror: str | None, relay: str | None,
                    retries: int, as_json: bool) -> None:
    """One device takes part in a round: fetch and verify the head list, randomize its records on the device
    (LocalAlg, ALGORITHM.md §5; every row of --input is this device's) and submit the message.

    The device ledger (by default the per-user one) is charged before the message leaves: a second report in
    the same round, or one past the lifetime budget, is refused with nothing sent (exit status 2); a message
    resent from the outbox is the same report and is not charged again.

    The device gets its report token at once (on a connection of its own) and sends the message at a uniformly
    random time in the round's report window, so that the server cannot pair reports with token issuances
    (docs/TOKENS.md); the command waits until then unless --no-wait (or --report-now, for tests)."""
    from hybriddp.device.ledger import DeviceLedgerRefusal, open_device_ledger
    from hybriddp.sdk import DeviceClient, RetryPolicy
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
    if no_wait and no_device_ledger and outbox is None:
        raise click.BadParameter("--no-wait keeps the message in the outbox until a later run sends it, and "
                                 "--no-device-ledger has none: give --outbox FILE", param_hint="--no-wait")
    if no_device_ledger:
        render.err.print("[yellow]warning: --no-device-ledger: this report is charged to no device ledger, so "
                         "nothing stops a second report in this round or one past the lifetime budget (tests and "
                         "simulations only)[/yellow]")
    from hybriddp.audit.pld import device_accountant
    ledger = DeviceClient.NO_LEDGER if no_device_ledger else open_device_ledger(
        device_ledger, lifetime_epsilon=lifetime_epsilon, lifetime_delta=lifetime_delta,
        accountant=device_accountant())
    records = None if input_path is None else _device_records(input_path, fmt, user_col, query_col, url_col,
                                                                skip_bad_rows)
    where = {"outbox": outbox} if outbox is not None else {}  # default: next to the device ledger
    credential = (read_token(credential_file, "HYBRIDDP_DEVICE_CREDENTIAL", "device credential", "--credential-file")
                  if credential_file is not None or os.environ.get("HYBRIDDP_DEVICE_CREDENTIAL", "").strip() else None)
    try:
        with DeviceClient(server, round_id, ledger, retry=RetryPolicy(attempts=retries + 1), credential=credential,
                          participation=one_in, report_now=report_now, mirror=mirror, relay=relay, **where) as dev:
            if report_now:
                render.err.print("[yellow]warning: --report-now: the server sees this device's token and report "
                                 "together and can link them (tests and simulations only)[/yellow]")
            ack = (dev.participate_value(value, wait=False) if records is None
                   else dev.participate(records, wait=False))  # or the message an earlier --no-wait run kept
            if ack.pending and not no_wait:
                _announce(round_id, ack.send_at)
                ack = dev.send_due(wait=True) or ack
    except DeviceLedgerRefusal as exc:
        raise exc.explained("pass --no-device-ledger only for tests and simulations") from None
    if as_json:
        render.print_json({"round": round_id, "acknowledged": ack.acknowledged, "counted": ack.counted,
                           "duplicates": ack.duplicates, "skipped": ack.skipped, "pending": ack.pending,
                           "send_at": None if ack.send_at is None else _when(ack.send_at)})
        return
    if ack.pending:
        render.out.print(f"round {round_id}: token got and message kept in the outbox; run this command again after "
                         f"{_when(ack.send_at)} to send it")
        return
    if ack.skipped:
        render.out.print(f"round {round_id}: not this device's period (one in {one_in}); nothing sent or charged")
        return
    state = "counted" if ack.counted else "already counted (a resent message)"
    render.out.print(f"round {round_id}: message acknowledged, {state}")


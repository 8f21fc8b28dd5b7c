"""Sizing before a round starts (issue 42): ``round create`` / ``series create`` ``--expect-optin``,
``--expect-devices`` and ``--dry-run`` print what the round can expect (:mod:`hybriddp.tune.sizing`): τ, the head
list's likely size, the chance it is empty, the opt-in users it needs and, with both groups' sizes, the expected
NDCG. A forecast reads public parameters and the built-in prior only: it costs no privacy.
"""

from __future__ import annotations

import contextlib
from typing import Any

import click

from hybriddp.cli import render
from hybriddp.tune.model import PopulationModel
from hybriddp.tune.sizing import RoundForecast


def sizing_options(f: Any) -> Any:
    """``--expect-optin``, ``--expect-devices``, ``--dry-run``."""
    for option in reversed((
            click.option("--expect-optin", type=click.IntRange(1, 10**9), default=None, metavar="USERS",
                         help="BLENDER: the opt-in users you expect to upload (users, 1 to 10⁹). The forecast then "
                              "gives the head list's likely size and the chance it is empty, and warns when the "
                              "round will likely list nothing. Default: not known (the forecast gives τ and the "
                              "opt-in users needed)."),
            click.option("--expect-devices", type=click.IntRange(1, 10**8), default=None, metavar="DEVICES",
                         help="BLENDER, with --expect-optin: the devices you expect to report; the forecast adds the "
                              "expected NDCG from two simulated rounds on the built-in prior (a few seconds per "
                              "million users)."),
            click.option("--like", metavar="ROUND", default=None,
                         help="BLENDER: forecast on a population model fitted to a past round's published head list "
                              "and opt-in estimates (its release; `hybriddp tune`'s fit, DP outputs only, about 10 "
                              "s) instead of the built-in prior, which has AOL's shape. Default: the prior."),
            click.option("--dry-run", is_flag=True,
                         help="Print the forecast and create nothing (no server or token needed, unless --like)."))):
        f = option(f)
    return f


def forecast(kind: str, params: dict[str, Any], expect_optin: int | None, expect_devices: int | None,
             like: str | None = None, server: str = "", admin_token_file: str | None = None) -> RoundForecast | None:
    """The forecast of a BLENDER round's API ``params`` (None for a mean round); with ``like`` (a round on
    ``server``) on the model fitted to that round's release (:func:`like_model`)."""
    if kind != "blender":
        if expect_optin is not None or expect_devices is not None:
            render.err.print("[yellow]note: --expect-optin/--expect-devices size BLENDER rounds only; ignored for "
                             "--kind mean[/yellow]")
        return None
    if expect_devices is not None and expect_optin is None:
        from hybriddp.core.errors import parameter_error
        raise parameter_error("expect_devices (--expect-devices)", expect_devices, "given with --expect-optin",
                              "The NDCG depends on both groups: add --expect-optin USERS.")
    from hybriddp.core.params import BlenderParams
    from hybriddp.tune.sizing import forecast_round

    keys = ("epsilon", "delta", "head_list_size", "m_o", "m_c", "f_o", "f_c", "project", "estimator")
    bp = BlenderParams(**{k: params[k] for k in keys})
    slow = expect_devices or like
    with render.err.status("forecasting the round", spinner="dots") if slow else contextlib.nullcontext():
        model = like_model(server, admin_token_file, like) if like is not None else None
        return forecast_round(bp, noise=params.get("noise", "discrete"), optin_users=expect_optin,
                              devices=expect_devices, model=model)


def like_model(server: str, admin_token_file: str | None, round_id: str) -> PopulationModel:
    """The population model of ``hybriddp tune`` fitted to a past round's release (head list and opt-in estimates:
    DP outputs only, docs/TUNE.md "The law fit"), extrapolated for a population of that round's opt-in users and
    devices."""
    from hybriddp.cli.remote import admin_client
    from hybriddp.core.errors import DataError, parameter_error
    from hybriddp.curator.release import release_from_documents
    from hybriddp.sdk.http import ConflictError
    from hybriddp.tune.inputs import from_release
    from hybriddp.tune.model import model_from_inputs

    with admin_client(server, admin_token_file) as admin:
        try:
            doc = admin.release(round_id)
        except ConflictError as exc:
            raise parameter_error("like (--like)", round_id, "a BLENDER round whose results are published",
                                  f"{exc} Leave --like out to forecast on the built-in prior.") from None
    try:
        inputs = from_release(release_from_documents(doc["headlist"], doc["estimates"]),
                              (f"round {round_id}'s head list", "its opt-in estimates"))
    except DataError as exc:
        raise parameter_error("like (--like)", round_id, "a round whose head list a model can be fitted to (at least "
                              "3 records and 2 opt-in records in T)",
                              f"{str(exc).split(';')[0]}. Leave --like out to forecast on the built-in prior."
                              ) from None
    optin = inputs.optin.n + inputs.optin.n_s
    population = optin + max(int(doc.get("messages") or 0), 1)
    return model_from_inputs(inputs, population=population, optin_fraction=optin / population)


def print_forecast(fc: RoundForecast | None) -> None:
    """The forecast's sentences on stdout, its warnings on stderr."""
    if fc is None:
        return
    render.out.print("[bold]Forecast[/bold] (docs/TUNE.md \"Sizing a round\"):")
    for line in fc.lines():
        render.out.print(f"  {line}", highlight=False)
    for w in fc.warnings:
        render.err.print(f"[yellow]warning: {w}[/yellow]", highlight=False)


def print_dry_run(fc: RoundForecast | None, params: dict[str, Any], as_json: bool) -> None:
    """``--dry-run``: the forecast alone (``--json``: with the round's parameters as the API would get them)."""
    if as_json:
        render.print_json({"forecast": None if fc is None else fc.to_json(), "params": params})
    else:
        print_forecast(fc)

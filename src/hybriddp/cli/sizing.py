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
            click.option("--dry-run", is_flag=True,
                         help="Print the forecast and create nothing (no server or token needed)."))):
        f = option(f)
    return f


def forecast(kind: str, params: dict[str, Any], expect_optin: int | None,
             expect_devices: int | None) -> RoundForecast | None:
    """The forecast of a BLENDER round's API ``params`` (None for a mean round)."""
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
    with render.err.status("forecasting the round (simulated rounds on the built-in prior)",
                           spinner="dots") if expect_devices else contextlib.nullcontext():
        return forecast_round(bp, noise=params.get("noise", "discrete"), optin_users=expect_optin,
                              devices=expect_devices)


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

"""``hybriddp privacy report LEDGER``: per-round and cumulative guarantees from a ledger."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from hybriddp.cli import render
from hybriddp.errors import parameter_error
from hybriddp.ledger import Charge, PrivacyLedger


def ledger_options(f: Any) -> Any:
    """--ledger / --round / --lifetime-epsilon / --lifetime-delta for commands that release."""
    f = click.option("--lifetime-delta", type=float, default=None,
                     help="Lifetime δ per user; needed when --ledger creates a new ledger.")(f)
    f = click.option("--lifetime-epsilon", type=float, default=None,
                     help="Lifetime ε per user (basic composition); needed when --ledger creates a new ledger.")(f)
    f = click.option("--round", "round_name", default=None,
                     help="Name of this round in the ledger. Default: the UTC time of the run.")(f)
    f = click.option("--ledger", "ledger_path", type=click.Path(dir_okay=False), default=None,
                     help="Privacy ledger (SQLite) to charge this round to; the round is refused, before anything "
                          "is released, if a user would exceed the lifetime budget.")(f)
    return f


def charge_round(ledger_path: str | None, round_name: str | None, lifetime_epsilon: float | None,
                 lifetime_delta: float | None, charges: list[Charge]) -> str | None:
    """Charge ``charges`` to the ledger (if any); returns the round name used."""
    if ledger_path is None:
        return None
    from datetime import datetime, timezone
    name = round_name or datetime.now(timezone.utc).strftime("round-%Y%m%dT%H%M%S.%fZ")
    with PrivacyLedger.open(ledger_path, lifetime_epsilon=lifetime_epsilon, lifetime_delta=lifetime_delta) as led:
        led.charge(name, charges)
    return name


@click.group("privacy")
def privacy_group() -> None:
    """Privacy accounting: what each user has spent across rounds."""


@privacy_group.command("report")
@click.argument("ledger", type=click.Path(dir_okay=False))
@click.option("--delta-prime", type=float, default=1e-6, show_default=True,
              help="The extra δ' of advanced composition (Dwork–Rothblum–Vadhan).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def report_cmd(ledger: str, delta_prime: float, as_json: bool) -> None:
    """Per-round releases and each user's cumulative (ε, δ) under basic and advanced composition."""
    from pathlib import Path

    from hybriddp.ledger import LedgerError
    if not Path(ledger).is_file():
        raise LedgerError(f"ledger file not found: {ledger}")
    if not 0 < delta_prime < 1:
        raise parameter_error("delta_prime (--delta-prime)", delta_prime, "strictly between 0 and 1",
                              "The default 1e-6 is typical.")
    with PrivacyLedger.open(ledger) as led:
        rep = led.report(delta_prime)
    if as_json:
        render.print_json(rep)
        return
    life = rep["lifetime"]
    t = Table(title=f"Rounds in {ledger}", title_justify="left")
    for col in ("round", "created (UTC)", "group", "users", "ε", "δ"):
        t.add_column(col, justify="right" if col in ("users", "ε", "δ") else "left")
    for r in rep["rounds"]:
        for i, g in enumerate(r["groups"]):
            t.add_row(r["round"] if i == 0 else "", r["created"] if i == 0 else "", g["group"], f"{g['users']:,}",
                      f"{g['epsilon']:g}", f"{g['delta']:g}")
    render.out.print(t)
    c = Table(title=f"Cumulative per user: one row per charge history (the users charged the same (ε, δ) in the "
                    f"same order share a row; lifetime budget ε = {life['epsilon']:g}, δ = {life['delta']:g}; "
                    f"advanced composition with δ' = {delta_prime:g})", title_justify="left")
    for col in ("charged (ε, δ), oldest first", "users", "releases", "basic ε", "basic δ", "advanced ε",
                "advanced δ", "best ε"):
        c.add_column(col, justify="left" if col.startswith("charged") else "right")
    for row in rep["cumulative"]:
        c.add_row(_history(row.get("charges", [])), f"{row['users']:,}", str(row["releases"]),
                  f"{row['basic']['epsilon']:.4g}", f"{row['basic']['delta']:.3g}",
                  f"{row['advanced']['epsilon']:.4g}", f"{row['advanced']['delta']:.3g}",
                  f"{row['best']['epsilon']:.4g}")
    render.out.print(c)
    render.out.print(f"{rep['users']:,} users; the most-charged user has spent ε = {rep['worst_basic_epsilon']:.4g} "
                     f"(basic); {rep['remaining_epsilon']:.4g} of the lifetime ε remains for them")


def _history(charges: list[dict[str, float]]) -> str:
    """``(4, 1e-05) × 2, (4, 0)``: a user's releases, oldest first, repeats collapsed."""
    runs: list[list[Any]] = []
    for ch in charges:
        label = f"({ch['epsilon']:g}, {ch['delta']:g})"
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return ", ".join(label if k == 1 else f"{label} × {k}" for label, k in runs) or "—"

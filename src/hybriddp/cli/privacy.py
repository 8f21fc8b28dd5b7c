"""``hybriddp privacy report LEDGER``: per-round and cumulative guarantees from a ledger — a file ledger
(:class:`~hybriddp.privacy.ledger.PrivacyLedger`) or the collection service's database
(:mod:`hybriddp.service.ledger_view`) — and the charging helpers of the commands that release.

Every run of a curator mechanism is charged, whatever it outputs (ALGORITHM.md §3.4): an empty head
list is charged like a head list (:func:`charge_empty_run`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from hybriddp.cli import render
from hybriddp.cli.options import int_range
from hybriddp.core.errors import EmptyHeadListError, parameter_error
from hybriddp.privacy.ledger import Charge, LedgerError, PrivacyLedger, is_service_database


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
                          "is released, if a user would exceed the lifetime budget. Every run is charged, an empty "
                          "head list too (it is an output of the mechanism), and a seeded run is recorded as "
                          "non-private.")(f)
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


def charge_empty_run(exc: EmptyHeadListError, ledger_path: str | None, round_name: str | None,
                     lifetime_epsilon: float | None, lifetime_delta: float | None) -> EmptyHeadListError:
    """Charge a curator run that kept no record (ALGORITHM.md §3.4) and return the one-line error to raise.

    The empty head list is an output of CreateHeadList, so the run is charged like any release
    (``exc.charges``, as a round named by ``round_name`` or the time); running again is a new release.
    A refused charge raises the ledger's own error, which says nothing about the run's outcome, as
    for a run that kept records. No output file is written either way.
    """
    if ledger_path is None:
        return EmptyHeadListError(
            f"{exc} This outcome is a release of the mechanism; nothing was recorded because no --ledger was "
            "given (with --ledger it is charged to the opt-in users, and every run again is a new release, charged "
            "again). No output file was written.", tau=exc.tau, epsilon=exc.epsilon, delta=exc.delta, m_o=exc.m_o,
            n_optin_users=exc.n_optin_users, charges=exc.charges)
    name = charge_round(ledger_path, round_name, lifetime_epsilon, lifetime_delta, exc.charges)
    n_users = sum(len(c.users) for c in exc.charges)
    seeded = "" if all(c.private for c in exc.charges) else " as non-private (seeded: no privacy guarantee)"
    return EmptyHeadListError(
        f"{exc} This outcome is a release of the mechanism: it was charged (ε = {exc.epsilon:g}, δ = {exc.delta:g})"
        f"{seeded} to the {n_users:,} opt-in users in {ledger_path} as round {name!r}; running again is a new "
        "release, charged again. No output file was written.", tau=exc.tau, epsilon=exc.epsilon, delta=exc.delta,
        m_o=exc.m_o, n_optin_users=exc.n_optin_users, charges=exc.charges)


@click.group("privacy")
def privacy_group() -> None:
    """Privacy accounting: what each user has spent across rounds."""


@privacy_group.command("report")
@click.argument("ledger")
@click.option("--delta-prime", type=float, default=1e-6, show_default=True,
              help="The extra δ' of advanced composition (Dwork–Rothblum–Vadhan); file ledgers.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def report_cmd(ledger: str, delta_prime: float, as_json: bool) -> None:
    """Per-round releases and each user's cumulative (ε, δ) under basic and advanced composition (file ledgers),
    or under basic composition next to the ε the service enforces at the lifetime δ, the tighter of basic and PLD
    accounting (the service's database; docs/ALGORITHM.md §14).

    LEDGER is a file ledger (--ledger of `headlist`/`run`), the collection service's SQLite database
    (`hybriddp serve --db`), or a database URL (sqlite:///path, postgresql+psycopg://...); the
    service's database is only read. Non-private (seeded) releases are flagged: their users have no
    privacy guarantee, and the (ε, δ) sums count private releases only.
    """
    if not 0 < delta_prime < 1:
        raise parameter_error("delta_prime (--delta-prime)", delta_prime, "strictly between 0 and 1",
                              "The default 1e-6 is typical.")
    if "://" in ledger:
        from hybriddp.service.ledger_view import open_service_ledger
        return _print_service(open_service_ledger(ledger), as_json)
    if not Path(ledger).is_file():
        raise LedgerError(f"ledger file not found: {ledger}")
    if is_service_database(ledger):
        from hybriddp.service.ledger_view import open_service_ledger
        return _print_service(open_service_ledger(f"sqlite:///{Path(ledger).resolve()}"), as_json)
    with PrivacyLedger.open(ledger) as led:
        rep = led.report(delta_prime)
    if as_json:
        render.print_json(rep)
        return None
    life = rep["lifetime"]
    t = Table(title=f"Rounds in {ledger}", title_justify="left")
    for col in ("round", "created (UTC)", "private", "group", "users", "ε", "δ"):
        t.add_column(col, justify="right" if col in ("users", "ε", "δ") else "left", no_wrap=col == "private")
    for r in rep["rounds"]:
        for i, g in enumerate(r["groups"]):
            t.add_row(r["round"] if i == 0 else "", r["created"] if i == 0 else "",
                      _private_cell(r.get("private", True)) if i == 0 else "", g["group"], f"{g['users']:,}",
                      f"{g['epsilon']:g}", f"{g['delta']:g}")
    render.out.print(t)
    c = Table(title=f"Cumulative per user: one row per charge history (the users charged the same (ε, δ) in the "
                    f"same order share a row; lifetime budget ε = {life['epsilon']:g}, δ = {life['delta']:g}; "
                    f"advanced composition with δ' = {delta_prime:g}; sums over private releases only)",
              title_justify="left")
    for col in ("charged (ε, δ), oldest first", "users", "releases", "non-private releases", "basic ε", "basic δ",
                "advanced ε", "advanced δ", "best ε"):
        c.add_column(col, justify="left" if col.startswith("charged") else "right")
    for row in rep["cumulative"]:
        n_np = row.get("non_private_releases", 0)
        best = "none" if row["best"] is None else f"{row['best']['epsilon']:.4g}"
        c.add_row(_history(row.get("charges", [])), f"{row['users']:,}", str(row["releases"]), _non_private_cell(n_np),
                  f"{row['basic']['epsilon']:.4g}", f"{row['basic']['delta']:.3g}",
                  f"{row['advanced']['epsilon']:.4g}", f"{row['advanced']['delta']:.3g}", best)
    render.out.print(c)
    render.out.print(f"{rep['users']:,} users; the most-charged user has spent ε = {rep['worst_basic_epsilon']:.4g} "
                     f"(basic); {rep['remaining_epsilon']:.4g} of the lifetime ε remains for them")
    _print_warning(rep)
    return None


def _private_cell(private: bool) -> str:
    return "yes" if private else "[bold red]NO (seeded)[/bold red]"


def _non_private_cell(n: int) -> str:
    return "0" if not n else f"[bold red]{n} (no privacy guarantee)[/bold red]"


def _print_warning(rep: dict[str, Any]) -> None:
    if rep.get("warning"):
        render.out.print(f"[bold red]warning: {rep['warning']}[/bold red]")


def _print_service(rep: dict[str, Any], as_json: bool) -> None:
    """The collection service's ledger (:func:`hybriddp.service.ledger_view.service_ledger`): rounds, then the
    pseudonyms grouped by what they spent."""
    if as_json:
        render.print_json(rep)
        return
    life = rep["lifetime"]
    t = Table(title=f"Rounds charged in the service database {rep['database']}", title_justify="left")
    for col in ("round", "name", "kind", "state", "private", "group", "users", "ε", "δ"):
        t.add_column(col, justify="right" if col in ("users", "ε", "δ") else "left", no_wrap=col == "private")
    for r in rep["rounds"]:
        for i, g in enumerate(r["groups"]):
            first = i == 0
            t.add_row(str(r["round"]) if first else "", (r["name"] or "") if first else "",
                      str(r["kind"]) if first else "", str(r["state"]) if first else "",
                      _private_cell(r["private"]) if first else "", g["group"], f"{g['users']:,}",
                      f"{g['epsilon']:g}", f"{g['delta']:g}")
    render.out.print(t)
    groups: dict[tuple[float, float, int, int, float | None], int] = {}
    for p in rep["pseudonyms"]:
        key = (p["epsilon"], p["delta"], p["rounds"], p["non_private_releases"], p.get("pld_epsilon"))
        groups[key] = groups.get(key, 0) + 1
    budget = ("" if life["epsilon"] is None else
              f"; lifetime budget ε = {life['epsilon']:g}, δ = {life['delta']:g}")
    c = Table(title=f"Cumulative per user (keyed pseudonyms; the users with the same totals share a row{budget}; "
                    "basic composition over private releases only)", title_justify="left")
    at = "" if life["delta"] is None else f" at δ = {life['delta']:g}"
    for col in ("users", "rounds", "non-private releases", "Σε", "Σδ", f"ε{at} (enforced: basic or PLD)"):
        c.add_column(col, justify="right")
    for (e, d, k, n_np, pld_eps), n in sorted(groups.items(), key=lambda kv: (-kv[0][0], -kv[0][1], -kv[0][3])):
        c.add_row(f"{n:,}", str(k), _non_private_cell(n_np), f"{e:.4g}", f"{d:.3g}",
                  "" if pld_eps is None else f"{pld_eps:.4g}")
    render.out.print(c)
    remaining = "" if rep["remaining_epsilon"] is None else (
        f"; {rep['remaining_epsilon']:.4g} of the lifetime ε remains for them")
    tight = "" if rep.get("worst_pld_epsilon") is None else (
        f"; with PLD accounting, the rule the service enforces with basic composition, ε = "
        f"{rep['worst_pld_epsilon']:.4g}{at}")
    render.out.print(f"{rep['users']:,} users; the most-charged user has spent ε = {rep['worst_basic_epsilon']:.4g} "
                     f"(basic){remaining}{tight}")
    _print_warning(rep)


def _history(charges: list[dict[str, Any]]) -> str:
    """``(4, 1e-05) × 2, (4, 0)``: a user's releases, oldest first, repeats collapsed; a non-private
    release reads ``(4, 1e-05) NON-PRIVATE``."""
    runs: list[list[Any]] = []
    for ch in charges:
        label = f"({ch['epsilon']:g}, {ch['delta']:g})" + ("" if ch.get("private", True) else " NON-PRIVATE")
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return ", ".join(label if k == 1 else f"{label} × {k}" for label, k in runs) or "—"


@privacy_group.command("compose")
@click.option("--rounds", type=int, default=12, show_default=True, callback=int_range(1, 1000),
              help="Rounds one user takes part in (e.g. the periods of a series, or fewer with rotation).")
@click.option("--epsilon", type=float, default=4.0, show_default=True, help="Each round's ε (paper default 4).")
@click.option("--delta", type=float, default=1e-5, show_default=True, help="Each round's δ (the head list's).")
@click.option("--m-o", type=int, default=1, show_default=True, callback=int_range(1, 3),
              help="Records per opt-in user (1 to 3: the mechanisms the exact audit enumerates).")
@click.option("--target-delta", type=float, default=2e-5, show_default=True,
              help="The δ at which the total ε is stated.")
@click.option("--head-list", "head_list", type=click.Path(dir_okay=False), default=None,
              help="A device head list (JSON, as `hybriddp headlist` writes it or GET /api/v1/rounds/ID/headlist "
                   "returns): the devices' rounds are then accounted exactly for its shape, ε, δ, f_C and m_C "
                   "(--epsilon and --delta apply to the opt-in groups). Default: devices by their (ε, δ) only.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def compose_cmd(rounds: int, epsilon: float, delta: float, m_o: int, target_delta: float, head_list: str | None,
                as_json: bool) -> None:
    """One user's total guarantee after --rounds rounds, per group: basic and advanced composition next to
    privacy-loss-distribution accounting (dp-accounting) of the exact per-round laws (docs/ALGORITHM.md §14).
    Devices are accounted exactly with --head-list, else by their (ε, δ) (no tighter than basic composition)."""
    from hybriddp.audit.pld import Mechanism, totals
    if not 0 < target_delta < 1:
        raise parameter_error("target delta (--target-delta)", target_delta, "strictly between 0 and 1")
    device = ("clients (LocalAlg, by its (ε, δ))", Mechanism("local", epsilon, delta, m_o))
    if head_list is not None:
        from hybriddp.core.headlist import read_device_json
        from hybriddp.device.localalg import DeviceHeadList
        doc = read_device_json(head_list)
        hl = DeviceHeadList.from_json(doc)
        device = (f"clients (LocalAlg on {head_list}: k = {len(hl.kq)}, ε = {doc['epsilon']:g}, m_C = {doc['m_c']})",
                  Mechanism("local", float(doc["epsilon"]), float(doc["delta"]), kq=tuple(hl.kq),
                            f_c=float(doc["f_c"]), m_c=int(doc["m_c"])))
    groups = (("optin-S (head list)", Mechanism("headlist", epsilon, delta, m_o)),
              ("optin-T (opt-in estimates)", Mechanism("optin", epsilon, 0.0, m_o)), device)
    rows = [{"group": name, **totals([mech] * rounds, target_delta).to_json()} for name, mech in groups]
    if as_json:
        render.print_json({"rounds": rounds, "epsilon": epsilon, "delta": delta, "m_o": m_o,
                           "target_delta": target_delta, "groups": rows})
        return
    t = Table(title=f"{rounds} rounds at ε = {epsilon:g}, δ = {delta:g} (m_O = {m_o}): total ε at δ = "
                    f"{target_delta:g} (basic and advanced: their own δ)", title_justify="left")
    for col in ("group", "basic ε", "basic δ", "advanced ε", "PLD ε"):
        t.add_column(col, justify="left" if col == "group" else "right")
    for r in rows:
        adv = "–" if r["advanced_epsilon"] == float("inf") else f"{r['advanced_epsilon']:.4g}"
        pld = ("∞ (the rounds' δ alone pass the target)" if r["pld_epsilon"] == float("inf")
               else f"{r['pld_epsilon']:.4g}")
        t.add_row(r["group"], f"{r['basic_epsilon']:.4g}", f"{r['basic_delta']:.3g}", adv, pld)
    render.out.print(t)

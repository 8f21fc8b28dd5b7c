"""How the round commands print what the server answers: a round, the rounds, a round's results
(ALGORITHM.md §6, §7 for BLENDER; §11 for a mean round)."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.table import Table

from hybriddp.cli import render
from hybriddp.core.rng import SEED_WARNING


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


ROUND_COLUMNS = (render.Col("id"), render.Col("name", wrap=10, drop=1), render.Col("kind", drop=3),
                 render.Col("state"), render.Col("created (UTC)", wrap=10, drop=2),
                 render.Col("opt-in users", justify="right"), render.Col("reports", justify="right"))
"""The rounds table's columns: the id (copied into other commands), state and counts are always shown whole; at a
narrow width the kind goes first, then the creation time, then the name."""


def print_rounds(rounds: list[dict[str, Any]]) -> None:
    """Every round, one row each, fitted to the console's width (:data:`ROUND_COLUMNS`, :func:`render.fit_table`):
    ids, states and counts are printed whole at 80 columns and more, and a column left out is named under it."""
    rows = []
    for r in rounds:
        c = r.get("counts") or {}
        created = str(r.get("created") or "")[:16].replace("T", " ")
        rows.append([str(r.get("id")), str(r.get("name") or ""), str(r.get("kind")), str(r.get("state")), created,
                     f"{c.get('optin_users') or 0:,}", f"{c.get('reports') or 0:,}"])
    t, left_out = render.fit_table(ROUND_COLUMNS, rows, render.out.width,
                                   title=f"{len(rounds)} round{'s' * (len(rounds) != 1)}", title_justify="left")
    if left_out:
        t.caption = f"left out at this width: {', '.join(left_out)} (`round status ID` or --json shows them)"
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


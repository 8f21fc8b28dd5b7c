"""Human output (Rich tables on stdout, progress on stderr) and JSON output."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.console import Console, JustifyMethod
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from hybriddp.core.headlist import HeadList
from hybriddp.core.jsonfile import json_safe
from hybriddp.core.rng import SEED_WARNING
from hybriddp.server.result import Result, json_default

out = Console(highlight=False, soft_wrap=False, width=max(100, Console().width))
err = Console(stderr=True, highlight=False)


@contextmanager
def stage_progress(enabled: bool = True) -> Iterator[Any]:
    """A spinner per pipeline stage on stderr; yields ``on_stage(name)`` for :class:`Stages`."""
    if not enabled or not err.is_terminal:
        yield None
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        current: list[int] = []

        def on_stage(name: str) -> None:
            if current:
                progress.update(current[-1], completed=1, total=1)
            current.append(progress.add_task(name, total=None))

        yield on_stage


@contextmanager
def bytes_progress(label: str, enabled: bool = True) -> Iterator[Any]:
    """A byte progress bar for file loading; yields ``progress(done, total)`` or None."""
    if not enabled or not err.is_terminal:
        yield None
        return
    with Progress(TextColumn(label), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total or None)

        yield update


@dataclass(frozen=True)
class Col:
    """A column of :func:`fit_table`.

    ``wrap``: None for a key column, which never wraps (ids, states, times, counts: its width is its longest cell);
    else the narrowest width, in characters, its cells may wrap (at spaces, folded within a word) down to.
    ``drop``: 0 for a column always shown; 1, 2, …: left out, highest first, when the table cannot fit otherwise.
    """

    header: str
    wrap: int | None = None
    drop: int = 0
    justify: JustifyMethod = "left"


def _edge(n: int) -> int:
    """Characters a Rich table with the default box and padding adds to ``n`` columns: a border each side and
    between columns, and one space of padding each side of every cell."""
    return 3 * n + 1


def fit_table(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int, **table_args: Any
              ) -> tuple[Table, list[str]]:
    """A table of ``rows`` that fits in ``width`` characters, and the headers of the columns it left out.

    Guarantee: every key column's cells are printed whole on one line (never squeezed, folded or cut), the kept
    wrapping columns are at least their ``wrap`` width, and the table is at most ``width`` wide whenever the kept
    columns' narrowest widths fit; to get there, droppable columns are left out (highest ``drop`` first) only when
    the narrowest widths of the others do not fit. Cells are plain text (no Rich markup is read from them). Spare
    width is given back to the wrapping columns, up to their longest cell."""
    def natural(i: int) -> int:
        return max([cell_len(cols[i].header)] + [cell_len(str(r[i])) for r in rows])

    def narrowest(i: int) -> int:
        header = max(cell_len(w) for w in cols[i].header.split()) if cols[i].header.strip() else 0
        cells = max([0] + [cell_len(str(r[i])) for r in rows])
        if cols[i].wrap is None:
            return max(header, cells)
        return max(header, min(cols[i].wrap, cells))

    kept = list(range(len(cols)))
    while sum(narrowest(i) for i in kept) + _edge(len(kept)) > width:
        droppable = [i for i in kept if cols[i].drop > 0]
        if not droppable:
            break
        kept.remove(max(droppable, key=lambda i: (cols[i].drop, i)))
    widths = {i: narrowest(i) for i in kept}
    spare = width - sum(widths.values()) - _edge(len(kept))
    for i in kept:  # give what is left to the wrapping columns, left to right, up to their longest cell
        if spare <= 0:
            break
        grow = min(spare, natural(i) - widths[i])
        if grow > 0:
            widths[i] += grow
            spare -= grow
    table = Table(**table_args)
    for i in kept:
        c = cols[i]
        table.add_column(c.header, justify=c.justify, width=widths[i], min_width=widths[i], max_width=widths[i],
                         no_wrap=c.wrap is None and widths[i] >= natural(i), overflow="fold")
    for r in rows:
        table.add_row(*(Text(str(r[i])) for i in kept))
    return table, [cols[i].header for i in range(len(cols)) if i not in kept]


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def print_figure9(res: Result, top: int = 10) -> None:
    """The paper's Fig. 9 table; values out of order relative to the truth are red with ↑."""
    rows = res.figure9(top)
    has_truth = res.truth_query is not None
    title = "Top queries (paper Fig. 9)" + ("" if has_truth else " — no ground truth, sorted by blended")
    t = Table(title=title, title_justify="left")
    t.add_column("query", overflow="fold", max_width=40)
    cols = [("p_true", "true p_q")] if has_truth else []
    cols += [("p_blended", "blended p̂_q"), ("p_optin_sum", "opt-in Σ_u"), ("p_client_direct", "client p̂_C,q"),
             ("p_client_sum", "client Σ_u")]
    for _, head in cols:
        t.add_column(head, justify="right")
    for row in rows:
        cells = [row["query"]]
        for key, _ in cols:
            v = _fmt(row[key])
            if row.get(key + "_regression") and has_truth:
                v = f"[red]↑{v}[/red]"
            cells.append(v)
        t.add_row(*cells)
    out.print(t)
    if has_truth:
        n_reg = {k: sum(r[k + "_regression"] for r in rows) for k, _ in cols if k != "p_true"}
        out.print("regressions (↑ larger than the row above): "
                  + ", ".join(f"{head} {n_reg[k]}" for k, head in cols if k != "p_true"))


def _print_metrics(m: dict[str, Any]) -> None:
    """The L1 and NDCG lines (ALGORITHM.md §9)."""
    out.print(f"L1    {m['l1']:.4f}   (records; queries {m['l1_queries']:.4f})")
    out.print(f"NDCG  {m['ndcg']:.4f}   (generalized; queries {m['ndcg_queries']:.4f}, "
              f"queries@10 {m['ndcg_queries_at_10']:.4f})")


def print_summary(res: Result) -> None:
    """Sizes, head list, metrics and the privacy guarantee, after the table."""
    s = res.sizes
    m = res.metrics
    if m:
        _print_metrics(m)
        line = f"local search: {m['hit_rate']:.1%} of held-out events hit the head list"
        if res.url_level:
            line += f", {m['top_url_rate']:.1%} click its top URL"
        out.print(line)
    out.print(f"head list: {head_list_size(res.head_list, res.url_level)} (M = {res.params.head_list_size})")
    out.print(f"estimator: {res.params.estimator} — {res.params.estimator_spec.summary}")
    print_check(res)
    if "users" in s:
        out.print(f"users: {s['users']:,} ({s['optin_users']:,} opt-in: {s['optin_users_s']:,} in S, "
                  f"{s['optin_users_t']:,} in T; {s['clients']:,} clients)")
    g = res.guarantee()
    out.print(f"privacy, opt-in users: {g['optin_users']}")
    out.print(f"privacy, clients: {g['clients']}; curator noise: {g['noise']}")
    if not res.client.variance_exact:
        out.print("note: m_C > 1, client variances are approximate (a client's reports are dependent)")
    if res.seed is not None:
        err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


def print_check(res: Result) -> None:
    """One line on the anchor check (ALGORITHM.md §7.2): what it flagged and changed, or that it was off."""
    check = res.parts.check if res.parts is not None else None
    if check is None:
        out.print("[yellow]defense: none — fake device reports could steer these estimates "
                  "(docs/ALGORITHM.md §7.2)[/yellow]")
        return
    c = check.summary()
    flagged = c["flagged_records"] + c["flagged_queries"]
    kappa = c["kappa"] if isinstance(c["kappa"], str) else f"{c['kappa']:g}"
    kq = c["kappa_query"] if isinstance(c["kappa_query"], str) else f"{c['kappa_query']:g}"
    if "kappa_query_round" in c:
        kq = f"{kq}: {c['kappa_query_round']:.2f}"
    line = (f"defense: anchor (α = {c['alpha']:g}, κ = {kappa}, ranking {kq}): "
            f"{c['flagged_records']} records and "
            f"{c['flagged_queries']} queries flagged, {c['clamped_records'] + c['clamped_queries']} bounded, "
            f"largest |z| {c['max_abs_z']:.2f} (critical {c['critical_z']:.2f})")
    if flagged:
        line = (f"[red]{line}; at least {c['excess_reports']:,.0f} fake reports "
                f"({c['fake_fraction_lower']:.2%}): no estimate moved further than its bound, and the other "
                "entries were cleaned of them[/red]")
    out.print(line)


def _pct(p: float | None) -> str:
    return "–" if p is None else f"{p:.3%}"


def print_held(check: dict[str, Any]) -> None:
    """What an administrator judges held results by (the ``anchor_check`` of a held result, ALGORITHM.md §7.2,
    "Judging held results"): per flagged entry the opt-in and device estimates, the test, the estimated fake reports
    and what ``publish-results --flagged keep`` / ``remove`` would publish; for a mean round the same for the mean.
    Results stored before the view existed show the summary line only."""
    if "optin_mean" in check:  # a mean round
        t = Table(title="flagged mean (docs/ALGORITHM.md §7.2)", title_justify="left", show_header=False)
        t.add_column("what")
        t.add_column("value", justify="right")
        kept = check.get("published_if_kept")
        for what, value in (
                ("opt-in mean", f"{check['optin_mean']:.6g}"),
                ("device mean", "–" if check.get("client_mean") is None else f"{check['client_mean']:.6g}"),
                ("z (critical)", f"{check['z']:.2f} ({check['critical_z']:.2f})" if check.get("z") is not None
                 else "–"),
                (f"extreme values at {check['extreme_value']:.6g} that explain the gap",
                 "–" if check.get("estimated_fake_values") is None else f"{check['estimated_fake_values']:,.1f}"),
                ("keep publishes the hybrid mean", "–" if kept is None else f"{kept:.6g}"),
                ("remove publishes", "no hybrid mean")):
            t.add_row(what, value)
        out.print(t)
        return
    entries = check.get("flagged_entries")
    if entries is None:
        return
    t = Table(title=f"flagged entries (docs/ALGORITHM.md §7.2; critical |z| {check['critical_z']:.2f})",
              title_justify="left")
    t.add_column("entry", overflow="fold", max_width=40)
    for col in ("opt-in", "devices", "test", "fake reports", "keep", "remove"):
        t.add_column(col, justify="right")
    for e in entries:
        label = f"query {e['query']}" if e["level"] == "query" else f"{e['query']}\n{e['url']}"
        test = "–" if e.get("z") is None else f"z {e['z']:.2f}"
        if e.get("p_value") is not None and e.get("p_threshold") is not None:
            test += f"\np {e['p_value']:.0e}\n≤ {e['p_threshold']:.0e}"
        fakes = "–" if e.get("estimated_fake_reports") is None else f"{e['estimated_fake_reports']:,.0f}"
        left = e.get("records_left_out_if_removed", 1)
        t.add_row(label, _pct(e["p_optin"]), _pct(e["p_client"]), test, fakes, _pct(e["published_if_kept"]),
                  "left out" if e["level"] == "record" else f"left out\n({left} records)")
    out.print(t)
    out.print("opt-in, devices: the two groups' estimates; test: their gap z in standard deviations, flagged at p ≤ "
              "the Holm level; fake reports: how many reports of the entry alone would explain the gap; keep / remove: "
              "what `round publish-results --flagged keep|remove` publishes for the entry")
    kept, removed = check.get("published_if_kept"), check.get("published_if_removed")
    if kept and removed:
        out.print(f"keep publishes {kept['records']} records and {kept['queries']} queries (flagged entries with their "
                  f"opt-in estimates); remove publishes {removed['records']} records and {removed['queries']} queries")


def print_algorithm(alg: Result, top: int = 10) -> None:
    """A baseline's result: top queries with its estimate, metrics, guarantee."""
    rows = alg.figure9(top)
    has_truth = alg.truth_query is not None
    t = Table(title=f"Top queries — {alg.algorithm}", title_justify="left")
    t.add_column("query", overflow="fold", max_width=40)
    if has_truth:
        t.add_column("true p_q", justify="right")
    t.add_column("estimate p̂_q", justify="right")
    for row in rows:
        est = _fmt(row["p_estimate"])
        if row["p_estimate_regression"] and has_truth:
            est = f"[red]↑{est}[/red]"
        t.add_row(*([row["query"]] + ([_fmt(row["p_true"])] if has_truth else []) + [est]))
    out.print(t)
    m = alg.metrics
    if m:
        _print_metrics(m)
    out.print(f"head list: {head_list_size(alg.head_list, alg.url_level)} (M = {alg.params.head_list_size})")
    g = alg.guarantee()
    for who, label in (("optin_users", "opt-in users"), ("clients", "clients"), ("all_users", "all users")):
        if who in g:
            out.print(f"privacy, {label}: {g[who]}")
    if alg.seed is not None:
        err.print(f"[yellow]warning: {SEED_WARNING}[/yellow]")


def warn_delta(delta: float, n_users: int) -> None:
    """Warn on stderr when δ is not below 1/n (PRIVACY.md, "Choosing parameters")."""
    if n_users > 0 and delta >= 1.0 / n_users:
        err.print(f"[yellow]warning: delta = {delta:g} is not below 1/number-of-users = {1.0 / n_users:.3g}; "
                  "a failure of that probability can expose a user. Use a smaller --delta.[/yellow]")


def print_json(obj: dict[str, Any]) -> None:
    """One JSON object on stdout."""
    sys.stdout.write(json.dumps(json_safe(obj), allow_nan=False, default=json_default) + "\n")


def head_list_size(hl: HeadList, url_level: bool) -> str:
    """The head list's size in one phrase, the same in every command: records over queries, or
    queries only for a log without URLs."""
    if url_level:
        return f"{hl.n_records} records over {hl.n_queries} queries"
    return f"{hl.n_queries} records (queries; the log has no URLs)"


def same_file(a: str, b: str) -> bool:
    """True when two output paths name the same file."""
    from pathlib import Path

    return Path(a).resolve() == Path(b).resolve()


# ----- long loops: progress, Ctrl-C, finite JSON (shared by the commands that run for long) ------------------
@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C inside the block: one line ``interrupted`` on stderr and exit status 130, no traceback.

    Commands write their outputs after the loop (through :mod:`hybriddp.core.atomic`), so an
    interrupted command leaves earlier outputs as they were.
    """
    try:
        yield
    except KeyboardInterrupt:
        err.file.flush()
        sys.stderr.write("interrupted\n")
        sys.exit(130)


@contextmanager
def count_progress(label: str, total: int, enabled: bool = True) -> Iterator[Any]:
    """A progress bar over ``total`` steps on stderr (terminals only); yields ``update(done, total)`` or None."""
    if not enabled or not err.is_terminal:
        yield None
        return
    from rich.progress import MofNCompleteColumn, TimeRemainingColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(label, total=total)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update

"""``hybriddp trends``: which queries rose or fell across a series of rounds' results (ALGORITHM.md §13)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from hybriddp.cli import render
from hybriddp.core.errors import DataError
from hybriddp.server.trends import DEFAULT_WINDOW


@click.command("trends")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--fdr", type=float, default=0.05, show_default=True,
              help="Expected share of false trends among those reported (Benjamini–Hochberg over every query, "
                   "period and direction).")
@click.option("--min-change", type=float, default=0.0, show_default=True,
              help="Smallest relative change that counts: 0.5 reports a query only if it rose to at least 1.5× "
                   "(or fell to at most 1/1.5) of its previous estimate with confidence. 0: any change.")
@click.option("--window", type=int, default=DEFAULT_WINDOW, show_default=True,
              help="Periods pooled on each side of a boundary (inverse-variance weighted): a lasting change is "
                   "√window times clearer, located to within window − 1 periods. 1: consecutive periods only. The "
                   "default is the window docs/RESULTS.md's trend figures were measured with.")
@click.option("--output", "output", type=click.Path(dir_okay=False), default=None,
              help="Write every tested change (.csv, .parquet) or the whole analysis (.json), atomically.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw the estimates over the periods (with 95% intervals) of the queries found rising or falling "
                   "(.png, .svg, .pdf).")
@click.option("--all", "show_all", is_flag=True, help="Print every tested change, not only the trends.")
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON.")
def trends_cmd(results: tuple[str, ...], fdr: float, min_change: float, window: int, output: str | None,
               plot_path: str | None, show_all: bool, as_json: bool) -> None:
    """Rising and falling queries across RESULTS, one result JSON per period in time order (`hybriddp run
    --output pN.json`, or a round's results). Each query listed in two consecutive periods is tested with the
    published variances; the false discoveries are controlled at --fdr. Costs no privacy (post-processing)."""
    from hybriddp.core.atomic import check_output_path
    from hybriddp.core.jsonfile import read_json
    from hybriddp.server.result import OUTPUT_SUFFIXES, write_output
    from hybriddp.server.trends import PeriodEstimates, trend_document, trends

    if output is not None:
        check_output_path(output, "--output", OUTPUT_SUFFIXES)
    if plot_path is not None:
        check_output_path(plot_path, "--plot", (".png", ".svg", ".pdf"))
    periods = [PeriodEstimates.from_result(read_json(p, "result", DataError), Path(p).stem) for p in results]
    found = trends(periods, fdr=fdr, min_change=min_change, window=window)
    doc = trend_document(periods, found, window)
    rows = doc["changes"]
    if output is not None:
        import pyarrow as pa
        empty = pa.table({"query": pa.array([], pa.string())})
        write_output(output, doc, pa.Table.from_pylist(rows) if rows else empty)
    if plot_path is not None:
        _plot(plot_path, periods, found)
    if as_json:
        render.print_json(doc)
        return
    print_trend_table(doc, show_all, f"trends over {len(periods)} periods: {doc['rising']} rising, {doc['falling']} "
                                     f"falling of {len(rows)} changes tested (FDR {fdr:g}, min change {min_change:g})")
    hint = nothing_found_hint(doc, "result files")
    if hint:
        render.out.print(hint)


def nothing_found_hint(doc: dict[str, Any], periods_word: str = "periods with published results") -> str | None:
    """One line saying why a trend analysis (:func:`hybriddp.server.trends.trend_document`, or the API's answer)
    found no rising or falling query, and which option to change; None when it found some.

    The reasons, first match: no period has results yet; only one has (the test compares two); fewer periods than
    2 × window, so no boundary has a whole window on both sides (suggests the --window that fits); no query was
    listed on both sides of any boundary; else the changes tested were within what the test's --min-change and
    --fdr let pass (suggests loosening them, or a longer window)."""
    if doc.get("rising") or doc.get("falling"):
        return None
    n = len(doc.get("periods") or [])
    window = int(doc.get("window") or 1)
    tested = int(doc.get("tested") or 0)
    fdr, min_change = float(doc.get("fdr") or 0.05), float(doc.get("min_change") or 0.0)
    if n == 0:
        return ("why none: no period has published results yet; trends start once two periods' rounds have closed "
                "(see `hybriddp series status`).")
    if n == 1:
        return "why none: only 1 period has published results; the test compares two, so wait for the next close."
    if n < 2 * window:
        fits = max(1, n // 2)
        return (f"why none: only {n} {periods_word}, fewer than 2 × window = {2 * window}: no boundary has "
                f"{window} periods on each side; try --window {fits}, or wait for more periods.")
    if tested == 0:
        return (f"why none: no query was listed on both sides of any boundary of the {n} periods (empty or disjoint "
                "head lists), so nothing could be tested.")
    loosen = f"a smaller --min-change (now {min_change:g}), " if min_change > 0 else ""
    return (f"why none: none of the {tested} changes tested was clear enough at --fdr {fdr:g} with --min-change "
            f"{min_change:g}; try {loosen}a larger --fdr, or a larger --window (now {window}) if the changes last.")


def print_trend_table(doc: dict[str, Any], show_all: bool, title: str) -> None:
    """The tested changes of a trend analysis (:func:`hybriddp.server.trends.trend_document`) as a table: the
    rising and falling ones, or every one (``show_all``)."""
    shown = doc["changes"] if show_all else [r for r in doc["changes"] if r["trend"] != "steady"]
    table = Table(title=title)
    for col in ("query", "from", "to", "p before", "p after", "change", "trend"):
        table.add_column(col, justify="right" if col.startswith("p ") or col == "change" else "left")
    for r in shown:
        change = "" if r["change"] is None else f"{r['change']:+.0%}"
        table.add_row(r["query"], r["from"], r["to"], f"{r['p_before']:.4g}", f"{r['p_after']:.4g}", change,
                      r["trend"], end_section=False)
    render.out.print(table)


def _plot(path: str, periods: list[Any], found: Any, most: int = 12) -> None:
    """Small multiples: each trending query's estimate per period with its 95% interval."""
    import math

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hybriddp.experiments.plots import save_figure
    names = list(dict.fromkeys(q for q, up, down in zip(found.query, found.rising, found.falling, strict=True)
                               if up or down))[:most]
    cols = max(1, min(4, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, q in zip(axes.flat, names, strict=False):
        pts = [(t, s) for t, s in enumerate(found.series(periods, q)) if s is not None]
        xs = [t for t, _ in pts]
        ys = [s[0] for _, s in pts]
        err = [1.96 * math.sqrt(max(s[1], 0.0)) for _, s in pts]
        ax.errorbar(xs, ys, yerr=err, marker="o", ms=3, capsize=2)
        ax.set_title(q[:40], fontsize=8)
        ax.set_xticks(range(len(periods)), [p.label[:8] for p in periods], fontsize=6, rotation=45)
        ax.tick_params(axis="y", labelsize=6)
    if not names:
        axes.flat[0].text(0.5, 0.5, "no query rose or fell", ha="center", va="center")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)

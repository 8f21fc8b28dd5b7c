"""Issue 42's rough edges on the command line: one default trend window, a reason when no trend is found, tables
readable at 100 (and 80) columns, a busy port refused before anything is created, the demo's patient clients.

The API's side (its default window, the refused short period) is in tests/service/test_rough_edges_service.py; the
pages' side (the network badge, the round page's table at 1280 px, the series page's window) in tests/browser.
"""

from __future__ import annotations

import io
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from clihelpers import invoke
from hybriddp.cli import render, roundviews
from hybriddp.cli import series as series_cli
from hybriddp.server.trends import DEFAULT_WINDOW

STATIC = Path(__file__).resolve().parents[1] / "src" / "hybriddp" / "service" / "static"


# ----- 1. one default trend window ------------------------------------------------------------------------------
def _help_default(*command: str) -> str:
    text = " ".join(invoke(*command, "--help").output.split())
    m = re.search(r"--window INTEGER(?: RANGE)?.*?\[default: (\d+)", text)
    assert m, text
    return m.group(1)


def test_every_trend_window_default_is_the_trend_modules() -> None:
    """The CLI's two trend commands, the experiment, the API (tests/service), the SDK and the page share
    :data:`DEFAULT_WINDOW`, the window docs/RESULTS.md's trend figures were measured with (4)."""
    assert DEFAULT_WINDOW == 4
    assert _help_default("trends") == str(DEFAULT_WINDOW)
    assert _help_default("series", "trends") == str(DEFAULT_WINDOW)
    experiment = " ".join(invoke("experiment", "--help").output.split())
    assert f"--window`). Default: {DEFAULT_WINDOW}." in experiment
    from hybriddp.experiments.trends import TrendsConfig
    assert TrendsConfig().window == DEFAULT_WINDOW
    from hybriddp.curator.carry import DEFAULT_CARRY
    assert DEFAULT_CARRY == DEFAULT_WINDOW  # a fall stays measurable for a whole window


def test_the_sdk_and_the_page_ask_the_server_for_its_default_window() -> None:
    """The SDK sends no window unless told (the server's default applies); the series page's menu preselects
    nothing itself and asks without a window, then shows the window the answer used."""
    from hybriddp.sdk.admin import AdminClient
    from hybriddp.sdk.http import fetch_series_trends

    sent: list[dict[str, str]] = []

    class Http:
        def request_json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            sent.append(kw["params"])
            return {}

    fetch_series_trends(Http(), "series-id")
    fetch_series_trends(Http(), "series-id", window=2)
    assert "window" not in sent[0] and sent[1]["window"] == "2"
    import inspect
    assert inspect.signature(AdminClient.series_trends).parameters["window"].default is None
    html = (STATIC / "series.html").read_text(encoding="utf-8")
    menu = re.search(r'<select id="window">(.*?)</select>', html)
    assert menu and "selected" not in menu.group(1)
    js = (STATIC / "series.js").read_text(encoding="utf-8")
    assert 'const query = windowChosen ? `?window=' in js and "showWindow(doc.window)" in js


# ----- 2. why no trend was found ----------------------------------------------------------------------------------
def _series_trends(monkeypatch: pytest.MonkeyPatch, doc: dict[str, Any], *args: str) -> str:
    monkeypatch.setattr(series_cli, "_reader", lambda server, call: doc)
    monkeypatch.setattr(render, "out", Console(width=120, file=io.StringIO(), highlight=False))
    invoke("series", "trends", "SID", "--server", "http://127.0.0.1:9", *args)
    return " ".join(render.out.file.getvalue().split())


def _doc(periods: int, tested: int, window: int = DEFAULT_WINDOW, **extra: Any) -> dict[str, Any]:
    return {"periods": [f"p{i}" for i in range(periods)], "fdr": 0.05, "min_change": 0.0, "window": window,
            "tested": tested, "rising": 0, "falling": 0, "changes": [], "series": {}, **extra}


def test_series_trends_says_why_nothing_was_found(monkeypatch: pytest.MonkeyPatch) -> None:
    few = _series_trends(monkeypatch, _doc(5, 5))
    assert "0 rising, 0 falling of 5" in few
    assert f"only 5 periods with published results, fewer than 2 × window = {2 * DEFAULT_WINDOW}" in few
    assert "try --window 2" in few
    strict = _series_trends(monkeypatch, _doc(10, 40, min_change=0.5), "--min-change", "0.5")
    assert "none of the 40 changes tested was clear enough at --fdr 0.05 with --min-change 0.5" in strict
    assert "a smaller --min-change (now 0.5)" in strict and "a larger --fdr" in strict
    none_yet = _series_trends(monkeypatch, _doc(0, 0, note="trends need two periods with published results"))
    assert "no period has published results yet" in none_yet
    one = _series_trends(monkeypatch, _doc(1, 0, note="trends need two periods with published results"))
    assert "only 1 period has published results" in one
    disjoint = _series_trends(monkeypatch, _doc(8, 0))
    assert "no query was listed on both sides of any boundary" in disjoint
    found = _series_trends(monkeypatch, {**_doc(8, 3), "rising": 1, "changes": [
        {"query": "q", "from": "p1", "to": "p2", "p_before": 0.1, "p_after": 0.2, "change": 1.0, "trend": "rising"}]})
    assert "why none" not in found


# ----- 3. tables at 100 and 80 columns ----------------------------------------------------------------------------
ROUND_ID = "RoundIdOf22Characters_"
SERIES_ID = "SeriesIdOf22Character_"


def _series_doc() -> dict[str, Any]:
    rows = [{"period": k + 1, "starts": f"2026-12-0{k + 7}T00:00:00+00:00", "optin_until": "2026-12-07T12:00:00+00:00",
             "ends": f"2026-12-0{k + 8}T00:00:00+00:00",
             "round": {"id": ROUND_ID, "state": state, "messages": 5, "reports": reports, "optin_users": None},
             "note": note}
            for k, (state, reports, note) in enumerate([
                ("results-published", 123456, None),
                ("headlist-published", 0, "no device reports by the period's end: left open (close it once devices "
                                           "report, or delete it)")])]
    rows.append({"period": 3, "starts": "2026-12-09T00:00:00+00:00", "optin_until": "2026-12-09T12:00:00+00:00",
                 "ends": "2026-12-10T00:00:00+00:00", "round": None, "note": "not started"})
    return {"id": SERIES_ID, "name": "weekly trends", "kind": "blender", "state": "active", "periods": 3,
            "period_seconds": 86400.0, "optin_seconds": 43200.0, "start": "2026-12-07T00:00:00+00:00",
            "current_period": 2, "carry": 4, "periods_table": rows}


def _rendered(monkeypatch: pytest.MonkeyPatch, width: int, draw: Any) -> tuple[str, list[str]]:
    console = Console(width=width, file=io.StringIO(), highlight=False, soft_wrap=False)
    monkeypatch.setattr(render, "out", console)
    monkeypatch.setattr(render, "err", Console(width=width, file=io.StringIO(), highlight=False))
    draw()
    text = console.file.getvalue()
    return text, text.splitlines()


@pytest.mark.parametrize("width", [100, 80])
def test_series_status_shows_every_period_state_and_round_at_narrow_widths(monkeypatch: pytest.MonkeyPatch,
                                                                           width: int) -> None:
    """`series create` / `series status` at COLUMNS=100 (and 80): Rich squeezed period, state and reports to
    nothing; now each is printed whole, the columns that do not fit are named, and the notes follow the table."""
    text, lines = _rendered(monkeypatch, width, lambda: series_cli.show_series(_series_doc(), False))
    assert all(len(line) <= width for line in lines), text
    row = {k: next(line for line in lines if line.startswith(f"│ {k} ")) for k in (1, 2, 3)}
    assert ROUND_ID in row[1] and "results-published" in row[1] and "123,456" in row[1]
    assert ROUND_ID in row[2] and "headlist-published" in row[2]
    assert "2026-12-07" in row[1] and "2026-12-09" in row[3]
    flat = " ".join(text.split())
    assert "period 2: no device reports by the period's end" in flat or "no device reports" in row[2]
    assert "left out at this width: opt-in until, ends" in flat
    assert "a period ends when the next starts and takes opt-in data for its first 12h" in flat


def test_series_status_keeps_every_column_when_there_is_room(monkeypatch: pytest.MonkeyPatch) -> None:
    text, _ = _rendered(monkeypatch, 200, lambda: series_cli.show_series(_series_doc(), False))
    for header in ("period", "starts", "opt-in until", "ends", "round", "state", "reports", "note"):
        assert header in text
    assert "left out" not in text and "2026-12-07 12:00:00" in text


@pytest.mark.parametrize("width", [100, 80])
def test_round_list_and_status_show_ids_states_and_counts_at_narrow_widths(monkeypatch: pytest.MonkeyPatch,
                                                                          width: int) -> None:
    rounds = [{"id": ROUND_ID, "name": "demo (aol preset, scale 0.1, collecting reports)", "kind": "blender",
               "state": "collecting-reports", "created": "2026-12-07T00:00:00+00:00",
               "counts": {"optin_users": 2604, "reports": 1234567}},
              {"id": "AnotherRoundId_0123456", "name": "m", "kind": "mean", "state": "results-published",
               "created": "2026-12-08T00:00:00+00:00", "counts": {"optin_users": None, "reports": 30}}]
    text, lines = _rendered(monkeypatch, width, lambda: roundviews.print_rounds(rounds))
    assert all(len(line) <= width for line in lines), text
    first = next(line for line in lines if ROUND_ID in line)
    assert "collecting-reports" in first and "2,604" in first and "1,234,567" in first
    second = next(line for line in lines if "AnotherRoundId_0123456" in line)
    assert "results-published" in second and "30" in second
    text, lines = _rendered(monkeypatch, width, lambda: roundviews.print_round(rounds[0] | {"params": {
        "epsilon": 4.0, "delta": 1e-7, "head_list_size": 100, "issuance_seconds": 3600.0}}))
    assert all(len(line) <= width for line in lines), text
    assert ROUND_ID in text and "collecting-reports" in text and "1,234,567" in text


def test_fit_table_drops_the_highest_drop_first_and_never_cuts_a_key_column() -> None:
    cols = (render.Col("id"), render.Col("a", wrap=5, drop=1), render.Col("b", drop=2), render.Col("c"))
    rows = [["x" * 30, "some words here", "y" * 30, "z" * 10]]
    table, left_out = render.fit_table(cols, rows, 60)
    assert left_out == ["b"]
    console = Console(width=60, file=io.StringIO())
    console.print(table)
    out = console.file.getvalue()
    assert "x" * 30 in out and "z" * 10 in out and "y" not in out
    assert "[red]" in _plain_cell("[red]not markup[/red]")


def _plain_cell(text: str) -> str:
    table, _ = render.fit_table((render.Col("v"),), [[text]], 80)
    console = Console(width=80, file=io.StringIO())
    console.print(table)
    return console.file.getvalue()


# ----- 5. a busy port -------------------------------------------------------------------------------------------
def test_serve_on_a_busy_port_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = invoke("serve", "--port", port, "--data-dir", data, ok=False)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.startswith(f"error: port {port} on 127.0.0.1 is in use (")
    assert message.endswith("); choose another with --port")
    assert "Traceback" not in result.output and "Application startup complete" not in result.output
    assert not data.exists()  # no data directory: no database, no admin token
    assert not (data / "hybriddp.db").exists() and not (data / "admin-token").exists()


def test_check_port_passes_a_free_port_and_port_0() -> None:
    from hybriddp.cli.serve import check_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    check_port("127.0.0.1", free)
    check_port("127.0.0.1", 0)

"""Fixtures of the real-browser tests: a ``hybriddp serve --demo`` process and Debian's Chromium driven by Playwright.

Chromium is ``/usr/bin/chromium`` (``apt-get install chromium``; Playwright's own browser download is never
used). A missing Chromium or Playwright FAILS the tests, with what to install. Each test gets a new browser
context (its own storage), collects the page's console errors and uncaught exceptions, and the test fails
if there were any. Screenshots go to ``test-artifacts/browser/`` at the top of the repository.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browserhelpers import API, CHROMIUM, CHROMIUM_ARGS, DemoServer, PageErrors, ServerProcess

from sessiononce import once_per_run


def _start(tmp: Path, db_url: str, *extra: str, timeout: float = 60.0) -> ServerProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    proc = ServerProcess(db_url, tmp, extra_args=extra)
    proc.start(timeout=timeout)
    return proc


def _check_log(proc: ServerProcess) -> None:
    assert "Traceback" not in proc.log_text(), proc.log_text()[-4000:]


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """``hybriddp serve --demo`` on a fresh SQLite file: the demo round runs into it first and a second round is left
    collecting reports (about 15 s)."""
    once_per_run(tmp_path_factory, "the browser tests' demo server")
    tmp = tmp_path_factory.mktemp("served-demo")
    db_url = f"sqlite:///{tmp / 'hybriddp.db'}"
    proc = _start(tmp / "main", db_url, "--demo", "--log-level", "warning", timeout=300)
    try:
        rounds = httpx.get(f"{proc.base_url}{API}/rounds", headers=proc.admin, timeout=30).json()["rounds"]
        assert [r["state"] for r in rounds] == ["results-published", "headlist-published"], rounds
        yield DemoServer(proc, db_url, rounds[0]["id"], rounds[1]["id"])
    finally:
        proc.stop()
    _check_log(proc)


@pytest.fixture
def second_server(demo: DemoServer, tmp_path: Path) -> Iterator[DemoServer]:
    """Another server process on the demo's database (SQLite WAL allows it): a test may stop it."""
    proc = _start(tmp_path / "second", demo.db_url, "--log-level", "warning")
    try:
        yield DemoServer(proc, demo.db_url, demo.demo_round, demo.collecting_round)
    finally:
        proc.stop()
    _check_log(proc)


@pytest.fixture
def open_server(demo: DemoServer, tmp_path: Path) -> Iterator[DemoServer]:
    """Another server process on the demo's database, started with ``--open-admission``: it takes reports without
    report tokens (docs/TOKENS.md), which its pages must call unsafe."""
    proc = _start(tmp_path / "open", demo.db_url, "--open-admission", "--log-level", "warning")
    try:
        yield DemoServer(proc, demo.db_url, demo.demo_round, demo.collecting_round)
    finally:
        proc.stop()
    _check_log(proc)


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """``hybriddp serve`` on a new, empty SQLite database (a test's own rounds, apart from the demo's)."""
    proc = _start(tmp_path / "fresh", f"sqlite:///{tmp_path / 'fresh.db'}", "--log-level", "warning")
    try:
        yield proc
    finally:
        proc.stop()
    _check_log(proc)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """Debian's Chromium under Playwright, headless; missing pieces fail the tests."""
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: pip install -e '.[test]' (the PyPI package; its browser "
                    "download is not used)", pytrace=False)
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"the browser tests need Chromium at {CHROMIUM}: apt-get install chromium", pytrace=False)
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        except PlaywrightError as exc:
            pytest.fail(f"Playwright cannot start {CHROMIUM}: {exc}", pytrace=False)
        yield browser
        browser.close()


@pytest.fixture
def page_errors() -> PageErrors:
    return PageErrors()


@pytest.fixture
def page(chromium: Any, page_errors: PageErrors, tmp_path: Path) -> Iterator[Any]:
    """A page in a new browser context (empty storage, like a new profile); the test fails on any page error."""
    context = chromium.new_context(viewport={"width": 1100, "height": 860}, locale="en-US", timezone_id="UTC")
    context.set_default_timeout(15_000)
    pg = context.new_page()
    page_errors.watch(pg)
    try:
        yield pg
    finally:
        context.close()
    assert page_errors.messages == [], "the page reported errors:\n" + "\n".join(page_errors.messages)

"""Helpers of the real-browser tests (imported by conftest.py and the tests: a module named ``conftest`` is
ambiguous when several directories have one)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tokenhelpers import relay_credential, tokened

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
from test_reliability import ServerProcess  # tests/service: the server as a process

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-quic", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
API = "/api/v1"


@dataclass
class DemoServer:
    """The served demo: the server process, its SQLite URL, the finished demo round's id and the id of the demo
    round left collecting reports."""

    proc: ServerProcess
    db_url: str
    demo_round: str
    collecting_round: str

    @property
    def base_url(self) -> str:
        return self.proc.base_url

    def get(self, path: str) -> Any:
        r = httpx.get(self.base_url + path, timeout=30)
        assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text[:500]}"
        return r.json()


@dataclass
class PageErrors:
    """What a page reported as an error: console messages of type error and uncaught exceptions."""

    messages: list[str] = field(default_factory=list)

    def watch(self, page: Any) -> None:
        page.on("console", lambda msg: self.messages.append(f"console.{msg.type}: {msg.text} ({msg.location})")
                if msg.type == "error" else None)
        page.on("pageerror", lambda exc: self.messages.append(f"uncaught: {exc}"))


def expect_failed_load(errors: PageErrors, url_part: str) -> list[str]:
    """Chromium logs a request that failed (an HTTP error status, an aborted request) as a console error: take those
    of URLs containing ``url_part`` off the page's errors, after checking there is one; returns them."""
    failed = [m for m in errors.messages if "Failed to load resource" in m and url_part in m]
    assert failed, f"no failed load of {url_part} among the page's errors: {errors.messages}"
    errors.messages[:] = [m for m in errors.messages if m not in failed]
    return failed


def with_tokens(base_url: str, admin: dict[str, str], rid: str, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages, each with its report token (docs/TOKENS.md), got with a new credential the administrator makes
    for them (a relay's: as many tokens per round as there are messages)."""
    with httpx.Client(base_url=base_url + API, timeout=60) as http:
        return tokened(http, "", rid, relay_credential(http, "", admin, len(msgs)), msgs)


def screenshot(page: Any, name: str) -> Path:
    """Keep a full-page screenshot as a test artifact; returns its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path

"""Issue 42's rough edges on the service's side: the API's default trend window, a series period too short for the
work its rounds need (422 naming the fields, the values and the fix; a warning where the windows are only squeezed),
and ``serve --demo``'s patient clients (an upload answered 503 is retried; a demo that fails all the same leaves the
server serving). SQLite only: none of this depends on the database.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from hybriddp.cli import cli
from hybriddp.server.trends import DEFAULT_WINDOW
from hybriddp.service import create_app
from hybriddp.service import demo as demo_mod
from hybriddp.service.series import MIN_REPORT_PHASE_SECONDS

ADMIN = "admin-token-of-the-rough-edges-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
PARAMS = {"epsilon": 8.0, "delta": 1e-5, "head_list_size": 10}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(f"sqlite:///{tmp_path / 'hybriddp.db'}", ADMIN, series_tick=0)) as c:
        yield c


def _create(client: TestClient, **body: Any) -> Any:
    return client.post(f"{API}/series", json={"kind": "blender", "params": PARAMS, "periods": 2, **body},
                       headers=AUTH)


# ----- 1. the API's default window ------------------------------------------------------------------------------
def test_the_trends_endpoint_defaults_to_the_trend_modules_window(client: TestClient) -> None:
    resp = _create(client, period_seconds=7 * 86400)
    assert resp.status_code == 201, resp.text
    doc = client.get(f"{API}/series/{resp.json()['id']}/trends").json()
    assert doc["window"] == DEFAULT_WINDOW
    params = client.app.openapi()["paths"][f"{API}/series/{{series_id}}/trends"]["get"]["parameters"]
    window = next(p for p in params if p["name"] == "window")
    assert window["schema"]["default"] == DEFAULT_WINDOW


# ----- 4. a period shorter than the work it needs -----------------------------------------------------------------
def test_a_period_too_short_for_tokens_and_reports_is_refused_naming_the_fix(client: TestClient) -> None:
    """Five-minute periods (the default opt-in window: half) leave 150 s for the head list, the tokens and the
    reports: the round would close while devices still report. 422, nothing stored."""
    resp = _create(client, period_seconds=300)
    assert resp.status_code == 422, resp.text
    message = resp.json()["error"]["message"]
    assert "\n" not in message
    for needle in ("period (--period) = 300.0", "opt-in window (--optin-window) of 150 s", "leaves 150 s",
                   f"at least {MIN_REPORT_PHASE_SECONDS:g} s", "params.issuance_seconds, 3600 s",
                   "params.report_seconds, 3600 s", "Use --period 20m or longer"):
        assert needle in message, message
    resp = _create(client, period_seconds=900, optin_seconds=600)  # 300 s left: a shorter opt-in window works
    assert resp.status_code == 422
    assert "--period 20m or longer" in resp.json()["error"]["message"]
    assert "a shorter --optin-window (at most 5m)" in resp.json()["error"]["message"]
    assert client.get(f"{API}/series", headers=AUTH).json()["series"] == []


def test_squeezed_windows_are_a_warning_and_roomy_ones_none(client: TestClient) -> None:
    resp = _create(client, period_seconds=1200)  # 600 s after the opt-in window: enough, but 7200 s squeezed
    assert resp.status_code == 201, resp.text
    (warning,) = resp.json()["warnings"]
    assert "3600 s + 3600 s" in warning and "shrinks them to 270 s + 270 s" in warning
    assert client.get(f"{API}/series/{resp.json()['id']}").json()["warnings"] == [warning]  # shown with the series
    roomy = _create(client, period_seconds=86400, start="2031-01-01T00:00:00+00:00")
    assert roomy.status_code == 201 and roomy.json()["warnings"] == []


def test_series_create_on_the_command_line_prints_the_refusal(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'cli.db'}", ADMIN, series_tick=0)
    with demo_mod.local_server(app) as url:
        result = CliRunner().invoke(cli, ["series", "create", "--server", url, "--period", "5m", "--periods", "2",
                                          "--epsilon", "8"], env={"HYBRIDDP_ADMIN_TOKEN": ADMIN})
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for needle in ("period (--period) = 300.0", "leaves 150 s", "Use --period 20m or longer"):
        assert needle in result.stderr, result.stderr


def test_the_period_option_states_the_rule() -> None:
    text = " ".join(CliRunner().invoke(cli, ["series", "create", "--help"]).output.split())
    assert "It must leave at least 600 s after the opt-in window (--period 20m or more" in text


# ----- 7. serve --demo on a busy machine ----------------------------------------------------------------------------
def test_the_demos_clients_wait_long_and_retry() -> None:
    assert demo_mod.DEMO_TIMEOUT_S >= 600 and demo_mod.DEMO_RETRY.attempts >= 5
    with demo_mod.demo_http() as http:
        assert http.timeout.read == demo_mod.DEMO_TIMEOUT_S
    with demo_mod.demo_admin("http://127.0.0.1:9", ADMIN) as admin:
        assert admin.retry is demo_mod.DEMO_RETRY and admin.http.timeout.read == demo_mod.DEMO_TIMEOUT_S


def test_an_upload_answered_503_once_is_retried_and_the_demo_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server refuses the first opt-in upload (503, as a loaded server does); the demo's relay retries it and
    the round is published as if nothing happened."""
    from hybriddp.core.params import BlenderParams
    from logdata import zipf_log

    refused: list[str] = []

    def busy_first_upload(app: Any) -> Any:
        async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if (scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith("/optin/records")
                    and not refused):
                refused.append(scope["path"])
                while (await receive()).get("more_body"):  # read the body, as a server that gave up late
                    pass
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"0")]})
                await send({"type": "http.response.body", "body": b'{"error": {"message": "busy"}}'})
                return
            await app(scope, receive, send)
        return wrapped

    real = demo_mod.local_server

    @contextlib.contextmanager
    def flaky_server(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
        with real(busy_first_upload(app), host) as url:
            yield url

    monkeypatch.setattr(demo_mod, "local_server", flaky_server)
    log = zipf_log(n_users=2000, n_queries=6, urls_per_query=2, seed=3)
    done = demo_mod.service_demo(log, BlenderParams(epsilon=8.0, optin_fraction=0.1), seed=None)
    assert refused and done.round["state"] == "results-published"
    assert done.server_results["sizes"]["optin_users"] == 200  # every opt-in user's upload stored, once


def _serve_demo_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception) -> tuple[Any, list[Any]]:
    """``hybriddp serve --demo`` whose demo raises ``exc``, with uvicorn.run recording the app instead of serving;
    the CLI's result and the apps it would have served."""
    import uvicorn

    def failing(*args: Any, **kw: Any) -> Any:
        raise exc

    monkeypatch.setattr(demo_mod, "populate_demo", failing)
    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(app() if kw.get("factory") else app))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = CliRunner().invoke(cli, ["serve", "--demo", "--data-dir", str(tmp_path / "data"), "--port", "0",
                                          "--log-level", "warning"])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return result, served


def test_serve_demo_keeps_serving_with_a_warning_when_the_demo_fails(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from hybriddp.sdk.http import ServiceUnavailableError

    result, served = _serve_demo_failing(tmp_path, monkeypatch, ServiceUnavailableError(
        "upload opt-in records of several users to round X: timed out (gave up after 8 attempts)"))
    assert result.exit_code == 0, result.output + result.stderr
    assert served, "the server was not started"
    assert "warning: the demo round could not be run (upload opt-in records" in result.stderr
    assert "serving without it" in result.stderr
    assert "serving on http://127.0.0.1:0" in result.stdout and "demo round:" not in result.stdout


def test_serve_demo_still_refuses_what_no_wait_can_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal (here the lifetime budget, HTTP 409) is bad input, not a busy machine: exit 2, nothing served."""
    from hybriddp.sdk.http import ConflictError

    result, served = _serve_demo_failing(tmp_path, monkeypatch, ConflictError(
        "enrol users in round X: past the lifetime budget (HTTP 409 budget_exceeded)", status=409,
        code="budget_exceeded"))
    assert result.exit_code == 2 and not served
    assert "error: enrol users in round X: past the lifetime budget" in result.stderr

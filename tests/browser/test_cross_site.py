"""Cross-site report forgery (issue 29) in a real Chromium: a page of *another origin* tries to make its visitor's
browser submit device reports to the service, with ``fetch(…, {mode: "no-cors", body: new Blob([msg])})``, with a
``text/plain`` body and with ``navigator.sendBeacon``. Before the guard (docs/DEPLOYMENT.md) such reports were
counted (1,000,000 → 1,000,002 messages); now none is. The same message sent by the service's own page is counted,
so the browser did deliver what the attack page sent. The messages carry valid report tokens (docs/TOKENS.md), so
what refuses them is the cross-site guard, not a missing token; nor can the attack page get itself a device
credential from a server with self-enrolment (``serve --demo``)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from browserhelpers import API, DemoServer, with_tokens

from hybriddp.device.localalg import randomize_records

ATTACK = """<!doctype html><html><body><p id="state">running</p><script>
const url = %(url)s, msgs = %(msgs)s, enrol = %(enrol)s;
fetch(enrol, {method: "POST", mode: "no-cors"}).catch(() => {});
navigator.sendBeacon(enrol, "");
fetch(url, {method: "POST", mode: "no-cors", body: new Blob([JSON.stringify(msgs[0])])}).catch(() => {});
fetch(url, {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
            body: JSON.stringify(msgs[1])}).catch(() => {});
navigator.sendBeacon(url, new Blob([JSON.stringify(msgs[2])]));
navigator.sendBeacon(url, JSON.stringify(msgs[3]));
setTimeout(() => { document.getElementById("state").textContent = "sent"; }, 1500);
</script></body></html>"""


@pytest.fixture
def attacker_site() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A second origin (another port): serves whatever page the test puts in the returned dict under "/"."""
    pages: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pages
    finally:
        server.shutdown()


def _credentials(demo: DemoServer) -> int:
    r = httpx.get(f"{demo.base_url}{API}/device-credentials", headers=demo.proc.admin, timeout=30)
    assert r.status_code == 200, r.text
    return len(r.json()["credentials"])


def _messages(demo: DemoServer) -> int:
    r = httpx.get(f"{demo.base_url}{API}/rounds/{demo.collecting_round}", timeout=30)
    return int(r.json()["counts"]["messages"])


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A page of a new context that, unlike the other browser tests', expects failed loads: the refusals."""
    context = chromium.new_context()
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def test_another_site_cannot_make_browsers_report(demo: DemoServer, page: Any,
                                                 attacker_site: tuple[str, dict[str, bytes]]) -> None:
    origin, pages = attacker_site
    headlist = httpx.get(f"{demo.base_url}{API}/rounds/{demo.collecting_round}/headlist", timeout=30).json()
    msgs = [randomize_records(headlist, [("weather", "https://weather.example/")]) for _ in range(5)]
    msgs = with_tokens(demo.base_url, demo.proc.admin, demo.collecting_round, msgs)  # each one valid as it is
    url = f"{demo.base_url}{API}/rounds/{demo.collecting_round}/reports"
    enrol = f"{demo.base_url}{API}/device-credentials/self"
    pages["/"] = (ATTACK % {"url": json.dumps(url), "msgs": json.dumps(msgs), "enrol": json.dumps(enrol)}).encode()
    before, credentials = _messages(demo), _credentials(demo)
    refused: list[int] = []
    page.on("response", lambda r: refused.append(r.status) if "/reports" in r.url or "/self" in r.url else None)
    page.goto(origin + "/")
    page.wait_for_function("document.getElementById('state').textContent === 'sent'")
    time.sleep(1.0)  # beacons are sent asynchronously
    assert _messages(demo) == before, "a report sent by another site's page was counted"
    assert _credentials(demo) == credentials, "another site's page got a device credential"
    assert refused and set(refused) <= {0, 403}, refused  # the requests did reach the server, which refused them

    # the service's own page sends the fifth message the way its device module does (JSON, same origin): counted
    page.goto(demo.base_url + "/")
    status = page.evaluate("""async ([url, msg]) => (await fetch(url, {method: "POST",
        headers: {"Content-Type": "application/json"}, body: JSON.stringify(msg)})).status""", [url, msgs[4]])
    assert status == 200
    assert _messages(demo) == before + 1

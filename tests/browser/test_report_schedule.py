"""The local-search page sends a report at a random time in the round's report window (protocol v2 §3.4), in a real
Chromium: the picked report is randomized, charged and kept in the page's outbox (localStorage) with a send time
uniform in the window, sent by a timer while the page is open, and, when the page was closed before that time, sent
when the page is opened again. The rounds here have short windows (round parameters ``issuance_seconds`` and
``report_seconds``) and the server runs with ``--open-admission`` (the tokens' part is tests/browser/
test_browser_pages.py, which sends at once through the page's test-only flag)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from browserhelpers import API
from test_browser_pages import (
    SAFE_URL,
    message_count,
    open_page,
    pick_top,
    posted,
    suggestions_round,
    wait_status,
    watch_posts,
)
from test_reliability import ServerProcess

from hybriddp.core import tokens

OUTBOX_KEY = "hybriddp-outbox"


def windowed_round(srv: ServerProcess, issuance: float, report: float, n_users: int = 240) -> tuple[str, dict]:
    """A BLENDER round whose head list lists "alert me", published now with the given issuance and report windows."""
    with httpx.Client(base_url=srv.base_url + API, timeout=60) as http:
        r = http.post("/rounds", headers=srv.admin, json={"kind": "blender", "name": "schedule", "params": {
            "epsilon": 4.0, "delta": 1e-5, "head_list_size": 10, "m_o": 1, "m_c": 1, "issuance_seconds": issuance,
            "report_seconds": report}})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        r = http.post(f"/rounds/{rid}/optin/enrol", headers=srv.admin,
                      json={"users": [f"user-{u}" for u in range(n_users)]})
        assert r.status_code == 201, r.text
        for token in r.json()["tokens"]:
            assert http.post(f"/rounds/{rid}/optin/records", json={"records": [{"query": "alert me", "url": SAFE_URL}]},
                             headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert http.post(f"/rounds/{rid}/headlist", headers=srv.admin).status_code == 200
        doc = http.get(f"/rounds/{rid}/headlist").json()
    assert doc["report_window"], doc
    return rid, doc


def outbox(page: Any) -> dict[str, Any]:
    return page.evaluate("key => JSON.parse(localStorage.getItem(key) || '{}')", OUTBOX_KEY)


def test_a_report_is_sent_at_a_random_time_in_the_window_and_after_a_reload(tmp_path: Any, page: Any) -> None:
    srv = ServerProcess(f"sqlite:///{tmp_path / 'schedule.db'}", tmp_path,
                        extra_args=("--open-admission", "--log-level", "warning"))
    srv.start(timeout=60)
    try:
        suggestions_round(srv)

        # open page: the timer sends the report at its time, inside the window
        rid_a, doc_a = windowed_round(srv, 0, 6)
        opens, closes = (tokens.parse_time(doc_a["report_window"][k], k) for k in ("opens", "closes"))
        posts = watch_posts(page)
        open_page(page, srv.base_url + "/", report_now=False)
        page.get_by_role("switch", name="Contribute").click()
        pick_top(page, "ale", ["alert me"])
        page.wait_for_function("([k, r]) => JSON.parse(localStorage.getItem(k) || '{}')[r] !== undefined",
                               arg=[OUTBOX_KEY, rid_a])
        entry = outbox(page)[rid_a]
        picked_at = time.time()
        assert opens - 1 <= entry["send_at"] <= closes, (entry["send_at"], opens, closes)
        if entry["send_at"] > picked_at + 0.5:
            assert posted(posts, f"/rounds/{rid_a}/reports") == [], "sent before its time"
            assert "Randomized and kept" in page.locator("#contribute-status").inner_text()
            assert page.locator("#sent-state").inner_text().startswith("waiting: sent at ")
        page.wait_for_function("() => document.getElementById('sent-state')?.textContent === "
                               "'acknowledged and counted'", timeout=15_000)
        sent_at = time.time()
        assert sent_at >= entry["send_at"] - 0.5 and sent_at <= closes + 3, (sent_at, entry["send_at"], closes)
        (req,) = posted(posts, f"/rounds/{rid_a}/reports")
        assert json.loads(req.post_data) == entry["message"]
        assert outbox(page) == {}
        assert message_count(srv, rid_a) == 1

        # the page closed before the send time: the next load sends the kept message
        rid_b, doc_b = windowed_round(srv, 4, 3)
        opens_b = tokens.parse_time(doc_b["report_window"]["opens"], "opens")
        open_page(page, srv.base_url + "/", report_now=False)
        page.get_by_role("switch", name="Contribute").click()
        pick_top(page, "ale", ["alert me"])
        wait_status(page, "If this page is closed, it is sent when the page is opened again")
        entry_b = outbox(page)[rid_b]
        assert entry_b["send_at"] >= opens_b - 1
        page.goto("about:blank")
        time.sleep(max(0.0, entry_b["send_at"] - time.time()) + 1)
        assert message_count(srv, rid_b) == 0, "the closed page sent nothing"
        with page.expect_request(lambda r: r.method == "POST" and r.url.endswith(f"/rounds/{rid_b}/reports")) as req_b:
            open_page(page, srv.base_url + "/", report_now=False)
        assert json.loads(req_b.value.post_data) == entry_b["message"]
        page.wait_for_function("() => document.getElementById('sent-state')?.textContent === "
                               "'acknowledged and counted'")
        assert message_count(srv, rid_b) == 1
        assert outbox(page) == {}
    finally:
        srv.stop()
    assert "Traceback" not in srv.log_text()

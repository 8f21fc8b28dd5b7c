"""The series page in a real Chromium (issue 30): a 12-period round series run through a real ``hybriddp serve``
with admission on (every device report carries its token), then ``/series/{id}`` must show the schedule, every
period's round, and the planted rising query as a rising trend with its chart; each round page links back.

Every page must run without console errors or uncaught exceptions (conftest ``page``); the screenshot is kept in
``test-artifacts/browser/``.
"""

from __future__ import annotations

from typing import Any

import httpx
from browserhelpers import API, screenshot, with_tokens

from hybriddp.server.trends import DEFAULT_WINDOW
from serieshelpers import PERIODS, drive_series


def test_the_series_page_shows_the_periods_and_the_rising_query(fresh_server: Any, page: Any) -> None:
    base, admin = fresh_server.base_url, fresh_server.admin
    with httpx.Client(base_url=base, timeout=120) as http:
        sid, acked = drive_series(http, admin, devices=600,
                                  tokens=lambda rid, msgs: with_tokens(base, admin, rid, msgs))
        for rid, n in acked.items():
            assert http.get(f"{API}/rounds/{rid}", headers=admin).json()["counts"]["messages"] == n
    page.goto(f"{base}/series/{sid}")
    page.wait_for_selector("#trends-panel:not([hidden])")
    # issue 42: the menu shows the window the server's default analysis used (the CLI's and the SDK's too)
    assert page.locator("#window").input_value() == str(DEFAULT_WINDOW)
    page.select_option("#window", "3")
    page.wait_for_function("() => !document.querySelector('#trends-summary').textContent.startsWith('Testing')")
    rising = page.wait_for_selector('figure.trend.rising[data-query="eclipse"]')
    assert "rising" in rising.inner_text()
    points = rising.query_selector_all("g.trend-point")
    assert len(points) == PERIODS  # listed in every period: one point with its interval each
    assert page.locator("#series-name").inner_text() == "weekly"
    assert "12 periods of 1 week" in page.locator("#schedule").inner_text()
    assert "2 periods" in page.locator("#budget").inner_text()
    rows = page.locator("#periods tbody tr")
    assert rows.count() == PERIODS and "results-" in rows.nth(0).inner_text()
    assert "rising" in page.locator("#trends-summary").inner_text()
    screenshot(page, "series-trends")
    first_round = rows.nth(0).locator("a").get_attribute("href")
    page.goto(f"{base}{first_round}")
    link = page.wait_for_selector("#series-link")
    assert link.inner_text() == "period 1 of a series" and link.get_attribute("href") == f"/series/{sid}"

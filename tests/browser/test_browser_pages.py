"""The local-search page and the round page in a real Chromium, against ``hybriddp serve --demo`` (issue 11).

* typing a prefix of a head-list query lists its suggestions in ranked order (blended probability, the
  order derived here from the published local-search document), each listbox update within 100 ms of its
  keystroke (measured in the page: the keydown event's time stamp to the listbox mutation);
* keyboard selection (arrows, Enter, Escape) and the ARIA wiring of the search box and listbox;
* the page still suggests after its server process is stopped (the document is kept in the browser), and
  after a reload too (its service worker keeps the page's files);
* with "contribute" on, picking a suggestion stores exactly one report (read from the database), made for
  the head list the demo's collecting round published; off (the default), picking sends nothing;
* report tokens (docs/TOKENS.md, protocol v2; ``serve --demo`` admits devices with self-enrolment): the page gets
  this browser a device credential once (kept in localStorage; a self-enrolled one the server no longer knows is
  replaced) and a token when contributing is switched on, before anything is picked; the message takes the id the
  token's nonce derives and carries the 354-byte Token, and the page shows that it carried one; a report whose POST
  failed is resent with the same id and token on the next pick, counted once; a server without self-enrolment gets
  nothing from a browser without a credential (nothing charged); a server with open admission gets reports without
  tokens and the page warns that it is unsafe. These tests set the page's test-only flag REPORT_NOW_KEY so that a
  report goes at once; tests/browser/test_report_schedule.py checks the random send time in a short window;
* the same pick under the same head list in a later round is sent again as the same randomized reports, uncharged
  (memoization); a second pick in a round is refused;
* a published URL that is not http(s) ("javascript:...", "data:...") is shown as text, never as a link;
* the round page of the closed demo round draws the interval chart and the results table (and so it does for
  a closed mean round).

Every page must run without console errors or uncaught exceptions (conftest ``page``); screenshots are kept
in ``test-artifacts/browser/``.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from browserhelpers import API, ARTIFACTS, DemoServer, PageErrors, expect_failed_load, screenshot, with_tokens
from test_reliability import ServerProcess, open_round, stored_messages

from hybriddp.core import tokens
from hybriddp.core.protocol import lists_hash, new_message_id
from hybriddp.device.localalg import randomize_records
from hybriddp.device.mean import randomize_value

LATENCY_MS = 100.0
CREDENTIAL_KEY = "hybriddp-device-credential"  # where the page keeps this browser's device credential
ADMIN_ONLY = "this server admits only devices with a credential from its administrator"
TOKEN = re.compile(r"[A-Za-z0-9_-]{472}")  # a report token: the 354-byte Token, URL-safe base64 without padding
REPORT_NOW_KEY = "hybriddp-report-now"  # the page's test-only flag: send a report at once, not in the window
SEPARATORS = re.compile(r"[\s./_-]+")

# installed in the page before typing: the time of every keydown and of every change of the listbox
MEASURE_JS = """() => {
  const box = document.querySelector('[role="searchbox"]');
  const list = document.getElementById(box.getAttribute('aria-controls'));
  window.__keys = []; window.__updates = [];
  box.addEventListener('keydown', (e) => {
    const now = performance.now();
    window.__keys.push(e.timeStamp > 0 && e.timeStamp <= now ? e.timeStamp : now);
  }, {capture: true});
  new MutationObserver(() => window.__updates.push(performance.now())).observe(list, {childList: true});
}"""


def watch_posts(page: Any) -> list[Any]:
    """The page's POST requests, in order, as they are made."""
    posts: list[Any] = []
    page.on("request", lambda req: posts.append(req) if req.method == "POST" else None)
    return posts

def expected_suggestions(doc: dict[str, Any], prefix: str, limit: int = 8) -> list[str]:
    """The queries a prefix should suggest: the query or one of its words starts with it (case-insensitive), in the
    document's order (the suggestions' guarded ranking, ALGORITHM.md §7.2)."""
    p = prefix.lower()
    hits = [q for q in doc["queries"] if any(w.startswith(p) for w in SEPARATORS.split(q["query"].lower()) if w)]
    return [q["query"] for q in hits][:limit]


def best_prefix(doc: dict[str, Any]) -> str:
    """A 3-letter prefix of a listed query that suggests as many queries as possible (ranking shows)."""
    prefixes = {q["query"].lower()[:3] for q in doc["queries"] if len(q["query"]) >= 3 and q["query"][:3].isalnum()}
    assert prefixes, doc
    return max(sorted(prefixes), key=lambda p: len(expected_suggestions(doc, p)))


def local_search_doc(server: DemoServer) -> dict[str, Any]:
    return server.get(f"{API}/rounds/{server.demo_round}/local-search")


def search_case(server: DemoServer) -> tuple[dict[str, Any], str, list[str]]:
    """The served demo round's local-search document, a prefix to type, and the suggestions expected for it."""
    doc = local_search_doc(server)
    prefix = best_prefix(doc)
    return doc, prefix, expected_suggestions(doc, prefix)


def open_page(page: Any, url: str, *, report_now: bool = True) -> None:
    """Load the local-search page and wait until its list and its contribute switch are set up; ``report_now``: set
    the page's test-only flag that sends a report at once instead of at a random time in the report window."""
    page.goto(url)
    page.wait_for_selector("body[data-loaded][data-contribute-ready]")
    assert page.get_by_role("searchbox").is_enabled()
    if report_now:
        page.evaluate("key => localStorage.setItem(key, '1')", REPORT_NOW_KEY)


def option_queries(page: Any) -> list[str]:
    return page.locator('[role="listbox"] [role="option"]').evaluate_all("els => els.map(e => e.dataset.query)")


def type_prefix(page: Any, prefix: str, expected: list[str]) -> None:
    box = page.get_by_role("searchbox")
    box.fill("")
    box.press_sequentially(prefix, delay=60)
    page.wait_for_function("n => document.querySelectorAll('[role=\"option\"]').length === n", arg=len(expected))


# ----- suggestions ------------------------------------------------------------------------------
def test_suggestions_in_ranked_order_within_100_ms(demo: DemoServer, page: Any) -> None:
    doc, prefix, expected = search_case(demo)
    assert expected
    open_page(page, demo.base_url + "/")
    page.evaluate(MEASURE_JS)
    page.get_by_role("searchbox").press_sequentially(prefix, delay=60)
    page.wait_for_function("n => document.querySelectorAll('[role=\"option\"]').length === n", arg=len(expected))

    assert option_queries(page) == expected
    keys = page.evaluate("window.__keys")
    updates = page.evaluate("window.__updates")
    assert len(keys) == len(prefix)
    latencies = []
    for i, k in enumerate(keys):
        nxt = keys[i + 1] if i + 1 < len(keys) else float("inf")
        after = [u for u in updates if k <= u < nxt]
        assert after, f"keystroke {i + 1} ({prefix[i]!r}) did not update the listbox: keys {keys}, updates {updates}"
        latencies.append(after[0] - k)
    assert max(latencies) < LATENCY_MS, f"listbox updates {latencies} ms after their keystrokes"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "suggestion-latency.json").write_text(json.dumps({"prefix": prefix, "ms": latencies}) + "\n")

    # each option shows its blended probability and its top URLs as links
    first = page.get_by_role("option").first
    top = next(q for q in doc["queries"] if q["query"] == expected[0])
    hrefs = first.get_by_role("link").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert hrefs == [u["url"] for u in top["urls"][:3]]
    page.get_by_role("searchbox").press("ArrowDown")  # the top suggestion highlighted, as in the README's picture
    screenshot(page, "local-search")


def test_keyboard_selection_and_aria(demo: DemoServer, page: Any) -> None:
    _, prefix, expected = search_case(demo)
    open_page(page, demo.base_url + "/")
    box = page.get_by_role("searchbox")
    listbox = page.locator('[role="listbox"]')  # hidden while empty
    assert box.get_attribute("aria-controls") == listbox.get_attribute("id")
    assert box.get_attribute("aria-autocomplete") == "list"
    assert listbox.get_attribute("aria-label")
    type_prefix(page, prefix, expected)
    options = page.get_by_role("option")

    def selected() -> list[int]:
        return [i for i in range(options.count()) if options.nth(i).get_attribute("aria-selected") == "true"]

    assert selected() == [] and box.get_attribute("aria-activedescendant") is None
    box.press("ArrowDown")
    assert selected() == [0]
    assert box.get_attribute("aria-activedescendant") == options.nth(0).get_attribute("id")
    box.press("ArrowUp")  # wraps to the last
    assert selected() == [len(expected) - 1]
    box.press("ArrowDown")  # and back to the first
    assert selected() == [0]
    if len(expected) > 1:
        box.press("ArrowDown")
        assert selected() == [1]
        assert box.get_attribute("aria-activedescendant") == options.nth(1).get_attribute("id")
        box.press("ArrowUp")
    assert box.evaluate("el => document.activeElement === el")  # focus stays in the box throughout
    box.press("Enter")
    assert box.input_value() == expected[0]
    assert options.count() == 0
    assert page.locator("#picked-query").inner_text() == expected[0]
    assert box.get_attribute("aria-activedescendant") is None

    type_prefix(page, prefix, expected)
    box.press("Escape")
    assert options.count() == 0
    assert box.input_value() == prefix


# ----- offline ----------------------------------------------------------------------------------
def test_suggests_after_the_server_is_stopped(second_server: DemoServer, page: Any) -> None:
    doc, prefix, expected = search_case(second_server)
    open_page(page, second_server.base_url + "/")
    kept = page.evaluate("JSON.parse(localStorage.getItem('hybriddp-local-search')).doc")
    assert kept == doc
    page.wait_for_function("() => navigator.serviceWorker.controller !== null")  # sw.js keeps the page's files
    second_server.proc.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(second_server.base_url + "/health", timeout=2)
    type_prefix(page, prefix, expected)  # the page as it was loaded
    assert option_queries(page) == expected
    page.get_by_role("searchbox").press("ArrowDown")
    page.get_by_role("searchbox").press("Enter")
    assert page.locator("#picked-query").inner_text() == expected[0]

    page.reload()  # and a reload, with the server still gone
    page.wait_for_selector("body[data-loaded][data-contribute-ready]")
    assert "offline" in page.locator("#net-status").inner_text()
    assert page.get_by_role("switch", name="Contribute").is_disabled()
    type_prefix(page, prefix, expected)
    assert option_queries(page) == expected
    screenshot(page, "local-search-offline")


def test_the_network_badge_follows_the_browsers_offline_and_online_events(demo: DemoServer, page: Any) -> None:
    """Issue 42: the badge changed only on reload; it must follow the window's ``offline`` and ``online`` events."""
    open_page(page, demo.base_url + "/")
    badge = page.locator("#net-status")
    assert badge.inner_text() == "online"
    page.evaluate("() => window.dispatchEvent(new Event('offline'))")
    assert badge.inner_text().startswith("offline")
    page.evaluate("() => window.dispatchEvent(new Event('online'))")  # the server answers: online again
    page.wait_for_function("() => document.querySelector('#net-status').textContent === 'online'")


# ----- contribute -------------------------------------------------------------------------------
def message_ids(db_url: str, rid: str) -> list[str]:
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(  # stored messages: settled ones and recent ones (SQLite)
                "SELECT message_id FROM messages WHERE round_num = (SELECT num FROM rounds WHERE id = :r) UNION ALL "
                "SELECT message_id FROM messages_recent WHERE round_num = (SELECT num FROM rounds WHERE id = :r)"),
                {"r": rid}).scalars())
    finally:
        engine.dispose()


def message_count(server: DemoServer | ServerProcess, rid: str) -> int:
    """The round's message count, as the administrator reads it."""
    proc = server.proc if isinstance(server, DemoServer) else server
    r = httpx.get(f"{proc.base_url}{API}/rounds/{rid}", headers=proc.admin, timeout=30)
    assert r.status_code == 200, r.text
    return int(r.json()["counts"]["messages"])


def plus_one(counts: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n + 1 for n in counts)


def kept_credential(page: Any) -> Any:
    return page.evaluate("key => JSON.parse(localStorage.getItem(key))", CREDENTIAL_KEY)


def pick_top(page: Any, prefix: str, expected: list[str]) -> None:
    """Type ``prefix`` and pick the top suggestion with the keyboard."""
    type_prefix(page, prefix, expected)
    page.get_by_role("searchbox").press("ArrowDown")
    page.get_by_role("searchbox").press("Enter")


def wait_status(page: Any, text: str) -> str:
    """Wait until the contribute status line contains ``text``; returns the line."""
    page.wait_for_function("t => document.getElementById('contribute-status').textContent.includes(t)", arg=text)
    return page.locator("#contribute-status").inner_text()


def posted(requests: list[Any], tail: str) -> list[Any]:
    return [r for r in requests if r.method == "POST" and r.url.endswith(tail)]


def test_contribute_stores_exactly_one_report_for_the_published_head_list(demo: DemoServer, page: Any) -> None:
    rid = demo.collecting_round  # serve --demo leaves it collecting reports next to the finished demo round
    headlist = demo.get(f"{API}/rounds/{rid}/headlist")
    published = demo.get(f"{API}/rounds/{rid}")["headlist_hash"]
    assert headlist["content_hash"] == published
    key = demo.get(f"{API}/rounds/{rid}/token-key")
    assert key["admission"] == "tokens"  # serve --demo admits devices by tokens (and self-enrolment)
    _, prefix, expected = search_case(demo)
    posts = watch_posts(page)
    before, count_before = stored_messages(demo.db_url, rid), message_count(demo, rid)  # other tests report too
    open_page(page, demo.base_url + "/")
    switch = page.get_by_role("switch", name="Contribute")
    assert switch.is_visible() and switch.is_enabled()
    assert switch.get_attribute("aria-checked") == "false"  # off by default
    assert page.locator("#admission-warning").is_hidden()  # admission by tokens: no warning

    box = page.get_by_role("searchbox")
    pick_top(page, prefix, expected)  # picked with contribute off: nothing is sent, no credential is asked for
    assert page.locator("#picked-query").inner_text() == expected[0]
    page.wait_for_timeout(300)
    assert posts == []
    assert kept_credential(page) is None
    assert stored_messages(demo.db_url, rid) == before

    switch.click()
    assert switch.get_attribute("aria-checked") == "true"
    type_prefix(page, prefix, expected)
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith(f"/rounds/{rid}/reports")) as req:
        box.press("ArrowDown")
        box.press("Enter")
    page.wait_for_function("() => document.getElementById('sent-state')?.textContent === 'acknowledged and counted'")
    sent = json.loads(req.value.post_data)
    assert set(sent) == {"id", "headlist", "reports", "token"}
    assert sent["headlist"] == published
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", sent["id"])
    assert TOKEN.fullmatch(sent["token"]), sent["token"]
    assert sent["id"] == tokens.Token.parse(sent["token"]).message_id  # the id the token's nonce derives
    assert len(sent["reports"]) == headlist["m_c"] == 1
    listed = {q["query"]: q["urls"] for q in headlist["queries"]}
    report = sent["reports"][0]
    assert report["query"] is None or report["query"] in listed
    assert report["url"] is None or (report["query"] is not None and report["url"] in listed[report["query"]])

    # the credential: got once by self-enrolment, kept in localStorage, the bearer of the one token request, made
    # when contributing was switched on, before anything was picked
    kept = kept_credential(page)
    assert kept["self_enrolled"] is True and kept["credential"].startswith("hdc_"), kept
    assert [r.url.rsplit("/", 1)[1] for r in posts] == ["self", "tokens", "reports"], [r.url for r in posts]
    (issuance,) = posted(posts, f"/rounds/{rid}/tokens")
    assert issuance.all_headers()["authorization"] == f"Bearer {kept['credential']}"
    assert len(json.loads(issuance.post_data)["blinded_msgs"]) == 1

    # the page shows the randomized message it sent (its token shortened), not the record (whenever the report is
    # not the record), and that the report carried an anonymous token
    shown = page.locator("#sent").inner_text()
    on_page = json.loads(page.locator("#sent-message").inner_text())
    assert set(on_page) == set(sent) and {k: v for k, v in on_page.items() if k != "token"} == \
        {k: v for k, v in sent.items() if k != "token"}
    assert on_page["token"].startswith(sent["token"][:8]) and sent["token"] not in page.content()
    if expected[0] not in json.dumps(sent, ensure_ascii=False):
        assert expected[0] not in shown
    assert page.locator("#sent-token").inner_text() == f"anonymous, one-use (key id {key['key_id'][:12]}…)"
    assert page.locator("#spent-value").inner_text().startswith(f"ε = {headlist['epsilon']:g} of")

    assert stored_messages(demo.db_url, rid) == plus_one(before)
    assert sent["id"] in message_ids(demo.db_url, rid)
    assert message_count(demo, rid) == count_before + 1
    screenshot(page, "local-search-contribute")

    # a second pick: the device ledger allows one report per head list, so nothing more is sent or asked for
    pick_top(page, prefix, expected)
    page.wait_for_function("() => document.getElementById('contribute-status').textContent.startsWith('Not sent')")
    assert posted(posts, "/reports") == [req.value] and len(posts) == 3
    assert stored_messages(demo.db_url, rid) == plus_one(before)

    # the curator's page of the collecting round: its state and its messages, no results yet
    page.goto(f"{demo.base_url}/rounds/{rid}")
    page.wait_for_selector("body[data-ready='true']")
    assert page.locator("#round-state").inner_text() == "collecting-reports"
    assert page.locator("#counts .count").nth(2).inner_text().split() == [f"{count_before + 1:,}", "device",
                                                                          "messages"]
    assert page.locator("#chart-panel").is_hidden() and page.locator("#table-panel").is_hidden()
    assert "once an administrator closes the round" in page.locator("#load-status").inner_text()


def test_a_report_whose_post_failed_is_resent_with_its_token(demo: DemoServer, page: Any,
                                                              page_errors: PageErrors) -> None:
    """The POST of the report fails (the connection is cut): the page keeps the message with its token, and the
    next pick sends that message again (same id, same token), which is counted once; no second token is asked for
    and the new pick itself is refused by the device ledger (one report per round)."""
    rid = demo.collecting_round
    _, prefix, expected = search_case(demo)
    posts = watch_posts(page)
    cut: list[Any] = []

    def cut_once(route: Any) -> None:
        if cut:
            route.continue_()
        else:
            cut.append(route.request)
            route.abort("connectionreset")

    page.route(f"**{API}/rounds/{rid}/reports", cut_once)
    before, count_before = stored_messages(demo.db_url, rid), message_count(demo, rid)
    open_page(page, demo.base_url + "/")
    page.get_by_role("switch", name="Contribute").click()
    pick_top(page, prefix, expected)
    status = wait_status(page, "The report is kept and sent again")
    assert "same id, same token: counted once" in status
    assert page.locator("#sent-state").inner_text() == "not acknowledged yet"
    assert len(cut) == 1
    first = json.loads(cut[0].post_data)
    assert TOKEN.fullmatch(first["token"]) and page.locator("#sent-token").inner_text().startswith("anonymous")
    assert message_count(demo, rid) == count_before and stored_messages(demo.db_url, rid) == before
    expect_failed_load(page_errors, f"/rounds/{rid}/reports")

    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith(f"/rounds/{rid}/reports")) as req:
        pick_top(page, prefix, expected)
    wait_status(page, "Sent the report kept from your earlier pick")
    assert json.loads(req.value.post_data) == first  # the same message: same id, same reports, same token
    assert page.locator("#sent-state").inner_text() == "acknowledged and counted"
    assert len(posted(posts, f"/rounds/{rid}/tokens")) == 1 and len(posted(posts, "/reports")) == 2
    assert message_count(demo, rid) == count_before + 1
    assert stored_messages(demo.db_url, rid) == plus_one(before)
    assert message_ids(demo.db_url, rid).count(first["id"]) == 1


def test_a_self_enrolled_credential_the_server_does_not_know_is_replaced(demo: DemoServer, page: Any,
                                                                         page_errors: PageErrors) -> None:
    """This browser kept a self-enrolled credential the server does not know (its database was reset): the token
    request gets 401, and the page enrols again once, keeps the new credential and reports with it."""
    rid = demo.collecting_round
    _, prefix, expected = search_case(demo)
    posts = watch_posts(page)
    count_before = message_count(demo, rid)
    open_page(page, demo.base_url + "/")
    stale = {"credential": "hdc_" + "A" * 43, "id": 999_999, "tokens_per_round": 1, "self_enrolled": True}
    page.evaluate("([key, doc]) => localStorage.setItem(key, JSON.stringify(doc))", [CREDENTIAL_KEY, stale])
    page.get_by_role("switch", name="Contribute").click()
    pick_top(page, prefix, expected)
    page.wait_for_function("() => document.getElementById('sent-state')?.textContent === 'acknowledged and counted'")
    assert [r.url.rsplit("/", 1)[1] for r in posts] == ["tokens", "self", "tokens", "reports"]
    first, second = posted(posts, f"/rounds/{rid}/tokens")
    assert first.response().status == 401 and second.response().status == 200
    expect_failed_load(page_errors, f"/rounds/{rid}/tokens")
    kept = kept_credential(page)
    assert kept["credential"] != stale["credential"] and kept["self_enrolled"] is True
    assert second.all_headers()["authorization"] == f"Bearer {kept['credential']}"
    assert TOKEN.fullmatch(json.loads(posted(posts, "/reports")[0].post_data)["token"])
    assert message_count(demo, rid) == count_before + 1


def test_no_report_without_a_credential_where_there_is_no_self_enrolment(second_server: DemoServer, page: Any,
                                                                         page_errors: PageErrors) -> None:
    """A server started without --self-enrolment gives no credential to its pages (404): the page says so and
    neither charges its ledger nor asks for a token nor sends anything (and asks only once)."""
    rid = second_server.collecting_round
    _, prefix, expected = search_case(second_server)
    posts = watch_posts(page)
    count_before = message_count(second_server, rid)
    open_page(page, second_server.base_url + "/")
    assert page.locator("#admission-warning").is_hidden()
    page.get_by_role("switch", name="Contribute").click()
    pick_top(page, prefix, expected)
    status = wait_status(page, ADMIN_ONLY)
    assert status.startswith("Not sent")
    (enrol,) = posted(posts, "/device-credentials/self")
    assert enrol.response().status == 404
    expect_failed_load(page_errors, "/device-credentials/self")
    assert kept_credential(page) is None
    assert page.locator("#spent-value").inner_text().startswith("ε = 0 of")  # nothing charged
    assert page.locator("#sent").is_hidden()

    pick_top(page, prefix, expected)  # again: the server's answer is remembered, nothing is asked
    page.wait_for_timeout(300)
    wait_status(page, ADMIN_ONLY)
    assert posts == [enrol]
    assert message_count(second_server, rid) == count_before


def test_open_admission_is_shown_and_reports_go_without_a_token(open_server: DemoServer, page: Any) -> None:
    rid = open_server.collecting_round
    assert open_server.get(f"{API}/rounds/{rid}/token-key")["admission"] == "open"
    _, prefix, expected = search_case(open_server)
    posts = watch_posts(page)
    count_before = message_count(open_server, rid)
    open_page(page, open_server.base_url + "/")
    warning = page.locator("#admission-warning")  # shown before anything is picked
    assert warning.is_visible() and warning.get_attribute("role") == "alert"
    assert "Open admission" in warning.inner_text() and "anyone can report" in warning.inner_text()
    page.get_by_role("switch", name="Contribute").click()
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith(f"/rounds/{rid}/reports")) as req:
        pick_top(page, prefix, expected)
    page.wait_for_function("() => document.getElementById('sent-state')?.textContent === 'acknowledged and counted'")
    sent = json.loads(req.value.post_data)
    assert set(sent) == {"id", "headlist", "reports"}  # no token, and no credential was asked for
    assert posts == [req.value] and kept_credential(page) is None
    assert page.locator("#sent-token").inner_text() == "none: this server runs with open admission"
    assert message_count(open_server, rid) == count_before + 1
    screenshot(page, "local-search-open-admission")


# ----- URLs that are not web addresses ----------------------------------------------------------
UNSAFE_URLS = ("javascript:alert(1)", "data:text/html,<script>alert(1)</script>")
SAFE_URL = "https://safe.example/alert"


def published_round_with_urls(srv: ServerProcess, urls: list[str], n_users: int = 240) -> str:
    """A closed BLENDER round whose head list lists the query "alert me" with each of ``urls``: every opt-in user
    uploads one record with one of them, and as many devices report one of those records."""
    rid, doc = open_round(srv, n_users, records=lambda i: [{"query": "alert me", "url": urls[i % len(urls)]}])
    assert [(q["query"], sorted(q["urls"])) for q in doc["queries"]] == [("alert me", sorted(urls))], doc
    messages = [randomize_records(doc, [("alert me", urls[i % len(urls)])]) for i in range(n_users)]
    messages = with_tokens(srv.base_url, srv.admin, rid, messages)  # the server admits reports with tokens
    with httpx.Client(base_url=srv.base_url + API, timeout=60) as http:
        assert http.post(f"/rounds/{rid}/reports", json=messages).status_code == 200
        assert http.post(f"/rounds/{rid}/close", headers=srv.admin, json={"flagged": "publish"}).status_code == 200
    return rid


def test_urls_that_are_not_web_addresses_are_shown_as_text(fresh_server: ServerProcess, page: Any) -> None:
    urls = [*UNSAFE_URLS, SAFE_URL]
    rid = published_round_with_urls(fresh_server, urls)
    doc = httpx.get(f"{fresh_server.base_url}{API}/rounds/{rid}/local-search", timeout=30).json()
    (entry,) = doc["queries"]
    assert sorted(u["url"] for u in entry["urls"]) == sorted(urls)  # all three reach the page
    open_page(page, fresh_server.base_url + "/")
    type_prefix(page, "ale", ["alert me"])

    def shown(container: str) -> dict[str, str]:
        """URL -> the tag of the element showing it."""
        return dict(page.locator(container).evaluate_all(
            "els => els.map(e => [e.dataset.url || e.textContent, e.tagName.toLowerCase()])"))

    listed = shown('[role="option"] .urls > *')
    assert listed == {u: ("a" if u == SAFE_URL else "span") for u in urls}, listed
    page.get_by_role("searchbox").press("ArrowDown")
    page.get_by_role("searchbox").press("Enter")
    picked = shown("#picked-urls li > :first-child")
    assert picked == {u: ("a" if u == SAFE_URL else "span") for u in urls}, picked
    for u in UNSAFE_URLS:  # the text is there, and no link anywhere on the page goes to it
        assert page.get_by_text(u, exact=True).count() == 1
    hrefs = page.locator("a[href]").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert SAFE_URL in hrefs and not [h for h in hrefs if not h.startswith(("https://", "http://", "/", "#"))], hrefs
    assert page.get_by_role("link", name=re.compile("alert\\(1\\)")).count() == 0
    screenshot(page, "local-search-unsafe-urls")


# ----- the round page ---------------------------------------------------------------------------
# every name/value pair of the Parameters and Privacy panels and every cell of the results table, as laid out
FACT_BOXES_JS = """() => [...document.querySelectorAll('dl.facts dd, #results-table td')].map((e) => {
  const r = e.getBoundingClientRect();
  const text = document.createRange();  // the lines of text, not the box (a grid row or table row may be taller)
  text.selectNodeContents(e);
  const t = text.getBoundingClientRect();
  const dt = e.tagName === 'DD' ? e.previousElementSibling.getBoundingClientRect() : null;
  return {text: e.innerText.trim(), wide: e.tagName === 'DD' || e.classList.contains('url'),
          width: r.width, height: t.height, top: r.top, dtTop: dt && dt.top,
          line: parseFloat(getComputedStyle(e).lineHeight), em: parseFloat(getComputedStyle(e).fontSize)};
})"""


def assert_values_readable(page: Any, width: int) -> None:
    """At ``width`` px, every parameter and privacy value sits beside its name; it and every URL of the results
    table are at least 6 em wide; a value or cell without spaces (a number, "yes", a shortened hash, a URL) takes
    one line up to 12 characters, two up to 24."""
    page.set_viewport_size({"width": width, "height": 860})
    boxes = page.evaluate(FACT_BOXES_JS)
    assert boxes, "no parameter values on the page"
    for b in boxes:
        where = f"at {width} px, the value {b['text']!r} is {b['width']:.0f} px wide, its text {b['height']:.0f} px"
        assert not b["wide"] or b["width"] >= 6 * b["em"], where
        if " " not in b["text"] and len(b["text"]) <= 24:
            assert b["height"] < (1.5 if len(b["text"]) <= 12 else 2.5) * b["line"], where
        if b["dtTop"] is not None:
            assert abs(b["top"] - b["dtTop"]) < 2, f"{where}: not beside its name"
    sideways = page.evaluate("document.documentElement.scrollWidth <= innerWidth")
    assert sideways, f"at {width} px the page scrolls sideways"


def test_round_page_draws_the_chart_and_the_table_of_a_closed_round(demo: DemoServer, page: Any) -> None:
    info = demo.get(f"{API}/rounds/{demo.demo_round}")
    results = demo.get(f"{API}/rounds/{demo.demo_round}/results")
    assert info["state"] == "results-published"
    page.goto(f"{demo.base_url}/rounds/{demo.demo_round}")
    page.wait_for_selector("body[data-ready='true']")

    assert page.locator("#round-state").inner_text() == "results-published"
    counts = page.locator("#counts").inner_text()
    for what, n in info["counts"].items():
        if what.startswith("optin"):  # live opt-in counts are for administrators only: the page shows a dash
            assert n is None
        else:
            assert f"{n:,}" in counts
    params = page.locator("#params").inner_text()
    assert f"{info['params']['epsilon']:g}" in params and str(info["params"]["head_list_size"]) in params
    assert results["privacy"]["clients"] in page.locator("#privacy").inner_text()
    # the check against the opt-in group (ALGORITHM.md §7.2): its verdict and numbers, from the results
    check = page.locator("#check-panel")
    assert check.is_visible() and results["anchor_check"]["verdict"] in check.inner_text()
    assert f"{results['anchor_check']['flagged_records']:,}" in page.locator("#check dl").inner_text()

    listed = sorted((r for r in results["records"] if not r["wildcard"]), key=lambda r: -r["p_blended"])[:10]
    chart = page.locator("#chart svg[role='img']")
    assert chart.count() == 1
    rows = chart.locator("g.row")
    assert rows.evaluate_all("els => els.map(e => e.dataset.label)") == [r["query"] for r in listed]
    for i in range(rows.count()):
        marks = rows.nth(i).locator("g.mark")
        assert marks.evaluate_all("els => els.map(e => e.dataset.series)") == ["blended", "optin", "client"]
        assert marks.locator("line.ci").count() == 3  # every estimate has a variance: three 95% intervals
    # the blended interval's width is 2 × 1.96 × sd on the chart's scale: check its ordering against opt-in's
    widths = rows.first.locator("line.ci").evaluate_all(
        "els => els.map(e => Math.abs(e.x2.baseVal.value - e.x1.baseVal.value))")
    top = listed[0]
    assert (widths[0] < widths[1]) == (top["var_blended"] < top["var_optin"])

    table = page.locator("#results-table tbody tr")
    assert table.count() == len(results["records"])
    first = table.first.locator("td").all_inner_texts()
    assert first[:2] == [listed[0]["query"], listed[0]["url"]]
    assert first[2] == f"{listed[0]['p_blended'] * 100:.3f}%"
    assert_values_readable(page, 1100)
    screenshot(page, "round")
    assert_values_readable(page, 400)  # a phone
    screenshot(page, "round-narrow")


def test_round_page_results_table_is_not_clipped_at_1280_px(demo: DemoServer, page: Any) -> None:
    """Issue 42: at a 1280 × 800 viewport the demo round's results table fits its panel: nothing is clipped, and the
    table's container is the one that would scroll (overflow-x auto) on a narrower screen."""
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{demo.base_url}/rounds/{demo.demo_round}")
    page.wait_for_selector("#results-table")
    fit = page.evaluate("""() => {
      const wrap = document.getElementById('table'), table = document.getElementById('results-table');
      const panel = document.getElementById('table-panel').getBoundingClientRect();
      return {table: table.scrollWidth, wrap: wrap.clientWidth, right: table.getBoundingClientRect().right,
              panel: panel.right, overflow: getComputedStyle(wrap).overflowX};
    }""")
    assert fit["overflow"] == "auto", fit
    assert fit["table"] <= fit["wrap"] and fit["right"] <= fit["panel"], f"the results table is clipped: {fit}"


def test_round_page_forecasts_a_round_collecting_opt_in_data(demo: DemoServer, page: Any) -> None:
    """Issue 42: before its head list is built, the page forecasts what a BLENDER round can list (with the
    administrator token): for the opt-in users uploaded so far (none: it will likely list nothing, said as a
    warning) and for a number typed in; the same document as the API's."""
    admin = demo.proc.admin
    with httpx.Client(base_url=demo.base_url + API, timeout=60) as http:
        r = http.post("/rounds", headers=admin, json={"kind": "blender", "name": "to size", "params": {
            "epsilon": 4.0, "delta": 1e-5, "head_list_size": 20}})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        expected = http.get(f"/rounds/{rid}/forecast", params={"optin_users": 30000}, headers=admin).json()
    try:
        page.goto(f"{demo.base_url}/rounds/{rid}")
        page.wait_for_selector("body[data-ready='true']")
        assert page.locator("#forecast-panel").is_visible()
        page.fill("#forecast-token", admin["Authorization"].removeprefix("Bearer "))
        page.click("#forecast-form button")
        page.wait_for_selector("body[data-forecast='uploaded']")
        text = page.locator("#forecast").inner_text()
        assert "With 0 opt-in users" in text and "Warning: this round will likely list nothing" in text
        page.fill("#forecast-optin", "30000")
        page.click("#forecast-form button")
        page.wait_for_selector("body[data-forecast='30000']")
        assert page.locator("#forecast li").all_inner_texts() == expected["lines"]
        assert "Warning" not in page.locator("#forecast").inner_text()
    finally:  # leave no round collecting opt-in data for the other tests of the demo server
        with httpx.Client(base_url=demo.base_url + API, timeout=60) as http:
            http.post(f"/rounds/{rid}/abort", headers=admin)


def test_round_page_of_a_closed_mean_round(demo: DemoServer, page: Any) -> None:
    lower, upper, eps = 0.0, 10.0, 1.0
    admin = demo.proc.admin
    with httpx.Client(base_url=demo.base_url + API, timeout=60) as http:
        r = http.post("/rounds", headers=admin, json={"kind": "mean", "name": "minutes per session", "params": {
            "epsilon": eps, "lower": lower, "upper": upper, "sigma2": 4.0}})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        r = http.post(f"/rounds/{rid}/optin/enrol", headers=admin, json={"users": [f"mean-{i}" for i in range(30)]})
        for i, token in enumerate(r.json()["tokens"]):
            r = http.post(f"/rounds/{rid}/optin/records", json={"values": [2.0 + i % 7]},
                          headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
        assert http.post(f"/rounds/{rid}/headlist", headers=admin).status_code == 200
        rng = random.Random(3)
        reports = [{"id": new_message_id(), "round": rid, "value": randomize_value(
            rng.uniform(lower, upper), lower=lower, upper=upper, epsilon=eps)} for _ in range(300)]
        reports = with_tokens(demo.base_url, admin, rid, reports)  # the server admits reports with tokens
        assert http.post(f"/rounds/{rid}/reports", json=reports).status_code == 200
        assert http.post(f"/rounds/{rid}/close", headers=admin, json={"flagged": "publish"}).status_code == 200
        results = http.get(f"/rounds/{rid}/results").json()
    page.goto(f"{demo.base_url}/rounds/{rid}")
    page.wait_for_selector("body[data-ready='true']")
    names = [e["estimator"] for e in results["estimates"]]
    assert sorted(names) == ["client", "hybrid", "optin"]
    rows = page.locator("#chart svg[role='img'] g.row")
    assert rows.evaluate_all("els => els.map(e => e.dataset.label)") == names
    assert page.locator("#chart svg line.ci").count() == 3
    cells = page.locator("#results-table tbody tr td:first-child").all_inner_texts()
    assert cells == names
    assert results["guarantee"] in page.locator("#privacy").inner_text()
    assert_values_readable(page, 1100)
    screenshot(page, "round-mean")
    assert_values_readable(page, 400)


def test_pages_are_not_in_the_api_schema(demo: DemoServer) -> None:
    schema = demo.get("/openapi.json")
    assert not [p for p in schema["paths"] if p in ("/", "/rounds/{round_id}", f"{API}/local-search/rounds")
                or p.startswith("/static")]
    rounds = demo.get(f"{API}/local-search/rounds")
    assert rounds["search"]["id"] == demo.demo_round
    r = httpx.get(demo.base_url + "/static/search.js", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    page_html = httpx.get(demo.base_url + "/", timeout=10)
    assert "script-src 'self'" in page_html.headers["content-security-policy"]


# ----- the API documentation ----------------------------------------------------------------------
def test_api_docs_render_from_the_server_alone(demo: DemoServer, page: Any) -> None:
    """/docs is Swagger UI from the installed package: every request stays on the server (no CDN), and
    the page lists the API's operations (no console errors: the page fixture checks)."""
    hosts: set[str] = set()
    page.on("request", lambda req: hosts.add(re.sub(r"^(\w+://[^/]+).*$", r"\1", req.url)))
    page.goto(demo.base_url + "/docs")
    page.wait_for_selector(".opblock", timeout=20_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert any("/api/v1/rounds/{round_id}/reports" in p.replace("\u200b", "") for p in paths), paths
    assert hosts == {demo.base_url}, hosts
    screenshot(page, "api-docs")


# ----- memoization on the page (docs/ALGORITHM.md §15) -----------------------------------------------------------
def suggestions_round(srv: Any) -> Any:
    """A closed round listing "alert me" (the suggestions the page offers; 240 opt-in users and 240 reports), and
    the records function that gives its opt-in users' data, for a later round with the same lists."""
    same = lambda i: [{"query": "alert me", "url": SAFE_URL}]  # noqa: E731
    rid0, doc0 = open_round(srv, 240, records=same)
    with httpx.Client(base_url=srv.base_url + API, timeout=60) as http:
        msgs = [randomize_records(doc0, [("alert me", SAFE_URL)]) for _ in range(240)]
        assert http.post(f"/rounds/{rid0}/reports", json=msgs).status_code == 200
        assert http.post(f"/rounds/{rid0}/close", headers=srv.admin, json={"flagged": "publish"}).status_code == 200
    return same


def test_the_same_pick_under_the_same_head_list_in_a_later_round_is_resent_uncharged(tmp_path: Any,
                                                                                     page: Any) -> None:
    """Two rounds publish the same head list (the same opt-in data, far above the threshold; under protocol v2 each
    commits to its own round's key and window, so the content hashes differ and the lists hashes agree): picking the
    same suggestion in the second sends the first round's randomized reports again under a new message id (naming
    the second round's head list), and the device's spend shown on the page does not move; a second pick in that
    round is refused."""
    srv = ServerProcess(f"sqlite:///{tmp_path / 'memo.db'}", tmp_path,
                        extra_args=("--open-admission", "--log-level", "warning"))
    srv.start(timeout=60)
    try:
        same = suggestions_round(srv)
        rid_a, doc_a = open_round(srv, 240, records=same)
        posts = watch_posts(page)
        open_page(page, srv.base_url + "/")
        page.get_by_role("switch", name="Contribute").click()
        pick_top(page, "ale", ["alert me"])
        page.wait_for_function("() => document.getElementById('sent-state')?.textContent === "
                               "'acknowledged and counted'")
        (sent_a,) = [json.loads(r.post_data) for r in posted(posts, f"/rounds/{rid_a}/reports")]
        spent = page.locator("#spent-value").inner_text()
        assert spent.startswith("ε = 4 of")

        rid_b, doc_b = open_round(srv, 240, records=same)
        assert sent_a["headlist"] == doc_a["content_hash"] != doc_b["content_hash"]  # each round's key and window
        assert lists_hash(doc_b) == lists_hash(doc_a)  # the same lists: the ledger's key (ALGORITHM.md §15)
        open_page(page, srv.base_url + "/")  # the newest collecting round, b, now takes the reports
        page.get_by_role("switch", name="Contribute").click()
        pick_top(page, "ale", ["alert me"])
        page.wait_for_function("() => document.getElementById('sent-state')?.textContent === "
                               "'acknowledged and counted'")
        (sent_b,) = [json.loads(r.post_data) for r in posted(posts, f"/rounds/{rid_b}/reports")]
        assert sent_b["reports"] == sent_a["reports"] and sent_b["id"] != sent_a["id"]
        assert sent_b["headlist"] == doc_b["content_hash"]
        assert page.locator("#spent-value").inner_text() == spent  # no new charge
        assert message_count(srv, rid_a) == message_count(srv, rid_b) == 1

        pick_top(page, "ale", ["alert me"])  # once per round, memoized or not
        wait_status(page, "Not sent")
        assert len(posted(posts, "/reports")) == 2
    finally:
        srv.stop()
    assert "Traceback" not in srv.log_text()

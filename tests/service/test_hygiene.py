"""Request hygiene of the collection service (issue 29, docs/DEPLOYMENT.md): cross-site requests refused, CORS only
for listed origins, bodies only with a JSON content type, security headers on every response, errors that do not
echo a client's input whole, /metrics behind the admin token, the round checked before a body is read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_api import ADMIN, API, AUTH, JSON, blender_round, device_messages, error_of

from hybriddp.service import create_app

EVIL = "http://evil.example"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'hybriddp.db'}"


@pytest.fixture
def client(sqlite_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(sqlite_url, ADMIN, open_admission=True)) as c:
        yield c


def messages_of(client: TestClient, rid: str) -> int:
    return int(client.get(f"{API}/rounds/{rid}").json()["counts"]["messages"])


def test_cross_site_reports_are_refused_and_nothing_is_stored(store_url: str) -> None:
    """What a page of another site can make a visitor's browser send: a report with that site's Origin, with
    Sec-Fetch-Site: cross-site, or with no Content-Type (a Blob, sendBeacon). Each is refused; the round's
    count does not move. The same report from this server's own origin, or from a client that is not a browser
    (no Origin), is counted."""
    with TestClient(create_app(store_url, ADMIN, open_admission=True)) as client:
        rid, hl = blender_round(client)
        url = f"{API}/rounds/{rid}/reports"
        msgs = device_messages(hl, 6, seed=29)
        for i, headers in enumerate([{**JSON, "Origin": EVIL}, {**JSON, "Sec-Fetch-Site": "cross-site"},
                                     {**JSON, "Origin": "null"}, {**JSON, "Sec-Fetch-Site": "same-site"}]):
            error_of(client.post(url, content=json.dumps(msgs[i]), headers=headers), 403, "cross_origin",
                     "cross-site request refused")
        error_of(client.post(url, content=json.dumps(msgs[4]).encode()), 415, "unsupported_media_type")
        error_of(client.post(url, content=json.dumps(msgs[4]), headers={"Content-Type": "text/plain"}), 415)
        assert messages_of(client, rid) == 0
        own = client.post(url, content=json.dumps(msgs[4]), headers={**JSON, "Origin": "http://testserver",
                                                                      "Sec-Fetch-Site": "same-origin"})
        assert own.status_code == 200, own.text
        assert client.post(url, json=msgs[5]).status_code == 200  # httpx: no Origin, a JSON type
        assert messages_of(client, rid) == 2
        # uploads and admin routes too
        error_of(client.post(f"{API}/rounds", json={"kind": "blender", "params": {}}, headers={**AUTH, "Origin": EVIL}),
                 403, "cross_origin")


def test_listed_origins_get_cors_and_others_do_not(sqlite_url: str) -> None:
    with TestClient(create_app(sqlite_url, ADMIN, open_admission=True,
                                      cors_origins=("https://pages.example.org",))) as client:
        rid, hl = blender_round(client)
        url = f"{API}/rounds/{rid}/reports"
        pre = client.options(url, headers={"Origin": "https://pages.example.org",
                                           "Access-Control-Request-Method": "POST",
                                           "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == "https://pages.example.org"
        assert "Content-Type" in pre.headers["access-control-allow-headers"]
        ok = client.post(url, json=device_messages(hl, 1, seed=1)[0], headers={"Origin": "https://pages.example.org",
                                                                              "Sec-Fetch-Site": "cross-site"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://pages.example.org"
        bad = client.options(url, headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"})
        assert bad.status_code == 403 and "access-control-allow-origin" not in bad.headers
        got = client.get(f"{API}/rounds/{rid}/headlist", headers={"Origin": EVIL})
        assert got.status_code == 200 and "access-control-allow-origin" not in got.headers


def test_every_response_carries_the_security_headers(client: TestClient) -> None:
    rid, hl = blender_round(client)
    responses = [client.get("/health"), client.get(f"{API}/rounds/{rid}/headlist"),
                 client.post(f"{API}/rounds/{rid}/reports", json=device_messages(hl, 1, seed=2)[0]),  # fast path
                 client.post(f"{API}/rounds/{rid}/reports", json={"id": "x"}),  # its error
                 client.get(f"{API}/nothing-here"), client.get("/openapi.json"),
                 client.post(f"{API}/rounds", json={}, headers={"Origin": EVIL})]  # the guard's own refusal
    for r in responses:
        assert r.headers["x-content-type-options"] == "nosniff", r.request.url
        assert r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["content-security-policy"].startswith("default-src 'none'"), r.request.url
    page = client.get("/")
    assert page.headers["content-security-policy"].startswith("default-src 'self'; script-src 'self';")
    docs = client.get("/docs")
    csp = docs.headers["content-security-policy"]
    assert "script-src 'self' 'sha256-" in csp and "unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]


def test_errors_do_not_echo_large_input(client: TestClient) -> None:
    """A megabyte in any field comes back as an error of at most a few hundred characters."""
    rid, _ = blender_round(client)
    huge = "q" * 1_000_000
    cases = [client.post(f"{API}/rounds", json={"kind": "blender", "name": huge, "params": {"estimator": huge}},
                         headers=AUTH),
             client.post(f"{API}/rounds", json={"kind": huge, "params": {}}, headers=AUTH),
             client.post(f"{API}/rounds/{rid}/reports", json={"id": huge, "reports": [[huge, huge]]}),
             client.post(f"{API}/rounds/{rid}/reports", content=b'{"id": "' + huge.encode(), headers=JSON),
             client.post(f"{API}/rounds/{rid}/reports", content=b"{}", headers={"Content-Type": huge}),
             client.get(f"{API}/rounds/{'A' * 5000}")]
    for r in cases:
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
        assert len(r.content) < 1_000, (r.request.url, len(r.content), r.text[:200])


def test_metrics_need_the_admin_token_unless_public(sqlite_url: str) -> None:
    with TestClient(create_app(sqlite_url, ADMIN, open_admission=True)) as client:
        error_of(client.get("/metrics"), 401, "unauthorized", "--public-metrics")
        error_of(client.get("/metrics", headers={"Authorization": "Bearer wrong-token-0123456789"}), 401)
        assert "hybriddp_reports_total" in client.get("/metrics", headers=AUTH).text
    with TestClient(create_app(sqlite_url, ADMIN, open_admission=True, public_metrics=True)) as client:
        assert "hybriddp_reports_total" in client.get("/metrics").text


def test_a_bad_cors_origin_is_refused_by_name(sqlite_url: str) -> None:
    from hybriddp.core.errors import ParameterError

    for bad in ("ftp://x", "https://a.example/path", "pages.example.org"):
        with pytest.raises(ParameterError, match="--cors-origin"):
            create_app(sqlite_url, ADMIN, open_admission=True, cors_origins=(bad,))


def test_the_local_search_round_list_reads_only_the_newest(client: TestClient) -> None:
    """The page's round pair comes from two indexed reads (migration 0005): the newest round taking reports."""
    rid1, _ = blender_round(client)
    rid2, _ = blender_round(client)
    got: dict[str, Any] = client.get(f"{API}/local-search/rounds").json()
    assert got["search"] is None and got["contribute"]["id"] == rid2 and rid1 != rid2


def test_pages_show_control_and_bidi_characters_visibly() -> None:
    """The pages' ``shown`` (static/api.js, used by every text node they build): a bidi override or a control character
    in a suggestion becomes a visible ⟨U+XXXX⟩; other text, right-to-left letters included, is unchanged. Node runs
    the module itself (missing node is a failure)."""
    import shutil
    import subprocess

    node = shutil.which("node")
    assert node is not None, "`node` is not on PATH: install Node.js 20 or newer (the pages' JS is tested with it)"
    api = Path(__file__).resolve().parents[2] / "src/hybriddp/service/static/api.js"
    cases = {"gro\u202eelgoog": "gro⟨U+202E⟩elgoog", "a\u2066b\u2069c\u200fd": "a⟨U+2066⟩b⟨U+2069⟩c⟨U+200F⟩d",
             "bell\u0007\u009b": "bell⟨U+0007⟩⟨U+009B⟩", "line\u2028sep": "line⟨U+2028⟩sep",
             "שלום é 東京 tab\there": "שלום é 東京 tab\there"}
    script = (f"import {{ shown }} from {json.dumps(api.as_uri())};\n"
              f"const cases = {json.dumps(cases)};\n"
              "for (const [k, v] of Object.entries(cases))\n"
              "  if (shown(k) !== v) { console.log(JSON.stringify([k, shown(k)])); process.exit(1); }\n")
    out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_same_origin_is_the_host_the_request_reached() -> None:
    from hybriddp.service.guard import Guard

    g = Guard()
    for origin, host in [("https://example.org", "example.org"), ("http://example.org", "example.org:80"),
                         ("http://example.org:8080", "example.org:8080"), ("https://[::1]:8443", "[::1]:8443"),
                         ("HTTP://Example.ORG", "example.org")]:
        assert g.same_origin(origin, host), (origin, host)
    for origin, host in [("http://evil.example", "example.org"), ("http://example.org:8080", "example.org"),
                         ("http://example.org.evil.example", "example.org"), ("null", "example.org"),
                         ("http://example.org", None), ("javascript:alert(1)", "example.org")]:
        assert not g.same_origin(origin, host), (origin, host)


def test_round_details_can_be_kept_to_administrators(sqlite_url: str) -> None:
    with TestClient(create_app(sqlite_url, ADMIN, open_admission=True)) as client:
        rid, _ = blender_round(client)
        public = client.get(f"{API}/rounds/{rid}").json()
        assert public["counts"]["optin_users"] is None  # the opt-in counts are the administrators' either way
    with TestClient(create_app(sqlite_url, ADMIN, open_admission=True, private_round_details=True)) as client:
        error_of(client.get(f"{API}/rounds/{rid}"), 401, "unauthorized", "--private-round-details")
        assert client.get(f"{API}/rounds/{rid}", headers=AUTH).json()["counts"]["optin_users"] > 0
        assert client.get(f"{API}/rounds/{rid}/headlist").status_code == 200  # what devices need stays public

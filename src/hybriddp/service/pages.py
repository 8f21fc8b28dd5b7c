"""The service's web pages: the local-search page (``/``), the curator's round page (``/rounds/{id}``) and a round
series' page with its trends (``/series/{id}``).

Both are static HTML shells with ES modules under ``/static/`` (no build step, nothing fetched from
anywhere but this server); the scripts read the public API. One small endpoint exists for them:

``GET /api/v1/local-search/rounds`` → ``{"search": R | null, "contribute": R | null}`` where ``R`` is
``{"id", "name", "state", "headlist_hash"}``:

* ``search``: the newest BLENDER round whose results are published — the round whose local-search
  document (``GET /api/v1/rounds/{id}/local-search``) the page downloads, keeps in the browser's
  storage and searches offline (a page opened as ``/?round=ID`` searches that round instead);
* ``contribute``: the newest BLENDER round that still takes device reports (``headlist-published``
  or ``collecting-reports``) — where the page's "contribute" switch sends its randomized report.

A round that published its results answers reports with 409, so contributing always goes to the next
round collecting reports, as a deployment runs them: round N's results power search while round N+1
collects. ``hybriddp serve --demo`` holds both: a finished round and a second one collecting reports.
With no round collecting reports the switch is shown disabled and says why.

Offline: the page keeps the document in localStorage, so it goes on suggesting when the network goes;
a service worker (``/sw.js``, network first) keeps the page's own files, so it also opens offline.

The pages are not part of the API: every route here is left out of the OpenAPI schema.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse
from starlette.staticfiles import StaticFiles

from hybriddp.service.store import REPORT_STATES, RoundInfo, Store

STATIC = Path(__file__).with_name("static")
"""The pages' files (shipped as package data)."""

SECURITY_HEADERS = {
    # only this server's scripts, styles and API; links out to suggested URLs stay plain navigations
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
                                "form-action 'self'"),
    "Referrer-Policy": "no-referrer",  # a suggested link opened from the page does not tell the site what was typed
    "X-Content-Type-Options": "nosniff",
}


class _Static(StaticFiles):
    """The static files, revalidated on every load (ETag) so an upgraded server's scripts are picked up."""

    def file_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        response.headers.update(SECURITY_HEADERS)
        return response


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC / name, media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-cache", **SECURITY_HEADERS})


def _brief(info: RoundInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"id": info.id, "name": info.name, "state": info.state, "headlist_hash": info.headlist_hash}


def page_rounds(store: Store) -> dict[str, dict[str, Any] | None]:
    """The rounds the local-search page uses: the newest published BLENDER round (to search) and the newest
    BLENDER round taking reports (to contribute to); ``None`` where there is none. Two indexed reads that stop
    at the newest match (migration 0005), whatever the number of rounds."""
    return {"search": _brief(store.newest_round("blender", ["results-published"])),
            "contribute": _brief(store.newest_round("blender", REPORT_STATES))}


def mount(app: FastAPI, store: Store) -> None:
    """Add the page routes, the pages' endpoint and the static assets to ``app``."""

    @app.get("/", include_in_schema=False)
    def local_search_page() -> FileResponse:
        return _page("index.html")

    @app.get("/rounds/{round_id}", include_in_schema=False)
    def round_page(round_id: str) -> FileResponse:  # the script reads the id from the URL and asks the API
        return _page("round.html")

    @app.get("/series/{series_id}", include_in_schema=False)
    def series_page(series_id: str) -> FileResponse:  # the script reads the id from the URL and asks the API
        return _page("series.html")

    @app.get("/sw.js", include_in_schema=False)
    def service_worker() -> FileResponse:  # at the root, so that its scope is the whole site
        return FileResponse(STATIC / "sw.js", media_type="text/javascript; charset=utf-8",
                            headers={"Cache-Control": "no-cache", **SECURITY_HEADERS})

    @app.get("/api/v1/local-search/rounds", include_in_schema=False)
    def local_search_rounds() -> dict[str, dict[str, Any] | None]:
        return page_rounds(store)

    mount_api_docs(app)
    # follow_symlink: in a source checkout static/hybriddp-device.js links to clients/js (a wheel holds the file)
    app.mount("/static", _Static(directory=STATIC, follow_symlink=True), name="static")


def docs_security_headers(html: str) -> dict[str, str]:
    """The CSP of the API docs page: its own scripts and styles, and its one inline script by its SHA-256 only
    (Swagger UI starts from an inline script; 'unsafe-inline' would let any injected script run)."""
    inline = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(x.encode()).digest()).decode()}'" for x in inline)
    csp = (f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
           "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
    return {**SECURITY_HEADERS, "Content-Security-Policy": csp}


def mount_api_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI from the installed ``swagger-ui-bundle-v2`` package, not from a CDN (FastAPI's
    default page loads its script from the internet: blank on a machine without it, and a third party
    learns who reads the docs). ``create_app`` turns FastAPI's own ``/docs`` and ``/redoc`` off."""
    import swagger_ui_bundle
    from fastapi.openapi.docs import get_swagger_ui_html

    @app.get("/docs", include_in_schema=False)
    def api_docs() -> HTMLResponse:
        page = get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} – API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/static/favicon.svg")
        page.headers.update(docs_security_headers(bytes(page.body).decode("utf-8")))
        return page

    app.mount("/docs-assets", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")

"""Request hygiene in front of every route (docs/DEPLOYMENT.md, issue 29): cross-site requests, CORS, security headers.

A browser visiting another site can be made to send requests to this service: ``fetch(url, {mode: "no-cors"})``
and ``navigator.sendBeacon`` need no permission from the server, and they carry the visitor's network address.
:class:`Guard` refuses every state-changing request (POST, PUT, PATCH, DELETE) that a browser marks as coming
from another origin, unless that origin is listed (``hybriddp serve --cors-origin``):

* ``Origin`` present and not this server's own origin (scheme aside: a TLS proxy changes it) nor a listed one;
* ``Sec-Fetch-Site: cross-site`` or ``same-site`` without a listed ``Origin``.

Clients that are not browsers (the SDK, ``participate``, curl) send neither header and are not affected. Listed
origins get CORS answers (preflight included); no other origin does. The JSON content types the bodies require
(:mod:`hybriddp.service.bodies`) are not CORS-safelisted, so a cross-origin page cannot even send a report body
without a preflight, which is answered only for listed origins.

Every response also gets the security headers of :data:`SECURITY_HEADERS` (a page's own CSP is kept).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import orjson

from hybriddp.core.errors import parameter_error

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
"""Headers every response carries."""

DEFAULT_CSP = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'"
"""The Content-Security-Policy of responses that set none (API JSON, errors): nothing may load or frame them."""

DEFAULT_PORTS = {"http": 80, "https": 443}
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CORS_METHODS = b"GET, POST, DELETE, OPTIONS"
CORS_HEADERS = b"Authorization, Content-Type, If-None-Match"


def _origin_parts(origin: str) -> tuple[str, str, int]:
    """(scheme, host — bracketed if IPv6, port — the scheme's default when absent) of an origin, lower case;
    ValueError if it is not one."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"{origin[:80]!r} is not an origin (scheme://host[:port], http or https)")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return parts.scheme, host, parts.port or DEFAULT_PORTS[parts.scheme]


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case with the scheme's default port dropped; ValueError if not an origin."""
    scheme, host, port = _origin_parts(origin)
    return f"{scheme}://{host}" + ("" if port == DEFAULT_PORTS[scheme] else f":{port}")


class Guard:
    """Decides what to do with a request before any route sees it (module docstring)."""

    def __init__(self, cors_origins: Iterable[str] = ()) -> None:
        """``cors_origins``: the listed origins; a string that is not one is a :class:`ParameterError` naming it."""
        listed = set()
        for origin in cors_origins:
            try:
                listed.add(normalize_origin(origin))
            except ValueError:
                raise parameter_error("CORS origin (--cors-origin)", origin[:80], "an origin such as "
                                      "https://pages.example.org (http or https, host and port only)") from None
        self.cors_origins = frozenset(listed)

    def same_origin(self, origin: str, host: str | None) -> bool:
        """Whether ``origin`` names this server as the request reached it (its Host header), any scheme."""
        if not host:
            return False
        try:
            _, name, port = _origin_parts(origin)
        except ValueError:
            return False
        h = host.strip().lower()  # host[:port]; without a port, the scheme's default
        return h == f"{name}:{port}" or (port in DEFAULT_PORTS.values() and h == name)

    def refusal(self, method: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """(status, code, message) when a request with this method and these (lower-case) headers must be refused,
        else None."""
        origin = headers.get("origin")
        listed = origin is not None and _safe_normalize(origin) in self.cors_origins
        if method == "OPTIONS" and origin is not None and "access-control-request-method" in headers:
            return None if listed else (403, "cross_origin", self._message(origin))
        if method not in UNSAFE_METHODS or listed:
            return None
        if origin is not None and origin != "null" and self.same_origin(origin, headers.get("host")):
            return None
        site = headers.get("sec-fetch-site")
        if origin is not None or site in ("cross-site", "same-site"):
            return 403, "cross_origin", self._message(origin or f"Sec-Fetch-Site: {site}")
        return None

    def preflight(self, method: str, headers: dict[str, str]) -> list[tuple[bytes, bytes]] | None:
        """The headers of a CORS preflight answer for a listed origin (None: not a preflight)."""
        if method != "OPTIONS" or "access-control-request-method" not in headers:
            return None
        return [*self.cors_headers(headers.get("origin")), (b"access-control-allow-methods", CORS_METHODS),
                (b"access-control-allow-headers", CORS_HEADERS), (b"access-control-max-age", b"600")]

    def cors_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        """Access-Control-Allow-Origin for a listed origin (no credentials: the API uses bearer tokens)."""
        if origin is None or _safe_normalize(origin) not in self.cors_origins:
            return []
        return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]

    @staticmethod
    def _message(what: str) -> str:
        return (f"cross-site request refused ({what[:80]}): this service takes state-changing requests only from its "
                "own pages and from clients that are not browsers; an operator lists other origins with "
                "hybriddp serve --cors-origin")

    async def __call__(self, app: Any, scope: Any, receive: Any, send: Any) -> None:
        """Serve ``scope`` with ``app`` behind the guard."""
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        method, headers = scope["method"], _headers(scope)
        refused = self.refusal(method, headers)
        if refused is not None:
            status, code, message = refused
            await _send_json(send, status, {"error": {"code": code, "message": message}})
            return
        extra = self.cors_headers(headers.get("origin"))
        pre = self.preflight(method, headers)
        if pre is not None:
            await send({"type": "http.response.start", "status": 204, "headers": [*pre, *SECURITY_HEADERS]})
            await send({"type": "http.response.body", "body": b""})
            return

        async def guarded(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": with_security_headers(list(msg.get("headers", [])), extra)}
            await send(msg)

        await app(scope, receive, guarded)


def with_security_headers(headers: list[Any], extra: Iterable[tuple[bytes, bytes]] = ()) -> list[Any]:
    """``headers`` plus :data:`SECURITY_HEADERS` and :data:`DEFAULT_CSP` where the response set none of its own."""
    names = {bytes(k).lower() for k, _ in headers}
    out = list(headers) + [h for h in SECURITY_HEADERS if h[0] not in names] + list(extra)
    if b"content-security-policy" not in names:
        out.append((b"content-security-policy", DEFAULT_CSP))
    return out


def _safe_normalize(origin: str) -> str | None:
    try:
        return normalize_origin(origin)
    except ValueError:
        return None


def _headers(scope: Any) -> dict[str, str]:
    """The request headers as a lower-case dict (the first of repeated ones)."""
    out: dict[str, str] = {}
    for k, v in scope.get("headers") or []:
        out.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
    return out


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    payload = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": with_security_headers(headers)})
    await send({"type": "http.response.body", "body": payload})

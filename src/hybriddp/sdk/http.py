"""The HTTP core of the SDK: one connection pool to one ``hybriddp serve``, errors, retries.

Retries. Submitting device messages is idempotent — every message carries a random 16-byte id and
the server counts an id once — so submissions (and every GET) are retried on connection errors,
timeouts, HTTP 429 and 5xx, with exponential backoff and full jitter (:class:`RetryPolicy`),
never on another 4xx. Requests that are not idempotent (create, enrol, upload, publish, close)
are retried only when the connection could not be opened at all (nothing was sent).

Errors. A refusal by the server becomes a :class:`ServiceRequestError` subclass carrying the
server's code and message (which names the field, the value and the fix); a server that stays
unreachable becomes :class:`ServiceUnavailableError`. Both are
:class:`~hybriddp.core.errors.HybridDPError`, so the CLI prints them as one line.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import ssl
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from hybriddp.core.errors import HybridDPError, parameter_error

log = logging.getLogger("hybriddp.sdk.client")
"""The SDK's one logger (retries)."""

API = "/api/v1"
NDJSON = "application/x-ndjson"
USER_AGENT = "hybriddp"


# ----- errors ---------------------------------------------------------------------------------
class ServiceRequestError(HybridDPError):
    """A request to the service failed: ``status`` and ``code`` as the server answered (None when there was no
    answer); the message names the request and carries the server's own message."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class UnauthorizedError(ServiceRequestError):
    """HTTP 401/403: a missing or wrong token."""


class NotFoundError(ServiceRequestError):
    """HTTP 404: no such round (or endpoint)."""


class ConflictError(ServiceRequestError):
    """HTTP 409: the round's state does not allow the request (e.g. reports after close)."""


class BodyTooLargeError(ServiceRequestError):
    """HTTP 413: the body is over the server's size limit."""


class ServiceUnavailableError(ServiceRequestError):
    """The server could not be reached, timed out or kept failing (5xx/429) after every retry.

    ``pending`` holds the device message that was not acknowledged, if any: it may be resent
    as it is (same id) later; the device ledger has already been charged for it.
    """

    pending: dict[str, Any] | None = None


_BY_STATUS: dict[int, type[ServiceRequestError]] = {
    401: UnauthorizedError, 403: UnauthorizedError, 404: NotFoundError, 409: ConflictError, 413: BodyTooLargeError,
}


def _error_from_response(resp: httpx.Response, what: str) -> ServiceRequestError:
    """The server's JSON error ``{"error": {"code", "message"}}`` as an exception naming the request."""
    code, message = None, None
    try:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code, message = err.get("code"), err.get("message")
        elif isinstance(body, dict) and "detail" in body:
            message = str(body["detail"])
    except (ValueError, UnicodeDecodeError):
        pass
    if not message:
        message = (resp.text or resp.reason_phrase or "no message").strip()[:300]
    cls = _BY_STATUS.get(resp.status_code, ServiceUnavailableError if resp.status_code >= 500 else ServiceRequestError)
    tag = f"HTTP {resp.status_code}" + (f" {code}" if code else "")
    return cls(f"{what}: {message} ({tag})", status=resp.status_code, code=code)


# ----- retries --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: before retry n (1, 2, ...) wait a uniform time in
    [0, min(max_delay, base_delay · 2^(n−1))] seconds (or the server's Retry-After, if larger and
    at most ``max_delay``). ``attempts`` counts the first try; 1 means no retry."""

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise parameter_error("attempts", self.attempts, "an integer >= 1 (1 = no retry)")
        for name in ("base_delay", "max_delay"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 <= v < float("inf")):
                raise parameter_error(name, v, "a finite number of seconds >= 0")

    def delay(self, retry: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        cap = min(self.max_delay, self.base_delay * 2.0 ** (retry - 1))
        wait = (rng or _JITTER).uniform(0.0, cap)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_delay))
        return wait


_JITTER = random.Random()  # jitter only spreads retries out in time: no secret depends on it

NO_RETRY = RetryPolicy(attempts=1)


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


# ----- the HTTP core ----------------------------------------------------------------------------
def check_base_url(base_url: Any, field: str = "server URL (--server)",
                   allowed: str = "an http:// or https:// URL such as http://127.0.0.1:8000 (where `hybriddp serve` "
                                  "listens)") -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing slash, else a ParameterError naming ``field``."""
    ok = isinstance(base_url, str)
    if ok:
        parts = urlsplit(base_url.strip())
        ok = parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.query and not parts.fragment
    if not ok:
        raise parameter_error(field, base_url, allowed)
    return base_url.strip().rstrip("/")


@functools.lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """The one verifying TLS context of the SDK's connections (httpx's default trust: certifi's bundle, or
    ``SSL_CERT_FILE``/``SSL_CERT_DIR``). Building one costs about 40 ms of CPU, and a device opens a new connection
    for its token and another for its report. Sharing the context links nothing: CPython's client sockets resume a
    TLS session only when one is passed to them (``ssl.SSLSocket.session``), which the SDK never does, so each new
    connection is a full handshake with nothing of the earlier ones (tests/service/test_tls_resumption.py)."""
    return httpx.create_ssl_context()


def new_client(timeout: httpx.Timeout | float, **kw: Any) -> httpx.Client:
    """A new connection pool with the shared :func:`tls_context` (``kw``: httpx.Client's other options)."""
    return httpx.Client(timeout=timeout, verify=tls_context(), **kw)


class ServiceHttp:
    """One httpx connection pool to one server, with error mapping and retries."""

    def __init__(self, base_url: str, *, token: str | None = None, retry: RetryPolicy | None = None,
                 timeout: float = 60.0, client: httpx.Client | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.base_url = check_base_url(base_url)
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        # every SDK client sends the same User-Agent: nothing about the device's software reaches the server
        headers = {"User-Agent": USER_AGENT, **({"Authorization": f"Bearer {token}"} if token else {})}
        self._own = client is None
        self.http = client or new_client(httpx.Timeout(timeout, connect=min(10.0, timeout)))
        self._headers = headers

    def close_connections(self) -> None:
        """Close the connection pool (when this object created it); ``with`` does it on exit."""
        if self._own:
            self.http.close()

    def __enter__(self):  # type: ignore[no-untyped-def]  # returns the subclass
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_connections()

    def request_json(self, method: str, path: str, *, what: str, idempotent: bool, **kw: Any) -> Any:
        """:meth:`request`, then the answer's JSON body (:func:`response_json`)."""
        return response_json(self.request(method, path, what=what, idempotent=idempotent, **kw), what)

    def request(self, method: str, path: str, *, what: str, idempotent: bool, json_body: Any = None,
                content: bytes | None = None, headers: dict[str, str] | None = None,
                ok: Sequence[int] = (200, 201), params: dict[str, str] | None = None) -> httpx.Response:
        """Send a request; return the response if its status is in ``ok``, else raise.

        ``idempotent`` requests are retried on transport errors, timeouts, 429 and 5xx; the others
        only when the connection could not be opened (nothing reached the server).
        """
        url = self.base_url + path
        hdrs = {**self._headers, **(headers or {})}
        if json_body is not None:
            content = json.dumps(json_body, allow_nan=False, separators=(",", ":")).encode("utf-8")
            hdrs.setdefault("Content-Type", "application/json")
        last: str = ""
        for attempt in range(1, self.retry.attempts + 1):
            retry_after = None
            try:
                resp = self.http.request(method, url, content=content, headers=hdrs, params=params)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                last = f"cannot connect to {self.base_url} ({exc or type(exc).__name__})"
            except httpx.TransportError as exc:  # sent (maybe partly): only idempotent requests may go again
                last = f"{type(exc).__name__} talking to {self.base_url} ({exc or 'no detail'})"
                if not idempotent:
                    raise ServiceUnavailableError(f"{what}: {last}; the request may or may not have been "
                                                  "applied: check the round's status before repeating it") from None
            else:
                if resp.status_code in ok:
                    return resp
                if not (resp.status_code == 429 or resp.status_code >= 500) or not idempotent:
                    raise _error_from_response(resp, what)
                last = str(_error_from_response(resp, what))
                retry_after = _retry_after(resp)
            if attempt < self.retry.attempts:
                wait = self.retry.delay(attempt, retry_after)
                log.info("%s: %s; retry %d of %d in %.2f s", what, last, attempt, self.retry.attempts - 1, wait)
                self._sleep(wait)
        tries = self.retry.attempts
        raise ServiceUnavailableError(f"{what}: {last} (gave up after {tries} attempt{'s' * (tries > 1)}); "
                                      "is `hybriddp serve` running there?")


def round_path(round_id: Any, tail: str = "") -> str:
    """The API path ``/api/v1/rounds/<round id><tail>``; a ParameterError when ``round_id`` cannot be an id."""
    if not isinstance(round_id, str) or not round_id or len(round_id) > 64:
        raise parameter_error("round id (--round)", round_id, "the id `hybriddp round create` printed "
                              "(22 characters of A-Z a-z 0-9 - _)")
    return f"{API}/rounds/{quote(round_id, safe='')}{tail}"


def series_path(series_id: Any, tail: str = "") -> str:
    """The API path ``/api/v1/series/<series id><tail>``; a ParameterError when ``series_id`` cannot be an id."""
    if not isinstance(series_id, str) or not series_id or len(series_id) > 64:
        raise parameter_error("series id", series_id, "the id `hybriddp series create` printed (22 characters of "
                              "A-Z a-z 0-9 - _)")
    return f"{API}/series/{quote(series_id, safe='')}{tail}"


def fetch_series(http: Any, series_id: str) -> dict[str, Any]:
    """``GET /api/v1/series/{id}``: the schedule and each period's round (public unless the server hides round
    details; the opt-in counts for administrators only)."""
    return http.request_json("GET", series_path(series_id), what=f"series {series_id}", idempotent=True)


def fetch_series_trends(http: Any, series_id: str, *, window: int | None = None, fdr: float = 0.05,
                        min_change: float = 0.0) -> dict[str, Any]:
    """``GET /api/v1/series/{id}/trends`` (public unless the server hides round details). ``window``: periods pooled
    on each side of a boundary; None sends none, so the server's default applies
    (:data:`hybriddp.server.trends.DEFAULT_WINDOW`, the answer's ``window``): the SDK keeps no default of its own."""
    params = {"fdr": repr(float(fdr)), "min_change": repr(float(min_change))}
    if window is not None:
        params["window"] = str(window)
    return http.request_json("GET", series_path(series_id, "/trends"), what=f"trends of series {series_id}",
                             idempotent=True, params=params)


def response_json(resp: httpx.Response, what: str) -> Any:
    """The answer's JSON body; a ServiceRequestError naming the request when it is not JSON."""
    try:
        return resp.json()
    except (ValueError, UnicodeDecodeError):
        raise ServiceRequestError(f"{what}: the server answered HTTP {resp.status_code} with a body that is not "
                                  f"JSON ({resp.text[:80]!r}); is this a hybriddp server?",
                                  status=resp.status_code) from None


def fetch_results(h: ServiceHttp, round_id: str, fmt: str) -> Any:
    """A round's published results: the JSON document, or the bytes of the ``csv`` / ``parquet`` table."""
    what = f"results of round {round_id}"
    resp = h.request("GET", round_path(round_id, "/results"), what=what, idempotent=True,
                     params={"format": fmt})
    return response_json(resp, what) if fmt == "json" else resp.content


def fetch_local_search(h: ServiceHttp, round_id: str) -> dict[str, Any]:
    """A round's local-search document."""
    what = f"local-search document of round {round_id}"
    return h.request_json("GET", round_path(round_id, "/local-search"), what=what, idempotent=True)


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    part: list[Any] = []
    for x in items:
        part.append(x)
        if len(part) >= size:
            yield part
            part = []
    if part:
        yield part

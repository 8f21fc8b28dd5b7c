"""Python SDK of the collection service (``hybriddp serve``), over HTTP with httpx.

Three roles, one class each (paper Fig. 1; the API is in docs and ``/openapi.json``):

* :class:`AdminClient` — the operator: create rounds, enrol opt-in users, publish the head list,
  close, fetch results (bearer admin token).
* :class:`OptinUploader` — one opt-in user: upload raw records (or values) with the token the
  operator gave at enrolment. This is the only path raw data takes (:class:`OptinRelay` forwards
  many users' uploads in one request, each still authenticated by its own token).
* :class:`DeviceClient` — one device (a client in the paper): fetch and verify the head list
  (cached by its ETag), randomize its own records on the device with
  :func:`hybriddp.device.randomize_records` (charging its own :class:`~hybriddp.device.DeviceLedger`,
  by default the per-user one of :func:`hybriddp.device.default_device_ledger_path`), and submit the message.

Retries. Submitting device messages is idempotent — every message carries a random 16-byte id and
the server counts an id once — so submissions (and every GET) are retried on connection errors,
timeouts, HTTP 429 and 5xx, with exponential backoff and full jitter (:class:`RetryPolicy`),
never on another 4xx. Requests that are not idempotent (create, enrol, upload, publish, close)
are retried only when the connection could not be opened at all (nothing was sent).

Errors. A refusal by the server becomes a :class:`ServiceRequestError` subclass carrying the
server's code and message (which names the field, the value and the fix); a server that stays
unreachable becomes :class:`ServiceUnavailableError`. Both are
:class:`~hybriddp.errors.HybridDPError`, so the CLI prints them as one line.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from hybriddp.device import (
    DeviceLedger,
    DeviceLedgerRefusal,
    check_message_id,
    default_device_ledger_path,
    open_device_ledger,
    randomize_records,
    validate_headlist,
)
from hybriddp.errors import HybridDPError, parameter_error

log = logging.getLogger(__name__)

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
def check_base_url(base_url: Any) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing slash, else a ParameterError."""
    ok = isinstance(base_url, str)
    if ok:
        parts = urlsplit(base_url.strip())
        ok = parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.query and not parts.fragment
    if not ok:
        raise parameter_error("server URL (--server)", base_url, "an http:// or https:// URL such as "
                              "http://127.0.0.1:8000 (where `hybriddp serve` listens)")
    return base_url.strip().rstrip("/")


class _Http:
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
        self.http = client or httpx.Client(timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)))
        self._headers = headers

    def close_connections(self) -> None:
        """Close the connection pool (when this object created it); ``with`` does it on exit."""
        if self._own:
            self.http.close()

    def __enter__(self):  # type: ignore[no-untyped-def]  # returns the subclass
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_connections()

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


def _rid(round_id: Any) -> str:
    if not isinstance(round_id, str) or not round_id or len(round_id) > 64:
        raise parameter_error("round id (--round)", round_id, "the id `hybriddp round create` printed "
                              "(22 characters of A-Z a-z 0-9 - _)")
    return quote(round_id, safe="")


def _json(resp: httpx.Response, what: str) -> Any:
    try:
        return resp.json()
    except (ValueError, UnicodeDecodeError):
        raise ServiceRequestError(f"{what}: the server answered HTTP {resp.status_code} with a body that is not "
                                  f"JSON ({resp.text[:80]!r}); is this a hybriddp server?",
                                  status=resp.status_code) from None


# ----- the administrator ------------------------------------------------------------------------
class AdminClient(_Http):
    """The operator of the service (admin bearer token).

    >>> admin = AdminClient("http://127.0.0.1:8000", token)            # doctest: +SKIP
    >>> rnd = admin.create_round("blender", {"epsilon": 4, "delta": 1e-5})  # doctest: +SKIP
    """

    def __init__(self, base_url: str, token: str, **kw: Any) -> None:
        if not isinstance(token, str) or not token.strip():
            raise parameter_error("admin token", "<empty>", "the token `hybriddp serve` was started with "
                                  "(--admin-token-file, or the HYBRIDDP_ADMIN_TOKEN environment variable)")
        kw.setdefault("timeout", 600.0)  # closing a round of millions of reports takes seconds
        super().__init__(base_url, token=token.strip(), **kw)

    def create_round(self, kind: str = "blender", params: dict[str, Any] | None = None, *, name: str | None = None,
                     seed: int | None = None, retention_hours: float | None = None) -> dict[str, Any]:
        """Create a round (state collecting-optin). ``seed``: experiments only, no privacy (refused unless the
        server runs with ``--insecure-testing-seeds``). ``retention_hours``: raw opt-in data are purged that
        long after creation at the latest (server default: a week)."""
        body: dict[str, Any] = {"kind": kind, "params": dict(params or {})}
        if name is not None:
            body["name"] = name
        if retention_hours is not None:
            body["retention_hours"] = retention_hours
        if seed is not None:
            body["params"]["seed"] = seed
        return _json(self.request("POST", f"{API}/rounds", what="create round", idempotent=False,
                                  json_body=body, ok=(201, 200)), "create round")

    def round(self, round_id: str) -> dict[str, Any]:
        """One round's state, parameters and counts."""
        what = f"round {round_id}"
        return _json(self.request("GET", f"{API}/rounds/{_rid(round_id)}", what=what, idempotent=True), what)

    def rounds(self) -> list[dict[str, Any]]:
        """Every round, newest first as the server lists them."""
        return _json(self.request("GET", f"{API}/rounds", what="list rounds", idempotent=True),
                     "list rounds")["rounds"]

    def enrol(self, round_id: str, user: str) -> str:
        """Enrol one opt-in user; returns the user's upload token (shown once, never stored by the server)."""
        what = f"enrol a user in round {round_id}"
        resp = self.request("POST", f"{API}/rounds/{_rid(round_id)}/optin/enrol", what=what, idempotent=False,
                            json_body={"user": user}, ok=(201, 200))
        return _json(resp, what)["token"]

    def enrol_many(self, round_id: str, users: Sequence[str], *, chunk: int = 10_000) -> list[str]:
        """Enrol users in order (their order is the curator's user order); one token per user."""
        what = f"enrol users in round {round_id}"
        tokens: list[str] = []
        for i in range(0, len(users), chunk):
            part = list(users[i:i + chunk])
            resp = self.request("POST", f"{API}/rounds/{_rid(round_id)}/optin/enrol", what=what,
                                idempotent=False, json_body={"users": part}, ok=(201, 200))
            got = _json(resp, what).get("tokens")
            if not isinstance(got, list) or len(got) != len(part):
                raise ServiceRequestError(f"{what}: the server answered without one token per user")
            tokens.extend(got)
        return tokens

    def publish_headlist(self, round_id: str, *, vocabulary: dict[str, list[str]] | None = None) -> dict[str, Any]:
        """Build the head list from the uploaded opt-in records, charge the ledger, publish, delete raw data.

        ``vocabulary`` (seeded experiment rounds only): the order of the query and URL codes
        ``{"queries": [...], "urls": [...]}``, so the build reproduces a seeded simulation.
        """
        what = f"publish the head list of round {round_id}"
        body = {"vocabulary": vocabulary} if vocabulary is not None else None
        return _json(self.request("POST", f"{API}/rounds/{_rid(round_id)}/headlist", what=what, idempotent=False,
                                  json_body=body), what)

    def abort(self, round_id: str) -> dict[str, Any]:
        """End a round still collecting opt-in data; its raw opt-in data are deleted (nothing is charged)."""
        what = f"abort round {round_id}"
        return _json(self.request("POST", f"{API}/rounds/{_rid(round_id)}/abort", what=what, idempotent=False),
                     what)

    def delete_round(self, round_id: str) -> dict[str, Any]:
        """Delete a round's raw data, tokens, reports, documents and results (its ledger charges stay)."""
        what = f"delete round {round_id}"
        return _json(self.request("DELETE", f"{API}/rounds/{_rid(round_id)}", what=what, idempotent=True), what)

    def ledger(self) -> dict[str, Any]:
        """The service's privacy ledger: per-round totals and per-pseudonym spend (no identities)."""
        return _json(self.request("GET", f"{API}/ledger", what="read the ledger", idempotent=True), "read the ledger")

    def close(self, round_id: str) -> dict[str, Any]:
        """Close the round (reports are refused from now on) and compute its results."""
        what = f"close round {round_id}"
        return _json(self.request("POST", f"{API}/rounds/{_rid(round_id)}/close", what=what, idempotent=False),
                     what)

    def results(self, round_id: str, fmt: str = "json") -> Any:
        """The results: a dict for ``json``, the bytes of the records table for ``csv`` / ``parquet``."""
        if fmt not in ("json", "csv", "parquet"):
            raise parameter_error("results format", fmt, "json, csv or parquet")
        return _results(self, round_id, fmt)

    def local_search(self, round_id: str) -> dict[str, Any]:
        """The compact local-search document (queries, their URLs, blended probabilities)."""
        return _local_search(self, round_id)

    def release(self, round_id: str) -> dict[str, Any]:
        """The published inputs of the result: head list, opt-in estimates, report counts per entry."""
        what = f"release of round {round_id}"
        return _json(self.request("GET", f"{API}/rounds/{_rid(round_id)}/release", what=what, idempotent=True),
                     what)


def _results(h: _Http, round_id: str, fmt: str) -> Any:
    what = f"results of round {round_id}"
    resp = h.request("GET", f"{API}/rounds/{_rid(round_id)}/results", what=what, idempotent=True,
                     params={"format": fmt})
    return _json(resp, what) if fmt == "json" else resp.content


def _local_search(h: _Http, round_id: str) -> dict[str, Any]:
    what = f"local-search document of round {round_id}"
    return _json(h.request("GET", f"{API}/rounds/{_rid(round_id)}/local-search", what=what, idempotent=True), what)


# ----- an opt-in user ---------------------------------------------------------------------------
class OptinUploader(_Http):
    """One opt-in user of one round: uploads raw records with the token from enrolment."""

    def __init__(self, base_url: str, round_id: str, token: str, **kw: Any) -> None:
        if not isinstance(token, str) or not token:
            raise parameter_error("opt-in token", token, "the token the operator gave at enrolment")
        super().__init__(base_url, token=token, **kw)
        self.round_id = round_id

    def upload(self, records: Iterable[tuple[str, str | None]], *, chunk: int = 50_000) -> int:
        """Upload (query, url) records (url None when there is none), in order; returns how many were stored.

        The server keys each chunk by its content (keyed hash), so a chunk resent after a lost answer, or
        the same records uploaded again, are acknowledged and not stored twice: uploads are retried like
        any idempotent request, and a repeat is not counted in the return value.
        """
        what = f"upload opt-in records to round {self.round_id}"
        path = f"{API}/rounds/{_rid(self.round_id)}/optin/records"
        accepted = 0
        for part in _chunks(({"query": q, "url": u} for q, u in records), chunk):
            body = {"records": part}
            resp = self.request("POST", path, what=what, idempotent=True, json_body=body)
            accepted += int(_json(resp, what)["accepted"])
        return accepted

    def upload_values(self, values: Iterable[float]) -> int:
        """Mean rounds: upload raw numeric values; returns how many were accepted."""
        what = f"upload opt-in values to round {self.round_id}"
        body = {"values": [float(v) for v in values]}
        resp = self.request("POST", f"{API}/rounds/{_rid(self.round_id)}/optin/records", what=what,
                            idempotent=True, json_body=body)
        return int(_json(resp, what)["accepted"])


class OptinRelay(_Http):
    """Forwards the uploads of many opt-in users at once (a collection relay, or a simulation): NDJSON bodies,
    one line per user with that user's own token, ``{"token": ..., "records": [...]}`` (mean rounds:
    ``"values"``). The server stores each body in one transaction or refuses it whole. Not retried once sent."""

    def __init__(self, base_url: str, round_id: str, **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self.round_id = round_id

    def upload_many(self, uploads: Iterable[tuple[str, Sequence[Any]]], *, values: bool = False,
                    max_body_bytes: int = 8 << 20) -> int:
        """Upload ``(token, records)`` pairs (or ``(token, values)`` with ``values=True``), in order, in bodies of
        at most ``max_body_bytes`` (one user's line may exceed it alone); returns how many items were accepted."""
        what = f"upload opt-in {'values' if values else 'records'} of several users to round {self.round_id}"
        path = f"{API}/rounds/{_rid(self.round_id)}/optin/records"
        accepted, lines, size = 0, [], 0

        def send() -> int:
            resp = self.request("POST", path, what=what, idempotent=False, content=b"".join(lines),
                                headers={"Content-Type": NDJSON})
            return int(_json(resp, what)["accepted"])

        for token, items in uploads:
            body = ({"token": token, "values": [float(v) for v in items]} if values else
                    {"token": token, "records": [{"query": q, "url": u} for q, u in items]})
            line = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
            if lines and size + len(line) > max_body_bytes:
                accepted += send()
                lines, size = [], 0
            lines.append(line)
            size += len(line)
        if lines:
            accepted += send()
        return accepted


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    part: list[Any] = []
    for x in items:
        part.append(x)
        if len(part) >= size:
            yield part
            part = []
    if part:
        yield part


# ----- a device -----------------------------------------------------------------------------
MEAN_ROUND_FORMAT = "hybriddp-mean-round"
"""The ``format`` of a mean round's device document (bounds and ε instead of a head list)."""


def _check_mean_document(doc: dict[str, Any], source: str) -> None:
    """A mean round's device document: finite bounds lower < upper, ε > 0, and its content hash."""
    from hybriddp.device import DeviceError, content_hash
    from hybriddp.mean_device import NumericRandomizer

    try:
        NumericRandomizer(lower=doc["lower"], upper=doc["upper"], epsilon=doc["epsilon"])
    except (KeyError, TypeError, HybridDPError) as exc:
        raise DeviceError(f"{source}: the mean round's document is not usable ({exc})") from None
    if doc.get("content_hash") != content_hash(doc):
        raise DeviceError(f"{source}: field 'content_hash' = {str(doc.get('content_hash'))[:30]!r} does not match "
                          "the content: the document was altered on the way. Retry later.")
@dataclass
class Acknowledgement:
    """The server's answer to submitted messages: all acknowledged, ``counted`` new, ``duplicates`` seen before."""

    acknowledged: int = 0
    counted: int = 0
    duplicates: int = 0

    def __iadd__(self, other: Acknowledgement) -> Acknowledgement:
        self.acknowledged += other.acknowledged
        self.counted += other.counted
        self.duplicates += other.duplicates
        return self


class _Sentinel:
    """A named marker value for a keyword argument."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NO_LEDGER = _Sentinel("DeviceClient.NO_LEDGER")
"""``DeviceClient(..., device_ledger=NO_LEDGER)``: keep no device ledger. TESTS AND SIMULATIONS ONLY."""
_NEXT_TO_LEDGER = _Sentinel("<next to the device ledger>")

SDK_WAY_OUT = ("only tests and simulations may skip the device ledger "
               "(DeviceClient(..., device_ledger=DeviceClient.NO_LEDGER))")
"""The end of a ledger refusal's message from the SDK: how a test or a simulation opts out."""


def outbox_path(ledger_path: str | os.PathLike[str], round_id: str) -> str:
    """The default outbox of a device in a round: ``<ledger path>.outbox-<round id>.json``, beside its ledger."""
    return f"{os.fspath(ledger_path)}.outbox-{quote(round_id, safe='')}.json"


class DeviceClient(_Http):
    """One device taking part in a round (LocalAlg on the device, ALGORITHM.md §5).

    Guarantee: :meth:`participate` and :meth:`participate_value` charge the device ledger before a report
    leaves and refuse (:class:`~hybriddp.device.DeviceLedgerRefusal`, nothing sent) a second report in a
    round or one past the device's lifetime budget — unless the ledger is switched off with
    :data:`NO_LEDGER`. A message resent from the outbox is the same report (same id) and is not charged again.

    Parameters
    ----------
    base_url, round_id : the server and the round.
    device_ledger : the device's own ledger: None (the default) for the per-user one,
        :func:`hybriddp.device.default_device_ledger_path` (budget ε 16, δ 1e-4 when new); a path for the
        ledger in that file; a :class:`~hybriddp.device.DeviceLedger`; or ``DeviceClient.NO_LEDGER`` for
        none — every report is then charged by nobody, so only tests and simulations of many devices may.
        The ledger is opened at the first participation (reading the round or submitting prepared
        messages never touches it).
    outbox : file holding the one message not yet acknowledged; default beside the device ledger
        (:func:`outbox_path`), none with ``NO_LEDGER``; None for none. :meth:`participate` writes it
        (atomically) before sending and removes it once the server acknowledged; a later call for the
        same head list resends it unchanged (same id: counted once) instead of randomizing again.
    retry, timeout : see :class:`RetryPolicy` (device submissions are retried: they are idempotent).

    :meth:`submit` and :meth:`submit_batch` send messages as they are (a relay, or simulated devices) and
    charge no ledger: whoever randomized them charged theirs.
    """

    NO_LEDGER = NO_LEDGER

    def __init__(self, base_url: str, round_id: str,
                 device_ledger: DeviceLedger | str | os.PathLike[str] | _Sentinel | None = None, *,
                 outbox: str | os.PathLike[str] | _Sentinel | None = _NEXT_TO_LEDGER, **kw: Any) -> None:
        if not (device_ledger is None or device_ledger is NO_LEDGER
                or isinstance(device_ledger, (DeviceLedger, str, os.PathLike))):
            raise parameter_error("device_ledger", device_ledger, "None (the per-user device ledger), a path, a "
                                  "DeviceLedger, or DeviceClient.NO_LEDGER (tests and simulations only)")
        if not (outbox is None or outbox is _NEXT_TO_LEDGER or isinstance(outbox, (str, os.PathLike))):
            raise parameter_error("outbox", outbox, "a path, or None for no outbox")
        kw.setdefault("timeout", 60.0)
        super().__init__(base_url, **kw)
        self.round_id = round_id
        self._no_ledger = device_ledger is NO_LEDGER
        self._ledger: DeviceLedger | None = device_ledger if isinstance(device_ledger, DeviceLedger) else None
        # the ledger's file when given as a path; None with the per-user default
        self._ledger_file = os.fspath(device_ledger) if isinstance(device_ledger, (str, os.PathLike)) else None
        self._outbox_beside_ledger = outbox is _NEXT_TO_LEDGER
        self._outbox_file = os.fspath(outbox) if isinstance(outbox, (str, os.PathLike)) else None
        self._etag: str | None = None
        self._headlist: dict[str, Any] | None = None

    @property
    def ledger(self) -> DeviceLedger | None:
        """The device ledger charged before a report leaves (opened, and the default one's directory created,
        on first use); None with ``NO_LEDGER``."""
        if self._ledger is None and not self._no_ledger:
            self._ledger = open_device_ledger(self._ledger_file)
        return self._ledger

    @property
    def outbox(self) -> str | None:
        """The outbox file (None: no outbox)."""
        if not self._outbox_beside_ledger:
            return self._outbox_file
        if self._no_ledger:
            return None
        ledger_path = (self._ledger.path if self._ledger is not None else
                       self._ledger_file if self._ledger_file is not None else default_device_ledger_path())
        return outbox_path(ledger_path, self.round_id)

    def _charge(self, charge: Callable[[], Any]) -> Any:
        """Run ``charge`` (which charges the ledger); a refusal becomes one line naming this round and the opt-out."""
        try:
            return charge()
        except DeviceLedgerRefusal as exc:
            raise exc.explained(SDK_WAY_OUT, self.round_id) from None

    # -- the head list --
    def fetch_headlist(self) -> dict[str, Any]:
        """The round's head list, verified (fields, ranges, content hash == ETag); cached by ETag.

        A second call sends ``If-None-Match`` and reuses the cached document on 304 Not Modified.
        """
        what = f"head list of round {self.round_id}"
        headers = {"If-None-Match": self._etag} if self._etag and self._headlist is not None else {}
        resp = self.request("GET", f"{API}/rounds/{_rid(self.round_id)}/headlist", what=what, idempotent=True,
                            headers=headers, ok=(200, 304))
        if resp.status_code == 304 and self._headlist is not None:
            return self._headlist
        doc = _json(resp, what)
        if isinstance(doc, dict) and doc.get("format") == MEAN_ROUND_FORMAT:
            _check_mean_document(doc, f"{what} from {self.base_url}")
        else:
            doc = validate_headlist(doc, f"{what} from {self.base_url}")
        etag = resp.headers.get("etag")
        if etag is not None and etag.strip('W/"') != doc["content_hash"]:
            raise ServiceRequestError(f"{what}: the ETag {etag} does not match the document's content hash "
                                      f"{doc['content_hash'][:19]}…; a proxy or cache altered it. Retry later.")
        self._etag, self._headlist = etag or f'"{doc["content_hash"]}"', doc
        return doc

    @property
    def headlist_cached(self) -> dict[str, Any] | None:
        """The last verified head list (None before :meth:`fetch_headlist`)."""
        return self._headlist

    # -- participating --
    def participate(self, records: Sequence[tuple[str, str | None]]) -> Acknowledgement:
        """Randomize this device's records over the round's head list and submit the message.

        The device ledger is charged before the message leaves, and refuses
        (:class:`~hybriddp.device.DeviceLedgerRefusal`, nothing sent) a second report for this head list or
        one past the lifetime budget; a message the server did not acknowledge raises
        :class:`ServiceUnavailableError` with ``pending`` set (and stays in the outbox, from which the next
        call resends it uncharged).
        """
        doc = self.fetch_headlist()
        msg = self._outbox_message(doc["content_hash"])
        if msg is None:
            msg = self._charge(lambda: randomize_records(doc, records, ledger=self.ledger))
            self._write_outbox(msg)
        ack = self.submit(msg)
        self._clear_outbox()
        return ack

    def submit(self, message: dict[str, Any]) -> Acknowledgement:
        """Submit one message (retried: the id makes it idempotent)."""
        try:
            return self._post_messages(json.dumps(message, separators=(",", ":"), allow_nan=False).encode(),
                                       "application/json", 1)
        except ServiceUnavailableError as exc:
            exc.pending = message
            raise

    def submit_batch(self, messages: Iterable[dict[str, Any]], *, chunk: int = 10_000,
                     ndjson: bool = True) -> Acknowledgement:
        """Submit many messages (a relay, or simulated devices): NDJSON (or JSON-array) bodies of at most
        ``chunk`` messages, each retried; a body the server finds too large (413) is split in halves."""
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise parameter_error("chunk", chunk, "an integer >= 1 (messages per request)")
        total = Acknowledgement()
        for part in _chunks(messages, chunk):
            total += self._submit_lines([json.dumps(m, separators=(",", ":"), allow_nan=False) for m in part],
                                        ndjson)
        return total

    def _submit_lines(self, lines: list[str], ndjson: bool) -> Acknowledgement:
        body = ("\n".join(lines) + "\n") if ndjson else "[" + ",".join(lines) + "]"
        try:
            return self._post_messages(body.encode("utf-8"), NDJSON if ndjson else "application/json", len(lines))
        except BodyTooLargeError:
            if len(lines) == 1:
                raise
            half = len(lines) // 2
            ack = self._submit_lines(lines[:half], ndjson)
            ack += self._submit_lines(lines[half:], ndjson)
            return ack

    def _post_messages(self, body: bytes, ctype: str, n: int) -> Acknowledgement:
        what = f"submit {n:,} device message{'s' * (n != 1)} to round {self.round_id}"
        resp = self.request("POST", f"{API}/rounds/{_rid(self.round_id)}/reports", what=what, idempotent=True,
                            content=body, headers={"Content-Type": ctype})
        got = _json(resp, what)
        return Acknowledgement(int(got["acknowledged"]), int(got["counted"]), int(got["duplicates"]))

    # -- mean rounds --
    def participate_value(self, value: float) -> Acknowledgement:
        """Mean rounds: clamp and randomize one value on the device (ALGORITHM.md §11) and submit it.

        The round's document (bounds, ε, content hash) comes from the head-list endpoint; the device
        ledger is charged (ε, 0) under its content hash before the value leaves, refusing a second report
        in the round or one past the lifetime budget as :meth:`participate` does.
        """
        from hybriddp.device import new_message_id
        from hybriddp.mean_device import NumericRandomizer

        doc = self.fetch_headlist()
        if doc.get("format") != MEAN_ROUND_FORMAT:
            raise ServiceRequestError(f"round {self.round_id} is a BLENDER round, not a mean round; a device takes "
                                      "part with its records (participate(records), `hybriddp participate --input`)")
        msg = self._outbox_message(doc["content_hash"])
        if msg is None:
            randomizer = NumericRandomizer(lower=doc["lower"], upper=doc["upper"], epsilon=doc["epsilon"])
            report = randomizer.randomize(value)  # checks the value before the ledger is charged
            ledger = self.ledger
            if ledger is not None:
                self._charge(lambda: ledger.record(doc["content_hash"], float(doc["epsilon"]), 0.0))
            msg = {"id": new_message_id(), "round": self.round_id, "value": report, "headlist": doc["content_hash"]}
            self._write_outbox(msg)
        ack = self.submit({k: v for k, v in msg.items() if k != "headlist"})
        self._clear_outbox()
        return ack

    # -- the outbox --
    def _outbox_message(self, headlist_hash: str) -> dict[str, Any] | None:
        outbox = self.outbox
        if outbox is None or not os.path.exists(outbox):
            return None
        try:
            with open(outbox, encoding="utf-8") as fh:
                msg = json.load(fh)
            check_message_id(msg.get("id"))
        except (OSError, ValueError, AttributeError, HybridDPError) as exc:
            raise ServiceRequestError(f"outbox {outbox} cannot be read ({exc}); it should hold one device "
                                      "message. Move it away to participate again") from None
        return msg if msg.get("headlist") == headlist_hash else None

    def _write_outbox(self, msg: dict[str, Any]) -> None:
        outbox = self.outbox
        if outbox is not None:
            from hybriddp.io.atomic import write_text
            write_text(outbox, json.dumps(msg))

    def _clear_outbox(self) -> None:
        outbox = self.outbox
        if outbox is not None:
            try:
                os.unlink(outbox)
            except FileNotFoundError:
                pass

    def round(self) -> dict[str, Any]:
        """The round's state, parameters and counts (anyone may read them)."""
        what = f"round {self.round_id}"
        return _json(self.request("GET", f"{API}/rounds/{_rid(self.round_id)}", what=what, idempotent=True), what)

    def results(self, fmt: str = "json") -> Any:
        """The round's published results (anyone may read them)."""
        return _results(self, self.round_id, fmt)

    def local_search(self) -> dict[str, Any]:
        """The round's local-search document."""
        return _local_search(self, self.round_id)


__all__ = [
    "NO_LEDGER", "Acknowledgement", "AdminClient", "BodyTooLargeError", "ConflictError", "DeviceClient",
    "NotFoundError", "OptinRelay", "OptinUploader", "RetryPolicy", "ServiceRequestError", "ServiceUnavailableError",
    "UnauthorizedError", "check_base_url", "outbox_path",
]

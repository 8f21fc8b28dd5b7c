"""Device requests through an Oblivious HTTP relay (RFC 9458; spec-v2 §4), as an httpx transport.

``httpx.Client(transport=OhttpTransport(relay_url, key_config))`` sends every request as binary HTTP (RFC 9292
§3, known-length) encapsulated to the service's gateway key (RFC 9458 §4.3, HPKE RFC 9180) and POSTed to
``{relay}/ohttp``; the answer is opened (§4.4) and returned as the inner response. The relay learns the device's
address but not the request; the service learns the request but only the relay's address.

Guarantees: the relay gets the encapsulated bytes and ``Content-Type: message/ohttp-req`` only (the inner
client sends no ``User-Agent``, ``Accept`` or cookies); a response that does not open under the request's own
context (tampered, or not its answer) is an :class:`httpx.RemoteProtocolError`, never returned as an answer; a
relay or gateway that refuses the outer request (not ``200 message/ohttp-res``) is returned as that refusal (its
status and JSON error), so the SDK's errors and retries apply to it as to a direct answer.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from hybriddp.core import bhttp, ohttp
from hybriddp.core.errors import DataError, parameter_error
from hybriddp.sdk.http import ServiceRequestError, ServiceUnavailableError, check_base_url

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                        "upgrade", "proxy-authenticate", "proxy-authorization", "host", "content-length"})
"""Header fields not put in the inner message: hop-by-hop (RFC 9110 §7.6.1), Host (the message's authority
stands for it, RFC 9292 §3.4) and Content-Length (the content is length-prefixed)."""

DEFAULT_TIMEOUT_S = 60.0


def check_relay_url(relay_url: Any) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing slash; a ParameterError naming ``--relay`` otherwise."""
    return check_base_url(relay_url, "relay URL (--relay)", "the http:// or https:// URL of an OHTTP relay "
                                                             "(`hybriddp relay`), such as http://127.0.0.1:8081")


def _client(timeout: float, transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """A pooled client that sends no header of its own but Connection (no User-Agent, Accept, Accept-Encoding)."""
    client = httpx.Client(timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)), trust_env=False,
                          follow_redirects=False, transport=transport)
    for name in ("user-agent", "accept", "accept-encoding"):
        del client.headers[name]
    return client


def fetch_key_configs(relay_url: str, *, client: httpx.Client | None = None,
                      timeout: float = DEFAULT_TIMEOUT_S) -> list[ohttp.KeyConfig]:
    """The gateway's key configurations as the relay serves them (``GET {relay}/ohttp-keys``, RFC 9458 §3.2).

    :class:`~hybriddp.sdk.http.ServiceUnavailableError` when the relay cannot be reached or answers 5xx;
    :class:`~hybriddp.sdk.http.ServiceRequestError` for another status or a body that is not key configurations.
    A device compares the config it uses with its head list's ``ohttp_key`` (spec-v2 §4) before trusting it."""
    base = check_relay_url(relay_url)
    http = client or _client(timeout)
    what = f"OHTTP key configurations from {base}/ohttp-keys"
    try:
        resp = http.get(f"{base}/ohttp-keys")
    except httpx.HTTPError as exc:
        raise ServiceUnavailableError(f"{what}: {type(exc).__name__} ({exc or 'no detail'}); is `hybriddp relay` "
                                      "running there?") from None
    finally:
        if client is None:
            http.close()
    if resp.status_code != 200:
        cls = ServiceUnavailableError if resp.status_code >= 500 else ServiceRequestError
        raise cls(f"{what}: HTTP {resp.status_code} ({resp.text[:200].strip()})", status=resp.status_code)
    media = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != ohttp.KEYS_MEDIA_TYPE:
        raise ServiceRequestError(f"{what}: the answer is {media or 'untyped'!r}, not {ohttp.KEYS_MEDIA_TYPE}; is "
                                  "this an OHTTP relay?", status=200)
    try:
        return ohttp.parse_key_configs(resp.content)
    except DataError as exc:
        raise ServiceRequestError(f"{what}: {exc}", status=200) from None


class OhttpTransport(httpx.BaseTransport):
    """An httpx transport that sends each request through an OHTTP relay (module docstring).

    Parameters
    ----------
    relay_url : the relay, ``http(s)://host[:port]``; requests go to ``{relay_url}/ohttp``.
    key_config : the gateway's key configuration (a :class:`~hybriddp.core.ohttp.KeyConfig` or its RFC 9458 §3.1
        bytes, e.g. the head list's ``ohttp_key`` decoded); None: fetched from ``{relay_url}/ohttp-keys`` on first
        use (the first config listed), and :attr:`key_config` tells the caller which, to compare with the head list.
    timeout : seconds for the relay when the outer request carries no timeout of its own.
    client : the :class:`httpx.Client` to reach the relay with (default: a pooled one of this transport's own that
        sends no header but Content-Type, closed by :meth:`close`).
    relay_transport : the httpx transport that client of its own uses (default: the network; tests script it).
    """

    def __init__(self, relay_url: str, key_config: ohttp.KeyConfig | bytes | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT_S, client: httpx.Client | None = None,
                 relay_transport: httpx.BaseTransport | None = None) -> None:
        self.relay_url = check_relay_url(relay_url)
        if key_config is not None and not isinstance(key_config, ohttp.KeyConfig):
            if not isinstance(key_config, (bytes, bytearray, memoryview)):
                raise parameter_error("key_config", type(key_config).__name__, "an ohttp.KeyConfig, its bytes "
                                      "(RFC 9458 §3.1), or None to fetch it from the relay")
            key_config = ohttp.KeyConfig.parse(bytes(key_config))
        if key_config is not None and not key_config.supported:
            raise parameter_error("key_config", f"key id {key_config.key_id}", "a config with HKDF-SHA256 and "
                                  "AES-128-GCM (spec-v2 §4)")
        self._config: ohttp.KeyConfig | None = key_config
        self._own = client is None
        self._http = client or _client(timeout, relay_transport)
        self._lock = threading.Lock()

    @property
    def config(self) -> ohttp.KeyConfig:
        """The gateway key configuration requests are encapsulated to (fetched from the relay if none was given)."""
        if self._config is None:
            with self._lock:
                if self._config is None:
                    usable = [c for c in fetch_key_configs(self.relay_url, client=self._http) if c.supported]
                    if not usable:
                        raise ServiceRequestError(f"{self.relay_url}/ohttp-keys lists no key config with HKDF-SHA256 "
                                                  "and AES-128-GCM (spec-v2 §4)")
                    self._config = usable[0]
        return self._config

    @property
    def key_config(self) -> bytes:
        """The RFC 9458 §3.1 bytes of :attr:`config`: what the device compares with its head list's ``ohttp_key``
        (base64url-decoded) before it sends anything through this relay (spec-v2 §4)."""
        return self.config.to_bytes()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Encapsulate ``request``, POST it to the relay, open the answer: the inner response (module docstring)."""
        content = request.read()
        headers = [(k.lower(), v) for k, v in request.headers.multi_items() if k.lower() not in HOP_BY_HOP]
        path = request.url.raw_path.decode("ascii") or "/"  # path and query, as sent to a server directly
        inner = bhttp.encode_request(request.method, request.url.scheme, request.url.netloc.decode("ascii"), path,
                                     headers, content)
        enc_request, context = ohttp.encapsulate_request(self.config, inner)
        outer = self._http.post(f"{self.relay_url}/ohttp", content=enc_request,
                                headers={"content-type": ohttp.REQUEST_MEDIA_TYPE}, timeout=_timeout(request))
        media = outer.headers.get("content-type", "").split(";")[0].strip().lower()
        if outer.status_code != 200 or media != ohttp.RESPONSE_MEDIA_TYPE:  # the relay's or gateway's refusal
            return httpx.Response(outer.status_code, headers=_kept(outer.headers.multi_items()), content=outer.content,
                                  request=request)
        try:
            answer = bhttp.decode_response(context.open_response(outer.content))
        except DataError as exc:
            raise httpx.RemoteProtocolError(f"the OHTTP answer from {self.relay_url} cannot be used: {exc}",
                                            request=request) from None
        return httpx.Response(answer.status, headers=_kept(answer.headers), content=answer.content, request=request)

    def close(self) -> None:
        """Close the client to the relay when this transport made it."""
        if self._own:
            self._http.close()


def _kept(headers: Any) -> list[tuple[str, str]]:
    """Response header fields without the hop-by-hop ones and Content-Length (the content is already whole)."""
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]


def _timeout(request: httpx.Request) -> httpx.Timeout | None:
    """The outer request's timeouts (httpx's ``timeout`` extension) for the request to the relay, if it has some."""
    ext = request.extensions.get("timeout")
    if not isinstance(ext, dict):
        return None
    try:
        return httpx.Timeout(**{k: ext.get(k) for k in ("connect", "read", "write", "pool")})
    except (TypeError, ValueError):
        return None

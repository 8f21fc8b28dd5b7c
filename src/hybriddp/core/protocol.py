"""The device protocol, defined once for every party (ALGORITHM.md §5, §6; docs/FORMATS.md): the head-list
document (format, version, content hash, validation), device message ids, and LocalAlg's budget split and
thresholds (Fig. 6 lines 1–5). Pure Python, no NumPy: a device runs it as it is."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import secrets
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hybriddp.core.errors import HybridDPError

HEADLIST_FORMAT = "hybriddp-headlist"
HEADLIST_VERSION = 1
LN_FLOAT_MAX = math.log(sys.float_info.max)
"""≈ 709.78, the largest x whose e^x is a finite float: LocalAlg's ε'_Q and ε'_U must not exceed it."""
M_C_MAX = 2**63 - 1
"""The largest m_C a head list may carry (a 64-bit integer, as the server's arrays need)."""


class DeviceError(HybridDPError, ValueError):
    """The head list or the records given to the device randomizer are unusable."""


# ----- Fig. 6 lines 1-5 ---------------------------------------------------------------------
def budget_split(epsilon: float, delta: float, f_c: float, m_c: int) -> tuple[float, float, float, float]:
    """(ε'_Q, δ'_Q, ε'_U, δ'_U) of Fig. 6 lines 1-3 (ALGORITHM.md §5)."""
    eps1, delta1 = epsilon / m_c, delta / m_c
    eps_q, delta_q = f_c * eps1, f_c * delta1
    return eps_q, delta_q, eps1 - eps_q, delta1 - delta_q


def keep_probability(eps: float, delta: float, n: int) -> float:
    """t = (e^ε + (δ/2)(n−1)) / (e^ε + n − 1): the chance to keep the true one of n values.

    n = 1 gives 1 (nothing to randomize).
    """
    if n <= 1:
        return 1.0
    e = math.exp(eps)
    return (e + (delta / 2.0) * (n - 1)) / (e + n - 1)


def thresholds(
    k: int, kq: Sequence[int], epsilon: float, delta: float, f_c: float, m_c: int
) -> tuple[float, list[float]]:
    """(t, [t_q for each query position]) of Fig. 6 lines 4-5 (ALGORITHM.md §5)."""
    eps_q, delta_q, eps_u, delta_u = budget_split(epsilon, delta, f_c, m_c)
    return keep_probability(eps_q, delta_q, k), [keep_probability(eps_u, delta_u, n) for n in kq]


# ----- message ids ------------------------------------------------------------------------------
MESSAGE_ID_BYTES = 16
ID_LENGTH = 22
"""Characters of a random id (16 bytes in URL-safe base64 without padding): device message ids and round ids."""
ID_PATTERN = rf"[A-Za-z0-9_-]{{{ID_LENGTH}}}"
"""The regular expression of such an id (its characters and length are the whole check: 22 characters of the
URL-safe alphabet always decode to 16 bytes, 132 bits with the last 4 ignored)."""
ID_REGEX = re.compile(ID_PATTERN)


def new_message_id() -> str:
    """A random message id: 16 bytes from the OS in URL-safe base64 without padding (22 chars).

    The id links nothing to the device: it only lets the server count a retried message once.
    """
    return base64.urlsafe_b64encode(secrets.token_bytes(MESSAGE_ID_BYTES))[:ID_LENGTH].decode()  # without "=="


def check_message_id(value: Any) -> str:
    """``value`` if it is 16 bytes in URL-safe base64 (22 characters, no padding), else DeviceError."""
    if not (isinstance(value, str) and ID_REGEX.fullmatch(value)):
        shown = repr(value)[:40]
        raise DeviceError(f"message id {shown} is not valid: it must be 16 random bytes in URL-safe base64 without "
                          "padding (22 characters of A-Z a-z 0-9 - _), e.g. from new_message_id()")
    return value


# ----- the head list as a device sees it ----------------------------------------------------
def content_hash(doc: dict[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``doc`` without its ``content_hash`` field.

    Lone surrogates (which no valid head list holds) are hashed as their code points, not refused.
    """
    body = {k: v for k, v in doc.items() if k != "content_hash"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canon.encode(errors="surrogatepass")).hexdigest()  # UTF-8


def max_epsilon(f_c: float, m_c: int) -> float:
    """The largest ε for which LocalAlg's e^{ε'_Q} and e^{ε'_U} are finite floats.

    ε'_Q = f_C·ε/m_C and ε'_U = (1 − f_C)·ε/m_C (Fig. 6 lines 1-3) must both be ≤ ln(largest float),
    so ε ≤ m_C·ln(sys.float_info.max)/max(f_C, 1 − f_C), stepped down past any rounding.
    """
    def works(eps: float) -> bool:
        eps_q, _, eps_u, _ = budget_split(eps, 0.0, f_c, m_c)
        try:
            math.exp(eps_q), math.exp(eps_u)
        except OverflowError:
            return False
        return True

    eps = m_c * LN_FLOAT_MAX / max(f_c, 1.0 - f_c)
    while eps > 0 and not works(eps):
        eps = math.nextafter(eps, 0.0)
    return eps


_REBUILD = "Use the head list exactly as `hybriddp headlist` wrote it, or rebuild it."


def _show(value: Any, limit: int = 60) -> str:
    """``repr(value)``, shortened for a one-line message."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__} nested too deeply>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind(value: Any) -> str:
    """What a parsed JSON value is, in words."""
    if value is None:
        return "null"
    for types, word in ((bool, "a boolean"), (str, "a string"), ((int, float), "a number"), (list, "a list"),
                        (dict, "an object")):
        if isinstance(value, types):
            return word
    return f"a {type(value).__name__}"


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond the float range
        return math.inf if value > 0 else -math.inf


def _check_number(where: str, value: Any, allowed: str, ok: Callable[[float], bool], fix: str,
                  integer: bool = False) -> None:
    """Raise :class:`DeviceError` unless ``value`` is a JSON number (an integer if ``integer``) with ``ok``."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        if integer and isinstance(value, float):
            what = "not an integer"
        elif isinstance(value, str):
            what = "a string, not a number (numbers are written without quotes)"
        else:
            what = f"{_kind(value)}, not a number"
        raise DeviceError(f"{where} = {_show(value)} is {what}; it must be {allowed}. {fix}")
    # an integer is compared exactly (2**63 − 1 as a float is 2**63); a number as a float (NaN fails every comparison)
    if not ok(value if integer else _as_float(value)):
        raise DeviceError(f"{where} = {_show(value)} is not allowed: it must be {allowed}. {fix}")


def _check_text(where: str, value: Any, fix: str) -> str:
    if not isinstance(value, str):
        raise DeviceError(f"{where} = {_show(value)} is {_kind(value)}; it must be a string. {fix}")
    try:
        value.encode()  # UTF-8
    except UnicodeEncodeError:
        raise DeviceError(f"{where} = {_show(value)} holds a lone surrogate, which is not text. {fix}") from None
    return value


def _check_queries(queries: Any, source: str) -> None:
    """The query list: ``[{"query": str, "urls": [str, ...]}, ...]``, no query or URL listed twice."""
    shape = 'a list of objects {"query": "...", "urls": ["...", ...]}'
    if not isinstance(queries, list):
        raise DeviceError(f"{source}: field 'queries' = {_show(queries)} is {_kind(queries)}; it must be {shape}. "
                          f"{_REBUILD}")
    seen: dict[str, int] = {}
    for i, item in enumerate(queries):
        where = f"{source}: queries[{i}]"
        if not isinstance(item, dict):
            raise DeviceError(f"{where} = {_show(item)} is {_kind(item)}; it must be an object "
                              f'{{"query": "...", "urls": ["...", ...]}}. {_REBUILD}')
        for key in ("query", "urls"):
            if key not in item:
                raise DeviceError(f"{where} has no field {key!r}; each entry is "
                                  f'{{"query": "...", "urls": ["...", ...]}}. {_REBUILD}')
        q = _check_text(f"{where}.query", item["query"], _REBUILD)
        if q in seen:
            raise DeviceError(f"{source}: query {_show(q)} is listed twice (queries[{seen[q]}] and queries[{i}]); "
                              f"a head list lists each query once. {_REBUILD}")
        seen[q] = i
        urls = item["urls"]
        if not isinstance(urls, list):
            raise DeviceError(f"{where}.urls = {_show(urls)} is {_kind(urls)}; it must be a list of strings "
                              f"(empty when the query has no listed URL). {_REBUILD}")
        url_seen: dict[str, int] = {}
        for j, u in enumerate(urls):
            _check_text(f"{where}.urls[{j}]", u, _REBUILD)
            if u in url_seen:
                raise DeviceError(f"{source}: URL {_show(u)} is listed twice under query {_show(q)} "
                                  f"(queries[{i}].urls[{url_seen[u]}] and [{j}]). {_REBUILD}")
            url_seen[u] = j


ROUND_COMMITMENTS = ("token_key", "ohttp_key", "report_window")
"""The fields a service-published head list adds for its round (docs/TOKENS.md "One key per round"): the round's
token key, the gateway's OHTTP key config and the report window. They are inside the content hash (every message
commits to them) but not part of the lists devices randomize over (:func:`lists_hash`)."""
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def lists_hash(doc: dict[str, Any]) -> str:
    """The content hash of what a device randomizes over: the document without its round's commitments
    (:data:`ROUND_COMMITMENTS`). Two rounds that publish the same lists have the same lists hash (and different
    content hashes); the device ledger keys its charges and memoized reports by it (ALGORITHM.md §15). A document
    without commitments (the file workflow's) has its content hash as lists hash."""
    if not any(k in doc for k in ROUND_COMMITMENTS):
        return str(doc["content_hash"])
    return content_hash({k: v for k, v in doc.items() if k not in ROUND_COMMITMENTS})


def _b64_bytes(value: Any) -> int | None:
    """The number of bytes a URL-safe base64 string (no padding) holds; None if it is not one."""
    if not isinstance(value, str) or len(value) > 8192 or not _B64URL.fullmatch(value) or len(value) % 4 == 1:
        return None
    try:
        return len(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except ValueError:
        return None


def check_round_commitments(doc: dict[str, Any], source: str) -> None:
    """The optional round commitments of a head list (or mean-round document), type-checked when present:
    ``token_key`` {key_id: 32 bytes base64url, modulus_bits: integer >= 2048, e: 65537}, ``ohttp_key`` (a
    base64url key config), ``report_window`` {opens, closes: UTC times "YYYY-MM-DDTHH:MM:SSZ", opens <= closes}."""
    fix = "Fetch the round's head list again from its server."
    if "token_key" in doc:
        tk = doc["token_key"]
        bits = tk.get("modulus_bits") if isinstance(tk, dict) else None
        if (not isinstance(tk, dict) or _b64_bytes(tk.get("key_id")) != 32 or isinstance(bits, bool)
                or not isinstance(bits, int) or bits < 2048 or tk.get("e") != 65537 or isinstance(tk.get("e"), bool)):
            raise DeviceError(f"{source}: field 'token_key' = {_show(tk)} must be {{\"key_id\": 32 bytes in base64url, "
                              f"\"modulus_bits\": an integer >= 2048, \"e\": 65537}}. {fix}")
    if "ohttp_key" in doc and not 5 <= (_b64_bytes(doc["ohttp_key"]) or 0) <= 1024:
        raise DeviceError(f"{source}: field 'ohttp_key' = {_show(doc['ohttp_key'])} must be an OHTTP key config in "
                          f"base64url (RFC 9458 §3.1). {fix}")
    if "report_window" in doc:
        win = doc["report_window"]
        times = [win.get(k) for k in ("opens", "closes")] if isinstance(win, dict) else [None, None]
        if not all(isinstance(x, str) and _TIME.fullmatch(x) for x in times) or times[0] > times[1]:
            raise DeviceError(f"{source}: field 'report_window' = {_show(win)} must be {{\"opens\": time, \"closes\": "
                              f"time}} in UTC like '2026-11-28T19:00:00Z', opens no later than closes. {fix}")


def validate_headlist(doc: Any, source: str = "head list") -> dict[str, Any]:
    """Check a head-list document; raise :class:`DeviceError` naming the field, its value and the fix.

    Checked: the format and version; every field present with the right JSON type and range
    (ε > 0, δ in (0, 1), f_C in (0, 1], m_C an integer from 1 to :data:`M_C_MAX`, ``url_level``
    a boolean if present); the query list (strings, no query or URL twice); the content hash; and
    that ε is small enough for e^{ε'} to be a float (:func:`max_epsilon`).
    """
    if not isinstance(doc, dict):
        raise DeviceError(f"{source}: expected a JSON object (a head list written by `hybriddp headlist`), found "
                          f"{_kind(doc)}")
    if doc.get("format") != HEADLIST_FORMAT:
        raise DeviceError(f"{source}: field 'format' = {_show(doc.get('format'))}, expected {HEADLIST_FORMAT!r}: "
                          "this is not a head list written by `hybriddp headlist`")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version != HEADLIST_VERSION:
        raise DeviceError(
            f"{source}: field 'version' = {_show(version)}; this reader understands version "
            f"{HEADLIST_VERSION}. Upgrade hybriddp or rebuild the head list."
        )
    for key in ("epsilon", "delta", "f_c", "m_c", "queries", "content_hash"):
        if key not in doc:
            raise DeviceError(f"{source}: missing field {key!r}. {_REBUILD}")
    _check_number(f"{source}: field 'epsilon'", doc["epsilon"], "a number > 0", lambda x: x > 0, _REBUILD)
    _check_number(f"{source}: field 'delta'", doc["delta"], "a number in (0, 1)", lambda x: 0 < x < 1, _REBUILD)
    _check_number(f"{source}: field 'f_c'", doc["f_c"], "a number in (0, 1]", lambda x: 0 < x <= 1, _REBUILD)
    _check_number(f"{source}: field 'm_c'", doc["m_c"], f"an integer from 1 to {M_C_MAX}",
                  lambda x: 1 <= x <= M_C_MAX, _REBUILD, integer=True)
    if "url_level" in doc and not isinstance(doc["url_level"], bool):
        raise DeviceError(f"{source}: field 'url_level' = {_show(doc['url_level'])} is {_kind(doc['url_level'])}; "
                          f"it must be true or false. {_REBUILD}")
    _check_queries(doc["queries"], source)
    check_round_commitments(doc, source)
    declared = doc["content_hash"]
    try:
        actual = content_hash(doc)
    except (RecursionError, TypeError, ValueError) as exc:  # nested too deeply, or not JSON data
        raise DeviceError(f"{source}: the document cannot be hashed ({exc}). {_REBUILD}") from None
    if declared != actual:
        raise DeviceError(f"{source}: field 'content_hash' = {_show(declared)} does not match the content "
                          f"({actual[:19]}…): the file was altered or damaged after it was written. Use the "
                          "original file, or rebuild the head list.")
    limit = max_epsilon(float(doc["f_c"]), int(doc["m_c"]))
    if not _as_float(doc["epsilon"]) <= limit:
        raise DeviceError(
            f"{source}: field 'epsilon' = {_show(doc['epsilon'])} is too large: LocalAlg computes e^(f_C·ε/m_C) and "
            f"e^((1−f_C)·ε/m_C), which overflow a float when the exponent passes ln(largest float) = "
            f"{LN_FLOAT_MAX:.2f}; with f_c = {doc['f_c']!r} and m_c = {doc['m_c']} epsilon must be at most "
            f"{limit!r}. Rebuild the head list with a smaller --epsilon (beyond about 50 per report LocalAlg "
            "reports the true record anyway).")
    return doc


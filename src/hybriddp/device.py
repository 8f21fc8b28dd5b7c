"""LocalAlg on one device: pure Python, no NumPy, OS randomness by default (ALGORITHM.md §5, Fig. 6).

This module is what a phone or a browser port implements. It reads the head-list JSON that
:mod:`hybriddp.headlist` writes (format ``hybriddp-headlist`` version 1), samples at most
``m_C`` of the device's records, and randomizes each one:

* ε' = ε/m_C, δ' = δ/m_C; ε'_Q = f_C·ε', δ'_Q = f_C·δ'; ε'_U = ε' − ε'_Q, δ'_U = δ' − δ'_Q
  (Fig. 6 lines 1-3);
* t = (e^{ε'_Q} + (δ'_Q/2)(k−1)) / (e^{ε'_Q} + k − 1) and
  t_q = (e^{ε'_U} + (δ'_U/2)(k_q−1)) / (e^{ε'_U} + k_q − 1) (Fig. 6 lines 4-5);
* with probability 1 − t report a uniformly random *other* query and a uniform URL of it;
  else with probability 1 − t_q keep the query and report a uniformly random *other* URL;
  else report the record itself (Fig. 6 lines 7-14).

Theorem 3: this is (ε, δ)-locally differentially private. Randomness comes from
:class:`SystemSource` (``secrets``) unless a source is passed; :class:`SeededSource` exists for
reproducible experiments only and gives no privacy.

A report is ``{"query": str | None, "url": str | None}``; ``None`` is the wildcard ``*``.
A device's message is ``{"headlist": <content hash>, "reports": [report, ...]}``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import random
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hybriddp.errors import HybridDPError
from hybriddp.io.atomic import write_text

HEADLIST_FORMAT = "hybriddp-headlist"
HEADLIST_VERSION = 1
LN_FLOAT_MAX = math.log(sys.float_info.max)
"""≈ 709.78, the largest x whose e^x is a finite float: LocalAlg's ε'_Q and ε'_U must not exceed it."""
M_C_MAX = 2**63 - 1
"""The largest m_C a head list may carry (a 64-bit integer, as the server's arrays need)."""


class DeviceError(HybridDPError, ValueError):
    """The head list or the records given to the device randomizer are unusable."""


class DeviceLedgerRefusal(DeviceError):
    """The device ledger refused a charge: this device already reported for the head list, or the charge would
    pass its lifetime budget. Nothing was charged and nothing may be reported.

    ``head_list``: the round's content hash; ``already``: True for a second report in the round, False for the
    lifetime budget; ``charge``: (ε, δ) of the refused report; ``spent`` and ``lifetime``: (Σε, Σδ) so far and
    the budget; ``path``: the ledger file; ``round_id``: the service round, when known. :meth:`explained`
    gives the one-line message a device shows, naming the way out.
    """

    def __init__(self, message: str, *, head_list: str, already: bool, charge: tuple[float, float],
                 spent: tuple[float, float], lifetime: tuple[float, float], path: str,
                 round_id: str | None = None) -> None:
        super().__init__(message)
        self.head_list, self.already, self.charge = head_list, already, charge
        self.spent, self.lifetime, self.path, self.round_id = spent, lifetime, path, round_id

    def explained(self, way_out: str, round_id: str | None = None) -> DeviceLedgerRefusal:
        """The same refusal with a one-line message naming the round, what was spent, the lifetime budget and
        ``way_out`` (how a test or a simulation skips the ledger)."""
        rid = round_id if round_id is not None else self.round_id
        where = (f"round {rid} (head list {self.head_list[:19]}…)" if rid is not None
                 else f"head list {self.head_list[:19]}…")
        (e, d), (se, sd), (le, ld) = self.charge, self.spent, self.lifetime
        budget = f"lifetime ε = {le:g}, δ = {ld:g}"
        if self.already:
            what = (f"this device already reported in {where}; a second report would spend ε = {e:g} again "
                    f"(spent so far ε = {se:.4g}, δ = {sd:.3g} of its {budget}; device ledger {self.path})")
        else:
            what = (f"{where}: reporting would spend ε = {e:g}, δ = {d:g} more and pass this device's {budget} "
                    f"(spent so far ε = {se:.4g}, δ = {sd:.3g}; device ledger {self.path})")
        return DeviceLedgerRefusal(f"{what}. No report was sent; {way_out}", head_list=self.head_list,
                                   already=self.already, charge=self.charge, spent=self.spent,
                                   lifetime=self.lifetime, path=self.path, round_id=rid)


# ----- randomness ---------------------------------------------------------------------------
class RandomSource(Protocol):
    """What LocalAlg draws: a uniform float in [0, 1) and a uniform integer in [0, n)."""

    def uniform(self) -> float: ...

    def below(self, n: int) -> int: ...


class SystemSource:
    """OS randomness (``secrets``): the default, and the only choice for production."""

    def __init__(self) -> None:
        self._sys = random.SystemRandom()

    def uniform(self) -> float:
        return self._sys.random()

    def below(self, n: int) -> int:
        return secrets.randbelow(n)


class SeededSource:
    """Mersenne Twister with a seed: reproducible experiments only, no privacy."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def uniform(self) -> float:
        return self._rng.random()

    def below(self, n: int) -> int:
        return int(self._rng.random() * n)


class UniformReplay:
    """Replays given uniforms: ``uniform()`` returns the next one, ``below(n)`` = ⌊v·n⌋.

    The batch randomizer (:mod:`hybriddp.randomizer`) uses exactly this arithmetic on NumPy
    uniforms, so feeding it the same three uniforms per report reproduces it bit for bit.
    """

    def __init__(self, values: Iterable[float]) -> None:
        self._it = iter(values)

    def uniform(self) -> float:
        return next(self._it)

    def below(self, n: int) -> int:
        return int(next(self._it) * n)


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


def new_message_id() -> str:
    """A random message id: 16 bytes from the OS in URL-safe base64 without padding (22 chars).

    The id links nothing to the device: it only lets the server count a retried message once.
    """
    return base64.urlsafe_b64encode(secrets.token_bytes(MESSAGE_ID_BYTES))[:22].decode()  # 22 characters + "=="


def check_message_id(value: Any) -> str:
    """``value`` if it is 16 bytes in URL-safe base64 (22 characters, no padding), else DeviceError."""
    # 22 characters of the URL-safe alphabet always decode to 16 bytes (132 bits, the last 4 ignored), so the
    # characters and the length are the whole check
    ok = isinstance(value, str) and len(value) == 22 and all(c.isascii() and (c.isalnum() or c in ("-", "_"))
                                                              for c in value)
    if not ok:
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


@dataclass
class DeviceHeadList:
    """A validated head list, indexed for LocalAlg.

    Query positions 0..k−2 are the listed queries and k−1 is ``*``; URL positions of query i
    are 0..k_q−2 for its listed URLs and k_q−1 for ``*``.
    """

    doc: dict[str, Any]
    query_index: dict[str, int]
    url_index: list[dict[str, int]]
    kq: list[int]
    one_minus_t: float
    one_minus_tq: list[float]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DeviceHeadList:
        """Validate and index a head-list document (already parsed from JSON)."""
        doc = validate_headlist(doc)
        queries = doc["queries"]
        query_index = {q["query"]: i for i, q in enumerate(queries)}
        url_index = [{u: j for j, u in enumerate(q["urls"])} for q in queries] + [{}]
        kq = [len(q["urls"]) + 1 for q in queries] + [1]
        t, tq = thresholds(len(kq), kq, doc["epsilon"], doc["delta"], doc["f_c"], doc["m_c"])
        return cls(doc, query_index, url_index, kq, 1.0 - t, [1.0 - x for x in tq])

    @property
    def k(self) -> int:
        return len(self.kq)

    @property
    def m_c(self) -> int:
        return int(self.doc["m_c"])

    @property
    def url_level(self) -> bool:
        """True when records are ⟨query, URL⟩ pairs (the default); False for query-level lists."""
        return bool(self.doc.get("url_level", True))

    def encode(self, query: str, url: str | None) -> tuple[int, int]:
        """Map a record onto HL: q ∉ HL → ⟨*,*⟩, u ∉ HL[q] → ⟨q,*⟩ (Fig. 6 line 6)."""
        qi = self.query_index.get(query, self.k - 1)
        ui = self.url_index[qi].get(url, self.kq[qi] - 1)  # no URL (None) is never listed: ⟨q,*⟩
        return qi, ui

    def decode(self, qi: int, ui: int) -> dict[str, str | None]:
        """A report in the wire form (``None`` = wildcard)."""
        if qi == self.k - 1:
            return {"query": None, "url": None}
        q = self.doc["queries"][qi]
        return {"query": q["query"], "url": q["urls"][ui] if ui < len(q["urls"]) else None}


def local_alg(qi: int, ui: int, hl: DeviceHeadList, src: RandomSource) -> tuple[int, int]:
    """Randomize one mapped record (query position, URL position); Fig. 6 lines 7-14.

    Draws at most three values, always in this order: v1 (query stage), then either the
    other query and its URL, or v2 (URL stage) and the other URL.
    """
    k = hl.k
    if k == 1:  # only ⟨*,*⟩ exists
        return 0, 0
    if src.uniform() < hl.one_minus_t:  # report another query, uniform over HL \ {q}
        j = src.below(k - 1)
        q2 = j if j < qi else j + 1
        return q2, src.below(hl.kq[q2])
    kq = hl.kq[qi]
    if kq > 1 and src.uniform() < hl.one_minus_tq[qi]:  # another URL, uniform over HL[q] \ {u}
        j = src.below(kq - 1)
        return qi, (j if j < ui else j + 1)
    return qi, ui


class DeviceLedger:
    """The device's own privacy ledger: at most one report per round, within a lifetime budget
    (basic composition over the rounds it reports in, ALGORITHM.md §2).

    A round is identified by the head list's content hash (a mean round's by its document's hash). The
    ledger is a small JSON file ``{"lifetime": {"epsilon": E, "delta": D}, "rounds": {hash: {"epsilon": e,
    "delta": d}}}`` rewritten atomically (temporary file + rename) *before* any report leaves the device; a
    new file is made readable by its owner only (0600). :meth:`record` re-reads the file under an exclusive
    lock on its directory (``flock``; none on Windows), so ledgers open in several processes, or several
    objects on one file, never charge one round twice nor lose each other's charges.

    ``default_lifetime``: the (ε, δ) budget of a new ledger when ``lifetime_epsilon``/``lifetime_delta`` are
    not given (without it a new ledger needs both).
    """

    def __init__(self, path: str | os.PathLike[str], *, lifetime_epsilon: float | None = None,
                 lifetime_delta: float | None = None,
                 default_lifetime: tuple[float, float] | None = None) -> None:
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise DeviceError(f"device ledger {self.path} is a directory; give a file name")
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            if default_lifetime is not None:
                lifetime_epsilon = default_lifetime[0] if lifetime_epsilon is None else lifetime_epsilon
                lifetime_delta = default_lifetime[1] if lifetime_delta is None else lifetime_delta
            self.state = _new_ledger_state(self.path, lifetime_epsilon, lifetime_delta)
            return
        except OSError as exc:
            raise DeviceError(f"cannot read device ledger {self.path}: {exc.strerror or exc}") from None
        self.state = _parse_ledger(data, self.path)
        for name, given in (("epsilon", lifetime_epsilon), ("delta", lifetime_delta)):
            if given is not None and _as_float(given) != self.state["lifetime"][name]:
                raise DeviceError(f"device ledger {self.path} has lifetime {name} {self.state['lifetime'][name]!r}, "
                                  f"not {given!r}: a device's lifetime budget is fixed when its ledger is created; "
                                  f"leave out --lifetime-{name}")

    def spent(self) -> tuple[float, float]:
        """(Σε, Σδ) over the rounds reported so far (basic composition)."""
        rounds = self.state["rounds"].values()
        return math.fsum(r["epsilon"] for r in rounds), math.fsum(r["delta"] for r in rounds)

    def check(self, round_id: str, epsilon: float, delta: float) -> None:
        """Raise :class:`DeviceLedgerRefusal` (already reported / over budget) or :class:`DeviceError` (a charge
        that is not a finite number >= 0) if :meth:`record` would refuse this round; change nothing."""
        life = self.state["lifetime"]
        facts = {"head_list": round_id, "spent": self.spent(), "lifetime": (life["epsilon"], life["delta"]),
                 "path": self.path}
        if round_id in self.state["rounds"]:
            prior = self.state["rounds"][round_id]
            raise DeviceLedgerRefusal(f"this device already reported for head list {round_id[:19]}…; "
                                      "a device reports at most once per round", already=True,
                                      charge=(prior["epsilon"], prior["delta"]), **facts)
        for name, value in (("epsilon", epsilon), ("delta", delta)):
            _check_number(f"the round's {name}", value, "a finite number >= 0", lambda x: 0 <= x < math.inf,
                          "The head list is damaged or not from a hybriddp server; not reporting.")
        e, d = facts["spent"]
        if e + epsilon > life["epsilon"] * (1 + 1e-12) or d + delta > life["delta"] * (1 + 1e-12):
            raise DeviceLedgerRefusal(f"reporting would exceed this device's lifetime budget (epsilon "
                                      f"{life['epsilon']}, delta {life['delta']}; spent {e:.4g}, {d:.3g}); not "
                                      "reporting", already=False, charge=(float(epsilon), float(delta)), **facts)

    def record(self, round_id: str, epsilon: float, delta: float) -> None:
        """Charge one round, or raise :class:`DeviceError` (already reported / over budget / not saved).

        Under the ledger's lock the file is read again first, so a charge made meanwhile by another process
        (or another object on the same file) counts.
        """
        with _ledger_lock(self.path):
            self._reload()
            self.check(round_id, epsilon, delta)
            self.state["rounds"][round_id] = {"epsilon": float(epsilon), "delta": float(delta)}
            try:
                self._save()
            except OSError as exc:
                del self.state["rounds"][round_id]
                raise DeviceError(f"cannot write device ledger {self.path} ({exc.strerror or exc}); nothing was "
                                  "charged, so nothing may be reported") from None

    def _reload(self) -> None:
        """Replace the state with the file's, if the file exists (a new ledger keeps its state)."""
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise DeviceError(f"cannot read device ledger {self.path}: {exc.strerror or exc}") from None
        self.state = _parse_ledger(data, self.path)

    def _save(self) -> None:
        """Replace the file atomically (:mod:`hybriddp.io.atomic`): it is never half-written; a new file is
        made 0600 (what rounds a device reported in is its owner's business)."""
        new = not os.path.exists(self.path)
        # pragma (mutation testing, docs/TESTING.md): every number in the state was checked finite on its way in
        # (_new_ledger_state, _parse_ledger, check), so allow_nan=False is a guard no input reaches
        write_text(self.path, json.dumps(self.state, allow_nan=False))  # pragma: no mutate
        if new:
            with contextlib.suppress(OSError):  # a file system without modes: the charge stands all the same
                os.chmod(self.path, 0o600)


@contextlib.contextmanager
def _ledger_lock(path: str) -> Iterator[None]:
    """An exclusive advisory lock (``flock``) on the directory of the ledger file ``path``, held for one charge.

    The directory, not the file, is locked because the file is replaced by a rename at every charge. Where
    ``flock`` does not exist (Windows) or the file system refuses it, charges are not serialized.
    """
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:  # no such directory: the save names the problem
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# ----- the default device ledger ------------------------------------------------------------------
DEVICE_LIFETIME_EPSILON = 16.0
"""Lifetime ε of a new default device ledger (the browser page's budget too)."""
DEVICE_LIFETIME_DELTA = 1e-4
"""Lifetime δ of a new default device ledger."""
DEVICE_LEDGER_NAME = "device-ledger.json"
"""The device ledger's file name in :func:`data_home`."""


def data_home() -> Path:
    """hybriddp's per-user data directory: ``$HYBRIDDP_DATA_HOME`` if set; else ``$XDG_DATA_HOME/hybriddp``
    (an absolute ``XDG_DATA_HOME`` only, as the XDG specification says); else the platform's place:
    ``%LOCALAPPDATA%\\hybriddp`` on Windows, ``~/Library/Application Support/hybriddp`` on macOS,
    ``~/.local/share/hybriddp`` elsewhere. Nothing is created here."""
    env = os.environ.get("HYBRIDDP_DATA_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "hybriddp"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "hybriddp"
    try:
        home = Path.home()
    except RuntimeError:  # no HOME and no password entry
        raise DeviceError("cannot find this user's home directory for hybriddp's data (the device ledger); set "
                          "HYBRIDDP_DATA_HOME to a private directory") from None
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "hybriddp"
    return home / ".local" / "share" / "hybriddp"


def default_device_ledger_path() -> Path:
    """Where a device keeps its ledger unless told otherwise: ``device-ledger.json`` in :func:`data_home`.

    ``hybriddp participate`` and :class:`hybriddp.client.DeviceClient` both use it by default.
    """
    return data_home() / DEVICE_LEDGER_NAME


def open_device_ledger(path: str | os.PathLike[str] | None = None, *, lifetime_epsilon: float | None = None,
                       lifetime_delta: float | None = None) -> DeviceLedger:
    """The device ledger at ``path``, by default :func:`default_device_ledger_path` (its directory created
    with mode 0700 if missing). A new ledger gets the lifetime budget given, else
    (:data:`DEVICE_LIFETIME_EPSILON`, :data:`DEVICE_LIFETIME_DELTA`); an existing one keeps its own."""
    if path is None:
        path = default_device_ledger_path()
        try:
            os.makedirs(path.parent, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise DeviceError(f"cannot create hybriddp's data directory {path.parent} for the device ledger "
                              f"({exc.strerror or exc}); set HYBRIDDP_DATA_HOME to a writable private directory, "
                              "or give the ledger's path (--device-ledger)") from None
    return DeviceLedger(path, lifetime_epsilon=lifetime_epsilon, lifetime_delta=lifetime_delta,
                        default_lifetime=(DEVICE_LIFETIME_EPSILON, DEVICE_LIFETIME_DELTA))


_LEDGER_FIX = ("Restore it from a backup; do not delete it, since a new ledger would forget the budget this "
               "device has already spent.")


def _new_ledger_state(path: str, epsilon: float | None, delta: float | None) -> dict[str, Any]:
    """The state of a new device ledger with lifetime budget (ε, δ), checked."""
    if epsilon is None or delta is None:
        raise DeviceError(f"device ledger {path} does not exist; to create it give the device's lifetime budget "
                          "(--lifetime-epsilon and --lifetime-delta)")
    _check_number("lifetime epsilon (--lifetime-epsilon)", epsilon, "a finite number > 0",
                  lambda x: 0 < x < math.inf, "")
    _check_number("lifetime delta (--lifetime-delta)", delta, "a number in (0, 1)", lambda x: 0 < x < 1, "")
    return {"lifetime": {"epsilon": float(epsilon), "delta": float(delta)}, "rounds": {}}


def _parse_ledger(data: bytes, path: str) -> dict[str, Any]:
    """Parse and check a device ledger file's bytes; raise :class:`DeviceError` saying what is wrong."""
    where = f"device ledger {path}"
    if not data.strip():
        raise DeviceError(f"{where} is empty. hybriddp writes it atomically, so it was never left empty by a "
                          f"report: something else truncated it. {_LEDGER_FIX}")
    try:
        state = json.loads(data.decode())  # UTF-8
    except UnicodeDecodeError as exc:
        raise DeviceError(f"{where} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}), so it is "
                          f"damaged or not a device ledger. {_LEDGER_FIX}") from None
    except (ValueError, RecursionError) as exc:
        raise DeviceError(f"{where} is not valid JSON ({exc}), so it is damaged or not a device ledger. "
                          f"{_LEDGER_FIX}") from None
    shape = '{"lifetime": {"epsilon": E, "delta": D}, "rounds": {...}}'
    if not isinstance(state, dict) or not isinstance(state.get("lifetime"), dict) \
            or not isinstance(state.get("rounds"), dict):
        found = (f"{_kind(state)} {_show(state, 40)}" if not isinstance(state, dict) else
                 f"an object with {', '.join(_show(k, 20) for k in list(state)[:5]) or 'no fields'}")
        raise DeviceError(f"{where}: expected a JSON object {shape}, found {found}; it is damaged or not a "
                          f"device ledger. {_LEDGER_FIX}")
    life = state["lifetime"]
    for name, allowed, ok in (("epsilon", "a finite number > 0", lambda x: 0 < x < math.inf),
                              ("delta", "a number in (0, 1)", lambda x: 0 < x < 1)):
        if name not in life:
            raise DeviceError(f"{where}: field 'lifetime' has no {name!r}. {_LEDGER_FIX}")
        _check_number(f"{where}: field lifetime.{name}", life[name], allowed, ok, _LEDGER_FIX)
    for key, charge in state["rounds"].items():
        if not isinstance(charge, dict) or "epsilon" not in charge or "delta" not in charge:
            raise DeviceError(f"{where}: round {_show(key, 30)} = {_show(charge, 40)}; it must be an object "
                              f'{{"epsilon": e, "delta": d}}. {_LEDGER_FIX}')
        _check_number(f"{where}: rounds[{_show(key, 30)}].epsilon", charge["epsilon"], "a finite number >= 0",
                      lambda x: 0 <= x < math.inf, _LEDGER_FIX)
        _check_number(f"{where}: rounds[{_show(key, 30)}].delta", charge["delta"], "a number in [0, 1]",
                      lambda x: 0 <= x <= 1, _LEDGER_FIX)
    return state


def check_records(hl: DeviceHeadList, records: Sequence[Any]) -> None:
    """Refuse records LocalAlg cannot use: not ``(query, url)`` string pairs, or, for a URL-level
    head list, a device none of whose records has a URL."""
    for i, rec in enumerate(records):
        if not (isinstance(rec, (tuple, list)) and len(rec) == 2 and isinstance(rec[0], str)
                and (rec[1] is None or isinstance(rec[1], str))):
            raise DeviceError(f"record {i} = {_show(rec)} is not a (query, url) pair of strings; give each record "
                              "as (query, clicked URL), with url None when the record has none")
    if records and hl.url_level and all(url is None for _, url in records):
        raise DeviceError(
            f"this device's {len(records)} record(s) have no URL (they are (query, None)), but the head list "
            f"{hl.doc['content_hash'][:19]}… is URL-level (url_level true): every record would be reported as "
            "⟨q,*⟩, a click on an unlisted URL, which biases the estimate of every listed URL. Give the device its "
            "(query, clicked URL) records (for a table, name the URL column with --url-col), or use a head list "
            "built from a log without URLs (url_level false).")


def randomize_records(
    headlist: dict[str, Any] | DeviceHeadList,
    records: Sequence[tuple[str, str | None]],
    *,
    source: RandomSource | None = None,
    ledger: DeviceLedger | None = None,
    message_id: str | None = None,
) -> dict[str, Any]:
    """One device's message: sample ≤ m_C records without replacement, randomize each.

    Parameters
    ----------
    headlist : the parsed head-list JSON (or a :class:`DeviceHeadList`).
    records : the device's own (query, url) records; url ``None`` when there is none.
    source : randomness; default :class:`SystemSource` (OS entropy).
    ledger : the device's :class:`DeviceLedger`; charged (ε, δ) for this round before reporting.
    message_id : the message's id; default a fresh random one (:func:`new_message_id`). The
        server counts a message id once, so a device may resend the same message safely.

    Returns
    -------
    ``{"id": message id, "headlist": content_hash, "reports": [{"query": ..., "url": ...}, ...]}``
    """
    hl = headlist if isinstance(headlist, DeviceHeadList) else DeviceHeadList.from_json(headlist)
    mid = check_message_id(message_id) if message_id is not None else new_message_id()
    src = source if source is not None else SystemSource()
    records = list(records)
    check_records(hl, records)  # before the ledger is charged
    if ledger is not None:
        ledger.record(hl.doc["content_hash"], float(hl.doc["epsilon"]), float(hl.doc["delta"]))
    m = min(hl.m_c, len(records))
    chosen: list[int] = []
    pool = list(range(len(records)))
    for _ in range(m):  # uniform sample without replacement
        chosen.append(pool.pop(src.below(len(pool))))
    reports = [hl.decode(*local_alg(*hl.encode(*records[i]), hl, src)) for i in chosen]
    return {"id": mid, "headlist": hl.doc["content_hash"], "reports": reports}

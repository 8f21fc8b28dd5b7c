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
import hashlib
import json
import math
import os
import random
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

HEADLIST_FORMAT = "hybriddp-headlist"
HEADLIST_VERSION = 1


class DeviceError(ValueError):
    """The head list or the records given to the device randomizer are unusable."""


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
    return base64.urlsafe_b64encode(secrets.token_bytes(MESSAGE_ID_BYTES)).rstrip(b"=").decode("ascii")


def check_message_id(value: Any) -> str:
    """``value`` if it is 16 bytes in URL-safe base64 (22 characters, no padding), else DeviceError."""
    ok = isinstance(value, str) and len(value) == 22 and all(c.isascii() and (c.isalnum() or c in "-_")
                                                              for c in value)
    if ok:
        try:
            ok = len(base64.urlsafe_b64decode(value + "==")) == MESSAGE_ID_BYTES
        except ValueError:
            ok = False
    if not ok:
        shown = repr(value)[:40]
        raise DeviceError(f"message id {shown} is not valid: it must be 16 random bytes in URL-safe base64 without "
                          "padding (22 characters of A-Z a-z 0-9 - _), e.g. from new_message_id()")
    return value


# ----- the head list as a device sees it ----------------------------------------------------
def content_hash(doc: dict[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``doc`` without its ``content_hash`` field."""
    body = {k: v for k, v in doc.items() if k != "content_hash"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canon.encode("utf-8")).hexdigest()


def validate_headlist(doc: Any, source: str = "head list") -> dict[str, Any]:
    """Check a head-list document; raise :class:`DeviceError` saying what is wrong."""
    if not isinstance(doc, dict):
        raise DeviceError(f"{source}: expected a JSON object, found {type(doc).__name__}")
    if doc.get("format") != HEADLIST_FORMAT:
        raise DeviceError(f"{source}: field 'format' = {doc.get('format')!r}, expected {HEADLIST_FORMAT!r}")
    if doc.get("version") != HEADLIST_VERSION:
        raise DeviceError(
            f"{source}: field 'version' = {doc.get('version')!r}; this reader understands version "
            f"{HEADLIST_VERSION}. Upgrade hybriddp or rebuild the head list."
        )
    for key in ("epsilon", "delta", "f_c", "m_c", "queries", "content_hash"):
        if key not in doc:
            raise DeviceError(f"{source}: missing field {key!r}")
    if content_hash(doc) != doc["content_hash"]:
        raise DeviceError(f"{source}: content_hash does not match the content; the file was altered or damaged")
    queries = doc["queries"]
    if not isinstance(queries, list) or not all(
        isinstance(q, dict) and isinstance(q.get("query"), str) and isinstance(q.get("urls"), list)
        and all(isinstance(u, str) for u in q["urls"]) for q in queries
    ):
        raise DeviceError(f"{source}: 'queries' must be a list of {{'query': str, 'urls': [str, ...]}}")
    eps, delta, f_c, m_c = doc["epsilon"], doc["delta"], doc["f_c"], doc["m_c"]
    if not (isinstance(eps, (int, float)) and eps > 0 and 0 < delta < 1 and 0 < f_c <= 1
            and isinstance(m_c, int) and m_c >= 1):
        raise DeviceError(f"{source}: privacy fields out of range (epsilon={eps}, delta={delta}, "
                          f"f_c={f_c}, m_c={m_c})")
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

    def encode(self, query: str, url: str | None) -> tuple[int, int]:
        """Map a record onto HL: q ∉ HL → ⟨*,*⟩, u ∉ HL[q] → ⟨q,*⟩ (Fig. 6 line 6)."""
        qi = self.query_index.get(query, self.k - 1)
        ui = self.url_index[qi].get(url, self.kq[qi] - 1) if url is not None else self.kq[qi] - 1
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
    """The device's own privacy ledger: at most one report per round, within a lifetime budget.

    A round is identified by the head list's content hash. The ledger is a small JSON file
    ``{"lifetime": {"epsilon": E, "delta": D}, "rounds": {hash: {"epsilon": e, "delta": d}}}``
    rewritten atomically (temporary file + rename) *before* any report leaves the device.
    """

    def __init__(self, path: str, *, lifetime_epsilon: float | None = None,
                 lifetime_delta: float | None = None) -> None:
        self.path = path
        try:
            with open(path, encoding="utf-8") as fh:
                self.state = json.load(fh)
        except FileNotFoundError:
            if lifetime_epsilon is None or lifetime_delta is None:
                raise DeviceError(f"device ledger {path} does not exist; give its lifetime epsilon and delta "
                                  "to create it") from None
            if not (lifetime_epsilon > 0 and 0 < lifetime_delta < 1):
                raise DeviceError(
                    f"lifetime budget out of range: epsilon={lifetime_epsilon}, delta={lifetime_delta}") from None
            self.state = {"lifetime": {"epsilon": float(lifetime_epsilon), "delta": float(lifetime_delta)},
                          "rounds": {}}
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DeviceError(f"device ledger {path} is damaged ({exc})") from None

    def spent(self) -> tuple[float, float]:
        """(Σε, Σδ) over the rounds reported so far (basic composition)."""
        rounds = self.state["rounds"].values()
        return sum(r["epsilon"] for r in rounds), sum(r["delta"] for r in rounds)

    def check(self, round_id: str, epsilon: float, delta: float) -> None:
        """Raise :class:`DeviceError` if :meth:`record` would refuse this round; change nothing."""
        saved = self.state
        self.state = json.loads(json.dumps(saved))
        try:
            self._charge(round_id, epsilon, delta)
        finally:
            self.state = saved

    def record(self, round_id: str, epsilon: float, delta: float) -> None:
        """Charge one round, or raise :class:`DeviceError` (already reported / over budget)."""
        self._charge(round_id, epsilon, delta)
        self._save()

    def _charge(self, round_id: str, epsilon: float, delta: float) -> None:
        if round_id in self.state["rounds"]:
            raise DeviceError(f"this device already reported for head list {round_id[:19]}…; "
                              "a device reports at most once per round")
        e, d = self.spent()
        life = self.state["lifetime"]
        if e + epsilon > life["epsilon"] * (1 + 1e-12) or d + delta > life["delta"] * (1 + 1e-12):
            raise DeviceError(f"reporting would exceed this device's lifetime budget (epsilon {life['epsilon']}, "
                              f"delta {life['delta']}; spent {e:.4g}, {d:.3g}); not reporting")
        self.state["rounds"][round_id] = {"epsilon": float(epsilon), "delta": float(delta)}

    def _save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.state, fh)
        os.replace(tmp, self.path)


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
    if ledger is not None:
        ledger.record(hl.doc["content_hash"], float(hl.doc["epsilon"]), float(hl.doc["delta"]))
    records = list(records)
    m = min(hl.m_c, len(records))
    chosen: list[int] = []
    pool = list(range(len(records)))
    for _ in range(m):  # uniform sample without replacement
        chosen.append(pool.pop(src.below(len(pool))))
    reports = [hl.decode(*local_alg(*hl.encode(*records[i]), hl, src)) for i in chosen]
    return {"id": mid, "headlist": hl.doc["content_hash"], "reports": reports}

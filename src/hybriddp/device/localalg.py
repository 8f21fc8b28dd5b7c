"""LocalAlg on one device: pure Python, no NumPy, OS randomness by default (ALGORITHM.md §5, Fig. 6).

This module is what a phone or a browser port implements. It reads the head-list JSON that
:mod:`hybriddp.core.headlist` writes (format ``hybriddp-headlist`` version 1), samples at most
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

import random
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hybriddp.core.protocol import (  # the protocol LocalAlg runs on (re-exported: the device API)
    DeviceError,
    _show,
    check_message_id,
    lists_hash,
    new_message_id,
    thresholds,
    validate_headlist,
)
from hybriddp.device.ledger import DeviceLedger, records_key


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

    The batch randomizer (:mod:`hybriddp.device.batch`) uses exactly this arithmetic on NumPy
    uniforms, so feeding it the same three uniforms per report reproduces it bit for bit.
    """

    def __init__(self, values: Iterable[float]) -> None:
        self._it = iter(values)

    def uniform(self) -> float:
        return next(self._it)

    def below(self, n: int) -> int:
        return int(next(self._it) * n)


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
    def shape(self) -> dict[str, Any]:
        """What the device ledger keeps of this list for PLD accounting (ALGORITHM.md §15): URLs per query with
        the wildcards (``kq``), f_C and m_C."""
        return {"kq": list(self.kq), "f_c": float(self.doc["f_c"]), "m_c": self.m_c}

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
    round_id: str | None = None,
) -> dict[str, Any]:
    """One device's message: sample ≤ m_C records without replacement, randomize each.

    With a ``ledger`` and the service's ``round_id`` (memoization), a device that already reported for this very
    head list (the same lists: :func:`~hybriddp.core.protocol.lists_hash`, whatever keys its round commits to) in
    another round, with the same records, sends the same reports again under a
    fresh message id and is not charged again: post-processing of its earlier randomized reports (ALGORITHM.md
    §15). In the same round, or with other records, it is refused: one report per head list. Without
    ``round_id`` there is no memoization.

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
    content = hl.doc["content_hash"]
    lists = lists_hash(hl.doc)  # the ledger's key: the same lists in another round are the same head list (§15)
    key = records_key(records) if ledger is not None and round_id is not None else None
    if key is not None and (again := ledger.memoized(lists, round_id)) is not None:  # type: ignore[union-attr,arg-type]
        return {"id": mid, "headlist": content, "reports": again}  # whatever the records now (ALGORITHM.md §15)
    shape = hl.shape  # for the ledger's PLD accounting
    if ledger is not None:  # refused before any randomness is drawn; charged below, before the message is returned
        ledger.check(lists, float(hl.doc["epsilon"]), float(hl.doc["delta"]), shape)
    m = min(hl.m_c, len(records))
    chosen: list[int] = []
    pool = list(range(len(records)))
    for _ in range(m):  # uniform sample without replacement
        chosen.append(pool.pop(src.below(len(pool))))
    reports = [hl.decode(*local_alg(*hl.encode(*records[i]), hl, src)) for i in chosen]
    if ledger is not None:  # the charge and the memo, in one write
        ledger.record(lists, float(hl.doc["epsilon"]), float(hl.doc["delta"]),
                      None if key is None or round_id is None else (key, reports, round_id), shape)
    return {"id": mid, "headlist": content, "reports": reports}

"""Round logic of the collection service, on top of the library's three parties.

* **Parameters**: :mod:`hybriddp.service.roundparams`.
* **Head list** (:func:`publish_headlist`): the ledger is charged **before** the curator's
  mechanism runs, in the transaction that starts the build (a round over a user's lifetime budget
  is refused, with nothing run); the opt-in records become a :class:`~hybriddp.core.records.RecordLog`
  (one user per opt-in token, in enrolment order; records in upload order),
  :func:`hybriddp.curator.party.curate` builds the head list and the opt-in estimates (ALGORITHM.md §3,
  §4), and one transaction stores the two documents (or records an empty head list, which ends
  the round), deletes the raw records and moves the round on. A mean round does the same with the
  curator's discrete-noise mean of the opt-in values.
* **Reports** (:class:`BlenderReports`, :class:`MeanReports`): each device message is checked
  (id, head-list hash or round, m_C, entries) before anything is stored.
* **Close** and the results: :mod:`hybriddp.service.closing`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hybriddp.core import tokens
from hybriddp.core.errors import DataError, EmptyHeadListError, parameter_error
from hybriddp.core.noise import noise_factory
from hybriddp.core.protocol import DeviceError, check_message_id, content_hash
from hybriddp.core.records import NO_URL, ArrayVocabulary, RecordLog
from hybriddp.core.rng import make_rng
from hybriddp.curator.party import curate
from hybriddp.curator.release import CuratorRelease, release_from_documents
from hybriddp.server.party import MessageCounter
from hybriddp.service.errors import ConflictError
from hybriddp.service.roundparams import blender_params, mean_mechanism, schedule
from hybriddp.service.sizing import empty_list_message
from hybriddp.service.store import RoundInfo, Store

logger = logging.getLogger(__name__)

# ----- the curator's step: build, charge, publish -----------------------------------------------
def publish_headlist(store: Store, round_id: str, vocabulary: dict[str, list[str]] | None = None) -> RoundInfo:
    """Charge the opt-in users, build the round's head list (or opt-in mean), publish, delete the raw data.

    The charge comes first, in the transaction that moves the round from collecting-optin to
    building-headlist (:meth:`Store.start_build`): every run of the curator's mechanism is charged
    whatever it outputs, and the round never goes back, so no retry can draw fresh noise
    (docs/ALGORITHM.md §3.4). The run then ends the round's build in one of three ways, each of which
    deletes the raw opt-in data: ``headlist-published``; ``headlist-empty`` when CreateHeadList kept no
    record (that outcome is the release: the round ends); ``aborted`` when the build failed.

    ``vocabulary`` (seeded BLENDER rounds only, to reproduce a simulation exactly): the order of
    the query and URL codes ``{"queries": [...], "urls": [...]}``; by default the codes follow the
    sorted distinct strings.
    """
    info = store.round(round_id)
    if vocabulary is not None and (info.kind != "blender" or not info.non_private):
        raise parameter_error("vocabulary", "<given>", "left out: it is for seeded (experiment) BLENDER rounds "
                              "only, which reproduce a simulation", "Publish without a body.")
    carried = carried_records(store, info) if info.kind == "blender" else []  # before anyone is charged
    info = store.start_build(round_id, *info.charge, private=not info.non_private)
    try:
        if info.kind == "blender":
            headlist, estimates = _curate_blender(store, info, vocabulary, carried)
        else:
            headlist, estimates = _curate_mean(store, info)
    except EmptyHeadListError as exc:
        logger.warning("round %s: CreateHeadList kept no record; the round ends (its run was charged)", info.id)
        outcome = {"outcome": "headlist-empty", "message": empty_list_message(exc, info.params)}
        return store.finish_build(info, "headlist-empty", results=outcome)
    except BaseException:
        logger.exception("round %s: the head-list build failed after its charge; the round is aborted", info.id)
        store.finish_build(info, "aborted")
        raise
    if info.non_private:  # the seed stays with the round's private parameters, never in a public document
        estimates = {**{k: v for k, v in estimates.items() if k != "content_hash"}, "seed": None}
        estimates["content_hash"] = content_hash(estimates)
    private = tokens.new_private_key()
    headlist, estimates = commit_keys(store, info, headlist, estimates, tokens.round_key(info.id, private))
    return store.finish_build(info, "headlist-published", headlist, estimates, round_key=private)


REPORT_SLACK = 0.1
"""The share of a period's time after its opt-in window that is left between the devices' report window and the
period's close (docs/TOKENS.md "When a device reports"): a device sending at the window's end still arrives."""


def report_window_end(store: Store, series_id: str, period: int) -> float:
    """When the report window of period ``period`` (from 0) of a series closes at the latest, in epoch seconds."""
    series = store.series(series_id)
    close = series.period_start(period + 1).timestamp()
    built = series.period_start(period).timestamp() + series.optin_seconds
    return close - REPORT_SLACK * max(0.0, close - built)


def commit_keys(store: Store, info: RoundInfo, headlist: dict[str, Any], estimates: dict[str, Any],
                key: tokens.RoundKey) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head list with what every device must see the same of (docs/TOKENS.md "One key per round"): the round's
    token key (``token_key``: key id, modulus size, exponent), the gateway's OHTTP key config (``ohttp_key``) and
    the report window (``report_window``), inside its content hash; the estimates document bound to the new hash.

    The window opens ``issuance_seconds`` after now and lasts ``report_seconds``; a period of a series ends its
    window before the period's close (:func:`report_window_end`)."""
    sched = schedule(info.params)
    start = time.time()
    opens = start + sched["issuance_seconds"]
    closes = opens + sched["report_seconds"]
    if info.series is not None and info.period is not None:
        end = report_window_end(store, info.series, info.period)
        if closes > end:  # the period closes first: both windows shrink in proportion
            span = max(0.0, end - start)
            total = sched["issuance_seconds"] + sched["report_seconds"]
            opens = start + (span * sched["issuance_seconds"] / total if total > 0 else 0.0)
            closes = max(opens, start + span)
    doc = {k: v for k, v in headlist.items() if k != "content_hash"}
    doc["token_key"] = key.committed()
    doc["ohttp_key"] = tokens.b64(store.gateway_config())
    doc["report_window"] = {"opens": tokens.format_time(opens), "closes": tokens.format_time(closes)}
    doc["content_hash"] = content_hash(doc)
    if estimates.get("headlist") == headlist.get("content_hash"):
        estimates = {**{k: v for k, v in estimates.items() if k != "content_hash"}, "headlist": doc["content_hash"]}
        estimates["content_hash"] = content_hash(estimates)
    return doc, estimates


def _curate_blender(store: Store, info: RoundInfo, vocabulary: dict[str, list[str]] | None,
                    carried: Sequence[tuple[str, str | None]] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """The curator's head list and opt-in estimates documents (the opt-in users were charged by
    :meth:`Store.start_build`, so the release's own charges are not computed); ``carried``: a series period's
    carried records (:func:`carried_records`)."""
    users, queries, urls, pseudonyms = store.optin_records(info.num)
    p = info.params
    log = optin_log(np.asarray(users, dtype=np.int64), queries, urls, pseudonyms, p["url_level"], vocabulary,
                    extra=carried)
    carry = None
    if carried:
        q = log.queries.encode([name for name, _ in carried])
        u = np.full(len(carried), NO_URL, dtype=np.int64)  # a record without URL level: no URL
        has_url = np.array([url is not None for _, url in carried]) & bool(p["url_level"])
        u[has_url] = log.urls.encode([url for _, url in carried if url is not None and p["url_level"]])
        if (q < 0).any() or (u[has_url] < 0).any():  # encode gives −1 for a string it does not know
            raise DataError("a carried record is missing from the round's vocabulary (a seeded round with a given "
                            "vocabulary cannot carry records)")
        carry = (q, u)
    release, _ = curate(log, blender_params(p), seed=p["seed"], noise_factory=noise_factory(p["noise"]),
                        with_charges=False, carry=carry)
    return release.headlist, release.estimates


def carried_records(store: Store, info: RoundInfo) -> list[tuple[str, str | None]]:
    """The (query, URL) records a series period's head list carries (ALGORITHM.md §13.1): those the head lists of
    the series' ``carry`` periods before it selected (published with an S count). Published documents only: the
    carried set is a function of earlier releases. Empty for a round of its own."""
    from hybriddp.core.headlist import split_keys
    from hybriddp.curator.carry import selected_records

    if info.series is None or info.period is None:
        return []
    series = store.series(info.series)
    out: set[tuple[str, str | None]] = set()
    for k, r in store.series_rounds(series).items():
        if not info.period - series.carry <= k < info.period:
            continue
        docs = store.documents(r.id)
        if docs.headlist is None or docs.estimates is None:
            continue
        rel = release_from_documents(json.loads(docs.headlist), json.loads(docs.estimates))
        q, u = split_keys(selected_records(rel.head_list, rel.optin.reused))
        names_u: list[str | None] = [None] * len(u)  # a record without URL level: (query, None)
        for i, name in zip(np.flatnonzero(u >= 0).tolist(), rel.urls.decode(u[u >= 0]), strict=True):
            names_u[i] = name
        out.update(zip(rel.queries.decode(q), names_u, strict=True))
    return sorted(out, key=lambda r: (r[0], r[1] or ""))


def optin_log(users: np.ndarray, queries: list[str], urls: list[str | None], pseudonyms: dict[int, str],
              url_level: bool, vocabulary: dict[str, list[str]] | None = None,
              extra: Sequence[tuple[str, str | None]] = ()) -> RecordLog:
    """The opt-in records as a :class:`RecordLog`: users coded in enrolment order, ids = ledger pseudonyms.

    Queries and URLs are coded by their sorted distinct strings, or by their position in
    ``vocabulary["queries"]`` / ``vocabulary["urls"]`` when given. ``extra`` records (a series' carried records)
    join the vocabularies whether or not anybody uploaded them.
    """
    seqs, user_code = np.unique(users, return_inverse=True)
    qnames, qcode = _codes(queries, None if vocabulary is None else vocabulary.get("queries", []), "queries",
                           [q for q, _ in extra])
    if url_level:
        unames, ucode = _codes(urls, None if vocabulary is None else vocabulary.get("urls", []), "urls",
                               [u for _, u in extra if u is not None])
    else:
        unames, ucode = np.array([], dtype=object), np.full(len(queries), NO_URL)
    ids = np.array([pseudonyms[int(s)] for s in seqs.tolist()], dtype=object)
    return RecordLog.from_user_sorted(user_code, qcode.astype(np.int32), ucode.astype(np.int32),
                                      ArrayVocabulary(qnames), ArrayVocabulary(unames), has_urls=url_level,
                                      user_ids=ids)


def _codes(strings: list[Any], order: list[str] | None, field: str,
           extra: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(vocabulary, code of each string): sorted distinct strings (``extra`` ones included), or the given order."""
    if order is None:
        names, inverse = np.unique(np.array(list(strings) + list(extra), dtype=object), return_inverse=True)
        return names, inverse[:len(strings)]
    names, inverse = np.unique(np.array(strings, dtype=object), return_inverse=True)
    index = {s: i for i, s in enumerate(order)}
    if len(index) != len(order):
        raise DataError(f"vocabulary.{field} lists a string twice; give each distinct string once")
    missing = [s for s in names.tolist() if s not in index]
    if missing:
        raise DataError(f"vocabulary.{field} lacks {missing[0]!r} (and {len(missing) - 1} more), which the uploaded "
                        "opt-in records use; give every distinct string of the records")
    mapped = np.array([index[s] for s in names.tolist()], dtype=np.int64)
    return np.array(order, dtype=object), mapped[inverse]


def _curate_mean(store: Store, info: RoundInfo) -> tuple[dict[str, Any], dict[str, Any]]:
    """The curator's release of a mean round from its stored opt-in values
    (:func:`hybriddp.curator.mean.curate_mean`, ALGORITHM.md §11), drawn from the OS CSPRNG unless the round
    is seeded (no privacy)."""
    from hybriddp.curator.mean import curate_mean

    users, values = store.optin_values(info.num)  # not empty: start_build refuses a round without values
    p = info.params
    rng = None if p["seed"] is None else make_rng(p["seed"])
    return curate_mean(info.id, users, values, mean_mechanism(p), rng)


# ----- device messages --------------------------------------------------------------------------
class BlenderReports:
    """Checks BLENDER device messages against one published head list (ALGORITHM.md §5, §6): the
    checks of :meth:`hybriddp.server.party.MessageCounter.entries` (fields, a valid random id, the
    head list's hash, at most m_C reports, every report a listed entry)."""

    recipe: tuple[Any, ...] = ()
    key = ""

    def __init__(self, release: CuratorRelease, verifier: tokens.TokenVerifier | None = None) -> None:
        self.release = release
        self.verifier = verifier
        self._counter = MessageCounter(release, "fetch GET /api/v1/rounds/{id}/headlist and randomize over it")

    def check(self, msg: Any, index: int) -> tuple[str, list[int]]:
        """(message id, entry index of each report) of the ``index``-th message of a request; with a
        ``verifier``, its report token is checked too (docs/TOKENS.md)."""
        mid, entries = self._counter.entries(msg, f"message {index}")
        if self.verifier is not None:
            self.verifier.check(msg, mid, f"message {index}")
        return mid, entries


HONEST_TAIL = 1e-9
"""A mean-round value an honest device sends with at most this probability is refused (:class:`MeanReports`)."""


class MeanReports:
    """Checks mean-round messages ``{"id": ..., "round": round id, "value": randomized number}``.

    A value is clamp(x) + Laplace(Δ/ε) (:mod:`hybriddp.device.mean`). An honest device's value lies
    within ln(1/:data:`HONEST_TAIL`) ≈ 20.7 noise scales of [lower, upper] with probability 1 − 1e-9
    (P[|Y| > t·b] = e^{−t}); a value farther out is refused: a fake report of an extreme value
    would otherwise move the client mean by up to its distance over n_L (a few such reports can
    move a mean of [0, 1] anywhere). Refusing costs an honest device a report with probability
    at most 1e-9 and depends on nothing but the public range and ε.
    """

    recipe: tuple[Any, ...] = ()
    key = ""

    def __init__(self, round_id: str, params: dict[str, Any], verifier: tokens.TokenVerifier | None = None) -> None:
        self.round_id = round_id
        self.verifier = verifier
        lo, hi = float(params["lower"]), float(params["upper"])
        reach = math.log(1.0 / HONEST_TAIL) * (hi - lo) / float(params["epsilon"])
        self.low, self.high = lo - reach, hi + reach

    def check(self, msg: Any, index: int) -> tuple[str, float]:
        """(message id, value) of the ``index``-th message of a request, or a DataError naming the problem."""
        source = f"message {index}"
        shape = '{"id": ..., "round": ..., "value": ...} (made with hybriddp.device.mean)'
        if not isinstance(msg, dict):
            raise DataError(f"{source}: expected a JSON object {shape}, found {_kind(msg)}")
        missing = [k for k in ("id", "round", "value") if k not in msg]
        if missing:
            raise DataError(f"{source}: field {missing[0]!r} is missing; a mean-round message is {shape}")
        mid = _message_id(msg["id"], source)
        if msg["round"] != self.round_id:
            raise DataError(f"{source}: message made for round {str(msg['round'])[:40]!r}, but this is round "
                            f"{self.round_id}; send it to its own round")
        v = msg["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not self.low <= v <= self.high:
            raise DataError(f"{source}: field 'value' = {str(v)[:40]} must be a number between {self.low:.6g} and "
                            f"{self.high:.6g} (the device's randomized value, hybriddp.device.mean.randomize_value: "
                            "the range plus the noise an honest device exceeds with probability 1e-9)")
        if self.verifier is not None:
            self.verifier.check(msg, mid, source)
        return mid, float(v)


def _message_id(value: Any, source: str) -> str:
    try:
        return check_message_id(value)
    except DeviceError as exc:
        raise DataError(f"{source}: {exc}") from None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


# ----- per-round caches (published documents and results never change) --------------------------
class _Cache:
    def __init__(self, size: int = 32) -> None:
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value

    def peek(self, key: Any) -> Any:
        with self._lock:
            return self._items.get(key)


_results = _Cache()


_targets = _Cache(256)


def report_target(store: Store, round_id: str, *, with_tokens: bool, cached_only: bool = False
                  ) -> tuple[RoundInfo, BlenderReports | MeanReports] | None:
    """(round, message checker) of a round whose head list is published; cached per round.

    ``with_tokens``: the checker verifies every message's report token under the round's key (docs/TOKENS.md).
    The cached round's state goes stale (the store checks the state when it stores reports);
    its id, kind, head list and token key never change once published. ``cached_only``: None on a miss
    instead of reading the database.
    """
    key = (store.url, round_id, with_tokens)
    if cached_only:
        return _targets.peek(key)

    def make() -> tuple[RoundInfo, BlenderReports | MeanReports]:
        docs = store.documents(round_id)
        info = docs.info
        if docs.headlist is None:
            raise ConflictError(f"reports refused: round {info.id} is {info.state!r}; its head list is not "
                                "published yet (reports are taken after POST /api/v1/rounds/{id}/headlist)")
        spki = base64.b64encode(store.round_key(round_id)[1].spki).decode() if with_tokens else None
        if info.kind == "mean":
            return info, checker_from_recipe(("mean", info.id, spki, info.params))
        return info, checker_from_recipe(("blender", info.id, spki, docs.headlist, docs.estimates))
    return _targets.get(key, make)


def checker_from_recipe(recipe: tuple[Any, ...]) -> BlenderReports | MeanReports:
    """The message checker of a round from its recipe: ``("blender", round id, key, head list JSON, estimates
    JSON)`` or ``("mean", round id, key, params)``, ``key`` the round's token key (base64 SPKI) or None when reports
    need no token. The checker keeps its recipe (``.recipe``), so another process
    (:mod:`hybriddp.service.checkpool`) can build the same checker."""
    kind, round_id, spki = recipe[:3]
    verifier = None if spki is None else tokens.TokenVerifier(tokens.RoundKey(round_id, base64.b64decode(spki)))
    if kind == "mean":
        checker: BlenderReports | MeanReports = MeanReports(round_id, recipe[3], verifier)
    else:
        checker = BlenderReports(release_from_documents(json.loads(recipe[3]), json.loads(recipe[4])), verifier)
    checker.recipe = recipe
    checker.key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode("utf-8", "surrogatepass")).hexdigest()
    return checker

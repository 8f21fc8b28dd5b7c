"""Round logic of the collection service, on top of the library's three parties.

* **Parameters** (:func:`validate_params`): a BLENDER round takes everything
  :class:`~hybriddp.core.params.BlenderParams` checks, plus the curator's noise and whether records
  have URLs; a mean round takes ε and the public range [lower, upper] (ALGORITHM.md §11), and
  optionally a known σ².
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
* **Close** (:func:`close_round`): reports per entry from the database →
  :func:`hybriddp.server.party.serve_estimates` (ALGORITHM.md §6, §7); a mean round blends the opt-in
  and client means with the Hybrid weighting of :mod:`hybriddp.mean`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import numpy as np
import pyarrow as pa

from hybriddp.core.errors import DataError, EmptyHeadListError, HybridDPError, parameter_error
from hybriddp.core.noise import NOISE_CLASSES, noise_factory
from hybriddp.core.params import LEGACY_ESTIMATOR, BlenderParams, check_seed
from hybriddp.core.protocol import DeviceError, check_message_id, content_hash
from hybriddp.core.records import NO_URL, ArrayVocabulary, RecordLog
from hybriddp.core.rng import SEED_WARNING, make_rng
from hybriddp.curator.party import curate
from hybriddp.curator.release import CuratorRelease, release_from_documents
from hybriddp.mean import VARIANCE_SHARE, Hybrid, HybridUnknownVariance
from hybriddp.mean.inputs import MAX_USERS, check_noise_scales
from hybriddp.server.party import MessageCounter, ReportCounts, serve_estimates
from hybriddp.server.result import Result
from hybriddp.service.errors import ConflictError
from hybriddp.service.store import RoundInfo, Store

logger = logging.getLogger(__name__)

KINDS = ("blender", "mean")

_BLENDER_FIELDS = [f.name for f in fields(BlenderParams)]
BLENDER_KEYS = (*_BLENDER_FIELDS, "noise", "url_level", "seed")
MEAN_KEYS = ("epsilon", "lower", "upper", "sigma2", "variance_share", "seed")


# ----- parameters -----------------------------------------------------------------------------
def _check_keys(kind: str, params: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise parameter_error(f"params of a {kind} round", ", ".join(unknown), f"among {', '.join(known)}")


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise parameter_error(name, value, "true or false")
    return value


def validate_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The round's parameters, checked and completed with defaults (stored with the round)."""
    if kind == "blender":
        _check_keys(kind, params, BLENDER_KEYS)
        out = {**BlenderParams().to_dict(), "noise": next(iter(NOISE_CLASSES)), "url_level": True, "seed": None,
               **params}
        _flag("project", out["project"])
        _flag("url_level", out["url_level"])
        if not isinstance(out["noise"], str):
            raise parameter_error("noise", out["noise"], " or ".join(repr(n) for n in NOISE_CLASSES))
        noise_factory(out["noise"])
        check_seed(out["seed"])
        blender_params(out)  # every range check of the library
        return out
    if kind == "mean":
        _check_keys(kind, params, MEAN_KEYS)
        for name in ("epsilon", "lower", "upper"):
            if name not in params:
                raise parameter_error(name, None, "given: a mean round needs epsilon, lower and upper")
        out = {"sigma2": None, "variance_share": VARIANCE_SHARE, "seed": None, **params}
        check_seed(out["seed"])
        mean_mechanism(out)
        # every group size a round can have (1 .. MAX_USERS) keeps the noise and the errors finite
        rho = out["variance_share"] if out["sigma2"] is None else None
        check_noise_scales(out["epsilon"], 1, 1, rho)
        check_noise_scales(out["epsilon"], MAX_USERS / 2, MAX_USERS / 2, rho)
        from hybriddp.curator.mean import integer_scale
        for eps in [out["epsilon"]] if rho is None else [rho * out["epsilon"], (1.0 - rho) * out["epsilon"]]:
            integer_scale(1, eps, "epsilon")  # the curator's exact noise can run: refused now, not after the charge
        return out
    raise parameter_error("kind", kind, " or ".join(repr(k) for k in KINDS))


def blender_params(params: dict[str, Any]) -> BlenderParams:
    """The library parameters of a BLENDER round."""
    given = {k: params[k] for k in _BLENDER_FIELDS if k in params}  # older rounds lack newer fields: defaults
    given.setdefault("estimator", LEGACY_ESTIMATOR)  # a round stored before the field: the paper's
    try:
        return BlenderParams(**given)
    except TypeError as exc:  # e.g. a string where a number belongs
        raise parameter_error("params", given, f"numbers of the right type ({exc})") from None


def mean_mechanism(params: dict[str, Any]) -> Hybrid:
    """Hybrid (σ² given) or HybridUnknownVariance (σ² estimated privately from the opt-in group)."""
    kw = {"lower": params["lower"], "upper": params["upper"], "epsilon": params["epsilon"]}
    if params["sigma2"] is None:
        return HybridUnknownVariance(**kw, variance_share=params["variance_share"])
    return Hybrid(**kw, sigma2=params["sigma2"])


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
    p = info.params
    delta = float(p["delta"]) if info.kind == "blender" else 0.0
    info = store.start_build(round_id, float(p["epsilon"]), delta, private=not info.non_private)
    try:
        if info.kind == "blender":
            headlist, estimates = _curate_blender(store, info, vocabulary)
        else:
            headlist, estimates = _curate_mean(store, info)
    except EmptyHeadListError as exc:
        logger.warning("round %s: CreateHeadList kept no record; the round ends (its run was charged)", info.id)
        outcome = {"outcome": "headlist-empty", "message": f"{str(exc).rstrip('.')}. The run was charged to the "
                   "opt-in users and the round has ended: a new round is a new release, charged again"}
        return store.finish_build(info, "headlist-empty", results=outcome)
    except BaseException:
        logger.exception("round %s: the head-list build failed after its charge; the round is aborted", info.id)
        store.finish_build(info, "aborted")
        raise
    if info.non_private:  # the seed stays with the round's private parameters, never in a public document
        estimates = {**{k: v for k, v in estimates.items() if k != "content_hash"}, "seed": None}
        estimates["content_hash"] = content_hash(estimates)
    return store.finish_build(info, "headlist-published", headlist, estimates)


def _curate_blender(store: Store, info: RoundInfo, vocabulary: dict[str, list[str]] | None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The curator's head list and opt-in estimates documents (the opt-in users were charged by
    :meth:`Store.start_build`, so the release's own charges are not computed)."""
    users, queries, urls, pseudonyms = store.optin_records(info.num)
    p = info.params
    log = optin_log(np.asarray(users, dtype=np.int64), queries, urls, pseudonyms, p["url_level"], vocabulary)
    release, _ = curate(log, blender_params(p), seed=p["seed"], noise_factory=noise_factory(p["noise"]),
                        with_charges=False)
    return release.headlist, release.estimates


def optin_log(users: np.ndarray, queries: list[str], urls: list[str | None], pseudonyms: dict[int, str],
              url_level: bool, vocabulary: dict[str, list[str]] | None = None) -> RecordLog:
    """The opt-in records as a :class:`RecordLog`: users coded in enrolment order, ids = ledger pseudonyms.

    Queries and URLs are coded by their sorted distinct strings, or by their position in
    ``vocabulary["queries"]`` / ``vocabulary["urls"]`` when given.
    """
    seqs, user_code = np.unique(users, return_inverse=True)
    qnames, qcode = _codes(queries, None if vocabulary is None else vocabulary.get("queries", []), "queries")
    if url_level:
        unames, ucode = _codes(urls, None if vocabulary is None else vocabulary.get("urls", []), "urls")
    else:
        unames, ucode = np.array([], dtype=object), np.full(len(queries), NO_URL)
    ids = np.array([pseudonyms[int(s)] for s in seqs.tolist()], dtype=object)
    return RecordLog.from_user_sorted(user_code, qcode.astype(np.int32), ucode.astype(np.int32),
                                      ArrayVocabulary(qnames), ArrayVocabulary(unames), has_urls=url_level,
                                      user_ids=ids)


def _codes(strings: list[Any], order: list[str] | None, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(vocabulary, code of each string): sorted distinct strings, or the given order."""
    names, inverse = np.unique(np.array(strings, dtype=object), return_inverse=True)
    if order is None:
        return names, inverse
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

    def __init__(self, release: CuratorRelease) -> None:
        self.release = release
        self._counter = MessageCounter(release, "fetch GET /api/v1/rounds/{id}/headlist and randomize over it")

    def check(self, msg: Any, index: int) -> tuple[str, list[int]]:
        """(message id, entry index of each report) of the ``index``-th message of a request."""
        return self._counter.entries(msg, f"message {index}")


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

    def __init__(self, round_id: str, params: dict[str, Any]) -> None:
        self.round_id = round_id
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


def report_target(store: Store, round_id: str, *, cached_only: bool = False
                  ) -> tuple[RoundInfo, BlenderReports | MeanReports] | None:
    """(round, message checker) of a round whose head list is published; cached per round.

    The cached round's state goes stale (the store checks the state when it stores reports);
    its id, kind and head list never change once published. ``cached_only``: None on a miss
    instead of reading the database.
    """
    key = (store.url, round_id)
    if cached_only:
        return _targets.peek(key)

    def make() -> tuple[RoundInfo, BlenderReports | MeanReports]:
        docs = store.documents(round_id)
        info = docs.info
        if docs.headlist is None:
            raise ConflictError(f"reports refused: round {info.id} is {info.state!r}; its head list is not "
                                "published yet (reports are taken after POST /api/v1/rounds/{id}/headlist)")
        if info.kind == "mean":
            return info, checker_from_recipe(("mean", info.id, info.params))
        return info, checker_from_recipe(("blender", docs.headlist, docs.estimates))
    return _targets.get(key, make)


def checker_from_recipe(recipe: tuple[Any, ...]) -> BlenderReports | MeanReports:
    """The message checker of a round from its recipe: ``("blender", head list JSON, estimates JSON)`` or
    ``("mean", round id, params)``. The checker keeps its recipe (``.recipe``), so another process
    (:mod:`hybriddp.service.checkpool`) can build the same checker."""
    if recipe[0] == "mean":
        checker: BlenderReports | MeanReports = MeanReports(recipe[1], recipe[2])
    else:
        checker = BlenderReports(release_from_documents(json.loads(recipe[1]), json.loads(recipe[2])))
    checker.recipe = recipe
    checker.key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode("utf-8", "surrogatepass")).hexdigest()
    return checker


# ----- close --------------------------------------------------------------------------------
def close_round(store: Store, round_id: str) -> RoundInfo:
    """Close (one request wins; reports are refused from now), estimate, store the results."""
    return finish_close(store, store.start_close(round_id))


def finish_close(store: Store, info: RoundInfo) -> RoundInfo:
    """closed → results-published: estimates from the stored reports."""
    docs = store.documents(info.id)
    if info.kind == "blender":
        release = release_from_documents(json.loads(docs.headlist), json.loads(docs.estimates))
        counts = store.entry_counts(info.num, release.head_list.n_entries)
        doc = blender_result(release, counts, info).to_json()
        if info.non_private:
            doc.update(non_private=True, warning=SEED_WARNING)
        return store.finish_close(info, doc, counts.tolist())
    return store.finish_close(info, mean_results(store, info, json.loads(docs.estimates)), None)


def blender_result(release: CuratorRelease, counts: np.ndarray, info: RoundInfo) -> Result:
    """The round's :class:`Result` from the release and the reports per entry (deterministic)."""
    rc = ReportCounts(np.asarray(counts, dtype=np.int64), messages=info.messages, reports=int(np.sum(counts)),
                      duplicates=info.duplicates)
    return serve_estimates(release, rc)


def mean_results(store: Store, info: RoundInfo, estimates: dict[str, Any]) -> dict[str, Any]:
    """Opt-in, client and hybrid means with their expected squared errors (ALGORITHM.md §11)."""
    p = info.params
    mech = mean_mechanism(p)
    n_l, total = store.report_values(info.num)
    n_t, mu_t, sigma2 = int(estimates["n_optin"]), float(estimates["mean"]), float(estimates["sigma2"])
    mu_l = total / n_l
    w = mech.weight_for(n_t, n_l, sigma2)

    def row(name: str, estimate: float, n: int, weight: float) -> dict[str, Any]:
        mse = mech.expected_squared_error(n_t, n_l, sigma2, weight=weight)
        return {"estimator": name, "estimate": estimate, "variance": mse, "n": n, "weight_optin": weight}
    rows = [row("optin", mu_t, n_t, 1.0), row("client", mu_l, n_l, 0.0),
            row("hybrid", w * mu_t + (1.0 - w) * mu_l, n_t + n_l, w)]
    out: dict[str, Any] = {
        "algorithm": "hybrid-mean", "round": info.id, "params": {k: v for k, v in p.items() if k != "seed"},
        "guarantee": mech.guarantee,
        "sigma2": sigma2, "sigma2_source": estimates["sigma2_source"],
        "variance_meaning": "expected squared error as an estimate of the mean of all n_optin + n_client users' "
                            "clamped values (ALGORITHM.md §11), at sigma2",
        "sizes": {"optin_users": n_t, "messages": n_l, "duplicate_messages": info.duplicates},
        "optin": rows[0], "client": rows[1], "hybrid": rows[2], "estimates": rows,
    }
    if info.non_private:
        out.update(non_private=True, warning=SEED_WARNING)
    return out


def result_of(store: Store, round_id: str) -> tuple[RoundInfo, dict[str, Any], Result | None]:
    """(round, result JSON, BLENDER Result rebuilt from the stored state or None for a mean round)."""
    docs = store.documents(round_id)
    info = docs.info
    if info.state == "headlist-empty" and docs.results is not None:
        raise ConflictError(f"round {round_id} has no results: {json.loads(docs.results)['message']}")
    if info.state != "results-published" or docs.results is None:
        raise ConflictError(f"round {round_id} has no results yet: it is {info.state!r}; results are published "
                            "when an administrator closes it (POST /api/v1/rounds/{id}/close)")
    results = json.loads(docs.results)
    if info.kind != "blender":
        return info, results, None

    def make() -> Result:
        release = release_from_documents(json.loads(docs.headlist), json.loads(docs.estimates))
        return blender_result(release, np.array(json.loads(docs.report_counts), dtype=np.int64), info)
    return info, results, _results.get((store.url, info.num), make)


def release_of(store: Store, round_id: str) -> dict[str, Any]:
    """The published inputs of a round's result, so anyone can recompute it with serve_estimates."""
    docs = store.documents(round_id)
    info = docs.info
    if info.state != "results-published":
        raise ConflictError(f"round {round_id} is {info.state!r}; its release is shown once its results are "
                            "published")
    return {"headlist": json.loads(docs.headlist), "estimates": json.loads(docs.estimates),
            "counts": None if docs.report_counts is None else json.loads(docs.report_counts),
            "messages": info.messages, "duplicates": info.duplicates}


def results_table(results: dict[str, Any], result: Result | None) -> pa.Table:
    """The table served as CSV/Parquet: BLENDER's records table, or the mean round's three estimates."""
    if result is not None:
        return result.records_table()
    return pa.Table.from_pylist(results["estimates"])


def local_search(info: RoundInfo, result: Result) -> dict[str, Any]:
    """The browser's document: listed queries and their URLs with blended probabilities, largest first."""
    hl = result.head_list
    names = result.query_names()
    _, urls = result.entry_names()
    p_q = np.asarray(result.blended.queries.p, dtype=np.float64)
    p_r = np.asarray(result.p_record, dtype=np.float64)
    per_query: dict[int, list[dict[str, Any]]] = {i: [] for i in range(hl.k - 1)}
    for e in np.flatnonzero(~hl.is_wildcard).tolist():
        q = int(hl.entry_query[e])
        if q in per_query and math.isfinite(p_r[e]):
            per_query[q].append({"url": urls[e], "p": float(p_r[e])})
    queries = []
    for i, entries in per_query.items():
        if math.isfinite(p_q[i]):
            entries.sort(key=lambda u: -u["p"])
            queries.append({"query": names[i], "p": float(p_q[i]), "urls": entries})
    queries.sort(key=lambda q: -q["p"])
    return {"round": info.id, "headlist": info.headlist_hash, "queries": queries}


# ----- start-up -------------------------------------------------------------------------------
def recover(store: Store) -> None:
    """Finish what a stopped server left mid-step: a round whose head list was being built is aborted
    (its run was charged and is never repeated), closed rounds get their results; raw opt-in data past
    their retention deadline are purged."""
    for info in store.unfinished():
        if info.state == "building-headlist":  # charged when the build started: never run again
            logger.warning("round %s: the head list was being built when the server stopped; its run was "
                           "charged, so the round is aborted and its raw opt-in data deleted", info.id)
            store.finish_build(info, "aborted")
        else:
            try:
                finish_close(store, info)
            except HybridDPError as exc:
                logger.error("round %s is closed but its results could not be computed: %s", info.id, exc)
    store.purge_expired()

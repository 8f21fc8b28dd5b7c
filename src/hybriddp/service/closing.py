"""Closing a round and its results (ALGORITHM.md §6, §7, §7.2, §11): estimate from the stored reports, check them
against the opt-in group, hold or publish them, and serve them (JSON, tables, the local-search document).

* **Close** (:func:`close_round`): reports per entry from the database →
  :func:`hybriddp.server.party.serve_estimates` with the round's defense (ALGORITHM.md §7.2); a mean round blends
  the opt-in and client means with the Hybrid weighting of :mod:`hybriddp.mean` and the same check. Results the
  check flags are held (``results-held``) for an administrator unless the close says otherwise; the check's
  summary carries what the administrator judges them by (:mod:`hybriddp.service.heldview`).
* **Publish held results** (:func:`publish_held`): as computed, or without the flagged entries
  (:func:`withhold_flagged`).
* **Start-up** (:func:`recover`): what a stopped server left mid-step.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import numpy as np
import pyarrow as pa

from hybriddp.core.errors import HybridDPError, parameter_error
from hybriddp.core.rng import SEED_WARNING
from hybriddp.curator.release import CuratorRelease, release_from_documents
from hybriddp.server.anchor import anchor_mean
from hybriddp.server.party import ReportCounts, serve_estimates
from hybriddp.server.result import Result
from hybriddp.service.errors import ConflictError
from hybriddp.service.heldview import blender_view, mean_view
from hybriddp.service.roundparams import defense, mean_mechanism
from hybriddp.service.rounds import MeanReports, _results
from hybriddp.service.store import RoundInfo, Store

logger = logging.getLogger(__name__)


# ----- close --------------------------------------------------------------------------------
ON_FLAG = ("hold", "publish", "remove")
"""What closing does when the anchor check flags the results (ALGORITHM.md §7.2): hold them for an administrator
(the default), publish them, or publish them without the flagged entries."""


def close_round(store: Store, round_id: str, flagged: str = "hold") -> RoundInfo:
    """Close (one request wins; reports are refused from now), estimate, store the results (held for an
    administrator when the anchor check flags them and ``flagged`` is ``hold``)."""
    if flagged not in ON_FLAG:
        raise parameter_error("flagged", flagged, " or ".join(repr(f) for f in ON_FLAG))
    return finish_close(store, store.start_close(round_id), flagged)


def finish_close(store: Store, info: RoundInfo, flagged: str = "hold") -> RoundInfo:
    """closed → results-published (or results-held): estimates from the stored reports."""
    docs = store.documents(info.id)
    if info.kind == "blender":
        release = release_from_documents(json.loads(docs.headlist), json.loads(docs.estimates))
        counts = store.entry_counts(info.num, release.head_list.n_entries)
        result = blender_result(release, counts, info)
        doc = result.to_json()
        check = result.parts.check if result.parts is not None else None
        if check is not None and check.flagged_any:  # what an administrator judges (§7.2)
            doc["anchor_check"].update(blender_view(doc, check, withhold_flagged(doc)))
        if info.non_private:
            doc.update(non_private=True, warning=SEED_WARNING)
    else:
        doc, counts = mean_results(store, info, json.loads(docs.estimates)), None
    doc["headlist"] = info.headlist_hash  # the content hash devices randomized over: it commits to the round's keys
    raised = bool(doc.get("anchor_check") and _raised(doc["anchor_check"]))
    if raised and flagged == "remove":
        doc = withhold_flagged(doc)
    return store.finish_close(info, doc, None if counts is None else counts.tolist(),
                              held=raised and flagged == "hold")


def _raised(check: dict[str, Any]) -> bool:
    """Whether an ``anchor_check`` summary flagged anything (BLENDER: any entry or query; mean: the mean)."""
    return bool(check.get("flagged") or check.get("flagged_records") or check.get("flagged_queries"))


def publish_held(store: Store, round_id: str, flagged: str = "keep") -> RoundInfo:
    """results-held → results-published: as computed (``keep``) or without the flagged entries (``remove``)."""
    if flagged not in ("keep", "remove"):
        raise parameter_error("flagged", flagged, "'keep' or 'remove'")
    docs = store.documents(round_id)
    if docs.info.state != "results-held" or docs.results is None:
        raise ConflictError(f"round {round_id} is {docs.info.state!r}; only results-held results wait to be "
                            "published")
    doc = json.loads(docs.results)
    return store.publish_held(round_id, withhold_flagged(doc) if flagged == "remove" else doc)


def withhold_flagged(doc: dict[str, Any]) -> dict[str, Any]:
    """The results without their flagged entries (ALGORITHM.md §7.2): BLENDER drops flagged queries (with their
    records) and flagged records from every table; a flagged mean round publishes no hybrid mean."""
    out = dict(doc)
    out["anchor_check"] = {**doc["anchor_check"], "withheld": True}
    out["anchor_check"].pop("flagged_entries", None)  # it names the entries left out, with their estimates
    if doc.get("algorithm") == "hybrid-mean":
        if "client_mean" in out["anchor_check"]:
            out["anchor_check"]["client_mean"] = None  # as the client estimate below
        for key in ("hybrid", "client"):
            out[key] = {**doc[key], "estimate": None}
        out["estimates"] = [out["optin"], out["client"], out["hybrid"]]
        return out
    bad_queries = {q["query"] for q in doc["queries"] if q.get("flagged")}
    out["queries"] = [q for q in doc["queries"] if q["query"] not in bad_queries]
    out["records"] = [r for r in doc["records"] if not r.get("flagged") and r["query"] not in bad_queries]
    out["figure9"] = [r for r in doc["figure9"] if r["query"] not in bad_queries]
    return out


def blender_result(release: CuratorRelease, counts: np.ndarray, info: RoundInfo) -> Result:
    """The round's :class:`Result` from the release and the reports per entry (deterministic), defended as the
    round's parameters say (:func:`defense`)."""
    rc = ReportCounts(np.asarray(counts, dtype=np.int64), messages=info.messages, reports=int(np.sum(counts)),
                      duplicates=info.duplicates)
    return serve_estimates(release, rc, defense=defense(info.params))


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
    policy = defense(p)
    check = None
    if policy is not None:
        rows[2]["estimate"], check = anchor_mean(mu_t, rows[0]["variance"], mu_l, rows[1]["variance"],
                                                 rows[2]["estimate"], policy)
    rows[2]["estimate"] = min(max(rows[2]["estimate"], float(p["lower"])), float(p["upper"]))  # a published mean
    if check is not None and check["flagged"]:  # what an administrator judges (§7.2)
        window = MeanReports(info.id, p)
        check.update(mean_view(mu_t, mu_l, n_l, window.low, window.high, rows[2]["estimate"]))
    out: dict[str, Any] = {
        "algorithm": "hybrid-mean", "round": info.id, "params": {k: v for k, v in p.items() if k != "seed"},
        "guarantee": mech.guarantee,
        "sigma2": sigma2, "sigma2_source": estimates["sigma2_source"],
        "variance_meaning": "expected squared error as an estimate of the mean of all n_optin + n_client users' "
                            "clamped values (ALGORITHM.md §11), at sigma2",
        "sizes": {"optin_users": n_t, "messages": n_l, "duplicate_messages": info.duplicates},
        "optin": rows[0], "client": rows[1], "hybrid": rows[2], "estimates": rows, "anchor_check": check,
    }
    if info.non_private:
        out.update(non_private=True, warning=SEED_WARNING)
    return out


def result_of(store: Store, round_id: str, admin: bool = False) -> tuple[RoundInfo, dict[str, Any], Result | None]:
    """(round, result JSON, BLENDER Result rebuilt from the stored state or None for a mean round). Held results
    (``results-held``) are shown to an administrator only."""
    docs = store.documents(round_id)
    info = docs.info
    if info.state == "headlist-empty" and docs.results is not None:
        raise ConflictError(f"round {round_id} has no results: {json.loads(docs.results)['message']}")
    if info.state == "results-held" and not admin:
        raise ConflictError(f"round {round_id}'s results are held: the check against the opt-in group flagged them "
                            "(docs/ALGORITHM.md §7.2) and an administrator has not published them yet")
    if info.state not in ("results-published", "results-held") or docs.results is None:
        raise ConflictError(f"round {round_id} has no results yet: it is {info.state!r}; results are published "
                            "when an administrator closes it (POST /api/v1/rounds/{id}/close)")
    results = json.loads(docs.results)
    if info.kind != "blender":
        return info, results, None

    def make() -> Result:
        release = release_from_documents(json.loads(docs.headlist), json.loads(docs.estimates))
        return blender_result(release, np.array(json.loads(docs.report_counts), dtype=np.int64), info)
    return info, results, _results.get((store.url, info.num), make)


def withheld(results: dict[str, Any]) -> bool:
    """Whether the published results left their flagged entries out (:func:`withhold_flagged`)."""
    return bool((results.get("anchor_check") or {}).get("withheld"))


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
    """The table served as CSV/Parquet: BLENDER's records table (the published rows), or the mean round's three
    estimates."""
    if result is not None:
        table = result.records_table()
        if withheld(results):
            keep = {(r["query"], r["url"]) for r in results["records"]}
            mask = [(q, u) in keep for q, u in zip(*result.entry_names(), strict=True)]
            table = table.filter(pa.array(mask))
        return table
    return pa.Table.from_pylist(results["estimates"])


def local_search(info: RoundInfo, result: Result, results: dict[str, Any] | None = None) -> dict[str, Any]:
    """The browser's document: listed queries and their URLs with the published probabilities (defended, in
    [0, 1]), queries in the suggestions' order (a defended round's guarded ranking, ALGORITHM.md §7.2, which the
    browser keeps), URLs largest first; without the flagged entries when the results withheld them
    (:func:`withheld`). The probabilities are the results' agreed finals (§7.3: a query at least the sum of its
    URLs); a query published at p ≤ 0 is not suggested, nor a URL at p ≤ 0."""
    hl = result.head_list
    names = result.query_names()
    _, urls = result.entry_names()
    p_q = np.asarray(result.blended.queries_final, dtype=np.float64)
    rank = np.asarray(result.blended.queries_ranking, dtype=np.float64)
    p_r = np.asarray(result.p_record, dtype=np.float64)
    check = result.parts.check if result.parts is not None else None
    drop = results is not None and withheld(results) and check is not None
    per_query: dict[int, list[dict[str, Any]]] = {i: [] for i in range(hl.k - 1)}
    for e in np.flatnonzero(~hl.is_wildcard).tolist():
        q = int(hl.entry_query[e])
        if q in per_query and math.isfinite(p_r[e]) and p_r[e] > 0.0 and not (drop and check.records.flagged[e]):
            per_query[q].append({"url": urls[e], "p": float(p_r[e])})
    queries = []
    for i, entries in per_query.items():
        if math.isfinite(p_q[i]) and p_q[i] > 0.0 and not (drop and check.queries.flagged[i]):
            entries.sort(key=lambda u: -u["p"])
            queries.append((-float(rank[i]), -float(p_q[i]), {"query": names[i], "p": float(p_q[i]), "urls": entries}))
    queries.sort(key=lambda row: row[:2])
    return {"round": info.id, "headlist": info.headlist_hash, "queries": [q for *_, q in queries]}


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

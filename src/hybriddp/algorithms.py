"""BLENDER and the baselines a privacy engineer would otherwise choose, behind one interface.

* ``blender``: the hybrid algorithm (ALGORITHM.md §2);
* ``optin-only``: the curator alone — head list from S, estimates from T, no clients;
* ``client-only``: clients alone over the opt-in head list, no blending;
* ``local-only``: no opt-in group at all — PEM heavy-hitter discovery over OLH, then the clients'
  two-stage LocalAlg estimation (:mod:`hybriddp.baselines.local_only`), with an aggregator that
  holds a dictionary of the existing records (the strongest local-only baseline);
* ``local-only-hashed``: the same with no dictionary — records hashed to 32 bits, PEM over the
  whole code space, false discoveries kept as records of true frequency 0;
* ``central``: everyone trusts the curator — CreateHeadList and EstimateOptinProbabilities over
  all users (the upper bound).

Every algorithm returns an :class:`AlgorithmResult` scored by :func:`hybriddp.evaluate.score`
against the truth of its own sampled records. ``blender``, ``optin-only`` and ``client-only``
come from one BLENDER run (:func:`blender_family`), so they share the head list, the samples
and the truth: their comparison is paired.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from hybriddp.blend import project_to_simplex
from hybriddp.evaluate import ground_truth, score, truth_vectors
from hybriddp.headlist import HeadList
from hybriddp.noise import DiscreteLaplaceNoise
from hybriddp.params import BlenderParams
from hybriddp.pipeline import NoiseFactory, Stages, curator_side, run_blender
from hybriddp.records import RecordLog, Vocabulary
from hybriddp.result import (
    BlenderResult,
    entry_names,
    query_names,
    result_from_run,
    write_output,
)
from hybriddp.rng import SEED_WARNING

ALGORITHMS = ("blender", "optin-only", "client-only", "local-only", "local-only-hashed", "central")

HASHED_ITEM_BITS = 32
"""Code length of ``local-only-hashed``: the shortest that keeps collisions rare (~n²/2^33)."""


@dataclass
class AlgorithmResult:
    """Final estimates of one algorithm over its head list, scored against the truth."""

    algorithm: str
    params: BlenderParams
    head_list: HeadList
    queries: Vocabulary
    urls: Vocabulary
    p_record: np.ndarray
    p_query: np.ndarray
    url_level: bool
    sizes: dict[str, int]
    guarantee: dict[str, str]
    seed: int | None
    metrics: dict[str, float | None] = field(default_factory=dict)
    truth_query: np.ndarray | None = None
    truth_record: np.ndarray | None = None
    detail: BlenderResult | None = None  # the full BLENDER result, for blender

    @property
    def n_records(self) -> int:
        """Records in the head list (queries for a log without URLs)."""
        return self.head_list.n_records if self.url_level else self.head_list.n_queries

    def top_queries(self, top: int = 10) -> list[dict[str, Any]]:
        """Listed queries by true p_q (by estimate without truth) with the estimate."""
        k = self.head_list.n_queries
        names = query_names(self.head_list, self.queries)
        key = self.truth_query if self.truth_query is not None else self.p_query[:k]
        rows = []
        order = np.argsort(-key, kind="stable")[:top]
        for pos, i in enumerate(order.tolist()):
            row: dict[str, Any] = {"query": names[i], "p_estimate": float(self.p_query[i]),
                                   "p_estimate_regression": bool(pos > 0 and self.p_query[i] >
                                                                 self.p_query[order[pos - 1]])}
            if self.truth_query is not None:
                row["p_true"] = float(self.truth_query[i])
            rows.append(row)
        return rows

    def records_table(self) -> pa.Table:
        """One row per head-list entry: query, URL, wildcard flag, estimate (and truth)."""
        if self.detail is not None:
            return self.detail.records_table()
        q, u = entry_names(self.head_list, self.queries, self.urls)
        cols: dict[str, Any] = {"query": q, "url": u, "wildcard": self.head_list.is_wildcard,
                                "p_estimate": self.p_record}
        if self.truth_record is not None:
            cols["p_true"] = self.truth_record
        return pa.table(cols)

    def write(self, path: str | Path) -> None:
        """``.json`` (everything), ``.csv`` or ``.parquet`` (the records table)."""
        write_output(path, self.to_json(), self.records_table())

    def to_json(self) -> dict[str, Any]:
        """The same top-level keys as BLENDER's JSON."""
        if self.detail is not None:
            out = self.detail.to_json()
            out["algorithm"] = self.algorithm
            return out
        p = self.params
        out = {
            "algorithm": self.algorithm, "ndcg": self.metrics.get("ndcg"), "l1": self.metrics.get("l1"),
            "head_list_records": self.n_records, "head_list_queries": self.head_list.n_queries,
            "epsilon": p.epsilon, "delta": p.delta, "metrics": self.metrics, "params": p.to_dict(),
            "privacy": self.guarantee, "sizes": self.sizes, "seed": self.seed,
            "top_queries": self.top_queries(),
        }
        if self.seed is not None:
            out["warning"] = SEED_WARNING
        return out


def _finish(res: AlgorithmResult, log: RecordLog, parts: tuple, project: bool) -> AlgorithmResult:
    truth, held = ground_truth(log, parts)
    res.truth_query, res.truth_record = truth_vectors(res.head_list, truth)
    if project:
        res.p_record = project_to_simplex(res.p_record)
    res.metrics = score(res.head_list, res.p_record, res.p_query, truth, log, held)
    return res


def _curator_guarantee(p: BlenderParams, who: str) -> dict[str, str]:
    return {who: f"({p.epsilon}, {p.delta})-DP, trusted-curator model (Theorems 1, 2)"}


def blender_family(
    log: RecordLog, params: BlenderParams, *, seed: int | None = None,
    noise_factory: NoiseFactory = DiscreteLaplaceNoise, stages: Stages | None = None,
) -> dict[str, AlgorithmResult]:
    """``blender``, ``optin-only`` and ``client-only`` from one BLENDER run (paired)."""
    run = run_blender(log, params, seed=seed, noise_factory=noise_factory, stages=stages)
    full = result_from_run(run)
    cur = run.curator
    hl = run.head_list
    parts = (cur.sampled_s, cur.sampled_t, run.sampled_c)
    base = {"params": params, "head_list": hl, "queries": log.queries, "urls": log.urls,
            "url_level": log.has_urls, "sizes": full.sizes, "seed": seed}
    g = full.guarantee()
    out = {"blender": AlgorithmResult(
        "blender", p_record=full.blended.records_final, p_query=full.blended.queries_final, guarantee=g,
        metrics=full.metrics, truth_query=full.truth_query, truth_record=full.truth_record, detail=full, **base)}
    out["optin-only"] = _finish(AlgorithmResult(
        "optin-only", p_record=cur.optin.p_record.copy(), p_query=cur.optin.p_query.copy(),
        guarantee={"optin_users": g["optin_users"], "clients": "not used"}, **base), log, parts, params.project)
    out["client-only"] = _finish(AlgorithmResult(
        "client-only", p_record=run.client.p_record.copy(), p_query=run.client.p_query.copy(),
        guarantee=g, **base), log, parts, params.project)
    return out


def run_central(log: RecordLog, params: BlenderParams, *, seed: int | None = None,
                noise_factory: NoiseFactory = DiscreteLaplaceNoise, stages: Stages | None = None) -> AlgorithmResult:
    """Everyone trusts the curator: S and T split all users (|S| = round(f_O·|U|))."""
    cur = curator_side(log, np.arange(log.n_users), params, seed=seed, noise_factory=noise_factory, stages=stages)
    sizes = {"users": log.n_users, "records": log.n_records, "users_s": cur.n_users_s, "users_t": cur.n_users_t,
             "head_list_s_records": cur.head_list_s.n_records}
    res = AlgorithmResult("central", params, cur.optin.head_list, log.queries, log.urls, cur.optin.p_record.copy(),
                          cur.optin.p_query.copy(), log.has_urls, sizes,
                          _curator_guarantee(params, "all_users"), seed)
    return _finish(res, log, (cur.sampled_s, cur.sampled_t), params.project)


def run_local(log: RecordLog, params: BlenderParams, *, seed: int | None = None,
              stages: Stages | None = None, item_bits: int | None = None) -> AlgorithmResult:
    """No opt-in group: PEM discovery + the clients' LocalAlg (see the baselines package).

    ``item_bits`` None: the dictionary coding (``local-only``); an integer: hashed codes with no
    dictionary (``local-only-hashed`` uses :data:`HASHED_ITEM_BITS`).
    """
    from hybriddp.baselines.local_only import run_local_only

    out = run_local_only(log, params, seed=seed, stages=stages, item_bits=item_bits)
    guarantee = {"all_users": f"({params.epsilon}, {params.delta})-local DP: PEM/OLH discovery users ε-LDP, "
                              "estimation users LocalAlg (Theorem 3); disjoint groups"}
    name = "local-only" if item_bits is None else "local-only-hashed"
    res = AlgorithmResult(name, params, out.head_list, log.queries, log.urls, out.p_record_raw.copy(),
                          out.p_query, log.has_urls, out.sizes, guarantee, seed)
    return _finish(res, log, (out.sampled,), params.project)


def run_algorithm(name: str, log: RecordLog, params: BlenderParams, *, seed: int | None = None,
                  noise_factory: NoiseFactory = DiscreteLaplaceNoise, stages: Stages | None = None) -> AlgorithmResult:
    """Run one of :data:`ALGORITHMS` on a log."""
    if name in ("blender", "optin-only", "client-only"):
        return blender_family(log, params, seed=seed, noise_factory=noise_factory, stages=stages)[name]
    if name == "central":
        return run_central(log, params, seed=seed, noise_factory=noise_factory, stages=stages)
    if name == "local-only":
        return run_local(log, params, seed=seed, stages=stages)
    if name == "local-only-hashed":
        return run_local(log, params, seed=seed, stages=stages, item_bits=HASHED_ITEM_BITS)
    from hybriddp.errors import parameter_error
    raise parameter_error("algorithm (--algorithm)", name, "one of " + ", ".join(ALGORITHMS))

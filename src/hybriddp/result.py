"""The output of a BLENDER run (ALGORITHM.md §8): per-entry and per-query tables, metrics, JSON.

A :class:`BlenderResult` needs no raw data: ``hybriddp run`` builds it from a simulation
(with ground truth, so it carries metrics), ``hybriddp estimate`` from files (without).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from hybriddp.client_estimates import ClientEstimates
from hybriddp.curator import OptinEstimates
from hybriddp.errors import DataError
from hybriddp.evaluate import ground_truth, score, truth_vectors
from hybriddp.headlist import HeadList
from hybriddp.noise import NOISE_LABELS
from hybriddp.params import BlenderParams
from hybriddp.pipeline import BlenderRun, BlendOutput
from hybriddp.records import Vocabulary
from hybriddp.rng import SEED_WARNING

WILDCARD_NAME = "*"


@dataclass
class BlenderResult:
    """Estimates over the final head list, with names, sizes, and (optionally) truth."""

    params: BlenderParams
    head_list: HeadList
    queries: Vocabulary
    urls: Vocabulary
    optin: OptinEstimates
    client: ClientEstimates
    blended: BlendOutput
    sizes: dict[str, int]
    noise: str
    seed: int | None
    url_level: bool
    f_c_used: float
    truth_query: np.ndarray | None = None  # p_q per listed query (ground truth, simulation only)
    truth_record: np.ndarray | None = None  # p_r per entry (0 for wildcards)
    metrics: dict[str, float | None] = field(default_factory=dict)

    @property
    def n_records(self) -> int:
        """Records in the final head list: ⟨q,u⟩ pairs, or the queries of a log without URLs."""
        return self.head_list.n_records if self.url_level else self.head_list.n_queries

    # ----- names --------------------------------------------------------------------------
    def query_names(self) -> list[str]:
        return query_names(self.head_list, self.queries)

    def entry_names(self) -> tuple[list[str], list[str]]:
        return entry_names(self.head_list, self.queries, self.urls)

    # ----- tables -------------------------------------------------------------------------
    def client_record_sums(self) -> np.ndarray:
        """Σ_u p̂_C,⟨q,u⟩ per query position (Fig. 9 column 6)."""
        return np.bincount(self.head_list.entry_query, weights=self.client.p_record, minlength=self.head_list.k)

    def records_table(self) -> pa.Table:
        """One row per head-list entry (wildcards included, marked)."""
        q, u = self.entry_names()
        cols: dict[str, Any] = {
            "query": q, "url": u, "wildcard": self.head_list.is_wildcard,
            "p_blended": self.blended.records_final, "p_blended_raw": self.blended.records.p,
            "var_blended": self.blended.records.var, "weight_optin": self.blended.records.weight_optin,
            "p_optin": self.optin.p_record, "var_optin": self.optin.var_record,
            "noise_draws": self.optin.draws_record,
            "p_client": self.client.p_record, "var_client": self.client.var_record,
        }
        if self.truth_record is not None:
            cols["p_true"] = self.truth_record
        return pa.table(cols)

    def queries_table(self) -> pa.Table:
        """One row per head-list query, ``*`` last (the columns of paper Fig. 9)."""
        cols: dict[str, Any] = {
            "query": self.query_names(),
            "p_blended": self.blended.queries.p, "var_blended": self.blended.queries.var,
            "weight_optin": self.blended.queries.weight_optin,
            "p_optin_sum": self.optin.p_query, "var_optin_sum": self.optin.var_query,
            "p_client_direct": self.client.p_query, "var_client_direct": self.client.var_query,
            "p_client_sum": self.client_record_sums(),
        }
        if self.truth_query is not None:
            cols["p_true"] = np.append(self.truth_query, np.nan)
        return pa.table(cols)

    def figure9(self, top: int = 10) -> list[dict[str, Any]]:
        """Top queries sorted by true p_q (by blended p̂_q without truth), with regressions.

        A value is a *regression* when it is larger than the value one row above, i.e. out
        of order relative to the true ranking (paper §5, Fig. 9).
        """
        k = self.head_list.n_queries
        names = self.query_names()
        key = self.truth_query if self.truth_query is not None else self.blended.queries.p[:k]
        order = np.argsort(-key, kind="stable")[:top]
        cols = {
            "p_blended": self.blended.queries.p, "p_optin_sum": self.optin.p_query,
            "p_client_direct": self.client.p_query, "p_client_sum": self.client_record_sums(),
        }
        rows = []
        for pos, i in enumerate(order.tolist()):
            row: dict[str, Any] = {"query": names[i]}
            if self.truth_query is not None:
                row["p_true"] = float(self.truth_query[i])
            for c, v in cols.items():
                row[c] = float(v[i])
                row[c + "_regression"] = bool(pos > 0 and v[i] > v[order[pos - 1]])
            rows.append(row)
        return rows

    # ----- JSON ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """One JSON object: parameters, guarantee, sizes, metrics, Fig. 9 rows, full tables."""
        p = self.params
        out: dict[str, Any] = {
            "algorithm": "blender",
            "ndcg": self.metrics.get("ndcg"),
            "l1": self.metrics.get("l1"),
            "head_list_records": self.n_records,
            "head_list_queries": self.head_list.n_queries,
            "epsilon": p.epsilon,
            "delta": p.delta,
            "metrics": self.metrics,
            "params": p.to_dict(),
            "privacy": self.guarantee(),
            "sizes": self.sizes,
            "noise": self.noise,
            "seed": self.seed,
            "figure9": self.figure9(),
            "queries": _table_rows(self.queries_table()),
            "records": _table_rows(self.records_table()),
        }
        if self.seed is not None:
            out["warning"] = SEED_WARNING
        return out

    def guarantee(self) -> dict[str, Any]:
        """The privacy actually delivered (ALGORITHM.md §2, §5)."""
        p = self.params
        return {
            "optin_users": f"({p.epsilon}, {p.delta})-DP, trusted-curator model "
                           "(Theorems 1, 2)",
            "clients": f"({p.epsilon}, {p.delta})-local DP (Theorem 3), f_C = {self.f_c_used}, m_C = {p.m_c}",
            "noise": NOISE_LABELS.get(self.noise, self.noise),
            "client_variances": "exact" if self.client.variance_exact
            else "approximate (m_C > 1: one client's reports are dependent)",
        }

    def write(self, path: str | Path) -> None:
        """Write by extension: ``.json`` (everything), ``.csv`` or ``.parquet`` (records table)."""
        write_output(path, self.to_json(), self.records_table())


def write_output(path: str | Path, obj: dict[str, Any], table: pa.Table) -> None:
    """``.json`` → ``obj``; ``.csv`` / ``.parquet`` → ``table``; other extensions are refused."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        path.write_text(json.dumps(obj, indent=2, allow_nan=False, default=json_default))
    elif suffix == ".csv":
        import pyarrow.csv as pacsv
        pacsv.write_csv(table, path)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq
        pq.write_table(table, path)
    else:
        raise DataError(f"--output {path}: unknown extension {suffix!r}; use .json, .csv or .parquet")


def query_names(hl: HeadList, queries: Vocabulary) -> list[str]:
    """Name of every query position of the list, ``*`` last."""
    return [*decode_or_placeholder(queries, hl.query_ids), WILDCARD_NAME]


def entry_names(hl: HeadList, queries: Vocabulary, urls: Vocabulary) -> tuple[list[str], list[str]]:
    """(query name, URL name) of every head-list entry; wildcards are ``*``."""
    qn = query_names(hl, queries)
    un = [WILDCARD_NAME] * hl.n_entries
    real = np.flatnonzero(~hl.is_wildcard)
    for e, name in zip(real.tolist(), decode_or_placeholder(urls, hl.entry_url[real]), strict=True):
        un[e] = name
    return [qn[i] for i in hl.entry_query.tolist()], un


def decode_or_placeholder(vocab: Vocabulary, ids: np.ndarray) -> list[str]:
    """Names of ``ids``; an id past the vocabulary's end is a placeholder for a discovered code
    that no record has (dictionary-free local-only, :func:`hybriddp.baselines.local_only.placeholder_ids`)
    and is named ``<no record k>``."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(vocab)
    known = ids < n
    names = vocab.decode(ids[known]) if known.any() else []
    out = iter(names)
    return [next(out) if k else f"<no record {int(i) - n + 1}>" for i, k in zip(ids.tolist(), known.tolist(),
                                                                              strict=True)]


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _table_rows(t: pa.Table) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in t.to_pylist()]


def json_default(o: Any) -> Any:
    """``json.dumps`` default: NumPy scalars as Python numbers."""
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def result_from_run(run: BlenderRun, *, with_metrics: bool = True) -> BlenderResult:
    """Build the result of a simulation, with ground truth and metrics (ALGORITHM.md §9)."""
    cur = run.curator
    hl = run.head_list
    sizes = {
        "users": run.log.n_users, "records": run.log.n_records,
        "optin_users": run.n_users_optin, "optin_users_s": cur.n_users_s, "optin_users_t": cur.n_users_t,
        "clients": run.n_users_clients, "records_s": len(cur.sampled_s), "records_t": len(cur.sampled_t),
        "reports": run.client.n, "head_list_s_records": cur.head_list_s.n_records,
        "head_list_s_queries": cur.head_list_s.n_queries,
    }
    res = BlenderResult(run.params, hl, run.log.queries, run.log.urls, cur.optin, run.client, run.blended,
                        sizes, cur.noise, run.seed, run.log.has_urls, run.f_c_used)
    if with_metrics and run.sampled_c is not None:
        truth, held = ground_truth(run.log, (cur.sampled_s, cur.sampled_t, run.sampled_c))
        res.truth_query, res.truth_record = truth_vectors(hl, truth)
        res.metrics = score(hl, run.blended.records_final, run.blended.queries_final, truth, run.log, held)
    return res

"""One result type for BLENDER and the baselines (ALGORITHM.md §8): tables, metrics, JSON.

A :class:`Result` needs no raw data. ``hybriddp run`` builds one from a simulation (with the
ground truth, so it carries metrics), ``hybriddp estimate`` and the server from the release
documents and report counts (without). BLENDER's results also carry their parts — the opt-in
and client estimates and the blend (:class:`BlendParts`) — so they show all of paper Fig. 9;
a baseline carries only its final estimates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from hybriddp.core.atomic import atomic_path, check_output_path, write_text
from hybriddp.core.headlist import HeadList
from hybriddp.core.jsonfile import json_safe
from hybriddp.core.noise import NOISE_LABELS
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import Vocabulary
from hybriddp.core.rng import SEED_WARNING
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.privacy.guarantees import Guarantee, blender_guarantees, describe
from hybriddp.server.anchor import AnchorCheck
from hybriddp.server.blend import BlendOutput
from hybriddp.server.client_estimates import ClientEstimates

WILDCARD_NAME = "*"
OUTPUT_SUFFIXES = (".json", ".csv", ".parquet")


@dataclass
class BlendParts:
    """BLENDER's intermediate estimates: opt-in (§4), client (§6), their blend (§7) and its anchor check (§7.2;
    None: undefended)."""

    optin: OptinEstimates
    client: ClientEstimates
    blended: BlendOutput
    f_c_used: float
    noise: str
    check: AnchorCheck | None = None


@dataclass
class Result:
    """Final estimates of one algorithm over its head list, with names, sizes, privacy and (in a
    simulation) the truth and metrics.

    ``p_record``/``p_query`` are the final estimates (BLENDER: the blended, projected values).
    ``guarantees`` states the privacy numerically (:mod:`hybriddp.privacy.guarantees`); ``parts`` is set
    for BLENDER only.
    """

    algorithm: str
    params: BlenderParams
    head_list: HeadList
    queries: Vocabulary
    urls: Vocabulary
    p_record: np.ndarray
    p_query: np.ndarray
    url_level: bool
    sizes: dict[str, int]
    guarantees: tuple[Guarantee, ...]
    seed: int | None
    parts: BlendParts | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    truth_query: np.ndarray | None = None  # p_q per listed query (ground truth, simulation only)
    truth_record: np.ndarray | None = None  # p_r per entry (0 for wildcards)

    @classmethod
    def blender(cls, params: BlenderParams, hl: HeadList, queries: Vocabulary, urls: Vocabulary,
                parts: BlendParts, sizes: dict[str, int], seed: int | None, url_level: bool) -> Result:
        """BLENDER's result from its parts (final estimates = the blend)."""
        g = blender_guarantees(params.epsilon, params.delta, parts.f_c_used, params.m_c)
        return cls("blender", params, hl, queries, urls, parts.blended.records_final, parts.blended.queries_final,
                   url_level, sizes, g, seed, parts)

    # ----- BLENDER's parts (an AttributeError for a baseline) ---------------------------------
    @property
    def optin(self) -> OptinEstimates:
        """The opt-in estimates (ALGORITHM.md §4)."""
        return self._parts().optin

    @property
    def client(self) -> ClientEstimates:
        """The client estimates (ALGORITHM.md §6)."""
        return self._parts().client

    @property
    def blended(self) -> BlendOutput:
        """The blend (ALGORITHM.md §7)."""
        return self._parts().blended

    @property
    def noise(self) -> str | None:
        """The curator's noise (``discrete`` or ``laplace``) for BLENDER, else None."""
        return self.parts.noise if self.parts is not None else None

    def _parts(self) -> BlendParts:
        if self.parts is None:
            raise AttributeError(f"the {self.algorithm} result has no BLENDER parts (opt-in/client/blend)")
        return self.parts

    @property
    def n_records(self) -> int:
        """Records in the final head list: ⟨q,u⟩ pairs, or the queries of a log without URLs."""
        return self.head_list.n_records if self.url_level else self.head_list.n_queries

    # ----- names --------------------------------------------------------------------------
    def query_names(self) -> list[str]:
        """Name of every query position, ``*`` last."""
        return query_names(self.head_list, self.queries)

    def entry_names(self) -> tuple[list[str], list[str]]:
        """(query, URL) name of every entry."""
        return entry_names(self.head_list, self.queries, self.urls)

    # ----- tables -------------------------------------------------------------------------
    def client_record_sums(self) -> np.ndarray:
        """Σ_u p̂_C,⟨q,u⟩ per query position (Fig. 9 column 6)."""
        return np.bincount(self.head_list.entry_query, weights=self.client.p_record, minlength=self.head_list.k)

    def records_table(self) -> pa.Table:
        """One row per head-list entry (wildcards included, marked)."""
        q, u = self.entry_names()
        cols: dict[str, Any] = {"query": q, "url": u, "wildcard": self.head_list.is_wildcard}
        if self.parts is None:
            cols["p_estimate"] = self.p_record
        else:
            b, o, c = self.blended, self.optin, self.client
            cols.update({
                "p_blended": b.records_final, "p_blended_raw": b.records.p,
                "var_blended": b.records.var, "weight_optin": b.records.weight_optin,
                "p_optin": o.p_record, "var_optin": o.var_record, "noise_draws": o.draws_record,
                "p_client": c.p_record, "var_client": c.var_record,
            })
            cols.update(interval95(b.records_final, b.records.var))
            cols.update(self._check_columns(self.parts.check, "records"))
        if self.truth_record is not None:
            cols["p_true"] = self.truth_record
        return pa.table(cols)

    def queries_table(self) -> pa.Table:
        """One row per head-list query, ``*`` last (BLENDER: the columns of paper Fig. 9)."""
        cols: dict[str, Any] = {"query": self.query_names()}
        if self.parts is None:
            cols["p_estimate"] = self.p_query
        else:
            b, o, c = self.blended, self.optin, self.client
            cols.update({
                "p_blended": b.queries_final, "p_blended_raw": b.queries.p, "var_blended": b.queries.var,
                "weight_optin": b.queries.weight_optin,
                "p_optin_sum": o.p_query, "var_optin_sum": o.var_query,
                "p_client_direct": c.p_query, "var_client_direct": c.var_query,
                "p_client_sum": self.client_record_sums(),
            })
            cols.update(interval95(b.queries_final, b.queries.var))
            cols.update(self._check_columns(self.parts.check, "queries"))
            if self.parts.check is not None:
                cols["p_rank"] = b.queries_ranking
        if self.truth_query is not None:
            cols["p_true"] = np.append(self.truth_query, np.nan)
        return pa.table(cols)

    @staticmethod
    def _check_columns(check: AnchorCheck | None, level: str) -> dict[str, Any]:
        """The anchor check's columns (ALGORITHM.md §7.2): z against the opt-in estimate, flagged, the bound, whether
        the bound moved the estimate, and the undefended blend."""
        if check is None:
            return {}
        side = check.records if level == "records" else check.queries
        return {"anchor_z": side.z, "flagged": side.flagged, "anchor_bound": side.bound,
                "anchor_kappa": side.kappa, "clamped": side.clamped, "p_undefended": side.undefended}

    def _columns(self) -> dict[str, np.ndarray]:
        if self.parts is None:
            return {"p_estimate": self.p_query}
        return {"p_blended": self.blended.queries_final, "p_optin_sum": self.optin.p_query,
                "p_client_direct": self.client.p_query, "p_client_sum": self.client_record_sums()}

    def figure9(self, top: int = 10) -> list[dict[str, Any]]:
        """Top queries sorted by true p_q (by the final estimate without truth), with regressions.

        A value is a *regression* when it is larger than the value one row above, i.e. out
        of order relative to the true ranking (paper §5, Fig. 9). A baseline has one column,
        ``p_estimate``.
        """
        k = self.head_list.n_queries
        names = self.query_names()
        key = self.truth_query if self.truth_query is not None else self.p_query[:k]
        order = np.argsort(-key, kind="stable")[:top]
        cols = self._columns()
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
        """One JSON object: parameters, guarantee, sizes, metrics, Fig. 9 rows, full tables.

        Never holds NaN or infinity (they become null).
        """
        p = self.params
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "ndcg": self.metrics.get("ndcg"),
            "l1": self.metrics.get("l1"),
            "head_list_records": self.n_records,
            "head_list_queries": self.head_list.n_queries,
            "epsilon": p.epsilon,
            "delta": p.delta,
            "metrics": dict(self.metrics),
            "params": p.to_dict(),
            "privacy": self.guarantee(),
            "sizes": self.sizes,
            "noise": self.noise,
            "seed": self.seed,
            "figure9": self.figure9(),
            "anchor_check": (self.parts.check.summary() if self.parts is not None and self.parts.check is not None
                             else None),
            "queries": self.queries_table().to_pylist(),
            "records": self.records_table().to_pylist(),
        }
        if self.seed is not None:
            out["warning"] = SEED_WARNING
        return json_safe(out)

    def guarantee(self) -> dict[str, Any]:
        """The privacy actually delivered, from :attr:`guarantees` (ALGORITHM.md §2, §5)."""
        out = describe(self.guarantees)
        if self.parts is not None:
            out["noise"] = NOISE_LABELS.get(self.parts.noise, self.parts.noise)
            out["client_variances"] = ("exact" if self.client.variance_exact
                                       else "approximate (m_C > 1: one client's reports are dependent)")
        return out

    def write(self, path: str | Path) -> None:
        """Write by extension: ``.json`` (everything), ``.csv`` or ``.parquet`` (records table)."""
        write_output(path, self.to_json(), self.records_table())


def interval95(p: np.ndarray, var: np.ndarray) -> dict[str, np.ndarray]:
    """p ± 1.96σ cut at [0, 1], the range of a probability, with ``ci95_clipped`` marking a cut interval."""
    half = 1.959963984540054 * np.sqrt(np.where(np.isfinite(var) & (var >= 0), var, np.nan))
    lo, hi = p - half, p + half
    with np.errstate(invalid="ignore"):
        return {"ci95_low": np.clip(lo, 0.0, 1.0), "ci95_high": np.clip(hi, 0.0, 1.0),
                "ci95_clipped": (lo < 0.0) | (hi > 1.0)}


def write_output(path: str | Path, obj: dict[str, Any], table: pa.Table) -> None:
    """``.json`` → ``obj``; ``.csv`` / ``.parquet`` → ``table``; written atomically (temp file + rename)."""
    path = check_output_path(path, "--output", OUTPUT_SUFFIXES)
    suffix = path.suffix.lower()
    if suffix == ".json":
        write_text(path, json.dumps(obj, indent=2, allow_nan=False, default=json_default))
        return
    with atomic_path(path) as tmp:
        if suffix == ".csv":
            import pyarrow.csv as pacsv
            pacsv.write_csv(table, tmp)
        else:
            import pyarrow.parquet as pq
            pq.write_table(table, tmp)


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
    that no record has (dictionary-free local-only, :func:`hybriddp.simulation.baselines.local_only.placeholder_ids`)
    and is named ``<no record k>``."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(vocab)
    known = ids < n
    names = vocab.decode(ids[known]) if known.any() else []
    out = iter(names)
    return [next(out) if k else f"<no record {int(i) - n + 1}>" for i, k in zip(ids.tolist(), known.tolist(),
                                                                              strict=True)]


def json_default(o: Any) -> Any:
    """``json.dumps`` default: NumPy scalars as Python numbers."""
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")



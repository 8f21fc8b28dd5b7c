"""Trends across rounds: which queries rose or fell between consecutive periods (ALGORITHM.md §13).

Input: the published results of a series of rounds, one per period, in time order. Every query listed in two
consecutive periods t − 1 and t gets the test statistic

    z = (p_t − r·p_{t−1}) / sqrt(v_t + r²·v_{t−1})

with p and v the published estimate (``p_blended``) and its published variance (``var_blended``: under the opt-in
anchor, its mean squared error including the bound's cost, ALGORITHM.md §7.2), and r = 1 + c for "rising"
(r = 1/(1 + c) for "falling"), ``c`` the smallest relative change that counts (``min_change``; 0: any change).
Under the null hypothesis "the query changed by less than c" the estimates of the two rounds are independent
(fresh noise each round; the same users in both only make the difference's variance smaller, so the test is
conservative), unbiased (up to the bound's bias, which v counts) and near normal, so z is at most standard normal
at the boundary. One-sided p-values of all (query,
period, direction) tests are corrected together by Benjamini–Hochberg at level ``fdr``: in expectation at most a
fraction ``fdr`` of the trends reported are false (the tests are independent across periods and nearly so
across queries). This is post-processing of published DP outputs and costs no privacy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybriddp.core.errors import DataError, parameter_error

DEFAULT_FDR = 0.05
DEFAULT_WINDOW = 4
"""Periods the trend test pools on each side of a boundary unless told otherwise: the one default of ``hybriddp
trends --window``, ``hybriddp series trends --window``, ``hybriddp experiment trends --window`` and the API's
``GET /api/v1/series/{id}/trends?window=`` (so of the SDK and the series page too, which ask the API for its
default). The trend table's precision and recall in docs/RESULTS.md ("Issue 30", "Trends with issue 40's default")
were measured with it, and it equals the series' default carry (:data:`hybriddp.curator.carry.DEFAULT_CARRY`): a
fall is seen on a whole window after it. The library function :func:`trends` keeps 1 (consecutive periods,
unpooled) for callers that name no window."""


@dataclass(frozen=True)
class PeriodEstimates:
    """One period's published query estimates: names, blended estimates and their variances."""

    label: str
    queries: list[str]
    p: np.ndarray
    var: np.ndarray

    @classmethod
    def from_result(cls, doc: Any, label: str) -> PeriodEstimates:
        """From a result document (``hybriddp run --output x.json``, or a round's published results)."""
        rows = doc.get("queries") if isinstance(doc, dict) else None
        if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
            raise DataError(f"{label}: not a BLENDER result document (no 'queries' table); give the JSON of "
                            "`hybriddp run --output` or of a round's results")
        if "p_blended" not in rows[0] or "var_blended" not in rows[0]:
            raise DataError(f"{label}: its queries have no 'p_blended'/'var_blended' (a baseline's result?); trends "
                            "need BLENDER's estimates with their variances")
        rows = [r for r in rows if r.get("query") is not None and r.get("query") != "*"]
        p = np.array([_number(r.get("p_blended"), label, "p_blended") for r in rows])
        # var_blended is the published estimate's mean squared error, the anchor's bound included (ALGORITHM.md
        # §7.2): the test reads it as it is, nothing else (not the undefended blend, nor the opt-in variance)
        var = np.array([_number(r.get("var_blended"), label, "var_blended") for r in rows])
        return cls(label, [str(r["query"]) for r in rows], p, var)


def _number(x: Any, label: str, field: str) -> float:
    if x is None:
        return math.nan
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise DataError(f"{label}: field {field!r} = {str(x)[:40]!r} is not a number")
    return float(x)


def benjamini_hochberg(p_values: np.ndarray, level: float) -> np.ndarray:
    """Which hypotheses Benjamini–Hochberg rejects at FDR ``level`` (step-up: the largest k with p_(k) ≤ k·level/m)."""
    p = np.asarray(p_values, dtype=float)
    m = p.size
    if m == 0:
        return np.zeros(0, dtype=bool)
    order = np.argsort(p, kind="stable")
    below = p[order] <= level * np.arange(1, m + 1) / m
    k = int(np.flatnonzero(below)[-1]) + 1 if below.any() else 0
    out = np.zeros(m, dtype=bool)
    out[order[:k]] = True
    return out


def _norm_sf(z: np.ndarray) -> np.ndarray:
    """P[N(0,1) > z], accurate in the tail."""
    return 0.5 * np.vectorize(math.erfc, otypes=[float])(np.asarray(z, dtype=float) / math.sqrt(2.0))


@dataclass(frozen=True)
class Trends:
    """Every tested (query, period) change: rows of :meth:`rows`, with the verdicts."""

    periods: list[str]
    query: list[str]
    period: np.ndarray  # index t of the later period (the change is t − 1 → t)
    before: np.ndarray
    after: np.ndarray
    var_before: np.ndarray
    var_after: np.ndarray
    z_rising: np.ndarray
    z_falling: np.ndarray
    rising: np.ndarray
    falling: np.ndarray
    fdr: float
    min_change: float

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for i in range(len(self.query)):
            verdict = "rising" if self.rising[i] else "falling" if self.falling[i] else "steady"
            b, a = float(self.before[i]), float(self.after[i])
            out.append({"query": self.query[i], "from": self.periods[int(self.period[i]) - 1],
                        "to": self.periods[int(self.period[i])], "p_before": b, "p_after": a,
                        "change": (a - b) / b if b > 0 else None, "z_rising": float(self.z_rising[i]),
                        "z_falling": float(self.z_falling[i]), "trend": verdict})
        return out

    def series(self, periods: Sequence[PeriodEstimates], query: str) -> list[tuple[float, float] | None]:
        """(estimate, variance) of ``query`` in each period; None where it was not listed."""
        out: list[tuple[float, float] | None] = []
        for pe in periods:
            i = pe.queries.index(query) if query in pe.queries else -1
            out.append(None if i < 0 else (float(pe.p[i]), float(pe.var[i])))
        return out


def _pooled(periods: Sequence[PeriodEstimates], lo: int, hi: int) -> dict[str, tuple[float, float]]:
    """Per query listed in periods ``lo … hi − 1``: the inverse-variance weighted mean of its estimates there and
    that mean's variance (1 / Σ 1/v)."""
    acc: dict[str, list[tuple[float, float]]] = {}
    for pe in periods[max(lo, 0):hi]:
        ok = np.isfinite(pe.p) & np.isfinite(pe.var) & (pe.var > 0)
        for q, p, v in zip(np.asarray(pe.queries, dtype=object)[ok], pe.p[ok], pe.var[ok], strict=True):
            acc.setdefault(q, []).append((float(p), float(v)))
    out = {}
    for q, pv in acc.items():
        if len(pv) == 1:  # one period: its own numbers, exactly
            out[q] = pv[0]
        else:
            w = sum(1.0 / v for _, v in pv)
            out[q] = (sum(p / v for p, v in pv) / w, 1.0 / w)
    return out


def trends(periods: Sequence[PeriodEstimates], *, fdr: float = DEFAULT_FDR, min_change: float = 0.0,
           window: int = 1) -> Trends:
    """Test every query listed on both sides of each period boundary for a rise and a fall by at least
    ``min_change`` (relative), with Benjamini–Hochberg at ``fdr`` over all the tests (module docstring).

    ``window`` > 1 pools up to ``window`` periods on each side (inverse-variance weighted): a change that lasts
    is √window times clearer, and a detection at t says the ``window`` periods from t differ from the ones
    before, so it locates a step to within ``window`` − 1 periods."""
    if not 0.0 < fdr < 1.0:
        raise parameter_error("fdr (--fdr)", fdr, "a number in (0, 1): the expected share of false trends")
    if not (math.isfinite(min_change) and min_change >= 0.0):
        raise parameter_error("min_change (--min-change)", min_change, "a number >= 0 (0.5: a change by 50% or more)")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise parameter_error("window (--window)", window, "an integer >= 1 (periods pooled on each side)")
    if len(periods) < 2:
        raise DataError(f"trends need at least two periods' results, got {len(periods)}")
    cols: dict[str, list[Any]] = {k: [] for k in ("query", "period", "b", "a", "vb", "va")}
    for t in range(1, len(periods)):
        before, after = _pooled(periods, t - window, t), _pooled(periods, t, t + window)
        for q in (q for q in periods[t].queries if q in before and q in after):
            for key, val in zip(cols, (q, t, before[q][0], after[q][0], before[q][1], after[q][1]), strict=True):
                cols[key].append(val)
    b, a = np.array(cols["b"], dtype=float), np.array(cols["a"], dtype=float)
    vb, va = np.array(cols["vb"], dtype=float), np.array(cols["va"], dtype=float)
    up, down = 1.0 + min_change, 1.0 / (1.0 + min_change)
    z_up = (a - up * b) / np.sqrt(va + up * up * vb)
    z_down = (down * b - a) / np.sqrt(va + down * down * vb)
    reject = benjamini_hochberg(np.concatenate([_norm_sf(z_up), _norm_sf(z_down)]), fdr)
    n = len(b)
    return Trends([pe.label for pe in periods], cols["query"], np.array(cols["period"], dtype=np.int64), b, a, vb,
                  va, z_up, z_down, reject[:n], reject[n:], fdr, min_change)


def trend_document(periods: Sequence[PeriodEstimates], found: Trends, window: int = 1,
                   most: int = 24) -> dict[str, Any]:
    """The analysis as JSON (``hybriddp trends --json``, ``GET /api/v1/series/{id}/trends``): the settings, every
    tested change, and per query found rising or falling (at most ``most``) its estimate and standard deviation in
    each period (null where it was not listed), for charts."""
    rows = found.rows()
    names = list(dict.fromkeys(q for q, up, down in zip(found.query, found.rising, found.falling, strict=True)
                               if up or down))[:most]
    charts = {q: [None if s is None else [s[0], math.sqrt(max(s[1], 0.0))] for s in found.series(periods, q)]
              for q in names}
    return {"periods": found.periods, "fdr": found.fdr, "min_change": found.min_change, "window": window,
            "tested": len(rows), "rising": sum(r["trend"] == "rising" for r in rows),
            "falling": sum(r["trend"] == "falling" for r in rows), "changes": rows, "series": charts}

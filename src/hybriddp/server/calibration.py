"""Calibration of the blended estimates by Monte Carlo: bias and reported variance (ALGORITHM.md §7, §7.1).

Rounds are drawn straight from the estimators' sampling laws, independently of their formulas: multinomial
counts of T (and S) with Laplace noise for the opt-in group (§4, §4.1), multinomial report counts under
LocalAlg's exact report distribution for the clients (§5, §6). Each round is blended, and per entry the
bias (as a z-score over the rounds) and the ratio of the mean reported variance to the empirical mean
squared error are reported. Used by the tests and by ``benchmarks/blend_calibration.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hybriddp.core.estimators import Blend, estimator_named
from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import LaplaceNoise
from hybriddp.core.params import head_list_scale
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.server.blend import blend_strategy
from hybriddp.server.client_estimates import ClientEstimates, estimate_client_probabilities
from hybriddp.server.consistency import make_consistent
from hybriddp.server.weights import Blended


def six_queries() -> tuple[HeadList, np.ndarray]:
    """The calibration list: six queries, 20 entries (URLs, each query's ⟨q,*⟩, and ⟨*,*⟩), with a known
    distribution p decreasing along the list, so the ⟨q,*⟩ of the last queries and ⟨*,*⟩ are the smallest.
    Every query has a real URL: EstimateOptinProbabilities drops queries that keep none (ALGORITHM.md §4)."""
    hl = HeadList.from_lists(list(range(6)), [[1, 2, 3], [4], [12], [5, 6, 7, 8, 9], [13], [10, 11]])
    w = np.linspace(3.0, 0.5, hl.n_entries) ** 2
    return hl, w / w.sum()


def optin_estimates(hl: HeadList, p_record: np.ndarray, n_t: int, n_s: int, epsilon: float) -> OptinEstimates:
    """Opt-in estimates of ``hl`` at ``p_record`` with their variances there: every real record reuses S when
    ``n_s`` > 0 (J = 2, |D_S| + |D_T| records), the wildcards are T's (§4.1); Laplace noise, m_O = 1."""
    reused = ~hl.is_wildcard if n_s else None
    draws = np.where(hl.is_wildcard | (n_s == 0), 1, 2)
    p_query = np.bincount(hl.entry_query, weights=p_record)
    var_y = LaplaceNoise(np.random.default_rng(0)).variance(head_list_scale(epsilon, 1))
    est = OptinEstimates(hl, p_record, p_record, draws, p_query, p_query, np.bincount(hl.entry_query, weights=draws),
                         n_t, var_y, reused, n_s, np.where(hl.is_wildcard, np.nan, 0.0) if n_s else None)
    est.var_record, est.var_query = est.variances_at(p_record, p_query)
    return est


def draw_rounds(hl: HeadList, p: np.ndarray, lp: LocalAlgParams, *, n_t: int, n_s: int, n_c: int, epsilon: float,
                trials: int, rng: np.random.Generator) -> tuple[list[OptinEstimates], list[ClientEstimates]]:
    """``trials`` independent rounds at the true entry distribution ``p``: opt-in estimates (S reused when
    ``n_s`` > 0) and client estimates from ``n_c`` reports."""
    b = head_list_scale(epsilon, 1)
    c_t = rng.multinomial(n_t, p, size=trials) + rng.laplace(0.0, b, (trials, hl.n_entries))
    if n_s:
        c_s = rng.multinomial(n_s, p, size=trials) + rng.laplace(0.0, b, (trials, hl.n_entries))
        p_o = np.where(hl.is_wildcard, c_t / n_t, (c_t + c_s) / (n_t + n_s))
    else:
        p_o = c_t / n_t
    reports = rng.multinomial(n_c, p @ output_distribution(lp), size=trials)
    return ([optin_estimates(hl, row, n_t, n_s, epsilon) for row in p_o],
            [estimate_client_probabilities(row, hl, lp) for row in reports])


@dataclass
class Calibration:
    """Per entry (records) and per query, over the rounds: estimates, reported variances and the truth."""

    p_record: np.ndarray  # the truth
    p_query: np.ndarray
    records: np.ndarray  # rounds × entries
    var_records: np.ndarray
    queries: np.ndarray  # rounds × queries
    var_queries: np.ndarray

    def z(self, level: str = "records") -> np.ndarray:
        """Mean error over its standard error, per entry (or query)."""
        err = self._err(level)
        return err.mean(0) / (err.std(0, ddof=1) / math.sqrt(len(err)))

    def relative_bias(self, level: str = "records") -> np.ndarray:
        """Mean error over the root mean squared error, per entry (or query): the bias in units of the error
        it rides on. A z-test over n rounds flags it at |z| ≥ 3 once it exceeds about 3/√n."""
        err = self._err(level)
        return err.mean(0) / np.sqrt((err**2).mean(0))

    def variance_ratio(self, level: str = "records") -> np.ndarray:
        """Mean reported variance over the empirical mean squared error, per entry (or query)."""
        var = self.var_records if level == "records" else self.var_queries
        return var.mean(0) / (self._err(level) ** 2).mean(0)

    def mse(self, level: str = "records") -> float:
        """Total mean squared error over the entries (or queries)."""
        return float((self._err(level) ** 2).mean(0).sum())

    def _err(self, level: str) -> np.ndarray:
        return self.records - self.p_record if level == "records" else self.queries - self.p_query


def calibrate(hl: HeadList, p: np.ndarray, lp: LocalAlgParams, estimators: tuple[str, ...], *, n_t: int, n_s: int,
              n_c: int, epsilon: float, trials: int, seed: int) -> dict[str, Calibration]:
    """Blend ``trials`` seeded rounds with the blend strategy of each of ``estimators`` (unprojected). The consistent
    blend is computed from the same round's pooled blend when that was asked for first (it is that blend made
    consistent, §7.1)."""
    opts, clis = draw_rounds(hl, p, lp, n_t=n_t, n_s=n_s, n_c=n_c, epsilon=epsilon, trials=trials,
                             rng=np.random.default_rng(seed))
    shape_r, shape_q = (trials, hl.n_entries), (trials, hl.k)
    out = {e: Calibration(p, np.bincount(hl.entry_query, weights=p), np.zeros(shape_r), np.zeros(shape_r),
                          np.zeros(shape_q), np.zeros(shape_q)) for e in estimators}
    for i, (opt, cli) in enumerate(zip(opts, clis, strict=True)):
        done: dict[Blend, tuple[Blended, Blended]] = {}
        for e in estimators:
            strategy = estimator_named(e).blend
            if strategy is Blend.CONSISTENT and Blend.POOLED in done:
                rec, qry = make_consistent(opt, cli, lp, *done[Blend.POOLED])
            else:
                b = blend_strategy(strategy, opt, cli, False, lp=lp)
                rec, qry = b.records, b.queries
            done[strategy] = (rec, qry)
            c = out[e]
            c.records[i], c.var_records[i], c.queries[i], c.var_queries[i] = rec.p, rec.var, qry.p, qry.var
    return out

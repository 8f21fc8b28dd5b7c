"""The opt-in estimates the curator publishes and their variances (ALGORITHM.md §4, §4.1; Theorem 4 corrected):
the curator's interface to the server, which blends them (§7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybriddp.core.headlist import HeadList
from hybriddp.curator.kept import KeptCount


@dataclass
class OptinEstimates:
    """Output of EstimateOptinProbabilities (ALGORITHM.md §4): the final HL and its estimates.

    Arrays indexed by entry of ``head_list`` (record level) or by query position (query
    level); ``draws_*`` is J, the number of noise draws an estimate sums. ``reused`` marks the
    records whose estimate also counts S (ALGORITHM.md §4.1; None: none does), whose |D_S| is ``n_s``;
    ``kept`` is the correction their S counts got for having passed τ (None: pooled as released, §4.1).
    """

    head_list: HeadList
    p_record: np.ndarray
    var_record: np.ndarray
    draws_record: np.ndarray
    p_query: np.ndarray
    var_query: np.ndarray
    draws_query: np.ndarray
    n: int  # |D_T|
    noise_variance: float  # variance of one draw, Var(Y)
    reused: np.ndarray | None = None
    n_s: int = 0  # |D_S|, when records reuse S
    s_counts: np.ndarray | None = None  # curator only: S's released count per final entry (NaN: none)
    kept: KeptCount | None = None

    def variances_at(self, p_record: np.ndarray, p_query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """σ̂²_O of every record and query evaluated at the given probabilities: the estimates' own
        for the release, a blend for the pooled weights (ALGORITHM.md §4, §4.1, §7)."""
        return self.record_variances_at(p_record), self.query_variances_at(p_query, p_record)

    def record_variances_at(self, p_record: np.ndarray) -> np.ndarray:
        """σ̂²_O of every record at ``p_record``; elementwise, so the last axis is the entries and any
        leading axes broadcast (ALGORITHM.md §4, §4.1)."""
        n = self.n if self.reused is None else np.where(self.reused, self.n + self.n_s, self.n)
        return optin_variance(p_record, self.draws_record, n, self.noise_variance) + self._excess(p_record)

    def _excess(self, p_record: np.ndarray) -> np.ndarray | float:
        """What correcting S's counts for τ adds to each record's variance (0 without the correction; §4.1):
        Var(X̃ | kept) − Var X at ``p_record``, over (|D_S| + |D_T|)², on the reused records."""
        if self.kept is None or self.reused is None:
            return 0.0
        n = self.n + self.n_s
        return np.where(self.reused, self.kept.excess(p_record), 0.0) / (n * n)

    def _excess_estimates(self) -> np.ndarray | None:
        """The same excess estimated from each reused record's released count, r(X)/(|D_S| + |D_T|)²
        (:meth:`KeptCount.excess_estimate`, unbiased given listing; ALGORITHM.md §4.1, "Reported variance"); None
        when the counts are not known here (or S's counts were not corrected)."""
        if self.kept is None or self.reused is None or self.s_counts is None:
            return None
        n = self.n + self.n_s
        x = np.where(self.reused, np.nan_to_num(self.s_counts), self.kept.threshold + 1.0)  # any released value
        return np.where(self.reused, self.kept.excess_estimate(x), 0.0) / (n * n)

    def reported_variances_at(self, p_record: np.ndarray, p_query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The opt-in variances the reported error spreads the opt-in estimates by (ALGORITHM.md §4.1, "Reported
        variance"; §7, "Reported variance"), records then queries, at 1-D ``p_record`` and ``p_query``: those of
        :meth:`variances_at` with each reused record's excess estimated from its released count, r(X), in place
        of the excess at ``p_record`` (which is what the weights use). A query adds its records' r(X). Without the
        released counts, :meth:`variances_at`."""
        r = self._excess_estimates()
        if r is None:
            return self.variances_at(p_record, p_query)
        hl = self.head_list
        n = np.where(self.reused, self.n + self.n_s, self.n)
        rec = optin_variance(p_record, self.draws_record, n, self.noise_variance) + r
        qry = reuse_query_variances(p_record, p_query, self.draws_record, self.reused, hl.entry_query, self.n,
                                    self.n_s, self.noise_variance)
        return rec, qry + np.bincount(hl.entry_query, weights=r, minlength=hl.k)

    def query_variances_at(self, p_query: np.ndarray, p_record: np.ndarray) -> np.ndarray:
        """σ̂²_O of every query at ``p_query`` (last axis: queries; leading axes broadcast), with the records
        at ``p_record`` (1-D) where a query's variance also depends on its records' (reused S, §4.1)."""
        if self.reused is None:
            return optin_variance(p_query, self.draws_query, self.n, self.noise_variance)
        pooled = reuse_query_variances(p_record, p_query, self.draws_record, self.reused, self.head_list.entry_query,
                                       self.n, self.n_s, self.noise_variance)
        if self.kept is None:
            return pooled
        hl = self.head_list
        return pooled + np.bincount(hl.entry_query, weights=self._excess(p_record), minlength=hl.k)


def optin_variance(p: np.ndarray, draws: np.ndarray, n: int | np.ndarray, noise_variance: float) -> np.ndarray:
    """σ̂²_O = p̂(1−p̂)/(n−1) + J·Var(Y)/(n(n−1))  (Theorem 4 corrected, ALGORITHM.md §4).

    With Laplace noise Var(Y) = 2b², ALGORITHM.md's 2·J·b²/(|D_T|(|D_T|−1)). p̂ is clamped into
    [0, 1] inside p(1−p) only. Fewer than 2 records give an infinite variance (no data). ``n`` may
    be one size per estimate (a record that reuses S counts |D_S| + |D_T| records, §4.1).
    """
    n_arr = np.broadcast_to(np.asarray(n, dtype=np.float64), np.shape(p))
    pc = np.clip(p, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = pc * (1.0 - pc) / (n_arr - 1) + draws * noise_variance / (n_arr * (n_arr - 1))
    return np.where(n_arr < 2, np.inf, var)


def reuse_query_variances(p_record: np.ndarray, p_query: np.ndarray, draws: np.ndarray, reused: np.ndarray,
                          entry_query: np.ndarray, n_t: int, n_s: int, noise_variance: float) -> np.ndarray:
    """Query variances when some records pool S and T (ALGORITHM.md §4.1).

    A reused record is (N_S + N_T + Y_S + Y_T)/n with n = |D_S| + |D_T| (its J counts both draws;
    its variance is :meth:`OptinEstimates.record_variances_at`); every other entry is a T estimate
    over |D_T|. A query sums P₁ (its reused records: one sample of
    n records) and P₂ (its other entries: T only), which share T's multinomial:
    Var = P₁(1−P₁)/(n−1) + P₂(1−P₂)/(|D_T|−1) − 2P₁P₂/n + the noise terms, with P₂ = p̂_q − P₁.
    ``p_query`` may have leading axes (``p_record`` is 1-D): they broadcast.
    """
    n = n_t + n_s
    k = np.shape(p_query)[-1]
    p1 = np.clip(np.bincount(entry_query, weights=np.where(reused, np.clip(p_record, 0.0, 1.0), 0.0),
                             minlength=k), 0.0, 1.0)
    p2 = np.clip(np.clip(p_query, 0.0, 1.0) - p1, 0.0, 1.0)
    j1 = np.bincount(entry_query, weights=np.where(reused, draws, 0), minlength=k)
    j2 = np.bincount(entry_query, weights=np.where(reused, 0, draws), minlength=k)
    pooled = optin_variance(p1, j1, n, noise_variance) - 2.0 * p1 * p2 / n
    return pooled + optin_variance(p2, j2, n_t, noise_variance)

"""EstimateClientProbabilities: denoising the clients' reports (ALGORITHM.md §6, Fig. 5, Obs. 1).

Works on report counts per head-list entry (a ``bincount``), so it costs O(|HL|) whatever the
number of clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybriddp.core.headlist import HeadList
from hybriddp.core.reportlaw import LocalAlgParams


@dataclass
class ClientEstimates:
    """p̂_C and σ̂²_C per entry (records) and per query position (direct query estimates)."""

    p_record: np.ndarray
    var_record: np.ndarray
    p_query: np.ndarray
    var_query: np.ndarray
    n: int
    variance_exact: bool  # False when m_C > 1: a client's reports are dependent (ALGORITHM.md §6)


def estimate_client_probabilities(
    report_counts: np.ndarray, hl: HeadList, lp: LocalAlgParams, m_c: int = 1
) -> ClientEstimates:
    """Unbiased p̂_C and delta-method σ̂²_C from report counts (ALGORITHM.md §6).

    With a = (kt − 1)/(k − 1):
      p̂_C,q = (r̂_q − (1−t)/(k−1))/a;  σ̂²_C,q = r̂_q(1−r̂_q)/((n−1)a²);
      D_q = t(t_q − (1−t_q)/(k_q−1));
      p̂_C,⟨q,u⟩ = (r̂_⟨q,u⟩ − t(1−t_q)/(k_q−1)·p̂_C,q − (1−t)(1−p̂_C,q)/((k−1)k_q))/D_q;
      σ̂²_C,⟨q,u⟩ = [r̂(1−r̂)/(n−1) + c²σ̂²_C,q + 2c·r̂(1−r̂_q)/((n−1)a)]/D_q²  (Erratum form),
      c = (1−t)/((k−1)k_q) − t(1−t_q)/(k_q−1).
    Entries with k_q = 1 take the query's estimate and variance. k = 1: p̂ = 1, variance 0.
    No reports (n = 0): estimates 0 with infinite variance, so blending gives them weight 0.
    """
    counts = np.asarray(report_counts)
    n = int(counts.sum())
    k = lp.k
    entry_q = hl.entry_query
    if k == 1:
        return ClientEstimates(np.ones(1), np.zeros(1), np.ones(1), np.zeros(1), n, m_c == 1)
    if n < 2:
        inf_r, inf_q = np.full(hl.n_entries, np.inf), np.full(k, np.inf)
        return ClientEstimates(np.zeros(hl.n_entries), inf_r, np.zeros(k), inf_q, n, m_c == 1)
    r_rec = counts / n
    r_q = np.bincount(entry_q, weights=counts) / n  # length k: the last entry is ⟨*,*⟩ of query k − 1
    g = _Geometry(hl, lp)
    p_q = (r_q - (1.0 - g.t) / (k - 1)) / g.a
    pq_e = p_q[entry_q]
    p_rec = (r_rec - g.other_url * pq_e - g.other_query * (1.0 - pq_e)) / g.d_q
    p_rec = np.where(g.multi, p_rec, pq_e)
    var_rec, var_q = g.variances(r_rec, r_q, n)
    return ClientEstimates(p_rec, var_rec, p_q, var_q, n, m_c == 1)


def client_variances(p_record: np.ndarray, p_query: np.ndarray, hl: HeadList, lp: LocalAlgParams,
                     n: int) -> tuple[np.ndarray, np.ndarray]:
    """σ²_C of records and queries evaluated at probabilities ``p_record``, ``p_query`` (not at the
    clients' own estimates): the formulas of :func:`estimate_client_probabilities` at the report
    frequencies those probabilities imply, r_q = a·p_q + (1−t)/(k−1) and
    r_⟨q,u⟩ = D_q·p_⟨q,u⟩ + t(1−t_q)/(k_q−1)·p_q + (1−t)(1−p_q)/((k−1)k_q) (ALGORITHM.md §6). At the
    clients' own estimates this gives back their estimated variances exactly. Elementwise: the last axis is
    the entries (queries), and leading axes of either argument broadcast."""
    k = lp.k
    if k == 1:
        return np.zeros(1), np.zeros(1)
    if n < 2:
        return np.full(hl.n_entries, np.inf), np.full(k, np.inf)
    g = _Geometry(hl, lp)
    r_rec, r_q = g.frequencies(p_record, p_query)
    return g.variances(r_rec, r_q, n)


class _Geometry:
    """The constants of LocalAlg's report distribution per entry (ALGORITHM.md §6)."""

    def __init__(self, hl: HeadList, lp: LocalAlgParams) -> None:
        k, t = lp.k, lp.t
        self.k, self.t, self.entry_q = k, t, hl.entry_query
        self.a = (k * t - 1.0) / (k - 1)
        kq = lp.kq[self.entry_q]
        tq = lp.tq[self.entry_q]
        self.multi = kq > 1
        # entries with k_q = 1 take the query's estimate; for them k_q − 1 is read as 1 and D_q = t > 0
        # (t_q = 1), so the formulas stay finite
        kq1 = np.maximum(kq - 1.0, 1.0)
        self.d_q = t * (tq - (1.0 - tq) / kq1)
        self.other_url = t * (1.0 - tq) / kq1
        self.other_query = (1.0 - t) / ((k - 1) * kq)
        self.c = self.other_query - self.other_url  # p̂_C,⟨q,u⟩ = (r̂ − other_query + c·p̂_C,q)/D_q

    def frequencies(self, p_record: np.ndarray, p_query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The report frequencies (clamped into [0, 1]) that record and query probabilities imply:
        r_q = a·p_q + (1−t)/(k−1), r_⟨q,u⟩ = D_q·p_⟨q,u⟩ + other_url·p_q + other_query·(1 − p_q) (ALGORITHM.md §6).
        Elementwise over the last axis; leading axes broadcast."""
        p_query = np.asarray(p_query, dtype=np.float64)
        r_q = self.a * p_query + (1.0 - self.t) / (self.k - 1)
        pq_e = p_query[..., self.entry_q]
        r_rec = (self.d_q * np.asarray(p_record, dtype=np.float64) + self.other_url * pq_e
                 + self.other_query * (1.0 - pq_e))
        return np.clip(r_rec, 0.0, 1.0), np.clip(r_q, 0.0, 1.0)

    def variances(self, r_rec: np.ndarray, r_q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Delta-method σ²_C of records and queries at report frequencies ``r_rec``, ``r_q``."""
        a = self.a
        var_q = r_q * (1.0 - r_q) / ((n - 1) * a * a)
        varq_e, rq_e = var_q[..., self.entry_q], r_q[..., self.entry_q]
        c = self.c
        var_rec = (r_rec * (1.0 - r_rec) / (n - 1) + c * c * varq_e
                   + 2.0 * c * r_rec * (1.0 - rq_e) / ((n - 1) * a)) / (self.d_q * self.d_q)
        return np.where(self.multi, var_rec, varq_e), var_q

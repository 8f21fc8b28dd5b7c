"""EstimateClientProbabilities: denoising the clients' reports (ALGORITHM.md §6, Fig. 5, Obs. 1).

Works on report counts per head-list entry (a ``bincount``), so it costs O(|HL|) whatever the
number of clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybriddp.headlist import HeadList
from hybriddp.randomizer import LocalAlgParams


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
    t = lp.t
    r_rec = counts / n
    r_q = np.bincount(entry_q, weights=counts) / n  # length k: the last entry is ⟨*,*⟩ of query k − 1
    a = (k * t - 1.0) / (k - 1)
    p_q = (r_q - (1.0 - t) / (k - 1)) / a
    var_q = r_q * (1.0 - r_q) / ((n - 1) * a * a)

    kq = lp.kq[entry_q]
    tq = lp.tq[entry_q]
    pq_e, varq_e, rq_e = p_q[entry_q], var_q[entry_q], r_q[entry_q]
    multi = kq > 1
    # entries with k_q = 1 take the query's estimate below; for them k_q − 1 is read as 1 and D_q = t > 0
    # (t_q = 1), so the formulas stay finite
    kq1 = np.maximum(kq - 1.0, 1.0)
    d_q = t * (tq - (1.0 - tq) / kq1)
    other_url = t * (1.0 - tq) / kq1
    other_query = (1.0 - t) / ((k - 1) * kq)
    p_rec = (r_rec - other_url * pq_e - other_query * (1.0 - pq_e)) / d_q
    c = other_query - other_url
    var_rec = (r_rec * (1.0 - r_rec) / (n - 1) + c * c * varq_e
               + 2.0 * c * r_rec * (1.0 - rq_e) / ((n - 1) * a)) / (d_q * d_q)
    p_rec = np.where(multi, p_rec, pq_e)
    var_rec = np.where(multi, var_rec, varq_e)
    return ClientEstimates(p_rec, var_rec, p_q, var_q, n, m_c == 1)

"""LocalAlg's constants per head list and its report law P[report | record] in closed form (ALGORITHM.md §5,
Fig. 6): what the server's client estimates unbias with (§6), the simulations randomize with, and the exact
privacy test (Theorem 3) checks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybriddp.core.headlist import HeadList
from hybriddp.core.protocol import thresholds


@dataclass(frozen=True)
class LocalAlgParams:
    """Per-head-list constants of LocalAlg (Fig. 6 lines 1-5)."""

    k: int
    kq: np.ndarray  # int64, shape (k,)
    t: float
    tq: np.ndarray  # float64, shape (k,)
    one_minus_t: float
    one_minus_tq: np.ndarray

    @classmethod
    def build(cls, hl: HeadList, epsilon: float, delta: float, f_c: float, m_c: int) -> LocalAlgParams:
        """Thresholds from the shared pure-Python code, so device and batch agree exactly."""
        return cls.of_shape(hl.kq, epsilon, delta, f_c, m_c)

    @classmethod
    def of_shape(cls, kq: np.ndarray, epsilon: float, delta: float, f_c: float, m_c: int) -> LocalAlgParams:
        """The same from the head list's shape alone: ``kq``, the URLs per query (wildcards included, ⟨*,*⟩ last)."""
        kq = np.asarray(kq, dtype=np.int64)
        t, tq = thresholds(len(kq), kq.tolist(), epsilon, delta, f_c, m_c)
        return cls(len(kq), kq, t, np.array(tq), 1.0 - t, np.array([1.0 - x for x in tq]))




def output_distribution(lp: LocalAlgParams) -> np.ndarray:
    """P[report entry j | record entry i] as an (n_entries × n_entries) matrix (ALGORITHM.md §5).

    * q' ≠ q: (1−t)/(k−1) · 1/k_{q'};
    * q' = q, u' = u: t·t_q;   q' = q, u' ≠ u: t·(1−t_q)/(k_q−1).
    """
    kq = lp.kq
    k = lp.k
    n = int(kq.sum())
    if k == 1:
        return np.ones((1, 1))
    entry_q = np.repeat(np.arange(k), kq)
    P = np.repeat(((1.0 - lp.t) / (k - 1) / kq[entry_q])[None, :], n, axis=0)
    same = entry_q[:, None] == entry_q[None, :]
    kq_row = kq[entry_q][:, None]
    tq_row = lp.tq[entry_q][:, None]
    other_url = lp.t * (1.0 - tq_row) / np.maximum(kq_row - 1, 1)  # k_q = 1: only the diagonal, set below
    P = np.where(same, np.broadcast_to(other_url, P.shape), P)
    P[np.arange(n), np.arange(n)] = lp.t * lp.tq[entry_q]
    return P


def privacy_loss_delta(P: np.ndarray, epsilon: float) -> float:
    """The smallest δ with P[L(x)∈Y] ≤ e^ε·P[L(x')∈Y] + δ for all x, x', Y (exact).

    For a pair (x, x') the worst Y is {y : P[y|x] > e^ε P[y|x']}, giving the hockey-stick
    divergence Σ_y max(0, P[y|x] − e^ε P[y|x']); the maximum over pairs is returned.
    """
    e = np.exp(epsilon)
    worst = 0.0
    for i in range(P.shape[0]):
        div = np.maximum(P[i][None, :] - e * P, 0.0).sum(axis=1)
        worst = max(worst, float(div.max()))
    return worst

"""Tail probabilities of the anchor's test statistic (ALGORITHM.md §7.2, "P-values"): the standard normal's, and
the normal–Laplace sum's that the opt-in estimates' curator noise makes it. Used by the test
(:mod:`hybriddp.server.anchor`) and by the bound's cost (:mod:`hybriddp.server.clamp`)."""

from __future__ import annotations

import math

import numpy as np

_ERFC = np.frompyfunc(math.erfc, 1, 1)


def normal_laplace_p(z: np.ndarray, noise_share: np.ndarray) -> np.ndarray:
    """P(|X| ≥ |z|) for X = G + L with unit variance: G normal with variance 1 − f, L Laplace with variance f
    (``noise_share``). The opt-in estimates carry the curator's (discrete) Laplace noise, whose tail is heavier than
    a normal's: where it dominates (an entry whose count is near 0), a normal p-value would flag honest rounds far
    more often than α. One Laplace of the noise's whole variance has a heavier tail than the sum of the J draws an
    estimate holds, so this is conservative. Closed form (the normal–Laplace law), for t ≥ 0 with s² = 1 − f and
    b = √(f/2): P(X > t) = Φ̄(t/s) + ½[e^{s²/(2b²) − t/b}·Φ̄(s/b − t/s) − e^{s²/(2b²) + t/b}·Φ̄(s/b + t/s)]."""
    t = np.abs(np.asarray(z, dtype=np.float64))
    f = np.clip(np.asarray(noise_share, dtype=np.float64), 0.0, 1.0)
    out = two_sided_p(t)
    mixed = np.isfinite(t) & (f > 1e-12)
    if not mixed.any():
        return out
    t, f = t[mixed], f[mixed]
    s = np.sqrt(np.maximum(1.0 - f, 1e-300))
    b = np.sqrt(f / 2.0)
    a0 = s * s / (2.0 * b * b)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        upper = 0.5 * two_sided_p(t / s) + 0.5 * (_exp_tail(a0 - t / b, s / b - t / s)
                                                 - _exp_tail(a0 + t / b, s / b + t / s))
    laplace = np.exp(-t / b)  # s → 0: the Laplace tail itself, 2 · ½e^{−t/b}
    out[mixed] = np.clip(np.where(s < 1e-6, laplace, 2.0 * upper), 0.0, 1.0)
    return out


def _exp_tail(a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """e^a·Φ̄(c) without overflow: directly for c < 5, else by the Mills ratio,
    Φ̄(c) ≈ φ(c)/c·(1 − 1/c² + 3/c⁴), i.e. e^{a − c²/2}/(c√(2π))·(…)."""
    direct = np.exp(np.minimum(a, 700.0)) * 0.5 * _ERFC(np.clip(c, -40.0, 40.0) / math.sqrt(2.0)).astype(np.float64)
    cc = np.maximum(c, 5.0)
    mills = np.exp(np.minimum(a - cc * cc / 2.0, 700.0)) / (cc * math.sqrt(2.0 * math.pi)) * (
        1.0 - 1.0 / cc**2 + 3.0 / cc**4)
    return np.where(c < 5.0, direct, mills)


def two_sided_p(z: np.ndarray) -> np.ndarray:
    """P(|Z| ≥ |z|) for a standard normal Z (NaN stays NaN)."""
    z = np.asarray(z, dtype=np.float64)
    out = np.full(z.shape, np.nan)
    ok = np.isfinite(z)
    out[ok] = _ERFC(np.abs(z[ok]) / math.sqrt(2.0)).astype(np.float64)
    return out

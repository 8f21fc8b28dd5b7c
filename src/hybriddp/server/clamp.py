"""What the opt-in anchor's bound costs an honest estimate, and the bound chosen per round from it (ALGORITHM.md §7.2,
"The bound, chosen per round" and "Honest error bars").

The bound publishes p̂ = p̂_O + clip(D, −κs, κs) = blend − ψ_κ(D), D = blend − p̂_O, ψ_κ(D) = D − clip(D, ±κs). On honest
data, with the opt-in error e_O = N_O + L (sampling, normal; the curator's Laplace noise L, variance ν), the clients'
e_C normal and the inverse-variance weight w = σ²_C/σ²_D, the error of the published estimate is e_B − ψ_κ(D). In units
of s (the standard deviation of D), X = D/s = u + ℓ, u normal with variance 1 − f, ℓ Laplace with variance f, the
noise share f = ν/σ²_D (the anchor's test takes the same law, :func:`~hybriddp.server.anchor.normal_laplace_p`).
Conditioning the blend's error on (u, ℓ) (the rest is independent of both) and Stein's identity for u give

    MSE = σ²_B·(1 − 2·H_f(κ)) + s²·G_f(κ),
    G_f(κ) = E[(|X| − κ)₊²],   H_f(κ) = f·P(|X| > κ) − E[ℓ·ψ_κ(X)]   (X in units of s, ψ_κ(x) = x − clip(x, ±κ)).

The estimate is unbiased (ψ_κ is odd, X symmetric). With no noise (f = 0) H = 0 and the blend's error is independent
of D; with noise, a large D is partly a large noise draw that the blend carries too (H < 0), which the clamp makes
worse. G_0(κ) = 2[(1 + κ²)Φ̄(κ) − κφ(κ)]; G_1(κ) = e^{−√2κ}; H_1(κ) = −(κ/√2)·e^{−√2κ}.

:func:`round_kappa` takes the smallest κ with (s²/σ²_B)·G_f(κ) − 2·H_f(κ) ≤ c: the bound adds at most a share c of the
blend's own variance, tight where the opt-in group carries the weight and loose where the devices do.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from hybriddp.server.tails import normal_laplace_p

KAPPA_STEP = 0.01
"""The κ grid's step (0 to :data:`KAPPA_MAX`)."""
KAPPA_MAX = 12.0
SHARE_STEP = 0.02
"""The noise-share grid's step (0 to 1); a share between two grid points takes the upper one (the heavier tail)."""
_KAPPA = np.arange(0.0, KAPPA_MAX + KAPPA_STEP / 2, KAPPA_STEP)


def _ndtr(x: np.ndarray) -> np.ndarray:
    """Φ(x), vectorized: erfc by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7), enough for the tables."""
    z = np.abs(x) / math.sqrt(2.0)
    k = 1.0 / (1.0 + 0.3275911 * z)
    poly = k * (0.254829592 + k * (-0.284496736 + k * (1.421413741 + k * (-1.453152027 + k * 1.061405429))))
    erfc = poly * np.exp(-z * z)
    return np.where(x >= 0, 1.0 - 0.5 * erfc, 0.5 * erfc)


@functools.cache
def _row(r: int) -> tuple[np.ndarray, np.ndarray]:
    """(G_f, H_f) on the κ grid for the noise share f = r·:data:`SHARE_STEP` (module docstring), by the trapezoid
    rule: G from the tail, ∫_κ^∞ 2(x − κ)·P(|X| > x) dx on [0, 40]; E[ℓ·ψ_κ(X)] over the Laplace ℓ on [0, 40 scales]
    (steps of 0.06 scales, 0.02 for the pure Laplace) with the normal part integrated in closed form."""
    f = min(r * SHARE_STEP, 1.0)
    x = np.arange(0.0, 40.0 + 0.0025, 0.005)
    tail = normal_laplace_p(x, np.full(x.shape, f))
    a = np.concatenate([np.cumsum(((x * tail)[1:] + (x * tail)[:-1])[::-1] * 0.0025)[::-1], [0.0]])
    b = np.concatenate([np.cumsum((tail[1:] + tail[:-1])[::-1] * 0.0025)[::-1], [0.0]])
    g = np.interp(_KAPPA, x, np.maximum(2.0 * (a - x * b), 0.0))
    if f == 0.0:
        return g, np.zeros_like(_KAPPA)
    beta, sd = math.sqrt(f / 2.0), math.sqrt(1.0 - f)
    step = 0.02 if sd < 1e-9 else 0.06  # the pure Laplace's integrand has a kink at κ; else smooth (error < 1e-7)
    ell = beta * np.arange(0.0, 40.0 + step / 2, step)[:, None]
    weight = ell / beta * np.exp(-ell / beta)  # ℓ·(1/β)e^{−ℓ/β} (the two signs of ℓ: m is odd, ℓ·m even)
    lp = np.empty_like(_KAPPA)
    for i in range(0, len(_KAPPA), 200):
        k = _KAPPA[None, i:i + 200]
        if sd < 1e-9:
            m = ell - np.clip(ell, -k, k)
        else:
            d1, d2 = (ell - k) / sd, (-ell - k) / sd
            pdf = math.sqrt(0.5 / math.pi)
            m = (sd * pdf * np.exp(-d1 * d1 / 2) + (ell - k) * _ndtr(d1)
                 - sd * pdf * np.exp(-d2 * d2 / 2) - (-ell - k) * _ndtr(d2))
        y = weight * m
        lp[i:i + 200] = ((y[1:] + y[:-1]) / 2 * (ell[1:] - ell[:-1])).sum(axis=0)
    h = f * normal_laplace_p(_KAPPA, np.full(_KAPPA.shape, f)) - lp
    return g, h


def _rows(noise_share: np.ndarray) -> np.ndarray:
    """The table row of each share: rounded up to the grid (the heavier tail), NaN and out-of-range clipped."""
    f = np.clip(np.nan_to_num(np.asarray(noise_share, dtype=np.float64), nan=1.0), 0.0, 1.0)
    return np.minimum(np.ceil(f / SHARE_STEP - 1e-9), round(1.0 / SHARE_STEP)).astype(np.int64)


def _at(kappa: np.ndarray | float, noise_share: np.ndarray | float, which: int) -> np.ndarray:
    k, rows = np.broadcast_arrays(np.asarray(kappa, dtype=np.float64), _rows(np.asarray(noise_share)))
    out = np.empty(k.shape)
    for r in np.unique(rows):
        at = rows == r
        out[at] = np.interp(k[at], _KAPPA, _row(int(r))[which])
    return out


def clamp_cost(kappa: np.ndarray | float, noise_share: np.ndarray | float = 0.0) -> np.ndarray:
    """G_f(κ) = E[(|X| − κ)₊²] (module docstring): the mean squared move of a clamp to ±κ, in units of the clamped
    quantity's variance."""
    return _at(kappa, noise_share, 0)


def noise_term(kappa: np.ndarray | float, noise_share: np.ndarray | float = 0.0) -> np.ndarray:
    """H_f(κ) (module docstring): how much of the blend's own error the clamp's move carries (0 without noise)."""
    return _at(kappa, noise_share, 1)


def clamped_variance(var_blend: np.ndarray, s: np.ndarray, kappa: np.ndarray,
                     noise_share: np.ndarray | float = 0.0) -> np.ndarray:
    """The mean squared error of the blend clamped into p̂_O ± κ·s on honest data: σ²_B·(1 − 2H_f(κ)) + s²·G_f(κ)."""
    return (np.asarray(var_blend, dtype=np.float64) * (1.0 - 2.0 * noise_term(kappa, noise_share))
            + np.asarray(s, dtype=np.float64) ** 2 * clamp_cost(kappa, noise_share))


def round_kappa(s: np.ndarray, var_blend: np.ndarray, cost: float, cap: float,
                noise_share: np.ndarray | float = 0.0) -> np.ndarray:
    """Per entry, the smallest κ on the grid whose clamp adds at most ``cost`` of the blend's variance on honest
    data, (s²/σ²_B)·G_f(κ) − 2·H_f(κ) ≤ cost, and at most ``cap``; 0 where s is 0 (the devices carry no weight)."""
    s = np.asarray(s, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.nan_to_num(s * s / np.asarray(var_blend, dtype=np.float64), nan=0.0, posinf=1e300)
    ratio, rows = np.broadcast_arrays(ratio, _rows(np.asarray(noise_share)))
    kappa = np.empty(ratio.shape)
    for r in np.unique(rows):
        at = rows == r
        g, h = _row(int(r))
        over = ratio[at, None] * g[None, :] - 2.0 * h[None, :] > cost  # decreasing in κ
        first = np.where(over.all(axis=1), len(_KAPPA) - 1, np.argmin(over, axis=1))
        kappa[at] = _KAPPA[first]
    return np.minimum(np.where(s > 0, kappa, 0.0), cap)

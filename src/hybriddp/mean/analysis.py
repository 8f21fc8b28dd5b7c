"""The exact expected squared errors of ALGORITHM.md §11: MSE_F, MSE_T, MSE_H(w), w*, R and the crossover n."""

from __future__ import annotations

import math

import numpy as np

from hybriddp.mean.inputs import Real, _epsilon, _fraction, _positive, _real, _variance


def mse_full_lm(n: Real, *, epsilon: float, width: float = 1.0) -> Real:
    """MSE_F = 2Δ²/(ε² n): expected squared error of FullLM (Lemma 3.1, ALGORITHM.md §11).

    Parameters
    ----------
    n : number of users (real, > 0; arrays broadcast).
    epsilon : ε > 0.
    width : Δ = hi − lo.
    """
    n = _positive(n, "n")
    eps, d = _epsilon(epsilon), _positive(width, "width")
    return 2.0 * d * d / (eps * eps * n)


def mse_only_tcm(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0) -> Real:
    """MSE_T = 2Δ²/(ε² n_T²) + σ²(1−c)/(c n), n_T = c·n: OnlyTCM (Lemma 3.2, ALGORITHM.md §11).

    The first term is the curator's Laplace noise, the second the sampling error of the opt-in
    mean as an estimate of the mean of all n users.
    """
    n, c = _positive(n, "n"), _fraction(optin_fraction)
    eps, d, s2 = _epsilon(epsilon), _positive(width, "width"), _variance(sigma2)
    n_t = c * n
    return 2.0 * d * d / (eps * eps * n_t * n_t) + s2 * (1.0 - c) / (c * n)


def hybrid_terms(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0,
                 optin_epsilon: Real | None = None) -> tuple[Real, Real, Real]:
    """(A, B, S) of ALGORITHM.md §11: A = 2Δ²/(ε_T² n_T²), B = 2Δ²/(ε² n_L), S = σ²/(c(1−c)n).

    A is the variance of the opt-in mean's noise, B that of the mean of n_L local reports, S
    that of μ̄_T − μ̄_L (the sampling term). ``optin_epsilon`` (default ε) is the budget the
    opt-in *mean* gets: (1 − ρ)·ε for :class:`HybridUnknownVariance`.
    """
    n, c = _positive(n, "n"), _fraction(optin_fraction)
    eps, d, s2 = _epsilon(epsilon), _positive(width, "width"), _variance(sigma2)
    eps_t = eps if optin_epsilon is None else _epsilon(optin_epsilon, "optin_epsilon")
    n_t, n_l = c * n, (1.0 - c) * n
    a = 2.0 * d * d / (eps_t * eps_t * n_t * n_t)
    b = 2.0 * d * d / (eps * eps * n_l)
    s = s2 / (c * (1.0 - c) * n)
    return a, b, s


def mse_hybrid(weight: Real, n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0,
               optin_epsilon: Real | None = None) -> Real:
    """MSE_H(w) = w²A + (1−w)²B + (w − c)²S: Hybrid with weight w on the opt-in mean (Lemma 3.3).

    w = 1 is OnlyTCM (MSE_H(1) = MSE_T); w = 0 uses the local reports alone.
    """
    w = _real("weight", weight, lambda a: np.ones_like(a, dtype=bool), "a finite number")
    c = _fraction(optin_fraction)
    a, b, s = hybrid_terms(n, c, epsilon=epsilon, sigma2=sigma2, width=width, optin_epsilon=optin_epsilon)
    return w * w * a + (1.0 - w) ** 2 * b + (w - c) ** 2 * s


def optimal_weight(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0,
                   optin_epsilon: Real | None = None) -> Real:
    """w* = (B + cS)/(A + B + S), the minimizer of MSE_H (dMSE_H/dw = 0; ALGORITHM.md §11). In (0, 1)."""
    c = _fraction(optin_fraction)
    a, b, s = hybrid_terms(n, c, epsilon=epsilon, sigma2=sigma2, width=width, optin_epsilon=optin_epsilon)
    return (b + c * s) / (a + b + s)


def mse_hybrid_optimal(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0,
                       optin_epsilon: Real | None = None) -> Real:
    """MSE_H(w*): the expected squared error of the optimally weighted Hybrid."""
    kw = {"epsilon": epsilon, "sigma2": sigma2, "width": width, "optin_epsilon": optin_epsilon}
    w = optimal_weight(n, optin_fraction, **kw)
    return mse_hybrid(w, n, optin_fraction, **kw)


def improvement(n: Real, optin_fraction: Real, *, epsilon: float, sigma2: Real, width: float = 1.0) -> Real:
    """R = min(MSE_F, MSE_T)/MSE_H(w*) (Theorem 3.4, ALGORITHM.md §11).

    R ≥ 1 whenever n_T = c·n ≥ 1: MSE_H(w*) ≤ MSE_H(1) = MSE_T, and MSE_H(w*) ≤ MSE_H(c) =
    c²A + (1−c)²B ≤ MSE_F because A = 2Δ²/(ε²n_T²) ≤ 2Δ²/(ε²n_T) (the curator's opt-in mean is at
    least as good as the opt-in users' local reports; equality at n_T = 1).

    ALGORITHM.md §11 check: R peaks at 2.03 near n ≈ 1.9e3 for c = 0.05, ε = 1, Δ = 1, σ² = 1/12.
    """
    kw = {"epsilon": epsilon, "sigma2": sigma2, "width": width}
    best = np.minimum(mse_full_lm(n, epsilon=epsilon, width=width), mse_only_tcm(n, optin_fraction, **kw))
    r = best / mse_hybrid_optimal(n, optin_fraction, **kw)
    return float(r) if np.ndim(r) == 0 else r


def crossover_n(optin_fraction: float, *, epsilon: float, sigma2: float, width: float = 1.0) -> float:
    """The n at which MSE_T = MSE_F: OnlyTCM beats FullLM for larger n (inf if never).

    From 2Δ²/(ε²n) = 2Δ²/(ε²c²n²) + σ²(1−c)/(cn):  n× = (2Δ²/(ε²c²)) / (2Δ²/ε² − σ²(1−c)/c),
    finite iff σ²(1−c)/c < 2Δ²/ε². R peaks there (1920 for c = 0.05, ε = 1, Δ = 1, σ² = 1/12,
    where R = 2.0304: ALGORITHM.md's "2.03 at n ≈ 1.9e3").
    """
    c, eps = float(_fraction(optin_fraction)), float(_epsilon(epsilon))
    d2, s2 = float(_positive(width, "width")) ** 2, float(_variance(sigma2))
    gap = 2.0 * d2 / eps**2 - s2 * (1.0 - c) / c
    return 2.0 * d2 / (eps**2 * c**2) / gap if gap > 0 else math.inf

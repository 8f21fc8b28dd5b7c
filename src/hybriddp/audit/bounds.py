"""Clopper–Pearson bounds without SciPy, and the ε and δ lower bounds they give."""

from __future__ import annotations

import math
from statistics import NormalDist

_FPMIN = 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
        c = 1.0 + aa / c
        c = c if abs(c) > _FPMIN else _FPMIN
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
        c = 1.0 + aa / c
        c = c if abs(c) > _FPMIN else _FPMIN
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (a, b > 0; the Beta(a, b) CDF at x)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - _log_beta(a, b))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def beta_ppf(q: float, a: float, b: float) -> float:
    """The q-quantile of Beta(a, b): the x with I_x(a, b) = q (safeguarded Newton on [0, 1])."""
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    mean = a / (a + b)
    sd = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))
    x = min(max(mean + NormalDist().inv_cdf(q) * sd, 1e-300), 1.0 - 1e-16)
    lb = _log_beta(a, b)
    for _ in range(500):
        f = betainc(a, b, x) - q
        if f == 0.0:
            return x
        if f > 0:
            hi = x
        else:
            lo = x
        if hi - lo <= 1e-15 * hi:
            return 0.5 * (lo + hi)
        pdf = math.exp((a - 1.0) * math.log(x) + (b - 1.0) * math.log1p(-x) - lb)
        nxt = x - f / pdf if pdf > 0 else math.nan
        if not lo < nxt < hi:  # Newton left the bracket: bisect (geometrically across decades)
            nxt = math.sqrt(lo * hi) if lo > 0 and hi > 10 * lo else 0.5 * (lo + hi)
        elif abs(nxt - x) <= 1e-15 * x:
            return nxt
        x = nxt
    return x


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower bound: P[p ≥ bound] ≥ 1 − α for k successes in n trials."""
    if k <= 0:
        return 0.0
    if k >= n:
        return alpha ** (1.0 / n)
    return beta_ppf(alpha, k, n - k + 1)


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper bound: P[p ≤ bound] ≥ 1 − α for k successes in n trials."""
    if k >= n:
        return 1.0
    if k <= 0:
        return -math.expm1(math.log(alpha) / n)  # 1 − α^{1/n}
    return beta_ppf(1.0 - alpha, k + 1, n - k)


def epsilon_lower_bound(p_lo: float, p_hi: float, delta: float) -> float:
    """ε_lb = ln((p_lo − δ)/p'_hi) clamped at 0 (0 when p_lo ≤ δ: the event only bounds δ)."""
    if p_lo - delta <= 0.0 or p_hi <= 0.0:
        return 0.0
    return max(0.0, math.log((p_lo - delta) / p_hi))


def delta_lower_bound(p_lo: float, p_hi: float, epsilon: float) -> float:
    """δ_lb = p_lo − e^ε·p'_hi clamped at 0."""
    return max(0.0, p_lo - math.exp(epsilon) * p_hi)

"""S's released counts, corrected for having passed τ (ALGORITHM.md §4.1, "Reusing S given τ").

CreateHeadList releases a record's S count X = N + Y only when X > τ (§3). For a record whose expected count
λ = |D_S|·p is near τ the released X is biased up: the rounds that list it are the rounds whose sample came out
high. Pooling X with T's count, (X + Z)/(|D_S| + |D_T|), carries that bias into the estimate (0.77 of its RMSE in
the selection-bias harness). Reuse pools the corrected count instead,

    p̂_O = (X̃(X) + Z)/(|D_S| + |D_T|),    X̃ = K⁻¹[G],  G(m) = m·P[m − 1 + Y > τ],

where K⁻¹ inverts the noise kernel: the three-point filter ((1 + q²)G(x) − qG(x − 1) − qG(x + 1))/(1 − q)² for
discrete Laplace noise (q = e^{−1/t}), G − b²G″ for Laplace(0, b). Then E_Y[X̃(m + Y)·1{m + Y > τ}] = G(m) (up to
X̃'s values at or below τ, which are never used), and for N ~ Poisson(λ), with λ·P[N = m − 1] = m·P[N = m],

    E[X̃·1{X > τ}] = Σ_m P[N = m]·m·P[m − 1 + Y > τ] = λ·Σ_m P[N = m]·P[m + Y > τ] = λ·P[X > τ]:

X̃ is unbiased for λ given that the record was listed. Far above τ, G(m) = m and X̃(x) = x: the pooled estimate of
before. What is left is the binomial's departure from Poisson (O(p)) and X̃'s unused values below τ (a share that
falls like the noise's tail); :meth:`KeptCount.moments` computes the bias they leave exactly. No estimator of the
released count can be exactly unbiased for every λ (§4.1 proves it), so this is as close as the law allows; its
price is variance for records near τ, which :meth:`KeptCount.moments` reports exactly. The reported error estimates
that extra variance from the released count itself (:meth:`KeptCount.excess_estimate`, unbiased given listing in the
same way; §4.1, "Reported variance").

Everything here is post-processing of CreateHeadList's output with public parameters: no privacy is spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from hybriddp.core.noise import DiscreteLaplaceNoise, effective_scale, noise_factory
from hybriddp.core.params import head_list_scale

TAIL_SCALES = 40.0
"""Noise scales beyond which a tail is treated as empty (e^−40 < 1e-17)."""

EXCESS_GRID = 1025
"""Points of the λ grid on which the correction's extra variance is tabulated (:func:`_excess_table`)."""

NEAR_SDS = 9.5
"""A true count λ more than this many √λ above the grid's last count leaves the grid no mass (P < e^−45): X̃ = X."""

CELLS_PER_SCALE = 8
"""Grid cells per noise scale for the moments under continuous Laplace noise (midpoint error O(1/64))."""


@dataclass(frozen=True)
class KeptCount:
    """The correction of S's released counts (ALGORITHM.md §4.1).

    ``threshold``: a count was released iff X > threshold (τ_d for discrete noise, whose counts are integers; τ for
    Laplace). ``scale``: the noise's scale as drawn (t of discrete Laplace; b of Laplace). ``n_s``: |D_S|."""

    threshold: float
    discrete: bool
    scale: float
    n_s: int

    @property
    def noise_variance(self) -> float:
        """Var Y of one draw."""
        if self.discrete:
            q = math.exp(-1.0 / self.scale)
            return 2.0 * q / (1.0 - q) ** 2
        return 2.0 * self.scale**2

    def survival(self, d: np.ndarray) -> np.ndarray:
        """P[Y > d] (integer d for discrete noise)."""
        d = np.asarray(d, dtype=np.float64)
        if self.discrete:  # P[Y ≥ k] = q^k/(1 + q) for k ≥ 1; P[Y > d] = 1 − P[Y ≥ d + 1]·… by symmetry
            q = math.exp(-1.0 / self.scale)
            up = q ** (np.abs(d) + 1.0) / (1.0 + q)  # P[Y ≥ |d| + 1]
            return np.where(d >= 0, up, 1.0 - q ** np.abs(d) / (1.0 + q))
        tail = 0.5 * np.exp(-np.abs(d) / self.scale)
        return np.where(d >= 0, tail, 1.0 - tail)

    def corrected(self, x: np.ndarray) -> np.ndarray:
        """X̃(x), the released count ``x`` corrected for having passed τ (module docstring); X̃(x) = x far above τ."""
        return self._inverse_kernel(np.asarray(x, dtype=np.float64), ((1.0, 1, 1.0),))

    def excess_estimate(self, x: np.ndarray) -> np.ndarray:
        """r(x): an estimate, from the released count ``x`` alone, of what the correction adds to the variance,
        Var(X̃ | X > τ) − Var X (ALGORITHM.md §4.1, "Reported variance"), elementwise; 0 far above τ.

        r = X̃² − Var Y − K⁻¹[G₂],  G₂(m) = m(m − 1)·P[m − 2 + Y > τ] + m·P[m − 1 + Y > τ].

        With λ²·P[N = m − 2] = m(m − 1)·P[N = m] and λ·P[N = m − 1] = m·P[N = m] (as for X̃),
        E[K⁻¹[G₂](X)·1{X > τ}] = (λ² + λ)·P[X > τ], so for N ~ Poisson(λ), where E[X̃ | X > τ] = λ,
        E[r | X > τ] = E[X̃² | X > τ] − λ² − λ − Var Y = Var(X̃ | X > τ) − Var X at every λ; the excess evaluated at
        an estimate of λ is not. What is left is X̃'s own residue: K⁻¹'s values at or below τ, which are never used,
        and the binomial's departure from Poisson. Against :meth:`moments`: within 1% + 0.15 counts² of the excess
        at ε = 4, +4–7% of it at ε = 1. Far above τ, K⁻¹[G₂](x) = x² − Var Y and r = 0. r can dip just below 0
        (≥ −0.3 counts² with Laplace noise at ε = 4); it is always added to a variance that holds both noise draws
        (2·Var Y)."""
        x = np.asarray(x, dtype=np.float64)
        g2 = self._inverse_kernel(x, ((1.0, 2, 2.0), (-1.0, 1, 2.0), (1.0, 1, 1.0)))
        return self.corrected(x) ** 2 - self.noise_variance - g2

    def _inverse_kernel(self, x: np.ndarray, terms: tuple[tuple[float, int, float], ...]) -> np.ndarray:
        """K⁻¹[G](x) for G(t) = Σ c·t^k·W(t − s) over ``terms`` (c, k, s), k ∈ {1, 2}, W(u) = P[u + Y > τ]: the
        three-point filter for discrete Laplace noise, G − b²G″ for Laplace(0, b) (module docstring). X̃ is
        K⁻¹[t·W(t − 1)]."""
        def big_g(t: np.ndarray) -> np.ndarray:
            return sum(c * t**k * self.survival(self.threshold - t + s) for c, k, s in terms)

        if self.discrete:
            q = math.exp(-1.0 / self.scale)
            return ((1.0 + q * q) * big_g(x) - q * big_g(x - 1.0) - q * big_g(x + 1.0)) / (1.0 - q) ** 2
        b = self.scale
        second = np.zeros_like(x)
        for c, k, s in terms:  # (t^k·W(t − s))″ = k(k − 1)t^(k−2)·W + 2k·t^(k−1)·W′ + t^k·W″
            d = self.threshold - x + s  # W(t − s) = P[Y > d]: W′ = f(d), W″ = sign(d)·f(d)/b, f the density of Y
            f = np.exp(-np.abs(d) / b) / (2.0 * b)
            w = self.survival(d) if k == 2 else 0.0
            second += c * (k * (k - 1) * w + 2.0 * k * x ** (k - 1) * f + x**k * np.sign(d) * f / b)
        return big_g(x) - b * b * second

    # ----- the law of X given that it was released -------------------------------------------------------------
    @cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Cells x of X from below 0 to where X̃(x) = x, their probability given each true count m
        (kernel[cell, m]), and X̃ on the released cells (0 elsewhere)."""
        tail = TAIL_SCALES * self.scale
        hi = self.threshold + tail + 2.0
        m = np.arange(0.0, math.ceil(hi + tail) + 2.0)
        if self.discrete:
            x = np.arange(-math.ceil(tail) - 1.0, math.ceil(hi) + 1.0)
            q = math.exp(-1.0 / self.scale)
            kernel = (1.0 - q) / (1.0 + q) * q ** np.abs(x[:, None] - m[None, :])
        else:  # cells of width h aligned on τ, so that each is released or not
            h = self.scale / CELLS_PER_SCALE
            i = np.arange(math.floor((-tail - 1.0 - self.threshold) / h), math.ceil((hi - self.threshold) / h) + 1)
            x = self.threshold + h * (i + 0.5)
            below = 1.0 - self.survival(x[:, None] - m[None, :] - h / 2)  # P[Y ≤ lower edge − m]
            kernel = (1.0 - self.survival(x[:, None] - m[None, :] + h / 2)) - below
        kept = x > self.threshold
        return x, m, kernel, np.where(kept, self.corrected(x), 0.0)

    def _cells(self, p: np.ndarray) -> np.ndarray:
        """P[X ∈ cell] of every grid cell (last axis) at N ~ Binomial(|D_S|, p), for 1-D ``p``."""
        _, m, kernel, _ = self._grid
        n, p = self.n_s, np.clip(p, 1e-12, 1.0 - 1e-12)[:, None]
        return np.exp(_log_choose(n, len(m)) + m * np.log(p) + (n - m) * np.log1p(-p)) @ kernel.T

    @property
    def _near_top(self) -> float:
        """The λ up to which the grid holds part of X's law: λ − NEAR_SDS·√λ = the grid's last count (at most |D_S|)."""
        m_max = self._grid[1][-1]
        return min(((NEAR_SDS + math.sqrt(NEAR_SDS**2 + 4.0 * m_max)) / 2.0) ** 2, float(self.n_s))

    def moments(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """E[X̃ | X > τ] − λ (the bias left, in counts) and Var(X̃ | X > τ) at N ~ Binomial(|D_S|, p), elementwise in
        ``p`` (any shape). Beyond the grid X̃(X) = X, so those cells' moments are X's totals (E X = λ,
        E X² = |D_S|p(1 − p) + λ² + Var Y) less the grid's."""
        x, m, _, xt = self._grid
        shape = np.shape(p)
        p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1.0 - 1e-12).reshape(-1)
        n = self.n_s
        lam = n * p
        bias, var = np.zeros_like(p), n * p * (1.0 - p) + self.noise_variance  # X̃ = X wherever X can fall
        near = lam < m[-1] + NEAR_SDS * np.sqrt(lam)
        if not near.any():
            return bias.reshape(shape), var.reshape(shape)
        ln = lam[near]
        cell = self._cells(p[near])  # the rest of X's law lies beyond the grid, where X̃ = X
        rest = np.clip(1.0 - cell.sum(-1), 0.0, 1.0)
        rest_x = ln - cell @ x
        rest_x2 = var[near] + ln**2 - cell @ (x * x)
        released = cell @ (x > self.threshold).astype(np.float64) + rest
        mean = (cell @ xt + rest_x) / released
        second = (cell @ (xt * xt) + rest_x2) / released
        bias[near], var[near] = mean - ln, np.maximum(second - mean**2, 0.0)
        return bias.reshape(shape), var.reshape(shape)

    def excess(self, p: np.ndarray) -> np.ndarray:
        """Var(X̃ | X > τ) − Var X, what the correction adds to the pooled estimate's variance, in counts², at
        N ~ Binomial(|D_S|, p), elementwise in ``p`` (ALGORITHM.md §4.1, "Variance"): interpolated in λ = |D_S|·p
        from :func:`_excess_table`, as the blend's weights evaluate it at every pass and quadrature node (at its
        estimate p̄). 0 far above τ. The reported variance uses :meth:`excess_estimate` of the released count
        instead, where that count is known."""
        lam, excess = _excess_table(self)
        x = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0) * self.n_s
        return np.where(x <= lam[-1], np.interp(x, lam, excess), 0.0)


@lru_cache(maxsize=16)
def _excess_table(rule: KeptCount) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`KeptCount.excess` from :meth:`KeptCount.moments` on a grid of λ from 0 to where it is 0 (P[N ≤ the
    grid's last count] < e^−45), shared by every round with the same rule (ALGORITHM.md §4.1, "Variance")."""
    lam = np.linspace(0.0, rule._near_top, EXCESS_GRID)
    p = lam / rule.n_s
    return lam, rule.moments(p)[1] - (rule.n_s * p * (1.0 - p) + rule.noise_variance)


def kept_count_for(epsilon: float, delta: float, m_o: int, noise: str, n_s: int) -> KeptCount:
    """The correction of a round's S counts from its public parameters: CreateHeadList's threshold and noise
    scale at (ε, δ, m_O) for ``--noise noise`` (ALGORITHM.md §3, §3.2), and |D_S|."""
    tau = noise_factory(noise)(None).head_list_threshold(epsilon, delta, m_o)
    return KeptCount(float(tau), noise == DiscreteLaplaceNoise.name,
                     effective_scale(noise, head_list_scale(epsilon, m_o)), int(n_s))


@lru_cache(maxsize=32)
def _log_choose(n: int, size: int) -> np.ndarray:
    """log C(n, m) for m = 0 … size − 1 (−inf above n)."""
    return np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) if k <= n else -np.inf
                     for k in range(size)])

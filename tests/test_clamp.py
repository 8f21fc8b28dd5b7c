"""What the opt-in anchor's bound costs an honest estimate (ALGORITHM.md §7.2, :mod:`hybriddp.server.clamp`):
G_f(κ) = E[(|X| − κ)₊²] and H_f(κ) against draws of the normal–Laplace sum itself, the per-round κ as the smallest
that keeps the cost within its share, and the published variance as the mean squared error of the clamped blend, by
Monte Carlo of the blend of two independent estimates (independent of the code's formulas)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybriddp.server.clamp import KAPPA_STEP, clamp_cost, clamped_variance, noise_term, round_kappa

DRAWS = 1_000_000


def draws(rng: np.random.Generator, share: float, n: int) -> np.ndarray:
    """n draws of X = G + L, unit variance: G normal with variance 1 − f, L Laplace with variance f."""
    return math.sqrt(1.0 - share) * rng.standard_normal(n) + rng.laplace(0.0, math.sqrt(share / 2.0), n)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_the_clamp_cost_is_the_mean_squared_excess_of_the_sum(share: float) -> None:
    """E[(|X| − κ)₊²] by 1,000,000 draws of the sum, within 6 standard errors (of the draws' own spread), at
    κ = 0, 0.5, 1.5, 3; and the closed forms at the ends: 2[(1 + κ²)Φ̄(κ) − κφ(κ)] (normal), e^{−√2κ} (Laplace)."""
    rng = np.random.default_rng(41)
    x = np.abs(draws(rng, share, DRAWS))
    for kappa in (0.0, 0.5, 1.5, 3.0):
        excess = np.maximum(x - kappa, 0.0) ** 2
        se = excess.std() / math.sqrt(DRAWS)
        got = float(clamp_cost(kappa, share))
        assert abs(got - excess.mean()) < 6 * se + 1e-6, (share, kappa, got, excess.mean())
        if share == 0.0:
            phi = math.exp(-kappa * kappa / 2) / math.sqrt(2 * math.pi)
            exact = 2 * ((1 + kappa * kappa) * 0.5 * math.erfc(kappa / math.sqrt(2)) - kappa * phi)
            assert got == pytest.approx(exact, rel=1e-4, abs=1e-9)
        if share == 1.0:
            assert got == pytest.approx(math.exp(-math.sqrt(2) * kappa), rel=1e-4)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.7, 1.0])
def test_the_noise_term_is_its_definition(share: float) -> None:
    """H_f(κ) = f·P(|X| > κ) − E[ℓ·ψ_κ(X)], X = u + ℓ (ℓ the Laplace part), ψ_κ(x) = x − clip(x, ±κ): by 1,000,000
    draws of (u, ℓ) within 6 standard errors, at κ = 0.5, 1.5, 3; 0 without noise."""
    rng = np.random.default_rng(53)
    u = math.sqrt(1.0 - share) * rng.standard_normal(DRAWS)
    ell = rng.laplace(0.0, math.sqrt(share / 2.0), DRAWS)
    x = u + ell
    for kappa in (0.5, 1.5, 3.0):
        sample = share * (np.abs(x) > kappa) - ell * (x - np.clip(x, -kappa, kappa))
        got = float(noise_term(kappa, share))
        assert abs(got - sample.mean()) < 6 * sample.std() / math.sqrt(DRAWS) + 1e-6, (share, kappa, got)


def test_the_per_round_kappa_is_the_smallest_within_the_cost() -> None:
    """s²·G(κ) ≤ c·σ²_B at the chosen κ, and not at one grid step below it (the smallest such κ); capped; 0 where the
    devices carry no weight (s = 0); tighter where the opt-in group's share of the weight is larger."""
    rng = np.random.default_rng(43)
    s = rng.uniform(0.1, 3.0, 400)
    var_b = rng.uniform(0.01, 2.0, 400)
    share = rng.uniform(0.0, 1.0, 400)
    cost = 0.05
    kappa = round_kappa(s, var_b, cost, cap=12.0, noise_share=share)
    def spent(k: np.ndarray, f: np.ndarray, sd: np.ndarray, vb: np.ndarray) -> np.ndarray:
        return clamped_variance(vb, sd, k, f) - vb  # what the clamp adds to the blend's variance

    assert np.all(spent(kappa, share, s, var_b) <= cost * var_b * (1 + 1e-3))
    inner = kappa > KAPPA_STEP
    assert np.all(spent(kappa[inner] - KAPPA_STEP, share[inner], s[inner], var_b[inner]) > cost * var_b[inner])
    assert np.all(round_kappa(s, var_b, cost, cap=1.0, noise_share=share) <= 1.0)
    assert round_kappa(np.array([0.0]), np.array([1.0]), cost, 5.0)[0] == 0.0
    small, large = round_kappa(np.array([1.0, 1.0]), np.array([0.1, 10.0]), cost, 12.0)
    assert small > large  # σ²_B = 10 s²: the opt-in group carries most of the weight, the bound is tight


@pytest.mark.parametrize(("var_o", "var_c", "share"), [(4.0, 1.0, 0.0), (1.0, 1.0, 0.0), (1.0, 9.0, 0.0),
                                                       (4.0, 1.0, 0.6)])
def test_the_published_variance_is_the_clamped_blends_mean_squared_error(var_o: float, var_c: float,
                                                                         share: float) -> None:
    """Two independent unbiased estimates of p (opt-in: normal, or normal plus Laplace noise of share f of the
    difference's variance; clients: normal), blended by inverse variance and clamped into p̂_O ± κ·s with
    s = σ²_O/σ_D: over 1,000,000 draws the published estimate is unbiased and its mean squared error is
    σ²_B + s²·G_f(κ) (within 6 standard errors), for the per-round κ at c = 0.05 and for a fixed κ = 0.5."""
    rng = np.random.default_rng(47)
    p = 0.3
    var_d = var_o + var_c
    noise = share * var_d  # the Laplace noise is in the opt-in estimate
    if noise > var_o:
        pytest.skip("the noise cannot exceed the opt-in estimate's variance")
    p_o = p + math.sqrt(var_o - noise) * rng.standard_normal(DRAWS) + rng.laplace(0.0, math.sqrt(noise / 2), DRAWS)
    p_c = p + math.sqrt(var_c) * rng.standard_normal(DRAWS)
    w = var_c / var_d
    blend = w * p_o + (1 - w) * p_c
    var_b = var_o * var_c / var_d
    s = var_o / math.sqrt(var_d)
    auto = float(round_kappa(np.array([s]), np.array([var_b]), 0.05, 12.0, share)[0])
    for kappa in (auto, 0.5):
        published = np.clip(blend, p_o - kappa * s, p_o + kappa * s)
        err = published - p
        reported = float(clamped_variance(np.array([var_b]), np.array([s]), np.array([kappa]), share)[0])
        se_mse = (err**2).std() / math.sqrt(DRAWS)
        assert abs(err.mean()) < 6 * err.std() / math.sqrt(DRAWS)
        assert abs((err**2).mean() - reported) < 6 * se_mse, (kappa, (err**2).mean(), reported)
        if kappa == auto:
            assert reported <= 1.05 * var_b * (1 + 1e-3)

"""OLH frequency oracle: exact privacy, sampler distribution, unbiasedness and variance."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from hybriddp.simulation.baselines.olh import (
    keep_probability,
    max_privacy_ratio,
    olh_estimate,
    olh_g,
    olh_hash,
    olh_output_distribution,
    olh_perturb,
    olh_variance,
    olh_variance_approx,
    support_counts,
)

EPS_GRID = [0.1, 0.5, 1.0, math.log(3.0), 2.0, 4.0, 8.0]


# ----- exact privacy ---------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon", EPS_GRID)
def test_exact_privacy_ratio_is_e_eps(epsilon: float) -> None:
    """P[(H, y) | v]/P[(H, y) | v'] = P[y | H(v)]/P[y | H(v')] ≤ e^ε for every g, with equality."""
    for g in sorted({2, 3, olh_g(epsilon), 57, 1000}):
        P = olh_output_distribution(g, epsilon)
        assert P.shape == (g, g)
        np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        ratio = max_privacy_ratio(P)
        assert ratio <= math.exp(epsilon) * (1 + 1e-12)
        assert ratio >= math.exp(epsilon) * (1 - 1e-12)  # GRR spends the whole budget


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
def test_broken_variant_violates_the_bound(epsilon: float) -> None:
    """A classic bug — the 'other' value drawn uniformly over all g values, the true one
    included — gives the true value extra mass and a ratio above e^ε; the check catches it."""
    for g in (2, olh_g(epsilon), 100):
        p = keep_probability(epsilon, g)
        broken = np.full((g, g), (1.0 - p) / g)
        np.fill_diagonal(broken, p + (1.0 - p) / g)
        np.testing.assert_allclose(broken.sum(axis=1), 1.0)
        assert max_privacy_ratio(broken) > math.exp(epsilon) * (1 + 1e-6)


def test_g_and_keep_probability() -> None:
    assert olh_g(4.0) == round(math.exp(4.0) + 1) == 56
    assert olh_g(0.01) == 2  # at least binary
    assert keep_probability(1.0, 4) == pytest.approx(math.e / (math.e + 3))


# ----- the hash family and support counting ------------------------------------------------
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 4.0, 9.0])
@pytest.mark.parametrize("threads", [1, 2])
def test_support_counts_equal_direct_hashing(epsilon: float, threads: int) -> None:
    """The interval test of support_counts equals evaluating H_i(x) == y_i, block by block."""
    rng = np.random.default_rng(3)
    values = rng.integers(0, 1 << 32, 3000, dtype=np.int64)
    reports = olh_perturb(values, epsilon, rng)
    cand = np.concatenate([values[:40], rng.integers(0, 1 << 32, 60, dtype=np.int64), [0, (1 << 32) - 1]])
    direct = (olh_hash(reports.a[None, :], reports.b[None, :], cand[:, None], reports.g)
              == reports.y[None, :]).sum(axis=1)
    got = support_counts(reports, cand, threads=threads, block_bytes=1 << 14)  # many small blocks
    assert np.array_equal(got, direct)


def test_hash_is_uniform_and_pairwise_universal() -> None:
    """Over random seeds H(x) is uniform on [0, g) and P[H(x) = H(x')] = 1/g (chi-square / 5σ)."""
    rng = np.random.default_rng(11)
    g, n = 56, 400_000
    a = rng.integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64, endpoint=True)
    b = rng.integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64, endpoint=True)
    h1 = olh_hash(a, b, np.uint64(12345), g)
    h2 = olh_hash(a, b, np.uint64(12346), g)  # adjacent keys: the hardest case for weak hashes
    assert h1.min() >= 0 and h1.max() < g
    assert stats.chisquare(np.bincount(h1, minlength=g)).pvalue > 1e-6
    collisions = int((h1 == h2).sum())
    sd = math.sqrt(n * (1 / g) * (1 - 1 / g))
    assert abs(collisions - n / g) < 5 * sd


def test_values_out_of_range_raise() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        olh_perturb(np.array([1 << 32]), 1.0, rng)
    with pytest.raises(ValueError):
        olh_perturb(np.array([-1]), 1.0, rng)
    reports = olh_perturb(np.array([1, 2, 3]), 1.0, rng)
    with pytest.raises(ValueError):
        olh_estimate(reports, np.array([1]), epsilon=2.0)


# ----- the sampler against the closed form ---------------------------------------------------
@pytest.mark.parametrize("epsilon", [1.0, 2.0, 4.0])
def test_sampler_matches_output_distribution(epsilon: float) -> None:
    """Joint (H(v), y) of many reports of one value ~ (1/g)·P[y | H(v)] (chi-square, p > 1e-6)."""
    rng = np.random.default_rng(int(epsilon * 100))
    n = 300_000
    value = 987_654_321
    reports = olh_perturb(np.full(n, value), epsilon, rng)
    g = reports.g
    h = olh_hash(reports.a, reports.b, np.uint64(value), g)
    observed = np.bincount(h * g + reports.y, minlength=g * g)
    expected = (olh_output_distribution(g, epsilon) / g).ravel() * n
    assert stats.chisquare(observed, expected).pvalue > 1e-6
    # and the GRR step alone: offset (y − H(v)) mod g is 0 w.p. p, else uniform
    offset = np.bincount((reports.y - h) % g, minlength=g)
    p = keep_probability(epsilon, g)
    exp_off = np.concatenate([[p], np.full(g - 1, (1 - p) / (g - 1))]) * n
    assert stats.chisquare(offset, exp_off).pvalue > 1e-6


# ----- estimator: unbiased, with the stated variance ----------------------------------------
@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_estimator_unbiased_with_stated_variance(epsilon: float) -> None:
    rng = np.random.default_rng(21 + int(epsilon))
    n = 20_000
    values = np.concatenate([np.zeros(3000), np.ones(1000), np.arange(2, n - 4000 + 2)]).astype(np.int64)
    cand = np.array([0, 1, 7, 10**9])  # heavy, medium, one holder, absent
    true = np.array([3000, 1000, 1, 0])
    reps = 400
    est = np.array([olh_estimate(olh_perturb(values, epsilon, rng), cand) for _ in range(reps)])
    var = np.array([olh_variance(n, t, epsilon) for t in true])
    # unbiased: the mean is within 5 standard errors of the truth
    assert np.all(np.abs(est.mean(axis=0) - true) < 5 * np.sqrt(var / reps))
    # variance: sample variance within 5 sd of its (near-normal) sampling distribution
    rel = est.var(axis=0, ddof=1) / var
    assert np.all(np.abs(rel - 1) < 5 * math.sqrt(2 / (reps - 1)))
    # the paper's approximation n·4e^ε/(e^ε−1)² is the non-holder variance up to g's rounding
    assert olh_variance(n, 0, epsilon) == pytest.approx(olh_variance_approx(n, epsilon), rel=0.1)

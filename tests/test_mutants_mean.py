"""The mean-estimation mechanisms with scripted noise: every scale, draw and field worked out by hand.

Issue 14 (mutation testing): the statistical tests of test_mean.py let arithmetic slips through. Here a
scripted generator hands out known Laplace draws and records the scale of each request, so the estimate,
the weight, the error and every field of :class:`MeanEstimate` can be checked against hand-computed
fractions (ALGORITHM.md §11).

Setting used throughout: [lower, upper] = [−1, 3] (Δ = 4), ε = 2; opt-in values 0, 1, 2, 5 (5 is clamped
to 3: t = 0, 1, 2, 3, mean 3/2, n_T = 4); local values −2, 1, 3, 3, 0, 2 (−2 clamped to −1: mean 4/3,
n_L = 6); n = 10, c = 2/5.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction as F

import numpy as np
import pytest

from hybriddp.errors import DataError, ParameterError
from hybriddp.mean.inputs import ClampCount
from hybriddp.mean.mechanisms import FullLM, Hybrid, HybridUnknownVariance, MeanEstimate, OnlyTCM

OPTIN = [0.0, 1.0, 2.0, 5.0]
LOCAL = [-2.0, 1.0, 3.0, 3.0, 0.0, 2.0]
SETTING = {"lower": -1.0, "upper": 3.0, "epsilon": 2.0}
CLAMPED = ClampCount(below=1, above=1)
MEAN_T, MEAN_L = F(3, 2), F(4, 3)


class ScriptedLaplace:
    """Stands in for a NumPy Generator: scalar draws come from ``scalars`` in order; an array draw of size k
    is 1/2, 1, 3/2, ..., k/2. Every call's (loc, scale, size) is recorded."""

    def __init__(self, *scalars: float) -> None:
        self.scalars = list(scalars)
        self.calls: list[tuple[float, float, int | None]] = []

    def laplace(self, loc: float, scale: float, size: int | None = None) -> float | np.ndarray:
        self.calls.append((loc, scale, size))
        if size is None:
            return self.scalars.pop(0)
        return (np.arange(size) + 1) / 2.0


def _array_noise_mean(k: int) -> F:
    return F(k + 1, 4)  # mean of 1/2, 1, ..., k/2


def _close(x: float, y: F | float) -> bool:
    return math.isclose(x, float(y), rel_tol=1e-13, abs_tol=1e-15)


# ----- FullLM --------------------------------------------------------------------------------------------------

def test_full_lm_by_hand() -> None:
    """Reports: the 10 clamped values (mean 14/10) plus draws 1/2..5 (mean 11/4) at scale Δ/ε = 2.
    MSE_F = 2Δ²/(ε²n) = 32/40 = 4/5."""
    rng = ScriptedLaplace()
    est = FullLM(**SETTING).estimate(OPTIN, LOCAL, rng=rng)
    assert rng.calls == [(0.0, 2.0, 10)]
    assert _close(est.estimate, F(14, 10) + _array_noise_mean(10))
    assert _close(est.expected_squared_error, F(4, 5))
    assert (est.mechanism, est.n_optin, est.n_local, est.clamped) == ("FullLM", 4, 6, CLAMPED)
    assert (est.sigma2, est.sigma2_source, est.weight, est.private_sigma2) == (None, "not needed", None, None)
    assert est.guarantee == "every user: 2-LDP (Laplace scale Δ/ε = 2 on the device)"
    assert est.rmse == pytest.approx(math.sqrt(0.8), rel=1e-14)
    assert FullLM(**SETTING).expected_squared_error(4, 6, sigma2=0.3) == pytest.approx(0.8, rel=1e-14)


def test_estimate_to_json_whole() -> None:
    est = FullLM(**SETTING).estimate(OPTIN, LOCAL, rng=ScriptedLaplace())
    assert est.to_json() == {"mechanism": "FullLM", "estimate": est.estimate, "expected_squared_error": 0.8,
                             "rmse": est.rmse, "n_optin": 4, "n_local": 6, "clamped": {"below": 1, "above": 1},
                             "sigma2": None, "sigma2_source": "not needed", "weight": None,
                             "guarantee": "every user: 2-LDP (Laplace scale Δ/ε = 2 on the device)",
                             "private_sigma2": None}
    one = MeanEstimate("m", 1.5, 0.25, 1, 2, ClampCount(3, 4), 0.5, "given", 0.75, "g", 0.125)
    assert one.rmse == 0.5
    assert one.to_json() == {"mechanism": "m", "estimate": 1.5, "expected_squared_error": 0.25, "rmse": 0.5,
                             "n_optin": 1, "n_local": 2, "clamped": {"below": 3, "above": 4}, "sigma2": 0.5,
                             "sigma2_source": "given", "weight": 0.75, "guarantee": "g", "private_sigma2": 0.125}


# ----- OnlyTCM -------------------------------------------------------------------------------------------------

def test_only_tcm_by_hand() -> None:
    """μ̂_T = 3/2 + 1/4, one draw at scale Δ/(ε n_T) = 4/8 = 1/2. MSE_T = 2Δ²/(ε² n_T²) + σ²(1−c)/(c n)
    = 32/64 + σ²·(3/5)/4: σ² = Δ²/4 = 4 (worst case) gives 1/2 + 3/5; σ² = 1 gives 1/2 + 3/20."""
    rng = ScriptedLaplace(0.25)
    est = OnlyTCM(**SETTING).estimate(OPTIN, LOCAL, rng=rng)
    assert rng.calls == [(0.0, 0.5, None)]
    assert _close(est.estimate, MEAN_T + F(1, 4))
    assert _close(est.expected_squared_error, F(1, 2) + F(3, 5))
    assert (est.sigma2, est.sigma2_source, est.weight) == (4.0, "worst case Δ²/4", 1.0)
    assert (est.mechanism, est.n_optin, est.n_local, est.clamped) == ("OnlyTCM", 4, 6, CLAMPED)
    assert est.guarantee == "opt-in users: 2-DP, trusted curator (Laplace scale Δ/(ε·n_T)); local users: not used"
    given = OnlyTCM(**SETTING).estimate(OPTIN, LOCAL, rng=ScriptedLaplace(-1.0), sigma2=1)
    assert _close(given.estimate, MEAN_T - 1)
    assert (given.sigma2, given.sigma2_source) == (1.0, "given")
    assert _close(given.expected_squared_error, F(1, 2) + F(3, 20))
    assert _close(OnlyTCM(**SETTING).expected_squared_error(4, 6), F(1, 2) + F(3, 5))


# ----- Hybrid, known σ² ----------------------------------------------------------------------------------------

def _hybrid_mse(w: F, sigma2: F, eps_t: F = F(2)) -> F:
    """w²A + (1−w)²B + (w−c)²S with A = 2Δ²/(ε_T² n_T²), B = 2Δ²/(ε² n_L), S = σ²/(c(1−c)n)."""
    a, b, s = F(32) / (eps_t**2 * 16), F(32, 4 * 6), sigma2 / (F(2, 5) * F(3, 5) * 10)
    return w * w * a + (1 - w) ** 2 * b + (w - F(2, 5)) ** 2 * s


def _w_star(sigma2: F, eps_t: F = F(2)) -> F:
    a, b, s = F(32) / (eps_t**2 * 16), F(32, 4 * 6), sigma2 / (F(2, 5) * F(3, 5) * 10)
    return (b + F(2, 5) * s) / (a + b + s)


def test_hybrid_by_hand() -> None:
    """σ² = 1: A = 1/2, B = 4/3, S = 5/12, w* = (4/3 + 1/6)/(9/4) = 2/3. μ̂_T = 3/2 + 1/4 (scale 1/2),
    μ̂_L = 4/3 + 7/4 (draws 1/2..3 at scale 2): estimate (2/3)(7/4) + (1/3)(37/12) = 79/36."""
    assert _w_star(F(1)) == F(2, 3)
    rng = ScriptedLaplace(0.25)
    mech = Hybrid(**SETTING, sigma2=1)
    est = mech.estimate(OPTIN, LOCAL, rng=rng)
    assert rng.calls == [(0.0, 0.5, None), (0.0, 2.0, 6)]
    assert _close(est.estimate, F(79, 36))
    assert _close(est.weight, F(2, 3)) and _close(mech.weight_for(4, 6), F(2, 3))
    assert _close(est.expected_squared_error, _hybrid_mse(F(2, 3), F(1)))
    assert (est.sigma2, est.sigma2_source, est.private_sigma2) == (1.0, "given", None)
    assert (est.mechanism, est.n_optin, est.n_local, est.clamped) == ("Hybrid", 4, 6, CLAMPED)
    assert est.guarantee == ("opt-in users: 2-DP, trusted curator (Laplace scale Δ/(ε·n_T)); local users: "
                             "2-LDP (Laplace scale Δ/ε on the device); σ² is public")
    # sigma2 at estimate time changes only the variance the error is evaluated at, not the weight
    other = mech.estimate(OPTIN, LOCAL, rng=ScriptedLaplace(0.25), sigma2=0.5)
    assert _close(other.weight, F(2, 3)) and _close(other.estimate, F(79, 36))
    assert _close(other.expected_squared_error, _hybrid_mse(F(2, 3), F(1, 2)))
    assert other.sigma2 == 0.5
    # the weight for another variance, and the error at a given weight
    assert _close(mech.weight_for(4, 6, sigma2=3.0), _w_star(F(3)))
    assert _close(mech.expected_squared_error(4, 6), _hybrid_mse(F(2, 3), F(1)))
    assert _close(mech.expected_squared_error(4, 6, sigma2=2.0), _hybrid_mse(_w_star(F(1)), F(2)))
    assert _close(mech.expected_squared_error(4, 6, weight=0.25), _hybrid_mse(F(1, 4), F(1)))


def test_hybrid_with_a_fixed_weight() -> None:
    mech = Hybrid(**SETTING, sigma2=1, weight=0.25)
    assert mech.weight == 0.25 and mech.sigma2 == 1.0
    est = mech.estimate(OPTIN, LOCAL, rng=ScriptedLaplace(0.25))
    assert est.weight == 0.25 and mech.weight_for(4, 6) == 0.25
    assert _close(est.estimate, F(1, 4) * F(7, 4) + F(3, 4) * F(37, 12))
    assert _close(est.expected_squared_error, _hybrid_mse(F(1, 4), F(1)))
    assert Hybrid(**SETTING, sigma2=0).weight is None


@pytest.mark.parametrize("weight", [True, "x", [0.5], math.nan, math.inf])
def test_hybrid_weight_must_be_one_finite_number(weight: object) -> None:
    with pytest.raises(ParameterError, match=re.escape(f"weight = {weight!r} is not allowed: it must be a finite "
                                                        "number.")):
        Hybrid(**SETTING, sigma2=1, weight=weight)


@pytest.mark.parametrize("sigma2", [-0.5, math.nan, "x", True])
def test_hybrid_sigma2_must_be_a_variance(sigma2: object) -> None:
    with pytest.raises(ParameterError, match=re.escape(f"sigma2 = {sigma2!r} is not allowed: it must be a finite "
                                                        "number >= 0")):
        Hybrid(**SETTING, sigma2=sigma2)


# ----- Hybrid, unknown σ² ----------------------------------------------------------------------------------------

def test_hybrid_unknown_variance_by_hand() -> None:
    """ρ = 1/5: ε_v = 2/5, ε_m = 8/5. s²_T = 5/3 (ddof 1 of 0..3); draw 1/4 at scale Δ²/(n_T ε_v) = 16/(8/5)
    = 10: σ̂² = 23/12. μ̂_T = 3/2 + 1/4 at scale Δ/(n_T ε_m) = 4/(32/5) = 5/8; μ̂_L = 37/12 (scale 2).
    ŵ = w*(σ̂²) with A' = 2Δ²/(ε_m² n_T²) = 32/(64/25·16) = 25/32."""
    rng = ScriptedLaplace(0.25, 0.25)
    mech = HybridUnknownVariance(**SETTING)
    assert mech.variance_share == 0.2 and mech.weight is None and mech.sigma2 == 4.0
    assert _close(mech.variance_epsilon, F(2, 5)) and _close(mech.mean_epsilon, F(8, 5))
    est = mech.estimate(OPTIN, LOCAL, rng=rng)
    assert [c[2] for c in rng.calls] == [None, None, 6]
    assert [c[1] for c in rng.calls] == pytest.approx([10.0, 0.625, 2.0], rel=1e-14)
    s2_hat = F(5, 3) + F(1, 4)
    w = _w_star(s2_hat, eps_t=F(8, 5))
    assert _close(est.private_sigma2, s2_hat) and _close(est.sigma2, s2_hat)
    assert est.sigma2_source == "private estimate"
    assert _close(est.weight, w)
    assert _close(est.estimate, w * F(7, 4) + (1 - w) * F(37, 12))
    assert _close(est.expected_squared_error, _hybrid_mse(w, s2_hat, eps_t=F(8, 5)))
    assert (est.mechanism, est.n_optin, est.n_local, est.clamped) == ("Hybrid, unknown σ²", 4, 6, CLAMPED)
    assert est.guarantee == ("opt-in users: 2-DP, trusted curator, by sequential composition of 0.4 (variance, "
                             "Laplace scale Δ²/(n_T·ε_v)) + 1.6 (mean, Laplace scale Δ/(n_T·ε_m)); local users: "
                             "2-LDP; the weight is post-processing")
    # a given σ² only changes where the error is evaluated (same ŵ)
    given = mech.estimate(OPTIN, LOCAL, rng=ScriptedLaplace(0.25, 0.25), sigma2=1)
    assert (given.sigma2, given.sigma2_source) == (1.0, "given") and _close(given.weight, w)
    assert _close(given.private_sigma2, s2_hat)
    assert _close(given.expected_squared_error, _hybrid_mse(w, F(1), eps_t=F(8, 5)))
    assert _close(mech.expected_squared_error(4, 6, sigma2=1.0), _hybrid_mse(_w_star(F(1), F(8, 5)), F(1), F(8, 5)))
    assert _close(mech.expected_squared_error(4, 6, sigma2=1.0, weight=0.5), _hybrid_mse(F(1, 2), F(1), F(8, 5)))
    assert _close(mech.weight_for(4, 6, 1.0), _w_star(F(1), F(8, 5)))


def test_private_variance_clip_and_one_value() -> None:
    """σ̂² is clipped to [0, Δ²/4 = 4]; with n_T = 1 the sample variance is 0 and the scale is 16/(1·ε_v)."""
    mech = HybridUnknownVariance(**SETTING, variance_share=0.5)  # ε_v = 1
    t = np.array([0.0, 1.0, 2.0, 3.0])
    assert mech.private_variance(t, ScriptedLaplace(100.0)) == 4.0
    assert mech.private_variance(t, ScriptedLaplace(-100.0)) == 0.0
    assert mech.private_variance(t, ScriptedLaplace(2.0)) == pytest.approx(5 / 3 + 2, rel=1e-14)
    rng = ScriptedLaplace(0.5)
    assert mech.private_variance(np.array([2.0]), rng) == 0.5 and rng.calls == [(0.0, 16.0, None)]
    rng = ScriptedLaplace(0.0)
    assert mech.private_variance(np.array([1.0, 3.0]), rng) == 2.0 and rng.calls == [(0.0, 8.0, None)]


def test_hybrid_unknown_variance_needs_a_variance() -> None:
    mech = HybridUnknownVariance(**SETTING)
    with pytest.raises(ValueError, match="^" + re.escape("HybridUnknownVariance.weight_for needs the (private) "
                                                         "variance estimate") + "$"):
        mech.weight_for(4, 6)
    with pytest.raises(ValueError, match="^" + re.escape("HybridUnknownVariance.expected_squared_error needs a "
                                                         "variance") + "$"):
        mech.expected_squared_error(4, 6)
    with pytest.raises(ParameterError, match="variance_share"):
        HybridUnknownVariance(**SETTING, variance_share=1.0)


# ----- shared: empty groups, defaults --------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [FullLM, OnlyTCM, Hybrid, HybridUnknownVariance])
def test_both_groups_must_be_non_empty(cls: type) -> None:
    kw = {"sigma2": 1.0} if cls is Hybrid else {}
    mech = cls(**SETTING, **kw)
    for t, loc, nt, nl in [([], [1.0], 0, 1), ([1.0], [], 1, 0)]:
        with pytest.raises(DataError, match=re.escape(
                f"{cls.name} needs both groups non-empty: got {nt} opt-in and {nl} local values (ALGORITHM.md §11)")):
            mech.estimate(t, loc, rng=np.random.default_rng(0))
    one = mech.estimate([1.0], [2.0], rng=np.random.default_rng(0))  # one of each is enough
    assert (one.n_optin, one.n_local) == (1, 1)


@pytest.mark.parametrize("cls", [FullLM, OnlyTCM, Hybrid, HybridUnknownVariance])
def test_without_a_generator_the_noise_comes_from_os_entropy(cls: type) -> None:
    kw = {"sigma2": 1.0} if cls is Hybrid else {}
    a = cls(**SETTING, **kw).estimate(OPTIN, LOCAL).estimate
    b = cls(**SETTING, **kw).estimate(OPTIN, LOCAL).estimate
    assert math.isfinite(a) and a != b


def test_properties_of_the_setting() -> None:
    mech = FullLM(lower=-1, upper=3, epsilon=2)
    assert mech.width == 4.0 and mech.epsilon == 2.0 and isinstance(mech.epsilon, float)


@pytest.mark.parametrize("mechanism", [FullLM(**SETTING), OnlyTCM(**SETTING), Hybrid(**SETTING, sigma2=0.5)])
def test_bad_groups_are_named_in_the_message(mechanism) -> None:
    """Which group holds the bad value, with the NaN's position or the shape, whole."""
    with pytest.raises(DataError, match="^" + re.escape(
            "opt-in values: value #2 is NaN; every user needs one numeric value") + "$"):
        mechanism.estimate([0.0, 1.0, math.nan], LOCAL, rng=np.random.default_rng(0))
    with pytest.raises(DataError, match="^" + re.escape(
            "local values: value #0 is NaN; every user needs one numeric value") + "$"):
        mechanism.estimate(OPTIN, [math.nan, 1.0], rng=np.random.default_rng(0))
    with pytest.raises(DataError, match="^" + re.escape(
            "local values: expected a 1-D sequence of numbers, got shape (2, 1)") + "$"):
        mechanism.estimate(OPTIN, [[1.0], [2.0]], rng=np.random.default_rng(0))

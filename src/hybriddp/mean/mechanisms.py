"""The mechanisms FullLM, OnlyTCM, Hybrid and HybridUnknownVariance, and their result MeanEstimate.

Floating-point noise, for simulations and studies only (``hybriddp mean simulate / estimate``): these
mechanisms add NumPy's float Laplace noise, whose low-order bits can leak the data in a deployment
(Mironov 2012). The collection service's curator computes the same opt-in mean and private variance
with exact discrete Laplace noise on integer statistics: :class:`hybriddp.curator.mean.DiscreteMeanCurator`
(ALGORITHM.md §11, §3.2). The device side of FullLM and the Hybrid's local reports is
:mod:`hybriddp.device.mean`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybriddp.core.errors import DataError
from hybriddp.core.rng import make_rng
from hybriddp.mean.analysis import mse_full_lm, mse_hybrid, mse_only_tcm, optimal_weight
from hybriddp.mean.inputs import (
    VARIANCE_SHARE,
    ClampCount,
    MeanSetting,
    OnSetting,
    _fraction,
    _real,
    _values,
    _variance,
    clamp_values,
)


@dataclass(frozen=True)
class MeanEstimate:
    """One run of a mechanism: the estimate and its analytic expected squared error.

    Attributes
    ----------
    mechanism : "FullLM", "OnlyTCM", "Hybrid" or "Hybrid, unknown σ²".
    estimate : the DP estimate of the mean of all users (of their clamped values).
    expected_squared_error : the analytic E[(estimate − μ̄)²] (ALGORITHM.md §11), with ``sigma2``.
    n_optin, n_local : group sizes n_T and n_L.
    clamped : values that were clamped before randomizing (both groups).
    sigma2 : the variance used in the error formula (and for the weight), or None (FullLM).
    sigma2_source : where ``sigma2`` came from: "given", "worst case Δ²/4", "private estimate".
    weight : w on the opt-in mean (Hybrid), 1 for OnlyTCM, None for FullLM.
    guarantee : the privacy guarantee of each group, in words.
    private_sigma2 : σ̂², the private variance estimate (Hybrid with unknown σ² only).
    """

    mechanism: str
    estimate: float
    expected_squared_error: float
    n_optin: int
    n_local: int
    clamped: ClampCount
    sigma2: float | None
    sigma2_source: str
    weight: float | None
    guarantee: str
    private_sigma2: float | None = None

    @property
    def rmse(self) -> float:
        """Root of the expected squared error, in the units of the values."""
        return math.sqrt(self.expected_squared_error)

    def to_json(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "estimate": self.estimate,
                "expected_squared_error": self.expected_squared_error, "rmse": self.rmse,
                "n_optin": self.n_optin, "n_local": self.n_local,
                "clamped": {"below": self.clamped.below, "above": self.clamped.above},
                "sigma2": self.sigma2, "sigma2_source": self.sigma2_source, "weight": self.weight,
                "guarantee": self.guarantee, "private_sigma2": self.private_sigma2}


class _Mechanism(OnSetting):
    """Shared parts: the validated setting, clamping, group sizes."""

    name = ""

    def __init__(self, *, lower: float, upper: float, epsilon: float) -> None:
        self.setting = MeanSetting(lower, upper, epsilon)

    def _groups(self, optin_values: Any, local_values: Any) -> tuple[np.ndarray, np.ndarray, ClampCount]:
        lo, hi = self.setting.lower, self.setting.upper
        t, ct = clamp_values(_values(optin_values, "opt-in values"), lo, hi)
        loc, cl = clamp_values(_values(local_values, "local values"), lo, hi)
        if len(t) < 1 or len(loc) < 1:
            raise DataError(f"{self.name} needs both groups non-empty: got {len(t)} opt-in and {len(loc)} "
                            "local values (ALGORITHM.md §11)")
        return t, loc, ct + cl

    def _sigma2(self, sigma2: float | None) -> tuple[float, str]:
        if sigma2 is None:
            return self.width ** 2 / 4.0, "worst case Δ²/4"
        return float(_variance(sigma2)), "given"


class FullLM(_Mechanism):
    """Everyone randomizes locally: r_i = clamp(x_i) + Lap(Δ/ε); estimate = mean(r) (Lemma 3.1).

    Guarantee: every user, opt-in or not, gets ε-LDP. Expected squared error MSE_F = 2Δ²/(ε² n)
    (it does not depend on the data). The device-side randomizer is
    :class:`hybriddp.device.mean.NumericRandomizer`; this is its batch (NumPy) equivalent.
    """

    name = "FullLM"

    @property
    def guarantee(self) -> str:
        return f"every user: {self.epsilon:g}-LDP (Laplace scale Δ/ε = {self.width / self.epsilon:g} on the device)"

    def expected_squared_error(self, n_optin: int, n_local: int, sigma2: float | None = None) -> float:
        """MSE_F = 2Δ²/(ε²n), n = n_T + n_L (σ² is not needed)."""
        return float(mse_full_lm(n_optin + n_local, epsilon=self.epsilon, width=self.width))

    def estimate(self, optin_values: Any, local_values: Any, *, rng: np.random.Generator | None = None,
                 sigma2: float | None = None) -> MeanEstimate:
        """Randomize every value (both groups) on "devices" and average the reports."""
        rng = rng if rng is not None else make_rng(None)
        t, loc, clamped = self._groups(optin_values, local_values)
        x = np.concatenate([t, loc])
        reports = x + rng.laplace(0.0, self.width / self.epsilon, len(x))
        return MeanEstimate(self.name, float(reports.mean()), self.expected_squared_error(len(t), len(loc)),
                            len(t), len(loc), clamped, None, "not needed", None, self.guarantee)


class OnlyTCM(_Mechanism):
    """Only the opt-in group: mean(clamp(x_T)) + Lap(Δ/(ε n_T)) (Lemma 3.2).

    Guarantee: opt-in users get ε-DP in the trusted-curator model (replace-one neighbours: the
    opt-in mean moves by at most Δ/n_T); the local users' data is not used. The analytic error
    MSE_T needs σ²: pass ``sigma2`` (known), else the worst case Δ²/4 is used (an upper bound).
    The noise is float Laplace: simulation only (the service's curator uses
    :class:`~hybriddp.curator.mean.DiscreteMeanCurator`).
    """

    name = "OnlyTCM"

    @property
    def guarantee(self) -> str:
        return (f"opt-in users: {self.epsilon:g}-DP, trusted curator (Laplace scale Δ/(ε·n_T)); "
                "local users: not used")

    def expected_squared_error(self, n_optin: int, n_local: int, sigma2: float | None = None) -> float:
        """MSE_T with c = n_T/n (ALGORITHM.md §11)."""
        n = n_optin + n_local
        s2, _ = self._sigma2(sigma2)
        return float(mse_only_tcm(n, n_optin / n, epsilon=self.epsilon, sigma2=s2, width=self.width))

    def estimate(self, optin_values: Any, local_values: Any, *, rng: np.random.Generator | None = None,
                 sigma2: float | None = None) -> MeanEstimate:
        """The curator's Laplace mechanism on the opt-in mean; ``local_values`` only count n."""
        rng = rng if rng is not None else make_rng(None)
        t, loc, clamped = self._groups(optin_values, local_values)
        est = float(t.mean() + rng.laplace(0.0, self.width / (self.epsilon * len(t))))
        s2, source = self._sigma2(sigma2)
        return MeanEstimate(self.name, est, self.expected_squared_error(len(t), len(loc), s2), len(t), len(loc),
                            clamped, s2, source, 1.0, self.guarantee)


class Hybrid(_Mechanism):
    """w·μ̂_T + (1−w)·μ̂_L with the optimal w* for a known σ² (Lemma 3.3, ALGORITHM.md §11).

    μ̂_T = mean(clamp(x_T)) + Lap(Δ/(ε n_T)) (curator) and μ̂_L = mean of the local reports
    clamp(x_i) + Lap(Δ/ε). w* = (B + cS)/(A + B + S) minimizes MSE_H(w) = w²A + (1−w)²B + (w−c)²S.

    Guarantee: opt-in users ε-DP (trusted curator), local users ε-LDP. The weight depends only
    on public quantities (n_T, n_L, ε, Δ and the *known* σ²), so it costs no privacy. The noise
    is float Laplace: simulation only (the service's curator computes μ̂_T with
    :class:`~hybriddp.curator.mean.DiscreteMeanCurator`, the devices use :mod:`hybriddp.device.mean`).

    Parameters
    ----------
    sigma2 : the known population variance σ² of the values (0 ≤ σ² ≤ Δ²/4 for any
        distribution on [lo, hi]).
    weight : use this fixed w instead of w* (for studying MSE_H(w)).
    """

    name = "Hybrid"

    def __init__(self, *, lower: float, upper: float, epsilon: float, sigma2: float,
                 weight: float | None = None) -> None:
        super().__init__(lower=lower, upper=upper, epsilon=epsilon)
        self.sigma2 = float(_variance(sigma2))
        self.weight = None if weight is None else float(_real("weight", weight, lambda a: a.ndim == 0,
                                                              "a finite number"))

    @property
    def guarantee(self) -> str:
        return (f"opt-in users: {self.epsilon:g}-DP, trusted curator (Laplace scale Δ/(ε·n_T)); local users: "
                f"{self.epsilon:g}-LDP (Laplace scale Δ/ε on the device); σ² is public")

    def weight_for(self, n_optin: int, n_local: int, sigma2: float | None = None) -> float:
        """The weight used: the fixed one, else w* for these group sizes."""
        if self.weight is not None:
            return self.weight
        n = n_optin + n_local
        s2 = self.sigma2 if sigma2 is None else sigma2
        return float(optimal_weight(n, n_optin / n, epsilon=self.epsilon, sigma2=s2, width=self.width))

    def expected_squared_error(self, n_optin: int, n_local: int, sigma2: float | None = None,
                               weight: float | None = None) -> float:
        """MSE_H(w) with c = n_T/n; w defaults to :meth:`weight_for`, σ² to the known one."""
        n = n_optin + n_local
        s2 = self.sigma2 if sigma2 is None else sigma2
        w = self.weight_for(n_optin, n_local) if weight is None else weight
        return float(mse_hybrid(w, n, n_optin / n, epsilon=self.epsilon, sigma2=s2, width=self.width))

    def estimate(self, optin_values: Any, local_values: Any, *, rng: np.random.Generator | None = None,
                 sigma2: float | None = None) -> MeanEstimate:
        """Blend the curator's opt-in mean and the local reports' mean with weight w.

        ``sigma2`` here only changes the variance the *error* is evaluated at (e.g. the data's
        true variance in a simulation); the weight uses the known σ² given at construction.
        """
        rng = rng if rng is not None else make_rng(None)
        t, loc, clamped = self._groups(optin_values, local_values)
        mu_t = t.mean() + rng.laplace(0.0, self.width / (self.epsilon * len(t)))
        mu_l = (loc + rng.laplace(0.0, self.width / self.epsilon, len(loc))).mean()
        w = self.weight_for(len(t), len(loc))
        s2 = self.sigma2 if sigma2 is None else float(_variance(sigma2))
        return MeanEstimate(self.name, float(w * mu_t + (1.0 - w) * mu_l),
                            self.expected_squared_error(len(t), len(loc), s2), len(t), len(loc), clamped,  # at w
                            s2, "given", w, self.guarantee)


class HybridUnknownVariance(Hybrid):
    """Hybrid when σ² is unknown: estimate it privately from the opt-in group, plug it into w*.

    The opt-in group's budget ε is split by sequential composition:

    1. ρ·ε (ρ = ``variance_share``, default :data:`VARIANCE_SHARE` = 0.2) buys the variance:
       σ̂² = clip(s²_T + Lap(Δ²/(n_T ρ ε)), 0, Δ²/4), where s²_T is the sample variance
       (divisor n_T − 1) of the clamped opt-in values. Its sensitivity under replacing one
       value is ≤ Δ²/n_T: for values in [0, Δ], replacing a by b changes Σ(x − x̄)²/n_T by
       (b − a)(a + b − 2m)(n_T − 1)/n_T², m the mean of the others, and |(b−a)(a+b−2m)| =
       |(b−m)² − (a−m)²| ≤ Δ². The clip is post-processing (σ² ≤ Δ²/4 by Popoviciu). With
       n_T = 1 there is no sample variance: s²_T := 0 (a constant, so still ρε-DP).
    2. (1 − ρ)·ε buys the mean: μ̂_T = mean(x_T) + Lap(Δ/(n_T (1 − ρ) ε)).
    3. ŵ = w*(σ̂²) computed with A' = 2Δ²/((1−ρ)²ε² n_T²) — post-processing of DP outputs.

    Guarantee: opt-in users ε-DP in the trusted-curator model (ρε + (1−ρ)ε); local users ε-LDP,
    exactly as in :class:`Hybrid` (their budget is untouched). The price is A' = A/(1−ρ)² and the
    error of ŵ. The reported ``expected_squared_error`` is MSE_H(ŵ) with A' and σ² := σ̂² — what
    the analyst can compute without further privacy cost; it is the exact expected error of a
    blend with a fixed weight ŵ (ŵ is random and mildly correlated with the opt-in data, so it is
    not the exact unconditional error). The tests bound the real (Monte Carlo) error by a
    stated factor of the known-variance Hybrid's.
    """

    name = "Hybrid, unknown σ²"

    def __init__(self, *, lower: float, upper: float, epsilon: float,
                 variance_share: float = VARIANCE_SHARE) -> None:
        _Mechanism.__init__(self, lower=lower, upper=upper, epsilon=epsilon)
        self.variance_share = float(_fraction(variance_share, "variance_share"))
        self.sigma2 = self.width ** 2 / 4.0  # unused: the weight comes from σ̂²
        self.weight = None

    @property
    def variance_epsilon(self) -> float:
        """ε_v = ρ·ε, spent on the private variance."""
        return self.variance_share * self.epsilon

    @property
    def mean_epsilon(self) -> float:
        """ε_m = (1 − ρ)·ε, spent on the opt-in mean."""
        return (1.0 - self.variance_share) * self.epsilon

    @property
    def guarantee(self) -> str:
        return (f"opt-in users: {self.epsilon:g}-DP, trusted curator, by sequential composition of "
                f"{self.variance_epsilon:g} (variance, Laplace scale Δ²/(n_T·ε_v)) + {self.mean_epsilon:g} (mean, "
                f"Laplace scale Δ/(n_T·ε_m)); local users: {self.epsilon:g}-LDP; the weight is post-processing")

    def private_variance(self, optin_values: np.ndarray, rng: np.random.Generator) -> float:
        """σ̂² = clip(s² + Lap(Δ²/(n_T ε_v)), 0, Δ²/4) of clamped opt-in values (ρε-DP).

        Float Laplace noise: simulation only. The service's curator releases σ̂² with exact discrete
        noise on the integer statistic n·Σk² − (Σk)² of the snapped values, same sensitivity argument
        (:meth:`hybriddp.curator.mean.DiscreteMeanCurator.private_variance`).
        """
        n_t = len(optin_values)
        s2 = float(np.var(optin_values, ddof=1)) if n_t > 1 else 0.0
        noisy = s2 + rng.laplace(0.0, self.width ** 2 / (n_t * self.variance_epsilon))
        return float(np.clip(noisy, 0.0, self.width ** 2 / 4.0))

    def weight_for(self, n_optin: int, n_local: int, sigma2: float | None = None) -> float:
        """ŵ = w*(σ²) with the opt-in mean's budget (1 − ρ)ε; ``sigma2`` is σ̂² (required)."""
        if sigma2 is None:
            raise ValueError("HybridUnknownVariance.weight_for needs the (private) variance estimate")
        n = n_optin + n_local
        return float(optimal_weight(n, n_optin / n, epsilon=self.epsilon, sigma2=sigma2, width=self.width,
                                    optin_epsilon=self.mean_epsilon))

    def expected_squared_error(self, n_optin: int, n_local: int, sigma2: float | None = None,
                               weight: float | None = None) -> float:
        """MSE_H(w) with A' (budget (1−ρ)ε for the opt-in mean), at variance σ² and weight w.

        ``weight`` defaults to w*(σ²) — the ideal: what the blend would achieve if σ̂² = σ².
        """
        if sigma2 is None:
            raise ValueError("HybridUnknownVariance.expected_squared_error needs a variance")
        n = n_optin + n_local
        w = self.weight_for(n_optin, n_local, sigma2) if weight is None else weight
        return float(mse_hybrid(w, n, n_optin / n, epsilon=self.epsilon, sigma2=sigma2, width=self.width,
                                optin_epsilon=self.mean_epsilon))

    def estimate(self, optin_values: Any, local_values: Any, *, rng: np.random.Generator | None = None,
                 sigma2: float | None = None) -> MeanEstimate:
        """Private variance (ρε), private opt-in mean ((1−ρ)ε), local reports, blend with ŵ.

        The error is reported at σ̂² unless ``sigma2`` is given (e.g. the data's true variance
        in a simulation, to evaluate the blend that was actually used).
        """
        rng = rng if rng is not None else make_rng(None)
        t, loc, clamped = self._groups(optin_values, local_values)
        s2_hat = self.private_variance(t, rng)
        mu_t = t.mean() + rng.laplace(0.0, self.width / (self.mean_epsilon * len(t)))
        mu_l = (loc + rng.laplace(0.0, self.width / self.epsilon, len(loc))).mean()
        w = self.weight_for(len(t), len(loc), s2_hat)
        s2, source = (s2_hat, "private estimate") if sigma2 is None else (float(_variance(sigma2)), "given")
        return MeanEstimate(self.name, float(w * mu_t + (1.0 - w) * mu_l),
                            self.expected_squared_error(len(t), len(loc), s2, w), len(t), len(loc), clamped,
                            s2, source, w, self.guarantee, s2_hat)

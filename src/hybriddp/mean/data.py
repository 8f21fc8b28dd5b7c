"""One run of every mechanism on fixed data, with a random opt-in split (:func:`simulate_on_data`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hybriddp.core.params import check_seed
from hybriddp.core.rng import SEED_WARNING, make_rng
from hybriddp.mean.inputs import (
    VARIANCE_SHARE,
    ClampCount,
    MeanSetting,
    _fraction,
    _values,
    check_noise_scales,
    clamp_values,
    group_sizes,
)
from hybriddp.mean.mechanisms import FullLM, Hybrid, HybridUnknownVariance, MeanEstimate, OnlyTCM


@dataclass(frozen=True)
class DataRun:
    """:func:`simulate_on_data`: one random opt-in split of fixed data, four mechanisms.

    ``estimates`` maps "full_lm", "only_tcm", "hybrid_oracle", "hybrid_unknown_variance" to a
    :class:`MeanEstimate` whose ``expected_squared_error`` is evaluated at the data's sample
    variance s² (divisor n − 1) of the clamped values: the exact expected error over the random
    opt-in subset and the noise, for this data (the Hybrid with unknown σ² at the weight it used).
    """

    n: int
    n_optin: int
    n_local: int
    epsilon: float
    lower: float
    upper: float
    true_mean: float
    clamped_mean: float
    sample_variance: float
    clamped: ClampCount
    estimates: dict[str, MeanEstimate]
    variance_share: float
    seed: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "n": self.n, "n_optin": self.n_optin, "n_local": self.n_local, "epsilon": self.epsilon,
            "lower": self.lower, "upper": self.upper, "true_mean": self.true_mean,
            "clamped_mean": self.clamped_mean, "sample_variance": self.sample_variance,
            "clamped": {"below": self.clamped.below, "above": self.clamped.above, "total": self.clamped.total},
            "variance_share": self.variance_share,
            "estimates": {k: v.to_json() for k, v in self.estimates.items()},
            "seed": self.seed, "notes": self.notes,
        }
        if self.seed is not None:
            obj["warning"] = SEED_WARNING
        return obj


def simulate_on_data(values: Any, *, lower: float, upper: float, epsilon: float, optin_fraction: float,
                     seed: int | None = None, variance_share: float = VARIANCE_SHARE) -> DataRun:
    """Simulate the hybrid model on real data: one value per user (ALGORITHM.md §11).

    A uniformly random subset of round(c·n) users opts in; the others randomize locally. Runs
    FullLM, OnlyTCM, Hybrid with the *oracle* σ² = s² of the data (simulation only: it reads the
    raw data, so that weight is not private) and :class:`HybridUnknownVariance` (fully private).
    """
    setting = MeanSetting(lower, upper, epsilon)
    raw = _values(values, "values")
    n_t, n_l = group_sizes(len(raw), optin_fraction)
    check_noise_scales(epsilon, n_t, n_l, float(_fraction(variance_share, "variance_share")))
    check_seed(seed)
    x, clamped = clamp_values(raw, setting.lower, setting.upper, log=False)
    rng_split, rng_f, rng_t, rng_h, rng_u = make_rng(seed).spawn(5)
    optin = np.zeros(len(x), dtype=bool)
    optin[rng_split.choice(len(x), size=n_t, replace=False)] = True
    x_t, x_l = x[optin], x[~optin]
    s2 = float(np.var(x, ddof=1))
    kw = {"lower": setting.lower, "upper": setting.upper, "epsilon": float(epsilon)}
    oracle = Hybrid(sigma2=s2, **kw)
    unknown = HybridUnknownVariance(variance_share=variance_share, **kw)
    estimates = {
        "full_lm": FullLM(**kw).estimate(x_t, x_l, rng=rng_f),
        "only_tcm": OnlyTCM(**kw).estimate(x_t, x_l, rng=rng_t, sigma2=s2),
        "hybrid_oracle": oracle.estimate(x_t, x_l, rng=rng_h),
        "hybrid_unknown_variance": unknown.estimate(x_t, x_l, rng=rng_u, sigma2=s2),
    }
    # clamping was done here on the raw data; report it once (the mechanisms saw clean values)
    estimates = {k: _with_clamped(v, clamped) for k, v in estimates.items()}
    notes = ["analytic RMSEs: expectation over the random opt-in subset and the noise, for this data, "
             "at its sample variance s² (divisor n − 1); Hybrid with unknown σ² at the weight it used",
             "Hybrid (oracle σ²) uses the data's true variance: a simulation benchmark, not private"]
    if clamped.total:
        notes.append(f"{clamped.total} values outside [{setting.lower:g}, {setting.upper:g}] were clamped "
                     f"({clamped.below} below, {clamped.above} above); the estimates target the clamped mean "
                     "(count from raw data: not differentially private, for your information)")
    return DataRun(len(x), n_t, len(x) - n_t, float(epsilon), float(lower), float(upper), float(raw.mean()),
                   float(x.mean()), s2, clamped, estimates, float(variance_share), seed, notes)


def _with_clamped(est: MeanEstimate, clamped: ClampCount) -> MeanEstimate:
    return replace(est, clamped=clamped)

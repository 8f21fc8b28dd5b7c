"""Monte Carlo on drawn data: analytic vs simulated MSE of every mechanism (:func:`simulate`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.core.params import check_seed
from hybriddp.core.rng import SEED_WARNING, make_rng
from hybriddp.mean.analysis import improvement, mse_full_lm, mse_hybrid_optimal, mse_only_tcm, optimal_weight
from hybriddp.mean.distributions import _BLOCK_ELEMENTS, Distribution
from hybriddp.mean.inputs import (
    MAX_USERS,
    VARIANCE_SHARE,
    MeanSetting,
    _fraction,
    _label,
    check_noise_scales,
    group_sizes,
    logger,
)

_MAX_JOB_TRIALS = 1 << 15

MAX_TRIALS = 10**9
"""Largest ``trials`` of :func:`simulate` (bernoulli values: ~15 minutes on one core)."""

MAX_SIMULATED_VALUES = 10**11
"""Largest number of values :func:`simulate` may draw in all (``trials`` × values per trial; ~100 ns each for
beta, so about 3 hours on one core)."""


# ----- Monte Carlo (drawn data) -------------------------------------------------------------
@dataclass
class _Moments:
    """Count, mean and M2 of the squared errors (Chan et al.'s parallel combination)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @classmethod
    def of(cls, x: np.ndarray) -> _Moments:
        m = float(x.mean())
        return cls(len(x), m, float(((x - m) ** 2).sum()))

    def add(self, o: _Moments) -> None:
        n = self.count + o.count
        d = o.mean - self.mean
        self.m2 += o.m2 + d * d * self.count * o.count / n
        self.mean += d * o.count / n
        self.count = n

    @property
    def se(self) -> float:
        """Standard error of the mean squared error."""
        return math.sqrt(self.m2 / (self.count - 1) / self.count) if self.count > 1 else math.inf


@dataclass(frozen=True)
class MechanismMSE:
    """Analytic and Monte Carlo MSE of one mechanism."""

    analytic: float
    simulated: float
    simulated_se: float

    @property
    def z(self) -> float:
        """(simulated − analytic)/SE."""
        return (self.simulated - self.analytic) / self.simulated_se if self.simulated_se > 0 else 0.0


MECHANISM_KEYS = ("mse_full_lm", "mse_only_tcm", "mse_hybrid", "mse_hybrid_unknown_variance")


@dataclass(frozen=True)
class SimulationResult:
    """What :func:`simulate` measured. ``mse[key]`` for key in :data:`MECHANISM_KEYS`.

    For ``mse_hybrid_unknown_variance``, ``analytic`` is the *ideal* MSE_H(w*) with the split
    budget (what it would be if σ̂² were exact), not the exact error of the plug-in weight.
    """

    n: int
    n_optin: int
    n_local: int
    optin_fraction: float
    epsilon: float
    lower: float
    upper: float
    distribution: Distribution
    sigma2: float
    trials: int
    variance_share: float
    seed: int | None
    mse: dict[str, MechanismMSE]
    w_star: float
    r: float
    seconds: float

    @property
    def r_simulated(self) -> float:
        """min(simulated MSE_F, MSE_T)/simulated MSE_H."""
        m = self.mse
        return min(m["mse_full_lm"].simulated, m["mse_only_tcm"].simulated) / m["mse_hybrid"].simulated

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "n": self.n, "n_optin": self.n_optin, "n_local": self.n_local, "optin_fraction": self.optin_fraction,
            "epsilon": self.epsilon, "lower": self.lower, "upper": self.upper,
            "distribution": str(self.distribution), "sigma2": self.sigma2, "trials": self.trials,
            "model": "values drawn i.i.d. each trial; opt-in group a uniformly random subset of size "
                     "round(c·n); target: the sample mean of all n values",
        }
        for key, m in self.mse.items():
            name = "analytic_ideal" if key == "mse_hybrid_unknown_variance" else "analytic"
            obj[key] = {name: m.analytic, "simulated": m.simulated, "simulated_se": m.simulated_se}
        obj["mse_hybrid_unknown_variance"]["variance_share"] = self.variance_share
        obj.update({"w_star": self.w_star, "r": self.r, "r_simulated": self.r_simulated,
                    "seconds": round(self.seconds, 3), "seed": self.seed})
        if self.seed is not None:
            obj["warning"] = SEED_WARNING
        return obj


@dataclass(frozen=True)
class _Plan:
    n_t: int
    n_l: int
    epsilon: float
    variance_share: float
    dist: Distribution
    w_star: float


def _simulate_job(plan: _Plan, rng: np.random.Generator, k: int) -> list[_Moments]:
    """k trials in units of Δ (values on [0, 1]); squared errors of the four mechanisms.

    Per trial, with D = μ̄_T − μ̄_L and c = n_T/n (so μ̄ = c μ̄_T + (1−c) μ̄_L):
    FullLM error = mean of n Lap(1/ε) = (G − G')/(ε n), G, G' ~ Gamma(n, 1) (exact: Lap = E − E');
    OnlyTCM error = Lap(1/(ε n_T)) + (1 − c)D; Hybrid error = w·Lap_T + (1 − w)·noise_L + (w − c)D.
    """
    n_t, n_l, eps = plan.n_t, plan.n_l, plan.epsilon
    n = n_t + n_l
    c = n_t / n
    s_t, q_t = plan.dist.group_sums(rng, n_t, k, squares=True)
    s_l, _ = plan.dist.group_sums(rng, n_l, k, squares=False)
    d = s_t / n_t - s_l / n_l
    e_full = (rng.standard_gamma(n, k) - rng.standard_gamma(n, k)) / (eps * n)
    noise_l = (rng.standard_gamma(n_l, k) - rng.standard_gamma(n_l, k)) / (eps * n_l)
    lap_t = rng.laplace(0.0, 1.0 / (eps * n_t), k)
    e_tcm = lap_t + (1.0 - c) * d
    w = plan.w_star
    e_hyb = w * lap_t + (1.0 - w) * noise_l + (w - c) * d
    # unknown σ²: private sample variance (ρε), opt-in mean with (1 − ρ)ε, plug-in weight
    eps_v, eps_m = plan.variance_share * eps, (1.0 - plan.variance_share) * eps
    s2 = (q_t - s_t * s_t / n_t) / (n_t - 1) if n_t > 1 else np.zeros(k)
    s2_hat = np.clip(s2 + rng.laplace(0.0, 1.0 / (n_t * eps_v), k), 0.0, 0.25)
    w_hat = optimal_weight(n, c, epsilon=eps, sigma2=s2_hat, optin_epsilon=eps_m)
    lap_m = rng.laplace(0.0, 1.0 / (eps_m * n_t), k)
    e_unk = w_hat * lap_m + (1.0 - w_hat) * noise_l + (w_hat - c) * d
    return [_Moments.of(e * e) for e in (e_full, e_tcm, e_hyb, e_unk)]


def simulate(n: int, optin_fraction: float, epsilon: float, *, lower: float = 0.0, upper: float = 1.0,
             distribution: str | Distribution = "uniform", trials: int = 10_000, seed: int | None = None,
             variance_share: float = VARIANCE_SHARE,
             progress: Callable[[int, int], Any] | None = None) -> SimulationResult:
    """Analytic and Monte Carlo MSE of FullLM, OnlyTCM, Hybrid(w*) and Hybrid with unknown σ².

    The model (ALGORITHM.md §11): each trial draws n values i.i.d. from ``distribution`` scaled to
    [lower, upper]; a uniformly random subset of n_T = round(c·n) users opts in (with i.i.d.
    values, the first n_T are such a subset); the target is the sample mean of all n values.
    The analytic MSEs use σ² = Δ²·Var(distribution on [0, 1]) and c = n_T/n.

    Vectorized over trials; no n × trials array: the local noise mean is exact via a difference
    of two Gamma draws; group sums are Binomial (bernoulli), a 53-term binomial bit decomposition
    (uniform, local group) or drawn in blocks of ≤ 2²¹ values (uniform opt-in group, which needs
    Σy² for the variance; beta). Cost: O(trials) for bernoulli; O(trials·n_T) for uniform (the
    opt-in group's values are drawn); O(trials·n) for beta (~40 ns per value). Trials run in
    jobs of ≤ 2¹⁵, each with its own child generator (``Generator.spawn``).

    Parameters
    ----------
    n, optin_fraction, epsilon : users, opt-in rate c, privacy loss ε.
    lower, upper : the value range (Δ = upper − lower).
    distribution : ``uniform`` | ``beta:a,b`` | ``bernoulli:p`` (on [lower, upper]).
    trials : Monte Carlo trials (≥ 2).
    seed : reproducible experiments; default OS randomness.
    variance_share : ρ of :class:`HybridUnknownVariance`.
    progress : ``progress(done_trials, trials)`` after each job.
    """
    setting = MeanSetting(lower, upper, epsilon)
    if not isinstance(n, bool) and isinstance(n, (int, np.integer)) and n > MAX_USERS:
        raise parameter_error(_label("n"), n, f"at most {MAX_USERS:.0e} (number of users)")
    n_t, n_l = group_sizes(n, optin_fraction)
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or not 2 <= trials <= MAX_TRIALS:
        raise parameter_error(_label("trials"), trials, f"an integer from 2 to {MAX_TRIALS:,}",
                              "10,000 trials give the MSEs to about 1-2%.")
    rho = float(_fraction(variance_share, "variance_share"))
    check_noise_scales(epsilon, n_t, n_l, rho)
    check_seed(seed)
    dist = Distribution.parse(distribution)
    eps, width = float(epsilon), setting.width
    c = n_t / n
    sigma2 = width * width * dist.variance
    w_star = float(optimal_weight(n, c, epsilon=eps, sigma2=dist.variance))
    plan = _Plan(n_t, n_l, eps, rho, dist, w_star)
    per_trial = max(dist.elements_per_trial(n_t, True), dist.elements_per_trial(n_l, False))
    values = int(trials) * (dist.elements_per_trial(n_t, True) + dist.elements_per_trial(n_l, False))
    if values > MAX_SIMULATED_VALUES:
        most = max(2, MAX_SIMULATED_VALUES // (values // int(trials)))
        raise parameter_error(_label("trials"), int(trials), f"at most {most:,} with --n {n:,} and --distribution "
                              f"{dist}: each trial draws {values // int(trials):,} values, and more than "
                              f"{MAX_SIMULATED_VALUES:.0e} in all take hours",
                              "Use fewer trials or a smaller --n (bernoulli values are O(1) per trial).")
    job = int(min(_MAX_JOB_TRIALS, max(1, _BLOCK_ELEMENTS // per_trial)))
    sizes = [min(job, trials - i) for i in range(0, trials, job)]
    rngs = make_rng(seed).spawn(len(sizes))
    logger.info("simulating %d trials in %d jobs of <= %d", trials, len(sizes), job)
    start = time.perf_counter()
    totals = [_Moments() for _ in MECHANISM_KEYS]
    done = 0
    for rng, k in zip(rngs, sizes, strict=True):
        for tot, m in zip(totals, _simulate_job(plan, rng, k), strict=True):
            tot.add(m)
        done += k
        if progress is not None:
            progress(done, trials)
    seconds = time.perf_counter() - start
    kw = {"epsilon": eps, "sigma2": sigma2, "width": width}
    analytic = [float(mse_full_lm(n, epsilon=eps, width=width)), float(mse_only_tcm(n, c, **kw)),
                float(mse_hybrid_optimal(n, c, **kw)),
                float(mse_hybrid_optimal(n, c, optin_epsilon=(1.0 - rho) * eps, **kw))]
    scale = width * width
    mse = {key: MechanismMSE(a, tot.mean * scale, tot.se * scale)
           for key, a, tot in zip(MECHANISM_KEYS, analytic, totals, strict=True)}
    return SimulationResult(int(n), n_t, n_l, float(optin_fraction), eps, float(lower), float(upper), dist, sigma2,
                            int(trials), rho, seed, mse, w_star, float(improvement(n, c, **kw)), seconds)

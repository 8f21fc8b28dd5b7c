"""Hybrid mean estimation: a few users opt in, the rest randomize on their devices (ALGORITHM.md §11).

Dubey & Korolova, "The Power of the Hybrid Model for Mean Estimation" (PPML @ NeurIPS 2018;
``papers/hybrid-model-mean-estimation-2018.txt``). Every one of n users holds a value in a
public range [lo, hi] (Δ = hi − lo). A fraction c of them opts in and trusts the curator
(n_T = round(c·n) users, trusted-curator model); the other n_L = n − n_T randomize locally.
The target is the sample mean μ̄ of all n users. Every mechanism uses the Laplace mechanism.

* :class:`FullLM` (paper Lemma 3.1): everyone reports x_i + Lap(Δ/ε); MSE_F = 2Δ²/(ε²n).
* :class:`OnlyTCM` (Lemma 3.2): mean of the opt-in values + Lap(Δ/(ε n_T));
  MSE_T = 2Δ²/(ε² n_T²) + σ²(1−c)/(c n).
* :class:`Hybrid` (Lemma 3.3): w·μ̂_T + (1−w)·μ̂_L with, for A = 2Δ²/(ε² n_T²),
  B = 2Δ²/(ε² n_L), S = σ²/(c(1−c)n),
  MSE_H(w) = w²A + (1−w)²B + (w − c)²S, minimized by w* = (B + cS)/(A + B + S).
* Improvement (Theorem 3.4): R = min(MSE_F, MSE_T)/MSE_H(w*).
* :class:`HybridUnknownVariance`: σ² is not known; the opt-in group spends ρ·ε of its budget
  on a private sample variance and (1 − ρ)·ε on its mean (see the class).

Where the expectation is taken (the error model)
------------------------------------------------
Over the Laplace noise and over *which* users opt in (a uniformly random subset of size n_T).
The formulas hold exactly, not only asymptotically, in two settings:

* **drawn data** (:func:`simulate`): the n values are i.i.d. from a distribution with variance
  σ² (fresh each trial); then μ̄_T − μ̄_L has variance σ²(1/n_T + 1/n_L) = S;
* **fixed data** (:func:`simulate_on_data`, ``hybriddp mean estimate``): the n values are given
  and only the opt-in subset is random (sampling without replacement); the formulas hold with
  σ² := s² = Σ(x_i − μ̄)²/(n − 1), the data's sample variance.

The formula functions take n and c as real numbers (for plots); the mechanisms and simulations
use the realized group sizes, c = n_T/n. Clamping to [lo, hi] happens before anything else;
the errors are about the mean of the clamped values, and clamping is counted and reported.

Randomness: NumPy generators from :func:`hybriddp.core.rng.make_rng` (OS-seeded unless a seed is
given; a seed is for experiments only and gives no privacy). One device's randomizer without
NumPy is :mod:`hybriddp.device.mean`.

Floating-point noise: the mechanisms above and :func:`simulate` add NumPy's float Laplace noise,
which is fine for simulations and studies but leaks through its low-order bits in a deployment
(Mironov 2012). The collection service's curator uses
:class:`hybriddp.curator.mean.DiscreteMeanCurator`: the same opt-in mean and private variance from integers, with
exact discrete Laplace noise drawn from the OS CSPRNG.
"""

from __future__ import annotations

# ``X as X``: a public name that is not in __all__, reachable as
# ``hybriddp.mean.X``. The private helpers live in the submodules; the logger lives in ``inputs``.
from hybriddp.mean.analysis import (
    crossover_n,
    hybrid_terms,
    improvement,
    mse_full_lm,
    mse_hybrid,
    mse_hybrid_optimal,
    mse_only_tcm,
    optimal_weight,
)
from hybriddp.mean.data import DataRun, simulate_on_data
from hybriddp.mean.distributions import Distribution
from hybriddp.mean.inputs import OPTION_NAMES as OPTION_NAMES
from hybriddp.mean.inputs import VARIANCE_SHARE, ClampCount, MeanSetting, clamp_values, group_sizes
from hybriddp.mean.inputs import Real as Real
from hybriddp.mean.inputs import logger as logger
from hybriddp.mean.mechanisms import FullLM, Hybrid, HybridUnknownVariance, MeanEstimate, OnlyTCM
from hybriddp.mean.plots import plot_improvement_vs_n, plot_mse_vs_n
from hybriddp.mean.simulation import MECHANISM_KEYS as MECHANISM_KEYS
from hybriddp.mean.simulation import MechanismMSE, SimulationResult, simulate

__all__ = [
    "VARIANCE_SHARE",
    "ClampCount",
    "DataRun",
    "Distribution",
    "FullLM",
    "Hybrid",
    "HybridUnknownVariance",
    "MeanEstimate",
    "MeanSetting",
    "MechanismMSE",
    "OnlyTCM",
    "SimulationResult",
    "clamp_values",
    "crossover_n",
    "group_sizes",
    "hybrid_terms",
    "improvement",
    "mse_full_lm",
    "mse_hybrid",
    "mse_hybrid_optimal",
    "mse_only_tcm",
    "optimal_weight",
    "plot_improvement_vs_n",
    "plot_mse_vs_n",
    "simulate",
    "simulate_on_data",
]

"""Scenarios: neighbouring inputs, output events, and the event chosen from a closed form."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from hybriddp.core.errors import parameter_error

Adapter = Callable[[np.random.Generator, int], tuple[Any, Any]]
"""``(rng, trials) -> (outputs on x, outputs on x')``: the real mechanism, vectorized over trials."""


@dataclass(frozen=True)
class Event:
    """An output event: ``indicator(outputs)`` is a bool array, one entry per trial."""

    name: str
    indicator: Callable[[Any], np.ndarray]


@dataclass(frozen=True)
class Scenario:
    """A pair of neighbouring inputs, the adapter that runs the mechanism on both, and events."""

    name: str
    x: str
    x_prime: str
    adapter: Adapter
    events: tuple[Event, ...]


@dataclass(frozen=True)
class MechanismAudit:
    """What to audit: the claim (ε, δ), the scenarios, and facts about the instance (``details``)."""

    mechanism: str
    epsilon: float
    delta: float
    scenarios: tuple[Scenario, ...]
    details: dict[str, Any] = field(default_factory=dict)


def _z(alpha: float) -> float:
    return NormalDist().inv_cdf(1.0 - alpha)


def predicted_lower_bound(p: float, p_prime: float, delta: float, trials: int, z: float) -> float:
    """The ε_lb to expect from an event with P[E|x] = p, P[E|x'] = p' (normal approximation)."""
    lo = p - z * math.sqrt(p * (1.0 - p) / trials)
    hi = p_prime + z * math.sqrt(p_prime * (1.0 - p_prime) / trials)
    if lo - delta <= 0 or hi <= 0:
        return 0.0
    return math.log((lo - delta) / hi)


def best_event(P: np.ndarray, delta: float, trials: int, z: float) -> tuple[int, int, np.ndarray, float]:
    """Neighbouring records (i, j) and output set E with the best predicted ε_lb, from a closed form.

    For every ordered pair of rows of the channel matrix ``P`` (P[y|x]), the candidate events are
    the Neyman–Pearson sets {y : P[y|x]/P[y|x'] ≥ λ} for each distinct likelihood ratio λ (the
    most powerful tests; Jagielski et al. 2020, Nasr et al. 2021); the one with the largest
    :func:`predicted_lower_bound` at ``trials`` is chosen *before* any sampling.

    Returns
    -------
    (i, j, outputs in E, predicted ε_lb)
    """
    best: tuple[int, int, np.ndarray, float] = (0, 1, np.array([0]), -math.inf)
    n = P.shape[0]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(P[j] > 0, P[i] / np.where(P[j] > 0, P[j], 1.0), np.inf)
            order = np.argsort(-ratio, kind="stable")
            r_sorted = ratio[order]
            cut_points = [c for c in range(1, n) if r_sorted[c] != r_sorted[c - 1]]
            for c in cut_points:
                members = order[:c]
                score = predicted_lower_bound(float(P[i, members].sum()), float(P[j, members].sum()),
                                              delta, trials, z)
                if score > best[3]:
                    best = (i, j, np.sort(members), score)
    return best


def _event_epsilon(p_x: float, p_xp: float, delta: float) -> float:
    """ln((P[E|x] − δ)/P[E|x']) from exact probabilities: what the audit tends to as trials → ∞."""
    return math.log((p_x - delta) / p_xp) if p_x > delta and p_xp > 0 else 0.0


def _check_delta_or_zero(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise parameter_error("delta (--delta)", delta, "in [0, 1) (0 for a pure ε-DP claim)")

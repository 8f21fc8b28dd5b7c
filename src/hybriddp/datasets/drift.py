"""Synthetic logs over periods whose query popularity drifts, with the truth known (ALGORITHM.md §10, §13).

:func:`plan_drift` picks, among the head queries of ranks ``ranks``, ``n_rising`` queries that rise and
``n_falling`` that fall: each changes its probability by the factor ``change`` (or 1/``change``) at one period
``t`` (drawn uniformly in 1 … periods − 1) and keeps the new level after it, a step. Every other head query keeps
its weight; the head is rescaled to its total mass each period, so the others move by the same small factor.
:func:`drift_logs` generates one log per period (a fresh sample of the preset's population, :func:`generate`
with the period's ``head_weights``).

The truth is exact, not estimated: :meth:`Drift.head_probabilities` of every period, and :meth:`Drift.changes`,
the (query, period) pairs whose probability changed by at least a factor between consecutive periods.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.core.records import RecordLog
from hybriddp.core.rng import make_rng
from hybriddp.datasets.generator import generate, weighted_head
from hybriddp.datasets.presets import get_preset


@dataclass(frozen=True)
class Drift:
    """A drift plan: per period, the multiplier of every head query's probability (``weights``, periods × head)."""

    preset: str
    weights: np.ndarray
    rising: tuple[tuple[int, int], ...]  # (head query id, period at which it rose)
    falling: tuple[tuple[int, int], ...]

    @property
    def periods(self) -> int:
        return int(self.weights.shape[0])

    def head_probabilities(self) -> np.ndarray:
        """The head queries' probabilities in every period (periods × head), as :func:`generate` draws them."""
        pre = get_preset(self.preset)
        return np.stack([weighted_head(pre, w) for w in self.weights])

    def changes(self, at_least: float = 1.5) -> dict[str, set[tuple[int, int]]]:
        """``{"rising": {(query id, t)}, "falling": {...}}``: the head queries whose probability rose to at least
        ``at_least`` times (fell to at most 1/``at_least``) of the period before, t = 1 … periods − 1."""
        p = self.head_probabilities()
        ratio = p[1:] / p[:-1]
        up = np.argwhere(ratio >= at_least)
        down = np.argwhere(ratio <= 1.0 / at_least)
        return {"rising": {(int(q), int(t) + 1) for t, q in up}, "falling": {(int(q), int(t) + 1) for t, q in down}}


def plan_drift(preset: str = "aol", periods: int = 12, *, n_rising: int = 10, n_falling: int = 10,
               change: float = 2.0, ranks: tuple[int, int] = (5, 60), seed: int | None = None) -> Drift:
    """Choose the rising and falling queries and their periods (module docstring)."""
    pre = get_preset(preset)
    n_head = pre.head_probabilities.size
    lo, hi = ranks
    if not (isinstance(periods, int) and periods >= 2):
        raise parameter_error("periods", periods, "an integer >= 2")
    if not (0 <= lo < hi <= n_head):
        raise parameter_error("ranks", ranks, f"0 <= first < last <= {n_head} (the preset's head queries)")
    if n_rising < 0 or n_falling < 0 or n_rising + n_falling > hi - lo:
        raise parameter_error("n_rising + n_falling", n_rising + n_falling, f"between 0 and {hi - lo} (the ranks)")
    if not change > 1.0:
        raise parameter_error("change", change, "a factor > 1 (2.0: the query doubles or halves)")
    rng = make_rng(seed)
    chosen = lo + rng.permutation(hi - lo)[: n_rising + n_falling]
    when = rng.integers(1, periods, size=chosen.size)
    weights = np.ones((periods, n_head))
    for i, (q, t) in enumerate(zip(chosen.tolist(), when.tolist(), strict=True)):
        weights[t:, q] = change if i < n_rising else 1.0 / change
    pairs = list(zip(chosen.tolist(), when.tolist(), strict=True))
    return Drift(preset, weights, tuple(pairs[:n_rising]), tuple(pairs[n_rising:]))


def drift_logs(drift: Drift, *, scale: float = 1.0, seed: int | None = None) -> list[RecordLog]:
    """One log per period of ``drift``: a fresh sample of the population with that period's head weights."""
    rng = make_rng(seed)
    seeds = rng.integers(0, 2**63 - 1, size=drift.periods)
    return [generate(drift.preset, seed=int(s), scale=scale, head_weights=w)
            for s, w in zip(seeds.tolist(), drift.weights, strict=True)]

"""Carried head lists: a series keeps recently selected records listed for a few periods (ALGORITHM.md §13.1).

A record that CreateHeadList selected (its noisy S count passed τ) in one of the last ``periods`` published head
lists of a series stays on the next period's list whatever that period's S says. Its estimate there comes from T
alone (no S count is released for it), so it is unbiased whatever it did, and a query that fell below the threshold
keeps an estimate for the trend test to see the fall. Only *published* lists decide what is carried: the carried
set is a function of earlier releases, so each period's list is post-processing of its own (ε, δ)-DP
CreateHeadList output and a public input, and no privacy is spent on it. The lists stay bounded: a record carried
without being selected again drops out ``periods`` periods after its last selection, and the trim to M records
(§4) applies to the union.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.core.headlist import HeadList, record_keys, split_keys

DEFAULT_CARRY = 4
"""Periods a selected record stays listed: the trend test's default window (``experiment trends --window``), so
a fall is seen on a whole window after it."""


def selected_records(head_list: HeadList, reused: np.ndarray | None) -> np.ndarray:
    """Record keys (:func:`record_keys`) of the published list's records that S selected in its period: those whose
    S count was released (``reused``, per entry of the list: :attr:`OptinEstimates.reused`, the estimates
    document's ``reused``). Carried records have none, so they are not selected again by being carried."""
    if reused is None:
        raise ValueError("carrying head lists needs an estimator that releases S's counts (reuse or consistent): "
                         "without them a selected record cannot be told from a carried one")
    q, u = head_list.records()
    entries = head_list.map_records(q, u)
    return np.unique(record_keys(q, u)[np.asarray(reused, dtype=bool)[entries]])


@dataclass
class Carry:
    """Which records each period of a series carries (module docstring): ``update`` with every published list,
    ``records`` for the next period."""

    periods: int = DEFAULT_CARRY
    last: dict[int, int] = field(default_factory=dict)  # record key → last period it was selected

    def __post_init__(self) -> None:
        if isinstance(self.periods, bool) or not isinstance(self.periods, int) or self.periods < 0:
            raise parameter_error("carry (--carry)", self.periods, "an integer >= 0: periods a selected record stays "
                                  "listed (0: every period's list is its own)")

    def update(self, period: int, keys: np.ndarray) -> None:
        """Record that ``keys`` (:func:`selected_records`) were selected in ``period``."""
        for k in np.asarray(keys, dtype=np.int64).tolist():
            self.last[k] = period

    def records(self, period: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(query ids, URL ids) carried into ``period``: selected in one of the ``periods`` periods before it."""
        if self.periods == 0:
            return None
        keys = np.array(sorted(k for k, t in self.last.items() if 0 < period - t <= self.periods), dtype=np.int64)
        return split_keys(keys) if keys.size else None

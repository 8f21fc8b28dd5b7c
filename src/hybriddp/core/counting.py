"""Counting: the seam where the same counting job runs on NumPy or on Spark (:mod:`hybriddp.spark`).

BLENDER's heavy lifting is counting: distinct records of the opt-in group S (CreateHeadList),
head-list entries of T (EstimateOptinProbabilities), and client reports
(EstimateClientProbabilities). Everything else works on arrays of head-list size.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class CountingBackend(Protocol):
    """Counting primitives BLENDER needs (ALGORITHM.md §3, §4, §6, §9).

    Keys are non-negative int64 codes (a record ⟨q,u⟩ is ``q << 32 | u``); entries are
    indices into a head list. Implementations must return exact integer counts.
    """

    name: str

    def count_distinct(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sorted distinct keys and how often each occurs."""
        ...

    def count_entries(self, entries: np.ndarray, n_entries: int) -> np.ndarray:
        """counts[i] = number of occurrences of entry i, for i in range(n_entries)."""
        ...


class NumpyBackend:
    """Counts in memory with vectorized NumPy (``unique`` / ``bincount``); the default backend."""

    name = "numpy"

    def count_distinct(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sorted distinct keys and their counts (``np.unique``)."""
        uniq, counts = np.unique(np.asarray(keys), return_counts=True)
        return uniq, counts.astype(np.int64)

    def count_entries(self, entries: np.ndarray, n_entries: int) -> np.ndarray:
        """``np.bincount`` with ``minlength = n_entries``."""
        if len(entries) and (entries.min() < 0 or entries.max() >= n_entries):
            raise ValueError(f"entry index out of range [0, {n_entries})")
        return np.bincount(entries, minlength=n_entries).astype(np.int64)


def default_backend() -> CountingBackend:
    """The in-process NumPy backend."""
    return NumpyBackend()


__all__ = ["CountingBackend", "NumpyBackend", "default_backend"]

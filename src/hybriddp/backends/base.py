"""The small interface every counting backend implements."""

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

"""In-process counting with NumPy (``unique`` / ``bincount``)."""

from __future__ import annotations

import numpy as np


class NumpyBackend:
    """Counts in memory with vectorized NumPy; the default backend."""

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

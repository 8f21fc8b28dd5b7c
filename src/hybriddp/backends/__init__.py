"""Counting backends: the seam where the same counting job runs on NumPy or, later, Spark.

BLENDER's heavy lifting is counting: distinct records of the opt-in group S (CreateHeadList),
head-list entries of T (EstimateOptinProbabilities), and client reports
(EstimateClientProbabilities). Everything else works on arrays of head-list size.
"""

from hybriddp.backends.base import CountingBackend
from hybriddp.backends.numpy_backend import NumpyBackend

__all__ = ["CountingBackend", "NumpyBackend", "default_backend"]


def default_backend() -> CountingBackend:
    """The in-process NumPy backend."""
    return NumpyBackend()

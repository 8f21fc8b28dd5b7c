"""Thread-count defaults of the library's pools (``hybriddp.core.threads``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from hybriddp.core.threads import MAX_DEFAULT_THREADS, default_threads, set_default_threads
from hybriddp.simulation.baselines.olh import olh_estimate, olh_perturb


@pytest.fixture(autouse=True)
def _reset():
    yield
    set_default_threads(None)


def test_default_then_environment_then_override(monkeypatch) -> None:
    monkeypatch.delenv("HYBRIDDP_THREADS", raising=False)
    assert default_threads() == min(MAX_DEFAULT_THREADS, os.cpu_count() or 1)
    monkeypatch.setenv("HYBRIDDP_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("HYBRIDDP_THREADS", "zero")  # unusable values fall back to the CPU default
    assert default_threads() == min(MAX_DEFAULT_THREADS, os.cpu_count() or 1)
    set_default_threads(1)
    assert default_threads() == 1
    with pytest.raises(ValueError, match="threads"):
        set_default_threads(0)


def test_results_do_not_depend_on_the_thread_count() -> None:
    values = np.random.default_rng(0).integers(0, 64, 50_000)
    reports = olh_perturb(values, 2.0, np.random.default_rng(1))
    cand = np.arange(64)
    set_default_threads(1)
    one = olh_estimate(reports, cand)
    set_default_threads(4)
    assert np.array_equal(one, olh_estimate(reports, cand))

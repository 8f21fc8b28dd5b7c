"""Seeded calibration runs of the blend on hybriddp.server.calibration.six_queries(), computed once per test session
and shared
by tests/test_blend.py and tests/test_consistency.py (hybriddp.server.calibration; ALGORITHM.md §7, §7.1)."""

from __future__ import annotations

import functools

from hybriddp.core.reportlaw import LocalAlgParams
from hybriddp.server.calibration import Calibration, calibrate, six_queries

N_T, N_S, N_C = 500, 9_500, 20_000


@functools.cache
def six_queries_calibration(with_s: bool) -> dict[str, Calibration]:
    """``with_s`` False: paper and pooled over 4,000 rounds of |D_T| = 500 opt-in records, 20,000 reports.
    True: reuse and consistent over 5,000 rounds with |D_S| = 9,500 more (f_O = 0.95)."""
    hl, p = six_queries()
    lp = LocalAlgParams.build(hl, 4.0, 1e-5, 0.85, 1)
    if with_s:
        return calibrate(hl, p, lp, ("reuse", "consistent"), n_t=N_T, n_s=N_S, n_c=N_C, epsilon=4.0, trials=5_000,
                         seed=2027)
    return calibrate(hl, p, lp, ("paper", "pooled"), n_t=N_T, n_s=0, n_c=N_C, epsilon=4.0, trials=4_000, seed=2026)

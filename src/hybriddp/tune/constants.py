"""The fixed settings of ``hybriddp tune``: the candidate grids, the paper's defaults and the fit's limits."""

from __future__ import annotations

GRID_F_O = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
"""Candidate f_O values (share of the opt-in group that builds the head list)."""
GRID_F_C = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))
"""Candidate f_C values (share of a client's budget spent on the query)."""
COARSE_F_C = (0.5, 0.65, 0.8, 0.95)
"""f_C values scanned once before the local climbs."""
PAPER_F_O = 0.95
PAPER_F_C = 0.85
M_RATIO = 1.35
"""Ratio between neighbouring head-list sizes of the M grid."""
M_FLOOR = 5
"""Smallest M of the grid (unless fewer records can form)."""
MIN_POPULATION = 1000
MAX_POPULATION = 25_000_000
"""Largest --population: 2 × trials synthetic populations of this size are held in memory."""
MAX_POPULATION_TRIALS = 50_000_000
"""Largest trials × population (~45 bytes per simulated user, 2 × trials populations: ~4.5 GB)."""
PRIOR_PRESET = "aol"
PRIVACY_NOTE = ("fitted only to differentially private outputs (head list, noisy opt-in estimates, |D_T|, "
                "|HL_S|): post-processing, no extra privacy cost")
LAW_UNCERTAINTY = 0.25
"""Relative uncertainty given to the fitted law when it is blended with a listed estimate."""
EXTRAPOLATION_COUNT = 0.2
"""The law is extrapolated down to the p whose expected count in the opt-in group is this."""
MAX_EXTRAPOLATED = 200_000
NDCG_TIE = 0.001
"""NDCG differences below this (or two paired standard errors) are ties (see :func:`_better`)."""
L1_TOLERANCE = 0.01
"""Relative L1 loss a candidate may not exceed to win on NDCG once the target is met (see :func:`_better`)."""
MIN_PASS_PROBABILITY = 1e-5
"""The fit replays the ranks whose chance to enter HL_S is at least this."""

"""Choosing BLENDER's knobs for a population from privatized information only (``hybriddp tune``).

A privacy engineer knows their number of users N, the opt-in fraction c and the budget (ε, δ); they need
f_O, f_C and the head-list size M. :func:`tune` simulates BLENDER on a synthetic population fitted only to
the curator's differentially private outputs (the head-list and opt-in estimates documents), and picks the
largest M whose expected generalized NDCG (ALGORITHM.md §9) reaches a target, with the best (f_O, f_C) for
it. Guarantee: everything here is post-processing of DP outputs, so tuning costs no privacy beyond what the
curator spent; no function accepts raw records. The population model, the law fit, the search and the
limits are in docs/TUNE.md.
"""

from __future__ import annotations

# ``X as X``: a public name that is not in __all__, reachable as ``hybriddp.tune.X``. The private helpers
# live in the submodules (forked-worker state: ``simulate``).
from hybriddp.tune.constants import COARSE_F_C as COARSE_F_C
from hybriddp.tune.constants import EXTRAPOLATION_COUNT as EXTRAPOLATION_COUNT
from hybriddp.tune.constants import GRID_F_C, GRID_F_O, PAPER_F_C, PAPER_F_O
from hybriddp.tune.constants import LAW_UNCERTAINTY as LAW_UNCERTAINTY
from hybriddp.tune.constants import M_FLOOR as M_FLOOR
from hybriddp.tune.constants import M_RATIO as M_RATIO
from hybriddp.tune.constants import MAX_EXTRAPOLATED as MAX_EXTRAPOLATED
from hybriddp.tune.constants import MIN_PASS_PROBABILITY as MIN_PASS_PROBABILITY
from hybriddp.tune.constants import MIN_POPULATION as MIN_POPULATION
from hybriddp.tune.constants import NDCG_TIE as NDCG_TIE
from hybriddp.tune.constants import PRIOR_PRESET as PRIOR_PRESET
from hybriddp.tune.constants import PRIVACY_NOTE as PRIVACY_NOTE
from hybriddp.tune.inputs import PrivatizedInputs, load_privatized
from hybriddp.tune.law import CuratorObservation, LawFit, RankFrequencyLaw, fit_rank_law
from hybriddp.tune.model import PopulationModel, model_from_inputs, prior_model
from hybriddp.tune.result import CandidateScore, Interval, TuneResult
from hybriddp.tune.result import t_quantile_975 as t_quantile_975
from hybriddp.tune.search import check_inputs_consistent, check_tune_inputs, default_delta, m_grid, tune

__all__ = [
    "GRID_F_C", "GRID_F_O", "PAPER_F_C", "PAPER_F_O", "CandidateScore", "CuratorObservation", "Interval",
    "LawFit", "PopulationModel", "PrivatizedInputs", "RankFrequencyLaw", "TuneResult", "check_inputs_consistent",
    "check_tune_inputs",
    "default_delta", "fit_rank_law", "load_privatized", "m_grid", "model_from_inputs", "prior_model", "tune",
]

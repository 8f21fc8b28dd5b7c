"""Choosing BLENDER's knobs for a population from privatized information only (``hybriddp tune``).

A privacy engineer knows their number of users N, the opt-in fraction c and the budget (ε, δ);
they need f_O, f_C and the head-list size M. :func:`tune` answers by simulating BLENDER on a
synthetic population that resembles theirs and picking the largest M whose expected generalized
NDCG (ALGORITHM.md §9) reaches a target, with the best (f_O, f_C) for it.

Privacy
-------
The synthetic population is fitted **only to differentially private outputs**: the head-list
JSON and the opt-in estimates JSON that ``hybriddp headlist`` writes (the lists, the noisy
p̂_O of every entry, |D_T|, |D_S| and the size of CreateHeadList's list |HL_S|, which is a
function of the (ε, δ)-DP list HL_S). Everything here is post-processing of those outputs, so
tuning costs no privacy beyond what the curator already spent. No function of this module accepts
raw records. Without the files, a documented prior is used instead: the head of the built-in
``aol`` synthetic preset (:func:`hybriddp.io.synth.head_record_probabilities`).

The population model
--------------------
Records are ⟨query, URL⟩ pairs with probabilities (the per-user-sampled distribution of ALGORITHM.md
§9; with m_O = m_C = 1 each user contributes one record, so a population of N users is N i.i.d.
draws from it). Three parts:

1. **Head records** ranked r = 1, 2, ...: a two-piece rank-frequency power law
   p(r) = A·r^(−α₁) for r ≤ B and p(B)·(r/B)^(−α₂) beyond, with B = the number of records in the
   curator's final list (:class:`RankFrequencyLaw`). The records of that list keep their query
   grouping (k_q from the list); their probability is the law at their rank in the noisy order,
   shrunk towards their own estimate where it is precise (precision-weighted, the law given a
   25% relative uncertainty), so well-measured tops such as "google" keep their size. Past the
   list the law is **extrapolated** down to the probability whose expected count in the whole
   opt-in group is 0.2 (such a record essentially never passes the threshold τ); each
   extrapolated record opens a new query with probability ν = (listed queries)/(listed records)
   and is otherwise a further URL of an earlier query, chosen with probability proportional to
   its mass (preferential attachment).
2. **Query tails**: the mass of a listed query outside its listed URLs, ⟨q,*⟩, from p̂_O of
   ⟨q,*⟩ shrunk towards ρ·(listed mass of q) with ρ = Σ_q p̂_O⟨q,*⟩ / Σ_q listed mass (less the
   extrapolated records attached to q). A new extrapolated query gets the tail ρ·p. Each draw
   of a tail is a fresh URL of its query.
3. **Singletons**: the rest of the mass. Every draw is a fresh ⟨query, URL⟩ that occurs once;
   this is exact for singletons, and for records rarer than the extrapolation cut it changes
   nothing BLENDER sees (they cannot pass τ and all map to ⟨*,*⟩).

The law fit
-----------
(A, α₁, α₂) are fitted by the method of simulated moments, because the listed estimates are
order statistics of very noisy counts (|D_T| is ~1,300 at AOL scale, so most listed records
were counted 0-5 times): sorting and the top-M selection inflate them (the winner's curse),
and a log-log regression on them would be biased. For a candidate law the curator is replayed
in expectation — record r enters HL_S when it occurs in D_S and its count Poisson(|D_S|·p(r))
plus noise exceeds τ (ranks with at least a 1e-5 chance are replayed; with the file's
noise: discrete or continuous Laplace, scale 2m_O/ε), its T-count is Poisson(|D_T|·p(r)) +
noise, and the top B are kept and sorted — over 48 replicas with common random numbers, so
the objective is smooth in the parameters. The objective is the mean squared standardized
distance between the observed and expected sorted counts, plus the standardized distance
between the observed |HL_S| and its expectation (which pins the slope α₂ that decides how
large a list can form). Nelder-Mead minimizes it from the log-log least-squares start. Without
|HL_S| in the file, α₂ = α₁.

The search
----------
Every candidate (f_O, f_C, M) is scored by running the real pipeline
(:func:`hybriddp.pipeline.run_blender`, with the chosen curator noise) on ``trials`` synthetic
populations; the same populations and seeds serve every candidate, so comparisons are paired.
1. **Formable sizes.** For each f_O ∈ {0.5, 0.6, 0.7, 0.8, 0.9, 0.95} the curator alone is
   run on every trial population: M counts as formable at f_O when every trial's |HL_S| ≥ M
   *and* the model gives |HL_S| ≥ M a ~99% chance (normal approximation of the sum of the
   records' pass probabilities), so a recommended M forms reliably, not only in the trials. The
   M grid is geometric (ratio 1.35) from the largest formable M down to 5.
2. **Best (f_O, f_C) at one M** (a *probe*): scan every f_O that forms M at the current f_C,
   then hill-climb f_C in steps of 0.05 from the best (the first probe first scans f_C ∈ {0.5,
   0.65, 0.8, 0.95} coarsely). The current f_C starts at the paper's 0.85 and carries over to
   the next probe. The f_O scan starts at the paper's 0.95, and a challenger replaces the
   incumbent only when it is clearly better: its mean generalized NDCG is higher by more than
   0.001 and two paired standard errors, or the NDCG ties (and is not lower) and its L1 is lower by more than two
   paired standard errors. Once the incumbent already reaches the target, a higher NDCG does not
   win if it costs a clearly worse L1 (by two paired standard errors and more than 1%): the
   target is met, and L1 matters for trend estimation. So a knob leaves the paper's default only
   on evidence, never on simulation noise. A probe *passes* when its best mean NDCG
   reaches the target and, re-simulated on ``trials`` fresh populations (new seeds, which
   removes the optimism of having picked the best of many), its mean still reaches the target
   and M forms in every fresh trial. The paper's defaults (f_O = 0.95, f_C = 0.85) at the same
   M run on the same fresh populations.
3. **Largest passing M.** Probe the largest M; if it passes, done. Else probe the smallest; if
   that fails too, the target is out of reach: the probed candidate with the best search NDCG
   is re-simulated and reported (``met = False``), with the effect of doubling the opt-in
   fraction and of ε + 1 on it. Else bisect the grid between the two (NDCG falls as M grows,
   so the passing sizes form a lower range): about 2 + log₂(grid size) probes, each ~8
   candidates × ``trials`` simulations.

Reported intervals are Student-t 95% intervals of the mean over the fresh trials: they cover
the simulation's randomness under the fitted model, not the uncertainty of the fit itself.
Costs: ~0.1 s per simulation at N = 519,371 and ~1.3 s at N = 5 M; simulations run in forked
worker processes (``workers``), the populations shared copy-on-write. Measured end to end on
2 cores: 5-15 s at AOL scale, 40-140 s at Yandex scale (fit ~10 s of it).

Limits
------
* m_O = m_C = 1 is simulated (the paper's setting and hybriddp's default); files written with
  m_O > 1 are fitted as if each sampled record were a user.
* The law is two power laws: a real rank-frequency curve with a knee inside the listed ranks
  is smoothed, and the extrapolation past |HL_S| is the fitted α₂ continued.
* The prior knows only the AOL preset's head (6,485 records of its 2,000 head queries): for
  very large opt-in groups it under-states how large a list can form. Fit your own files.
"""

from __future__ import annotations

# ``X as X``: a public name of the former single module that is not in __all__, still reachable as
# ``hybriddp.tune.X``. The private helpers live in the submodules (forked-worker state: ``simulate``).
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
from hybriddp.tune.search import ProgressFn as ProgressFn
from hybriddp.tune.search import check_inputs_consistent, check_tune_inputs, default_delta, m_grid, tune

__all__ = [
    "GRID_F_C", "GRID_F_O", "PAPER_F_C", "PAPER_F_O", "CandidateScore", "CuratorObservation", "Interval",
    "LawFit", "PopulationModel", "PrivatizedInputs", "RankFrequencyLaw", "TuneResult", "check_inputs_consistent",
    "check_tune_inputs",
    "default_delta", "fit_rank_law", "load_privatized", "m_grid", "model_from_inputs", "prior_model", "tune",
]

"""The ``blender-tuned`` line: BLENDER with the knobs ``hybriddp tune`` picks from an earlier round.

The paper's defaults (f_O = 0.95, f_C = 0.85) were chosen for M = 50. For another head-list
size a deployment asks ``hybriddp tune --head-list-size M`` — and tune may only read
differentially private outputs. Each trial of ``blender-tuned`` therefore plays two rounds of a
deployment:

1. **Round 1 (pilot)** at the paper's defaults: an independent opt-in draw of the same users
   (seed ``blake2b(trial seed | "pilot")``) runs the curator (CreateHeadList and
   EstimateOptinProbabilities, ALGORITHM.md §3–§4) and releases the two documents ``hybriddp headlist``
   writes — the device head list and the opt-in estimates (:func:`hybriddp.curator.party.curate`).
2. **Tune** reads those two documents only (:func:`hybriddp.tune.inputs.from_release`), fits its
   population model and picks (f_O, f_C) for the point's M (:func:`hybriddp.tune.tune` with
   ``head_list_size``; 3 simulated populations per candidate, in-process), simulating BLENDER with
   :data:`~hybriddp.experiments.figures.TUNED_ESTIMATOR` (the default estimator).
3. **Round 2** runs BLENDER with the chosen knobs and the estimator tune simulated (read back from
   tune's result, so the knobs are never applied to an estimator they were not chosen for) at the
   trial's own seed — the seed of the point's other lines, so ``blender-tuned`` and the default
   estimator's line at the paper's knobs are paired — and is scored like every other run.

Privacy: each round is (ε, δ)-DP for its users on its own; tuning is post-processing of round
1's release and costs nothing more. The opt-in users of both rounds are charged twice in a real
deployment (two releases), as ``hybriddp privacy report`` would show; the figure reports the
per-round guarantee, like every other line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hybriddp.core.errors import HybridDPError
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog
from hybriddp.core.rng import hash_seed
from hybriddp.curator.party import curate
from hybriddp.experiments.figures import TUNED_ESTIMATOR, Point
from hybriddp.simulation.pipeline import split_optin

TUNE_TRIALS = 3
"""Simulated populations per candidate in the experiment's tune calls (tune's own default)."""


def tuned_params(log: RecordLog, point: Point, seed: int) -> tuple[BlenderParams, dict[str, Any]]:
    """The round-2 parameters of ``blender-tuned`` at ``point`` (module docstring) and what tune said.

    Guarantee: the returned parameters carry the estimator tune simulated when it chose f_O and f_C
    (``info["estimator"]``, :data:`~hybriddp.experiments.figures.TUNED_ESTIMATOR`).

    Raises :class:`~hybriddp.core.errors.HybridDPError` subclasses when round 1 forms no usable list
    or no f_O forms M (the point is then missing, as in the paper).
    """
    from hybriddp.tune import tune
    from hybriddp.tune.inputs import from_release

    params = point.params()
    pilot_seed = hash_seed(seed, "pilot")
    optin_users, _ = split_optin(log.n_users, params.optin_fraction, pilot_seed)
    rel, _ = curate(log, params, optin_users=optin_users, seed=pilot_seed, with_charges=False)
    try:
        inputs = from_release(rel, ("pilot round", "pilot round"))
    except HybridDPError as exc:  # name the round
        raise type(exc)(str(exc) if str(exc).startswith("pilot round") else "pilot round: " + str(exc)) from exc
    res = tune(log.n_users, params.optin_fraction, params.epsilon, params.delta, inputs=inputs,
               trials=TUNE_TRIALS, seed=hash_seed(seed, "tune"), workers=1,
               head_list_size=point.head_list_size, estimator=TUNED_ESTIMATOR)
    chosen = res.chosen
    tuned = dataclasses.replace(params, f_o=chosen.f_o, f_c=chosen.f_c, estimator=res.estimator)
    info = {"tuned_f_o": chosen.f_o, "tuned_f_c": chosen.f_c, "tune_met": res.met,
            "tune_expected_ndcg": chosen.ndcg.mean, "estimator": res.estimator}
    return tuned, info

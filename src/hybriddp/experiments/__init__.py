"""Reproduce the paper's evaluation (Avent et al. 2017, §4.2, Figures 9 and 11–16).

``hybriddp experiment NAME --dataset aol|yandex|PATH`` runs BLENDER (and the baselines) over
the parameter grids of each figure, several trials per point, and writes to ``--out``:

* ``trials.csv`` — one row per run (algorithm, swept parameters, trial, seed, every metric,
  head-list size reached, seconds); resumed on the next invocation;
* ``figN.csv`` / ``figN.png`` — the points of each figure (mean, 95% t-interval, reached);
* ``summary.json`` and ``report.md`` — everything, with the paper's claims checked.

Modules: :mod:`~hybriddp.experiments.figures` (the grids), :mod:`~hybriddp.experiments.datasets`
(data and defaults), :mod:`~hybriddp.experiments.runner` (tasks, seeds, resume, processes),
:mod:`~hybriddp.experiments.aggregate` (means, intervals, missing points),
:mod:`~hybriddp.experiments.claims`, :mod:`~hybriddp.experiments.plots`,
:mod:`~hybriddp.experiments.report`, and :mod:`~hybriddp.experiments.run` which ties them.
"""

from hybriddp.experiments.datasets import DatasetSpec
from hybriddp.experiments.figures import FIGURE_NAMES
from hybriddp.experiments.run import ExperimentOutput, default_out_dir, run_experiment

__all__ = ["FIGURE_NAMES", "DatasetSpec", "ExperimentOutput", "default_out_dir", "run_experiment"]

"""Purely local-DP baselines BLENDER is compared with (paper §4.2.2, §5).

* :mod:`hybriddp.simulation.baselines.olh` — OLH, optimized local hashing (Wang, Blocki, Li, Jha,
  "Locally differentially private protocols for frequency estimation", USENIX Security 2017);
* :mod:`hybriddp.simulation.baselines.pem` — PEM, the prefix extending method over OLH (Wang, Li, Jha,
  "Locally differentially private heavy hitter identification", IEEE TDSC 2019,
  arXiv:1708.06674);
* :mod:`hybriddp.simulation.baselines.local_only` — the ``local-only`` baseline: no opt-in group at all;
  PEM discovers the head list, then BLENDER's client LocalAlg estimates its probabilities.
"""

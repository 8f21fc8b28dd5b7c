"""Simulations of whole rounds on a log: the pipeline (:mod:`.pipeline`), the algorithms and baselines
(:mod:`.algorithms`, :mod:`.baselines`), group-size checks and scoring (L1, NDCG; :mod:`.scoring`)."""

"""The trusted curator (paper Fig. 1, Fig. 2 lines 1–3): CreateHeadList and EstimateOptinProbabilities
(:mod:`.mechanisms`, ALGORITHM.md §3, §4), the round's release with its charges (:mod:`.party`,
:mod:`.release`) and the hybrid-mean curator (:mod:`.mean`, ALGORITHM.md §11)."""

"""The collection server's estimates (paper Fig. 1, Fig. 2 lines 4–6): device messages checked and counted
(:mod:`.party`), the client estimates (:mod:`.client_estimates`, ALGORITHM.md §6), the blends
(:mod:`.blend`, §7), consistent queries (:mod:`.consistency`, §7.1) and the result (:mod:`.result`)."""

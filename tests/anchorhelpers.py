"""Honest and attacked rounds on the six-query calibration list for the anchor tests (ALGORITHM.md §7.2), drawn
from the sampling laws directly: multinomial opt-in counts with Laplace noise (§4), multinomial report counts under
LocalAlg's exact report distribution (§5)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import LaplaceNoise
from hybriddp.core.params import head_list_scale
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.server.anchor import AnchorCheck, AnchorPolicy, anchor_blend
from hybriddp.server.blend import BlendOutput, blend_estimates
from hybriddp.server.calibration import optin_estimates, six_queries
from hybriddp.server.client_estimates import ClientEstimates, estimate_client_probabilities

EPSILON = 4.0
N_T, N_C = 2_000, 20_000


@dataclass
class Round:
    hl: HeadList
    p: np.ndarray  # the population's entry distribution
    lp: LocalAlgParams
    optin: OptinEstimates
    counts: np.ndarray  # honest report counts

    def estimate(self, counts: np.ndarray, estimator: str = "pooled") -> tuple[ClientEstimates, BlendOutput]:
        client = estimate_client_probabilities(counts, self.hl, self.lp)
        return client, blend_estimates(self.optin, client, False, estimator=estimator, lp=self.lp)

    def defend(self, counts: np.ndarray, policy: AnchorPolicy | None = None,
               estimator: str = "pooled") -> tuple[ClientEstimates, BlendOutput, AnchorCheck]:
        return anchor_blend(self.optin, self.lp, counts, policy or AnchorPolicy(),
                            lambda c: self.estimate(c, estimator), False)


def setting() -> tuple[HeadList, np.ndarray, LocalAlgParams]:
    hl, p = six_queries()
    return hl, p, LocalAlgParams.build(hl, EPSILON, 1e-5, 0.85, 1)


def honest_round(rng: np.random.Generator, n_t: int = N_T, n_c: int = N_C) -> Round:
    """One honest round: opt-in estimates from |D_T| = ``n_t`` noisy counts, ``n_c`` honest reports."""
    hl, p, lp = setting()
    b = head_list_scale(EPSILON, 1)
    c_t = rng.multinomial(n_t, p) + rng.laplace(0.0, b, hl.n_entries)
    est = optin_estimates(hl, c_t / n_t, n_t, 0, EPSILON)
    counts = rng.multinomial(n_c, p @ output_distribution(lp))
    return Round(hl, p, lp, est, counts)


def laplace_variance() -> float:
    return LaplaceNoise(np.random.default_rng(0)).variance(head_list_scale(EPSILON, 1))

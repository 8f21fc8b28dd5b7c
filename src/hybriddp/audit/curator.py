"""The curator-side mechanisms: CreateHeadList's keep decisions and the opt-in noisy counts."""

from __future__ import annotations

import math

import numpy as np

from hybriddp.audit.scenario import (
    Event,
    MechanismAudit,
    Scenario,
    _check_delta_or_zero,
    _event_epsilon,
    _z,
    predicted_lower_bound,
)
from hybriddp.errors import parameter_error
from hybriddp.noise import effective_scale, noise_factory
from hybriddp.params import check_head_list_params, head_list_scale
from hybriddp.rng import make_rng


def headlist_audit(epsilon: float = 4.0, delta: float = 1e-2, *, noise: str = "discrete",
                   trials: int = 10**6) -> MechanismAudit:
    """CreateHeadList (ALGORITHM.md §3, Fig. 3; Theorem 1) with m_O = 1: the keep decisions of two records.

    The swap pair's counts (c1, c2) → (c1 − 1, c2 + 1) are the ones with the best predicted
    bound at ``trials`` (closed form through ``noise.survival``; in the geometric tails, where
    each keep decision has likelihood ratio e^{1/b}). The adapters compute
    ``counts + noise.sample(b, ·) > τ`` exactly as :func:`~hybriddp.curator.create_head_list`
    does (same noise source, same b_S = 2/ε, same τ from ``noise.head_list_threshold``; one draw
    per distinct record, in record-key order (r1 then r2), row i of the draws = trial i; x's
    draws first, then x''s).
    """
    check_head_list_params(epsilon, delta, 1)
    factory = noise_factory(noise)
    probe = factory(make_rng(0))
    tau = probe.head_list_threshold(epsilon, delta, 1)
    b = head_list_scale(epsilon, 1)
    surv = probe.survival  # P[Y > x]; P[c + Y > τ] = surv(τ − c)

    def swap_probs(c: tuple[int, int]) -> tuple[float, float]:
        """P[r1 kept, r2 not kept] on x = (c1, c2) and on x' = (c1 − 1, c2 + 1)."""
        c1, c2 = c
        return (surv(tau - c1, b) * (1.0 - surv(tau - c2, b)),
                surv(tau - c1 + 1, b) * (1.0 - surv(tau - c2 - 1, b)))

    top = math.ceil(tau) + 4
    z = _z(0.01 / 16)
    c1, c2 = max(((c1, c2) for c1 in range(1, top) for c2 in range(top)),
                 key=lambda c: predicted_lower_bound(*swap_probs(c), delta, trials, z))
    p_x, p_xp = swap_probs((c1, c2))
    x_counts = np.array([c1, c2], dtype=np.int64)
    xp_counts = np.array([c1 - 1, c2 + 1], dtype=np.int64)

    def swap_adapter(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        src = factory(rng)
        t = src.head_list_threshold(epsilon, delta, 1)
        keep_x = x_counts + src.sample(b, 2 * n).reshape(n, 2) > t
        keep_xp = xp_counts + src.sample(b, 2 * n).reshape(n, 2) > t
        return keep_x, keep_xp

    def presence_adapter(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        src = factory(rng)
        t = src.head_list_threshold(epsilon, delta, 1)
        keep_x = 1 + src.sample(b, n) > t
        return keep_x, np.zeros(n, dtype=bool)  # r ∉ D_S(x'): CreateHeadList cannot keep it

    details = {
        "noise": noise, "m_o": 1, "b": b, "noise_scale": effective_scale(noise, b), "tau": tau,
        "counts_x": [c1, c2], "counts_x_prime": [c1 - 1, c2 + 1],
        "single_record_survival": surv(tau - 1.0, b),
        "closed_form": {"p_x": p_x, "p_x_prime": p_xp, "epsilon_event": _event_epsilon(p_x, p_xp, delta),
                        "presence_p_x": surv(tau - 1.0, b), "presence_p_x_prime": 0.0},
    }
    swap = Scenario(
        "one user moves from r1 to r2", f"N(r1)={c1}, N(r2)={c2}", f"N(r1)={c1 - 1}, N(r2)={c2 + 1}",
        swap_adapter, (Event("r1 in HL and r2 not in HL", lambda out: out[:, 0] & ~out[:, 1]),))
    presence = Scenario(
        "r present once vs absent (delta-dominated)", "N(r)=1", "N(r)=0", presence_adapter,
        (Event("r in HL", lambda out: out),))
    return MechanismAudit("headlist", float(epsilon), float(delta), (swap, presence), details)


def optin_estimate_audit(epsilon: float = 4.0, delta: float = 0.0, *, noise: str = "discrete") -> MechanismAudit:
    """EstimateOptinProbabilities' noisy counts (ALGORITHM.md §4, Fig. 4; Theorem 2: (ε, 0)-DP), m_O = 1.

    Outputs are N̂(r) = N(r, D_T) + Y_r = p̂_O,r·|D_T| for the two records whose counts change
    (the other entries' noise does not depend on the input). The adapter draws
    ``noise.sample(b_T, 2·trials)`` (row i = trial i, columns r1, r2) as
    :func:`~hybriddp.curator.estimate_optin_probabilities` draws one value per head-list entry.
    """
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise parameter_error("epsilon (--epsilon)", epsilon, "a finite number > 0")
    _check_delta_or_zero(delta)
    factory = noise_factory(noise)
    b = head_list_scale(epsilon, 1)
    x_counts = np.array([1.0, 0.0])
    xp_counts = np.array([0.0, 1.0])

    def adapter(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        src = factory(rng)
        return x_counts + src.sample(b, 2 * n).reshape(n, 2), xp_counts + src.sample(b, 2 * n).reshape(n, 2)

    surv = factory(make_rng(0)).survival  # P[Y > x]

    def at_least(s: int) -> float:  # P[Y ≥ s] for an integer s
        return surv(s - 1, b) if noise == "discrete" else surv(s, b)

    p_x = at_least(0) * (1.0 - surv(0, b))
    p_xp = at_least(1) * (1.0 - surv(-1, b))
    details = {"noise": noise, "m_o": 1, "b": b, "noise_scale": effective_scale(noise, b), "counts_x": [1, 0],
               "counts_x_prime": [0, 1],
               "closed_form": {"p_x": p_x, "p_x_prime": p_xp, "epsilon_event": _event_epsilon(p_x, p_xp, delta)}}
    scen = Scenario("one user's record r1 becomes r2", "N(r1)=1, N(r2)=0", "N(r1)=0, N(r2)=1", adapter,
                    (Event("N^(r1) >= 1 and N^(r2) <= 0", lambda out: (out[:, 0] >= 1.0) & (out[:, 1] <= 0.0)),))
    return MechanismAudit("optin-estimate", float(epsilon), float(delta), (scen,), details)


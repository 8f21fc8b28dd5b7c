"""The curator-side mechanisms: CreateHeadList's keep decisions and released counts, and the opt-in noisy counts."""

from __future__ import annotations

import math
from collections.abc import Callable

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
from hybriddp.noise import NoiseSource, effective_scale, noise_factory
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

    A third scenario audits what :func:`~hybriddp.curator.create_head_list_with_counts` releases
    with HL_S: the noisy count N(r, D_S) + Y_r of every kept record (ALGORITHM.md §3.3), the very
    draw that kept it. Its output per trial is the released count of r1 and of r2 (NaN when the
    record is not kept); see :func:`_released_counts_scenario`. The first two scenarios are
    unchanged, so their numbers stay comparable with earlier audits.
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
    released, released_details = _released_counts_scenario(epsilon, delta, noise, trials, factory, tau, b)
    details.update(released_details)
    swap = Scenario(
        "one user moves from r1 to r2", f"N(r1)={c1}, N(r2)={c2}", f"N(r1)={c1 - 1}, N(r2)={c2 + 1}",
        swap_adapter, (Event("r1 in HL and r2 not in HL", lambda out: out[:, 0] & ~out[:, 1]),))
    presence = Scenario(
        "r present once vs absent (delta-dominated)", "N(r)=1", "N(r)=0", presence_adapter,
        (Event("r in HL", lambda out: out),))
    return MechanismAudit("headlist", float(epsilon), float(delta), (swap, presence, released), details)


def _released_counts_scenario(epsilon: float, delta: float, noise: str, trials: int,
                              factory: Callable[[np.random.Generator], NoiseSource],
                              tau: float, b: float) -> tuple[Scenario, dict[str, object]]:
    """CreateHeadList's released noisy counts (ALGORITHM.md §3.3): the swap pair, on the counts themselves.

    Output per trial and record (columns r1, r2): N(r, D_S) + Y_r when r is kept, NaN when it is
    not, exactly as :func:`~hybriddp.curator.create_head_list_with_counts` releases it (same noise
    source, b_S = 2/ε, τ from ``noise.head_list_threshold``, one draw per distinct record in
    record-key order: r1 then r2, row i = trial i; x's draws first, then x''s).

    x = (c1, c2), x' = (c1 − 1, c2 + 1), with c1 ≥ 2 and c2 ≥ 1 so that both records are in D_S
    on both sides (a record present on one side only is the δ-dominated pair). The event is
    E = {r1 released with count ≥ s, and r2 not released or released with count ≤ s2}, so
    P[E|x] = P[c1 + Y > τ, c1 + Y ≥ s]·P[c2 + Y ≤ max(τ, s2)], a product of two survival
    probabilities of the noise. (c1, c2, s, s2) maximize :func:`predicted_lower_bound` at
    ``trials``; among equal predictions the event that reads the released values (some released
    count of r1 lies below s, some of r2 at most s2) is preferred over one that is a function of
    the keep decisions alone. Since the released counts are a post-processing of the noisy count
    vector, whose L1 sensitivity is 2, the best event has likelihood ratio e^{2/b} = e^ε
    (E = {N̂(r1) ≥ c1, N̂(r2) ≤ c2} with c1 > τ, c2 ≥ τ: P[E|x] = P[Y ≥ 0]², ¼ for Laplace noise,
    where at ε = 4, δ = 1e-2 the keep decisions alone reach P[E|x] ≈ 0.2 at a smaller ratio).
    ``factory``, ``tau`` and ``b`` are :func:`headlist_audit`'s noise class, threshold and scale.
    """
    surv = factory(make_rng(0)).survival  # P[Y > x]
    discrete = noise == "discrete"  # integer counts and noise: c + Y > τ_d iff c + Y ≥ τ_d + 1
    lowest = tau + 1.0 if discrete else tau  # the smallest released count (its infimum for Laplace)

    def r1_event(c: int, s: int) -> float:
        """P[c + Y > τ and c + Y ≥ s]: r1 released with count ≥ s."""
        return surv(max(tau + 1.0, s) - c - 1.0, b) if discrete else surv(max(tau, s) - c, b)

    def r2_event(c: int, s2: int) -> float:
        """P[c + Y ≤ max(τ, s2)]: r2 not released, or released with count ≤ s2."""
        return 1.0 - surv(max(tau, s2) - c, b)

    top = math.ceil(tau) + 4

    def candidates(pairs: list[tuple[int, int, bool]], prob: Callable[[int, int], float],
                   step: int) -> dict[tuple[float, float], tuple[int, int, bool]]:
        """(P on x, P on x') → its (count, threshold, reads the counts) candidate, those that read first."""
        out: dict[tuple[float, float], tuple[int, int, bool]] = {}
        for c, t, reads in sorted(pairs, key=lambda p: not p[2]):  # stable: grid order within each group
            out.setdefault((prob(c, t), prob(c + step, t)), (c, t, reads))
        return out

    first = candidates([(c, s, s > lowest) for c in range(2, top) for s in range(1, top + 2)], r1_event, -1)
    second = candidates([(c, s2, s2 >= lowest if discrete else s2 > lowest) for c in range(1, top)
                         for s2 in range(0, top + 2)], r2_event, 1)
    z = _z(0.01 / 24)  # 3 scenarios × 4 tests × 2 bounds at 99% (Bonferroni, as run_audit does)

    def score(pair: tuple[tuple[float, float], tuple[float, float]]) -> tuple[float, bool]:
        (a, a_p), (e, e_p) = pair
        return (predicted_lower_bound(a * e, a_p * e_p, delta, trials, z), first[pair[0]][2] and second[pair[1]][2])

    best1, best2 = max(((p1, p2) for p1 in first for p2 in second), key=score)
    (c1, s, _), (c2, s2, _) = first[best1], second[best2]
    p_x, p_xp = best1[0] * best2[0], best1[1] * best2[1]
    x_counts = np.array([c1, c2], dtype=np.int64)
    xp_counts = np.array([c1 - 1, c2 + 1], dtype=np.int64)

    def adapter(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        src = factory(rng)
        t = src.head_list_threshold(epsilon, delta, 1)
        noisy_x = x_counts + src.sample(b, 2 * n).reshape(n, 2)
        noisy_xp = xp_counts + src.sample(b, 2 * n).reshape(n, 2)
        return np.where(noisy_x > t, noisy_x, np.nan), np.where(noisy_xp > t, noisy_xp, np.nan)

    def indicator(out: np.ndarray) -> np.ndarray:
        r1, r2 = out[:, 0], out[:, 1]
        return ~np.isnan(r1) & (r1 >= s) & (np.isnan(r2) | (r2 <= s2))

    details: dict[str, object] = {
        "released_counts_x": [c1, c2], "released_counts_x_prime": [c1 - 1, c2 + 1],
        "released_count_thresholds": [s, s2],
        "closed_form_counts": {"p_x": p_x, "p_x_prime": p_xp, "epsilon_event": _event_epsilon(p_x, p_xp, delta)},
    }
    scenario = Scenario(
        "one user moves from r1 to r2 (released noisy counts)", f"N(r1)={c1}, N(r2)={c2}",
        f"N(r1)={c1 - 1}, N(r2)={c2 + 1}", adapter,
        (Event(f"r1 released with count >= {s} and (r2 not released or released with count <= {s2})",
               indicator),))
    return scenario, details


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


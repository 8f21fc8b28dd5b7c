"""The curator-side mechanisms: CreateHeadList's keep decisions and released counts, and the opt-in noisy counts.

Every adapter runs the library function production runs —
:func:`hybriddp.curator.mechanisms.create_head_list_with_counts` (ALGORITHM.md §3, §3.3) and
:func:`hybriddp.curator.mechanisms.estimate_optin_probabilities` (ALGORITHM.md §4) — looked up on
:mod:`hybriddp.curator.mechanisms` at call time, so a patched or changed function is what the audit measures. One
call runs a whole block of trials: its input holds one disjoint copy of the scenario's records per trial (trial i,
record j is the record ⟨iR + j, iR + j⟩ of a scenario with R records, repeated as many times as its count), and each
trial's released values are read back from the returned head list. The mechanism draws one independent noise value
per distinct record (per head-list entry for the opt-in counts), so the trials of a block are independent runs of
the mechanism on the scenario's records; records whose count does not change between x and x' only add independent
outputs, which no event reads. """

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
from hybriddp.core.errors import parameter_error
from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import NoiseSource, effective_scale, noise_factory
from hybriddp.core.params import check_head_list_params, head_list_scale
from hybriddp.core.rng import make_rng
from hybriddp.curator import mechanisms as _curator

BLOCK_ROWS = 1 << 20
"""Log rows per library call: a block of trials holds about this many rows (memory stays bounded)."""

M_O_VALUES = (1, 2, 3)
"""The m_O the audits cover (sampled records per opt-in user, ALGORITHM.md §1)."""

HEADLIST_SCENARIOS = 4
"""Scenarios of :func:`headlist_audit` (for the Bonferroni level of the event search)."""


def check_m_o(m_o: int) -> None:
    """``m_o`` is one of :data:`M_O_VALUES`."""
    if isinstance(m_o, bool) or not isinstance(m_o, (int, np.integer)) or int(m_o) not in M_O_VALUES:
        raise parameter_error("m_o (--m-o)", m_o, "1, 2 or 3 (records sampled per opt-in user that the audit "
                              "covers)", "The paper uses 1.")


def head_list_release(counts: np.ndarray, trials: int, noise: NoiseSource, *, epsilon: float, delta: float,
                      m_o: int) -> np.ndarray:
    """What :func:`hybriddp.curator.mechanisms.create_head_list_with_counts` releases for ``trials`` runs on records
    with
    the given counts (ALGORITHM.md §3, §3.3).

    Returns a float array of shape (trials, R), R = len(counts): the released noisy count N(r, D_S) + Y_r of
    record r in trial i, NaN when the record is not in HL_S. A record of count 0 is not in the log at all. The
    trials of one call are the disjoint copies described in the module docstring; the library is called once
    per block of about :data:`BLOCK_ROWS` rows.
    """
    counts = np.asarray(counts, dtype=np.int64)
    r = len(counts)
    out = np.empty((trials, r))
    block = max(1, min(trials, BLOCK_ROWS // max(int(counts.sum()), 1)))
    for start in range(0, trials, block):
        n = min(block, trials - start)
        codes = np.arange(n * r, dtype=np.int64)  # record j of trial i: ⟨iR + j, iR + j⟩
        rows = np.repeat(codes, np.tile(counts, n))
        hl, s_counts = _curator.create_head_list_with_counts(rows, rows, epsilon=epsilon, delta=delta, m_o=m_o,
                                                             noise=noise)
        e = hl.map_records(codes, codes)
        out[start:start + n] = np.where(hl.is_wildcard[e], np.nan, s_counts[e]).reshape(n, r)
    return out


def optin_release(counts: np.ndarray, trials: int, noise: NoiseSource, *, epsilon: float, m_o: int,
                  integer: bool) -> np.ndarray:
    """The noisy counts N̂(r) = p̂_O,r·|D_T| that :func:`hybriddp.curator.mechanisms.estimate_optin_probabilities`
    releases
    for ``trials`` runs on records with the given counts in D_T (ALGORITHM.md §4).

    HL_S is one query whose URLs are the trials' records (trial i, record j is URL iR + j), M is their number,
    so nothing is trimmed or folded and every record's estimate is its own entry's (N(r, D_T) + Y_r)/|D_T|.
    Returns shape (trials, R). ``integer`` (discrete noise): N̂ is rounded to the nearest integer, undoing the
    rounding of the division by |D_T| and the product with it; with Laplace noise N̂ is p̂_O·|D_T| as computed,
    within a few ulps of N + Y.
    """
    counts = np.asarray(counts, dtype=np.int64)
    r = len(counts)
    out = np.empty((trials, r))
    block = max(1, min(trials, BLOCK_ROWS // max(int(counts.sum()) + r, 1)))
    for start in range(0, trials, block):
        n = min(block, trials - start)
        codes = np.arange(n * r, dtype=np.int64)
        hl_s = HeadList.from_lists([0], [codes])  # query 0: URLs 0 … nR−1, ⟨0,*⟩; then ⟨*,*⟩
        url = np.repeat(codes, np.tile(counts, n))
        est = _curator.estimate_optin_probabilities(np.zeros(len(url), dtype=np.int64), url, hl_s, epsilon=epsilon,
                                                    m_o=m_o, head_list_size=n * r, noise=noise)
        e = est.head_list.map_records(np.zeros(n * r, dtype=np.int64), codes)
        vals = est.p_record[e] * est.n
        out[start:start + n] = (np.rint(vals) if integer else vals).reshape(n, r)
    return out


def headlist_audit(epsilon: float = 4.0, delta: float = 1e-2, *, noise: str = "discrete", trials: int = 10**6,
                   m_o: int = 1) -> MechanismAudit:
    """CreateHeadList (ALGORITHM.md §3, Fig. 3; Theorem 1) with its released noisy counts (§3.3), m_O ∈ {1, 2, 3}.

    Every scenario's adapter is :func:`head_list_release`, i.e. the library's
    :func:`~hybriddp.curator.mechanisms.create_head_list_with_counts` with noise class ``noise``; its output per
    trial is the
    released count of each of the scenario's records (NaN when not kept), and the events read it. One user's
    m = m_O records are r1 m times; in x' they are r2 m times (ALGORITHM.md §1: a user may hold a record more
    than once), so counts move by m. b_S = 2m/ε, so each record's keep decision and count have likelihood ratio
    at most e^{m/b} = e^{ε/2}.

    1. Keep decisions: (c1, c2) → (c1 − m, c2 + m), E = {r1 kept, r2 not kept}, with (c1, c2) the counts of
       the best predicted bound at ``trials`` (closed form through ``noise.survival``, in the geometric tails
       where E has likelihood ratio e^{2m/b} = e^ε).
    2. Presence (δ-dominated): N(r1) = m in x, r1 absent in x' (its m rows are r2 there); E = {r1 kept} has
       P[E|x] ≤ δ/2 and P[E|x'] = 0, so it bounds δ only. Sampling cannot test the paper's δ = 1e-5: the
       event's probability is then ≤ 5e-6 (7.3e-7 with discrete noise) and 10^6 trials see a handful of
       events; the exact audit (:mod:`hybriddp.audit.exact`, ALGORITHM.md §3.5) is the δ test there. The
       default δ = 1e-2 makes the event measurable (δ_lb > 0 at 10^6 trials).
    3. Released counts: the swap of 1, with events on the counts (:func:`_released_counts_scenario`).
    4. Released counts near the threshold (:func:`_near_threshold_scenario`): r1 at the threshold, where its
       keep decision and its count both carry information. A release whose count is not the draw that kept
       the record (a second, independent draw) reaches e^{3m/b} = e^{1.5ε} there; the real release e^ε.
    """
    check_m_o(m_o)
    m = int(m_o)
    check_head_list_params(epsilon, delta, m)
    factory = noise_factory(noise)
    probe = factory(make_rng(0))
    tau = probe.head_list_threshold(epsilon, delta, m)
    b = head_list_scale(epsilon, m)
    surv = probe.survival  # P[Y > x]; P[c + Y > τ] = surv(τ − c)
    z = _z(0.01 / (8 * HEADLIST_SCENARIOS))  # 4 tests × 2 bounds per scenario at 99% (as run_audit does)

    def swap_probs(c: tuple[int, int]) -> tuple[float, float]:
        """P[r1 kept, r2 not kept] on x = (c1, c2) and on x' = (c1 − m, c2 + m) (0 for an absent record)."""
        c1, c2 = c
        keep1_xp = surv(tau - c1 + m, b) if c1 > m else 0.0
        keep2_x = surv(tau - c2, b) if c2 > 0 else 0.0
        return surv(tau - c1, b) * (1.0 - keep2_x), keep1_xp * (1.0 - surv(tau - c2 - m, b))

    top = math.ceil(tau) + 2 * m + 3
    c1, c2 = max(((c1, c2) for c1 in range(m, top) for c2 in range(top)),
                 key=lambda c: predicted_lower_bound(*swap_probs(c), delta, trials, z))
    p_x, p_xp = swap_probs((c1, c2))

    def run(counts: list[int]) -> Callable[[np.random.Generator, int], np.ndarray]:
        def go(rng: np.random.Generator, n: int) -> np.ndarray:
            return head_list_release(np.array(counts), n, factory(rng), epsilon=epsilon, delta=delta, m_o=m)
        return go

    def pair(x: list[int], xp: list[int]) -> Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]:
        on_x, on_xp = run(x), run(xp)
        return lambda rng, n: (on_x(rng, n), on_xp(rng, n))

    def kept(out: np.ndarray) -> np.ndarray:
        return ~np.isnan(out)

    presence_p = surv(tau - m, b)
    details: dict[str, object] = {
        "noise": noise, "m_o": m, "b": b, "noise_scale": effective_scale(noise, b), "tau": tau,
        "counts_x": [c1, c2], "counts_x_prime": [c1 - m, c2 + m],
        "single_record_survival": surv(tau - 1.0, b), "presence_survival": presence_p,
        "closed_form": {"p_x": p_x, "p_x_prime": p_xp, "epsilon_event": _event_epsilon(p_x, p_xp, delta),
                        "presence_p_x": presence_p, "presence_p_x_prime": 0.0},
        "adapter": "hybriddp.curator.mechanisms.create_head_list_with_counts",
    }
    swap = Scenario(
        f"one user moves {m} record(s) from r1 to r2", f"N(r1)={c1}, N(r2)={c2}", f"N(r1)={c1 - m}, N(r2)={c2 + m}",
        pair([c1, c2], [c1 - m, c2 + m]),
        (Event("r1 in HL and r2 not in HL", lambda out: kept(out[:, 0]) & ~kept(out[:, 1])),))
    presence = Scenario(
        "r present vs absent (delta-dominated)", f"N(r)={m}", f"N(r)=0 (its {m} row(s) are r' instead)",
        pair([m, 0], [0, m]), (Event("r in HL", lambda out: kept(out[:, 0])),))
    released, released_details = _released_counts_scenario(delta, noise, trials, probe.survival, tau, b, m, pair)
    near, near_details = _near_threshold_scenario(delta, noise, probe.survival, tau, b, m, pair)
    details.update(released_details)
    details.update(near_details)
    return MechanismAudit("headlist", float(epsilon), float(delta), (swap, presence, released, near), details)


PairAdapter = Callable[[list[int], list[int]], Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]]
"""``pair(counts on x, counts on x')``: the scenario adapter running the library on both count vectors."""


def _released_counts_scenario(delta: float, noise: str, trials: int, surv: Callable[[float, float], float],
                              tau: float, b: float, m: int, pair: PairAdapter) -> tuple[Scenario, dict[str, object]]:
    """CreateHeadList's released noisy counts (ALGORITHM.md §3.3): the swap pair, on the counts themselves.

    Output per trial and record (columns r1, r2): what :func:`head_list_release` returns. x = (c1, c2),
    x' = (c1 − m, c2 + m), with c1 ≥ m + 1 and c2 ≥ 1 so that both records are in D_S on both sides (a record
    present on one side only is the δ-dominated pair). The event is
    E = {r1 released with count ≥ s, and r2 not released or released with count ≤ s2}, so
    P[E|x] = P[c1 + Y > τ, c1 + Y ≥ s]·P[c2 + Y ≤ max(τ, s2)], a product of two survival probabilities of the
    noise. (c1, c2, s, s2) maximize :func:`predicted_lower_bound` at ``trials``; among equal predictions the
    event that reads the released values (some released count of r1 lies below s, some of r2 at most s2) is
    preferred over one that is a function of the keep decisions alone. Since the released counts are a
    post-processing of the noisy count vector, whose L1 sensitivity is 2m, the best event has likelihood ratio
    e^{2m/b} = e^ε (E = {N̂(r1) ≥ c1, N̂(r2) ≤ c2} with c1 > τ, c2 ≥ τ: P[E|x] = P[Y ≥ 0]², ¼ for Laplace noise,
    where at ε = 4, δ = 1e-2 the keep decisions alone reach P[E|x] ≈ 0.2 at a smaller ratio). A release of the
    *true* count of a kept record makes P[E|x'] = 0 here. ``surv``, ``tau`` and ``b`` are
    :func:`headlist_audit`'s noise survival function, threshold and scale.
    """
    discrete = noise == "discrete"  # integer counts and noise: c + Y > τ_d iff c + Y ≥ τ_d + 1
    lowest = tau + 1.0 if discrete else tau  # the smallest released count (its infimum for Laplace)

    def r1_event(c: int, s: int) -> float:
        """P[c + Y > τ and c + Y ≥ s]: r1 released with count ≥ s."""
        return surv(max(tau + 1.0, s) - c - 1.0, b) if discrete else surv(max(tau, s) - c, b)

    def r2_event(c: int, s2: int) -> float:
        """P[c + Y ≤ max(τ, s2)]: r2 not released, or released with count ≤ s2."""
        return 1.0 - surv(max(tau, s2) - c, b)

    top = math.ceil(tau) + 2 * m + 3

    def candidates(pairs: list[tuple[int, int, bool]], prob: Callable[[int, int], float],
                   step: int) -> dict[tuple[float, float], tuple[int, int, bool]]:
        """(P on x, P on x') → its (count, threshold, reads the counts) candidate, those that read first."""
        out: dict[tuple[float, float], tuple[int, int, bool]] = {}
        for c, t, reads in sorted(pairs, key=lambda p: not p[2]):  # stable: grid order within each group
            out.setdefault((prob(c, t), prob(c + step, t)), (c, t, reads))
        return out

    first = candidates([(c, s, s > lowest) for c in range(m + 1, top) for s in range(1, top + 2)], r1_event, -m)
    second = candidates([(c, s2, s2 >= lowest if discrete else s2 > lowest) for c in range(1, top)
                         for s2 in range(0, top + 2)], r2_event, m)
    z = _z(0.01 / (8 * HEADLIST_SCENARIOS))

    def score(pair_: tuple[tuple[float, float], tuple[float, float]]) -> tuple[float, bool]:
        (a, a_p), (e, e_p) = pair_
        return (predicted_lower_bound(a * e, a_p * e_p, delta, trials, z),
                first[pair_[0]][2] and second[pair_[1]][2])

    best1, best2 = max(((p1, p2) for p1 in first for p2 in second), key=score)
    (c1, s, _), (c2, s2, _) = first[best1], second[best2]
    p_x, p_xp = best1[0] * best2[0], best1[1] * best2[1]

    def indicator(out: np.ndarray) -> np.ndarray:
        r1, r2 = out[:, 0], out[:, 1]
        return ~np.isnan(r1) & (r1 >= s) & (np.isnan(r2) | (r2 <= s2))

    details: dict[str, object] = {
        "released_counts_x": [c1, c2], "released_counts_x_prime": [c1 - m, c2 + m],
        "released_count_thresholds": [s, s2],
        "closed_form_counts": {"p_x": p_x, "p_x_prime": p_xp, "epsilon_event": _event_epsilon(p_x, p_xp, delta)},
    }
    scenario = Scenario(
        f"one user moves {m} record(s) from r1 to r2 (released noisy counts)", f"N(r1)={c1}, N(r2)={c2}",
        f"N(r1)={c1 - m}, N(r2)={c2 + m}", pair([c1, c2], [c1 - m, c2 + m]),
        (Event(f"r1 released with count >= {s} and (r2 not released or released with count <= {s2})",
               indicator),))
    return scenario, details


def _near_threshold_scenario(delta: float, noise: str, surv: Callable[[float, float], float], tau: float, b: float,
                             m: int, pair: PairAdapter) -> tuple[Scenario, dict[str, object]]:
    """Released counts near the threshold: the keep decision and the count of r1 both carry information.

    x = (c1, c2), x' = (c1 − m, c2 + m) with c1 = τ_d (discrete noise) or ⌊τ⌋ (Laplace), the largest count
    whose keep probability is still in the geometric tail, and c2 = c1 + 2m, where r2 is kept almost surely.
    E = {r1 released with count ≥ c1, and r2 not released or released with count ≤ c2}.

    * The release of ALGORITHM.md §3.3 (count = the draw that kept the record): r1 released implies a count
      > τ ≥ c1, so the r1 part is the keep decision, P = P[Y > τ − c1], likelihood ratio e^{m/b}; the r2 part
      is {c2 + Y ≤ c2} = {Y ≤ 0} (c2 ≥ τ), ratio e^{m/b}. Together e^{2m/b} = e^ε: within the claim, and
      P[E|x] = P[Y > τ − c1]·P[Y ≤ 0] (discrete: q/(1 + q)², about 0.105 at ε = 4).
    * A release whose count carries a second, independent draw Y': the r1 part is
      P[Y > τ − c1]·P[Y' ≥ 0], ratio e^{2m/b} (the keep decision and the count each give e^{m/b}), so E
      reaches e^{3m/b} = e^{1.5ε}; P[E|x] ≈ 0.09 at ε = 4 with discrete noise, so 10^5 trials refute ε.
    * A release of the true count: x' never releases r1 with count ≥ c1 (its count is c1 − m): P[E|x'] = 0.
    """
    discrete = noise == "discrete"
    c1 = int(tau) if discrete else math.floor(tau)
    c2 = c1 + 2 * m

    def at_most(x: float) -> float:  # P[Y ≤ x]
        return 1.0 - surv(x, b)

    def r1_prob(c: int) -> float:  # P[c + Y > τ] (then the count c + Y > τ ≥ c1); 0 for an absent record
        return surv(tau - c, b) if c > 0 else 0.0

    p_x = r1_prob(c1) * at_most(0.0)
    p_xp = r1_prob(c1 - m) * at_most(-float(m))

    def indicator(out: np.ndarray) -> np.ndarray:
        r1, r2 = out[:, 0], out[:, 1]
        return ~np.isnan(r1) & (r1 >= c1) & (np.isnan(r2) | (r2 <= c2))

    details: dict[str, object] = {
        "near_threshold_counts_x": [c1, c2], "near_threshold_counts_x_prime": [c1 - m, c2 + m],
        "closed_form_near_threshold": {"p_x": p_x, "p_x_prime": p_xp,
                                       "epsilon_event": _event_epsilon(p_x, p_xp, delta)},
    }
    scenario = Scenario(
        f"one user moves {m} record(s) from r1 to r2 (released counts near the threshold)",
        f"N(r1)={c1}, N(r2)={c2}", f"N(r1)={c1 - m}, N(r2)={c2 + m}", pair([c1, c2], [c1 - m, c2 + m]),
        (Event(f"r1 released with count >= {c1} and (r2 not released or released with count <= {c2})",
               indicator),))
    return scenario, details


def optin_estimate_audit(epsilon: float = 4.0, delta: float = 0.0, *, noise: str = "discrete",
                         m_o: int = 1) -> MechanismAudit:
    """EstimateOptinProbabilities' noisy counts (ALGORITHM.md §4, Fig. 4, Theorem 2: (ε, 0)-DP), m_O ∈ {1, 2, 3}.

    The adapter is :func:`optin_release`, i.e. the library's
    :func:`~hybriddp.curator.mechanisms.estimate_optin_probabilities`;
    outputs are N̂(r) = p̂_O,r·|D_T| for the two records whose counts change (the other entries' noise does not
    depend on the input). x: the user's m records are r1 (N(r1) = m, N(r2) = 0); x': they are r2. b_T = 2m/ε.
    E = {N̂(r1) ≥ m, N̂(r2) ≤ 0}: likelihood ratio e^{2m/b} = e^ε.
    """
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise parameter_error("epsilon (--epsilon)", epsilon, "a finite number > 0")
    _check_delta_or_zero(delta)
    check_m_o(m_o)
    m = int(m_o)
    factory = noise_factory(noise)
    b = head_list_scale(epsilon, m)
    integer = noise == "discrete"

    def adapter(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        src = factory(rng)
        return (optin_release(np.array([m, 0]), n, src, epsilon=epsilon, m_o=m, integer=integer),
                optin_release(np.array([0, m]), n, src, epsilon=epsilon, m_o=m, integer=integer))

    surv = factory(make_rng(0)).survival  # P[Y > x]

    def at_least(s: int) -> float:  # P[Y ≥ s] for an integer s
        return surv(s - 1, b) if integer else surv(s, b)

    p_x = at_least(0) * (1.0 - surv(0, b))
    p_xp = at_least(m) * (1.0 - surv(-m, b))
    details = {"noise": noise, "m_o": m, "b": b, "noise_scale": effective_scale(noise, b), "counts_x": [m, 0],
               "counts_x_prime": [0, m], "adapter": "hybriddp.curator.mechanisms.estimate_optin_probabilities",
               "closed_form": {"p_x": p_x, "p_x_prime": p_xp, "epsilon_event": _event_epsilon(p_x, p_xp, delta)}}
    scen = Scenario(f"one user's {m} record(s) r1 become r2", f"N(r1)={m}, N(r2)=0", f"N(r1)=0, N(r2)={m}", adapter,
                    (Event(f"N^(r1) >= {m} and N^(r2) <= 0", lambda out: (out[:, 0] >= m) & (out[:, 1] <= 0.0)),))
    return MechanismAudit("optin-estimate", float(epsilon), float(delta), (scen,), details)

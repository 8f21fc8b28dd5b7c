"""Empirical privacy audit: a statistical lower bound on ε from the real mechanism code.

Issue "Privacy assurance". The closed-form checks (SPEC §5, §12) prove that the *formulas* are
private; this module checks that the *code* is, the way DP auditing does it (Jagielski, Ullman,
Oprea, "Auditing differentially private machine learning: how private is private SGD?",
NeurIPS 2020; Nasr, Song, Thakurta, Papernot, Carlini, "Adversary instantiation: lower bounds
for differentially private machine learning", IEEE S&P 2021):

1. fix two neighbouring inputs x, x' (SPEC §1: one user's record changes value) on which the
   mechanism is worst, and an output event E chosen *in advance* from the closed form (the
   likelihood-ratio-optimal set, Neyman–Pearson);
2. run the real mechanism ``trials`` times on x and ``trials`` times on x' and count how often
   E happens: k and k';
3. (ε, δ)-DP says P[E|x] ≤ e^ε·P[E|x'] + δ, so with a lower confidence bound p_lo of P[E|x] and
   an upper bound p'_hi of P[E|x'] (one-sided Clopper–Pearson),
   ε ≥ ε_lb = ln((p_lo − δ)/p'_hi)  and, at the claimed ε, δ ≥ δ_lb = p_lo − e^ε·p'_hi.

Each event is tested with its complement and in both orders (x against x', x' against x); the
reported bound is the largest, clamped at 0. All Clopper–Pearson bounds hold *simultaneously*
with the stated confidence (Bonferroni: each of the 2 bounds of each of the m tests is taken at
level α/(2m), α = 1 − confidence), so the maximum is itself a valid lower bound. A correct
mechanism gives ε_lb ≤ ε (and δ_lb ≤ δ) with probability ≥ the confidence; an ε_lb above the
claim is a privacy bug.

Mechanisms (each a list of :class:`Scenario`: an adapter ``(rng, trials) -> (outputs_x,
outputs_x')`` running the real code vectorized over trials, and the events on its outputs):

* ``localalg`` — LocalAlg (SPEC §5, paper Fig. 6) through :func:`~hybriddp.randomizer.randomize_batch`
  on a small head list (3 queries of 2 URLs); x, x' and E are the pair of records and the
  Neyman–Pearson output set with the best predicted bound, found from
  :func:`~hybriddp.randomizer.output_distribution` (E = {report = x} against a record of
  another query: likelihood ratio e^{ε'_Q}·k_q·e^{ε'_U}/(e^{ε'_U} + k_q − 1) ≈ e^{0.95ε}).
* ``headlist`` — CreateHeadList (SPEC §3, Fig. 3). Two pairs. (a) The ε-tight one: r1 seen
  c1 times and r2 c2 times in x, one user moved from r1 to r2 in x'; E = {r1 kept, r2 not kept},
  with (c1, c2) around τ (searched on the closed form) so that both keep decisions sit in the
  geometric tails of the noise: likelihood ratio e^{2/b} = e^ε. (b) The δ-dominated one: r once
  in x, absent from x'; E = {r ∈ HL} has P[E|x] ≤ δ/2 and P[E|x'] = 0, so it can only bound δ
  (p_lo − δ < 0: ε_lb is 0 for any δ).
  The default δ is 1e-2 rather than the paper's 1e-5: at 1e-5 the survival probability is ≤ 5e-6
  (7.3e-7 with the discrete threshold, which rounds τ up to an integer) and 10^6 trials see ~5
  events (or ~1), too few to measure; at 1e-2 it is 5e-3 (2.2e-3 discrete), and the δ bound
  δ_lb = p_lo − e^ε·p'_hi is positive at 10^6 trials. The price is on the ε-tight pair: δ is
  subtracted from P[E|x] (ε_E = 3.99 with discrete noise, 3.72 with Laplace, where the best
  P[E|x] is only ≈ 0.2).
* ``optin-estimate`` — the noisy counts of EstimateOptinProbabilities (SPEC §4, Fig. 4,
  Theorem 2: (ε, 0)-DP); x: N(r1) = 1, N(r2) = 0, x': the other way round;
  E = {N̂(r1) ≥ 1, N̂(r2) ≤ 0} (N̂ = p̂_O·|D_T|), likelihood ratio e^{2/b} = e^ε.
* ``local-only`` — the OLH report of a PEM discovery user (:mod:`hybriddp.baselines.olh`,
  ε-LDP); values v ≠ v'; E = {y = H(v) ≠ H(v')}, likelihood ratio exactly e^ε.

The Clopper–Pearson bounds are computed here (regularized incomplete beta by Lentz's continued
fraction, inverted by safeguarded Newton), so SciPy stays a test-only dependency.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from hybriddp.baselines.olh import OLHReports, olh_g, olh_hash, olh_perturb
from hybriddp.baselines.olh import keep_probability as olh_keep_probability
from hybriddp.errors import parameter_error
from hybriddp.headlist import HeadList
from hybriddp.noise import noise_factory, rational_scale
from hybriddp.params import check_delta, check_head_list_params, head_list_scale
from hybriddp.randomizer import LocalAlgParams, output_distribution, randomize_batch
from hybriddp.rng import make_rng

log = logging.getLogger(__name__)

MECHANISMS = ("localalg", "headlist", "optin-estimate", "local-only")

DEFAULTS: dict[str, tuple[float, float]] = {
    "localalg": (1.0, 1e-5),
    "headlist": (4.0, 1e-2),
    "optin-estimate": (4.0, 0.0),
    "local-only": (1.0, 0.0),
}
"""(ε, δ) audited when none is given: the mechanism's own claim at a sensible setting."""

CHUNK = 1 << 20
"""Trials per adapter call: memory stays bounded whatever ``trials`` is."""


# ----- Clopper–Pearson without SciPy ---------------------------------------------------------
_FPMIN = 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
        c = 1.0 + aa / c
        c = c if abs(c) > _FPMIN else _FPMIN
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
        c = 1.0 + aa / c
        c = c if abs(c) > _FPMIN else _FPMIN
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (a, b > 0; the Beta(a, b) CDF at x)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - _log_beta(a, b))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def beta_ppf(q: float, a: float, b: float) -> float:
    """The q-quantile of Beta(a, b): the x with I_x(a, b) = q (safeguarded Newton on [0, 1])."""
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    mean = a / (a + b)
    sd = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))
    x = min(max(mean + NormalDist().inv_cdf(q) * sd, 1e-300), 1.0 - 1e-16)
    lb = _log_beta(a, b)
    for _ in range(500):
        f = betainc(a, b, x) - q
        if f == 0.0:
            return x
        if f > 0:
            hi = x
        else:
            lo = x
        if hi - lo <= 1e-15 * hi:
            return 0.5 * (lo + hi)
        pdf = math.exp((a - 1.0) * math.log(x) + (b - 1.0) * math.log1p(-x) - lb)
        nxt = x - f / pdf if pdf > 0 else math.nan
        if not lo < nxt < hi:  # Newton left the bracket: bisect (geometrically across decades)
            nxt = math.sqrt(lo * hi) if lo > 0 and hi > 10 * lo else 0.5 * (lo + hi)
        elif abs(nxt - x) <= 1e-15 * x:
            return nxt
        x = nxt
    return x


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower bound: P[p ≥ bound] ≥ 1 − α for k successes in n trials."""
    if k <= 0:
        return 0.0
    if k >= n:
        return alpha ** (1.0 / n)
    return beta_ppf(alpha, k, n - k + 1)


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper bound: P[p ≤ bound] ≥ 1 − α for k successes in n trials."""
    if k >= n:
        return 1.0
    if k <= 0:
        return -math.expm1(math.log(alpha) / n)  # 1 − α^{1/n}
    return beta_ppf(1.0 - alpha, k + 1, n - k)


def epsilon_lower_bound(p_lo: float, p_hi: float, delta: float) -> float:
    """ε_lb = ln((p_lo − δ)/p'_hi) clamped at 0 (0 when p_lo ≤ δ: the event only bounds δ)."""
    if p_lo - delta <= 0.0 or p_hi <= 0.0:
        return 0.0
    return max(0.0, math.log((p_lo - delta) / p_hi))


def delta_lower_bound(p_lo: float, p_hi: float, epsilon: float) -> float:
    """δ_lb = p_lo − e^ε·p'_hi clamped at 0."""
    return max(0.0, p_lo - math.exp(epsilon) * p_hi)


# ----- mechanisms as scenarios -----------------------------------------------------------------
Adapter = Callable[[np.random.Generator, int], tuple[Any, Any]]
"""``(rng, trials) -> (outputs on x, outputs on x')``: the real mechanism, vectorized over trials."""


@dataclass(frozen=True)
class Event:
    """An output event: ``indicator(outputs)`` is a bool array, one entry per trial."""

    name: str
    indicator: Callable[[Any], np.ndarray]


@dataclass(frozen=True)
class Scenario:
    """A pair of neighbouring inputs, the adapter that runs the mechanism on both, and events."""

    name: str
    x: str
    x_prime: str
    adapter: Adapter
    events: tuple[Event, ...]


@dataclass(frozen=True)
class MechanismAudit:
    """What to audit: the claim (ε, δ), the scenarios, and facts about the instance (``details``)."""

    mechanism: str
    epsilon: float
    delta: float
    scenarios: tuple[Scenario, ...]
    details: dict[str, Any] = field(default_factory=dict)


def _z(alpha: float) -> float:
    return NormalDist().inv_cdf(1.0 - alpha)


def predicted_lower_bound(p: float, p_prime: float, delta: float, trials: int, z: float) -> float:
    """The ε_lb to expect from an event with P[E|x] = p, P[E|x'] = p' (normal approximation)."""
    lo = p - z * math.sqrt(p * (1.0 - p) / trials)
    hi = p_prime + z * math.sqrt(p_prime * (1.0 - p_prime) / trials)
    if lo - delta <= 0 or hi <= 0:
        return 0.0
    return math.log((lo - delta) / hi)


def best_event(P: np.ndarray, delta: float, trials: int, z: float) -> tuple[int, int, np.ndarray, float]:
    """Neighbouring records (i, j) and output set E with the best predicted ε_lb, from a closed form.

    For every ordered pair of rows of the channel matrix ``P`` (P[y|x]), the candidate events are
    the Neyman–Pearson sets {y : P[y|x]/P[y|x'] ≥ λ} for each distinct likelihood ratio λ (the
    most powerful tests; Jagielski et al. 2020, Nasr et al. 2021); the one with the largest
    :func:`predicted_lower_bound` at ``trials`` is chosen *before* any sampling.

    Returns
    -------
    (i, j, outputs in E, predicted ε_lb)
    """
    best: tuple[int, int, np.ndarray, float] = (0, 1, np.array([0]), -math.inf)
    n = P.shape[0]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(P[j] > 0, P[i] / np.where(P[j] > 0, P[j], 1.0), np.inf)
            order = np.argsort(-ratio, kind="stable")
            r_sorted = ratio[order]
            cut_points = [c for c in range(1, n) if r_sorted[c] != r_sorted[c - 1]]
            for c in cut_points:
                members = order[:c]
                score = predicted_lower_bound(float(P[i, members].sum()), float(P[j, members].sum()),
                                              delta, trials, z)
                if score > best[3]:
                    best = (i, j, np.sort(members), score)
    return best


def _audit_head_list() -> tuple[HeadList, list[str]]:
    """The audited head list: queries q0, q1, q2 with URLs u0..u5 (two each), plus wildcards."""
    hl = HeadList.from_lists([0, 1, 2], [[0, 1], [2, 3], [4, 5]])
    names = []
    for e in range(hl.n_entries):
        q = int(hl.entry_query[e])
        qn = "*" if q == hl.k - 1 else f"q{q}"
        u = int(hl.entry_url[e])
        names.append(f"<{qn},{'*' if u < 0 else f'u{u}'}>")
    return hl, names


def localalg_audit(epsilon: float = 1.0, delta: float = 1e-5, *, f_c: float = 0.85, m_c: int = 1,
                   trials: int = 10**6, lp: LocalAlgParams | None = None) -> MechanismAudit:
    """LocalAlg (SPEC §5, Fig. 6; Theorem 3: (ε, δ)-LDP) on a 3-query head list, 2 URLs each.

    The pair of records and the event come from the closed form of the *claimed* parameters
    (:func:`best_event` on :func:`~hybriddp.randomizer.output_distribution`); the samples come
    from :func:`~hybriddp.randomizer.randomize_batch` with ``lp`` — by default the claimed
    :meth:`LocalAlgParams.build`, or deliberately broken parameters to test the audit.
    """
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise parameter_error("epsilon (--epsilon)", epsilon, "a finite number > 0")
    check_delta(delta)
    hl, names = _audit_head_list()
    claimed = LocalAlgParams.build(hl, epsilon, delta, f_c, m_c)
    used = lp if lp is not None else claimed
    P = output_distribution(claimed)
    i, j, members, predicted = best_event(P, delta, trials, _z(0.01 / 8))
    event_name = "report in {" + ", ".join(names[m] for m in members) + "}"

    def adapter(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        out_x = randomize_batch(np.full(n, i, dtype=np.int64), hl, used, rng=rng)
        out_xp = randomize_batch(np.full(n, j, dtype=np.int64), hl, used, rng=rng)
        return out_x, out_xp

    p, pp = float(P[i, members].sum()), float(P[j, members].sum())
    details = {
        "head_list": [names[e] for e in range(hl.n_entries)], "k": hl.k, "kq": hl.kq.tolist(),
        "f_c": f_c, "m_c": m_c, "t": claimed.t, "tq": claimed.tq.tolist(),
        "t_sampled": used.t, "tq_sampled": used.tq.tolist(),
        "closed_form": {"p_x": p, "p_x_prime": pp, "epsilon_event": _event_epsilon(p, pp, delta),
                        "predicted_lower_bound": predicted},
    }
    scen = Scenario(f"record {names[i]} vs record {names[j]}", names[i], names[j], adapter,
                    (Event(event_name, lambda out: np.isin(out, members)),))
    return MechanismAudit("localalg", float(epsilon), float(delta), (scen,), details)


def headlist_audit(epsilon: float = 4.0, delta: float = 1e-2, *, noise: str = "discrete",
                   trials: int = 10**6) -> MechanismAudit:
    """CreateHeadList (SPEC §3, Fig. 3; Theorem 1) with m_O = 1: the keep decisions of two records.

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
        "noise": noise, "m_o": 1, "b": b, "noise_scale": _noise_scale(noise, b), "tau": tau,
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
    """EstimateOptinProbabilities' noisy counts (SPEC §4, Fig. 4; Theorem 2: (ε, 0)-DP), m_O = 1.

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
    details = {"noise": noise, "m_o": 1, "b": b, "noise_scale": _noise_scale(noise, b), "counts_x": [1, 0],
               "counts_x_prime": [0, 1],
               "closed_form": {"p_x": p_x, "p_x_prime": p_xp, "epsilon_event": _event_epsilon(p_x, p_xp, delta)}}
    scen = Scenario("one user's record r1 becomes r2", "N(r1)=1, N(r2)=0", "N(r1)=0, N(r2)=1", adapter,
                    (Event("N^(r1) >= 1 and N^(r2) <= 0", lambda out: (out[:, 0] >= 1.0) & (out[:, 1] <= 0.0)),))
    return MechanismAudit("optin-estimate", float(epsilon), float(delta), (scen,), details)


def local_only_audit(epsilon: float = 1.0, delta: float = 0.0, *, v: int = 1, v_prime: int = 2) -> MechanismAudit:
    """The local-only baseline's discovery report: OLH (ε-LDP) of a PEM user's value v vs v'.

    The adapter is :func:`~hybriddp.baselines.olh.olh_perturb` (hash seeds and GRR) on
    ``trials`` copies of v and of v'. The privacy loss of a report (H, y) is ±ε when exactly one of
    H(v), H(v') equals y and 0 otherwise, so E = {y = H(v) ≠ H(v')} is the optimal event.
    """
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and 0 < epsilon <= 20):
        raise parameter_error("epsilon (--epsilon)", epsilon, "a number in (0, 20]")
    _check_delta_or_zero(delta)
    g = olh_g(epsilon)

    def adapter(rng: np.random.Generator, n: int) -> tuple[OLHReports, OLHReports]:
        return (olh_perturb(np.full(n, v, dtype=np.int64), epsilon, rng),
                olh_perturb(np.full(n, v_prime, dtype=np.int64), epsilon, rng))

    def supports_v_only(rep: OLHReports) -> np.ndarray:
        hv = olh_hash(rep.a, rep.b, np.uint64(v), rep.g)
        return (rep.y == hv) & (hv != olh_hash(rep.a, rep.b, np.uint64(v_prime), rep.g))

    p = olh_keep_probability(epsilon, g)
    q = (1.0 - p) / (g - 1)
    p_x, p_xp = p * (1.0 - 1.0 / g), q * (1.0 - 1.0 / g)  # universal hash: P[H(v) ≠ H(v')] = 1 − 1/g
    details = {"g": g, "p": p, "q": q, "v": v, "v_prime": v_prime,
               "closed_form": {"p_x": p_x, "p_x_prime": p_xp, "epsilon_event": _event_epsilon(p_x, p_xp, delta)}}
    scen = Scenario(f"OLH report of value {v} vs {v_prime}", f"v={v}", f"v={v_prime}", adapter,
                    (Event(f"y = H({v}) != H({v_prime})", supports_v_only),))
    return MechanismAudit("local-only", float(epsilon), float(delta), (scen,), details)


def _noise_scale(noise: str, b: float) -> float:
    """The scale actually used: the rational t ≥ b for discrete noise, b for Laplace."""
    return float(rational_scale(b)) if noise == "discrete" else b


def _event_epsilon(p_x: float, p_xp: float, delta: float) -> float:
    """ln((P[E|x] − δ)/P[E|x']) from exact probabilities: what the audit tends to as trials → ∞."""
    return math.log((p_x - delta) / p_xp) if p_x > delta and p_xp > 0 else 0.0


def _check_delta_or_zero(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise parameter_error("delta (--delta)", delta, "in [0, 1) (0 for a pure ε-DP claim)")


# ----- running an audit ------------------------------------------------------------------------
@dataclass
class EventTest:
    """One test: event E (or its complement) with x in the numerator, x' in the denominator."""

    scenario: str
    event: str
    complement: bool  # the event is the complement of the scenario's event
    swapped: bool  # x' of the scenario is in the numerator
    x: str
    x_prime: str
    count_x: int
    count_x_prime: int
    trials: int
    p_x_lower: float
    p_x_prime_upper: float
    epsilon_lower_bound: float
    delta_lower_bound: float
    epsilon_point_estimate: float | None


@dataclass
class AuditResult:
    """The audit's outcome; :meth:`to_json` is what ``hybriddp audit --json`` prints."""

    mechanism: str
    epsilon_claimed: float
    delta: float
    trials: int
    confidence: float
    per_bound_confidence: float
    epsilon_lower_bound: float
    delta_lower_bound: float
    best: EventTest
    tests: list[EventTest]
    details: dict[str, Any]
    seed: int | None
    seconds: float

    @property
    def violation(self) -> bool:
        """True when the audit refutes the claim (ε_lb > ε or δ_lb > δ)."""
        return self.epsilon_lower_bound > self.epsilon_claimed or self.delta_lower_bound > self.delta

    def to_json(self) -> dict[str, Any]:
        b = self.best
        return {
            "mechanism": self.mechanism,
            "epsilon_claimed": self.epsilon_claimed,
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "delta": self.delta,
            "delta_lower_bound": self.delta_lower_bound,
            "violation": self.violation,
            "trials": self.trials,
            "confidence": self.confidence,
            "per_bound_confidence": self.per_bound_confidence,
            "method": "one-sided Clopper-Pearson, Bonferroni over all tests; eps_lb = ln((p_x_lower - delta)"
                      "/p_x_prime_upper), delta_lb = p_x_lower - e^eps_claimed * p_x_prime_upper",
            "scenario": b.scenario,
            "event": b.event,
            "x": b.x,
            "x_prime": b.x_prime,
            "count_x": b.count_x,
            "count_x_prime": b.count_x_prime,
            "p_x_lower": b.p_x_lower,
            "p_x_prime_upper": b.p_x_prime_upper,
            "epsilon_point_estimate": b.epsilon_point_estimate,
            "tests": [asdict(t) for t in self.tests],
            "details": self.details,
            "seed": self.seed,
            "seconds": round(self.seconds, 3),
        }


def _point_estimate(k: int, kp: int, n: int, delta: float) -> float | None:
    """ln((k/n − δ)/(k'/n)): 0 when k/n ≤ δ, None (unbounded) when k' = 0."""
    p, pp = k / n, kp / n
    if p - delta <= 0:
        return 0.0
    if pp == 0:
        return None
    return math.log((p - delta) / pp)


def run_audit(audit: MechanismAudit, trials: int, rng: np.random.Generator, *, confidence: float = 0.99,
              seed: int | None = None, chunk: int = CHUNK) -> AuditResult:
    """Run every scenario ``trials`` times on x and on x', count the events, bound ε and δ.

    Parameters
    ----------
    audit : the mechanism, its claim and scenarios (e.g. from :func:`make_audit`).
    trials : runs of the mechanism on each of x and x' (per scenario).
    rng : randomness of the mechanism runs.
    confidence : joint confidence of all the Clopper–Pearson bounds (Bonferroni).
    seed : recorded in the result only.
    chunk : trials per adapter call (bounded memory).
    """
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise parameter_error("trials (--trials)", trials, "an integer >= 1")
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise parameter_error("confidence (--confidence)", confidence, "strictly between 0 and 1")
    trials = int(trials)
    start = time.perf_counter()
    counts = [[[0, 0] for _ in s.events] for s in audit.scenarios]
    done = 0
    while done < trials:
        n = min(chunk, trials - done)
        for s_idx, scen in enumerate(audit.scenarios):
            out_x, out_xp = scen.adapter(rng, n)
            for e_idx, ev in enumerate(scen.events):
                counts[s_idx][e_idx][0] += int(np.count_nonzero(ev.indicator(out_x)))
                counts[s_idx][e_idx][1] += int(np.count_nonzero(ev.indicator(out_xp)))
        done += n
    n_tests = 4 * sum(len(s.events) for s in audit.scenarios)
    alpha = (1.0 - confidence) / (2 * n_tests)
    tests: list[EventTest] = []
    for s_idx, scen in enumerate(audit.scenarios):
        for e_idx, ev in enumerate(scen.events):
            k, kp = counts[s_idx][e_idx]
            for comp, name, a, b in ((False, ev.name, k, kp), (True, f"not ({ev.name})", trials - k, trials - kp)):
                for swap, (xa, ca), (xb, cb) in ((False, (scen.x, a), (scen.x_prime, b)),
                                                 (True, (scen.x_prime, b), (scen.x, a))):
                    lo = clopper_pearson_lower(ca, trials, alpha)
                    hi = clopper_pearson_upper(cb, trials, alpha)
                    tests.append(EventTest(
                        scen.name, name, comp, swap, xa, xb, ca, cb, trials, lo, hi,
                        epsilon_lower_bound(lo, hi, audit.delta), delta_lower_bound(lo, hi, audit.epsilon),
                        _point_estimate(ca, cb, trials, audit.delta)))
    best = max(tests, key=lambda t: (t.epsilon_lower_bound, t.delta_lower_bound))
    eps_lb = best.epsilon_lower_bound
    delta_lb = max(t.delta_lower_bound for t in tests)
    seconds = time.perf_counter() - start
    log.info("audit %s: eps_lb=%.4f (claimed %.4f), delta_lb=%.3g (claimed %.3g), %d trials, %.2fs",
             audit.mechanism, eps_lb, audit.epsilon, delta_lb, audit.delta, trials, seconds)
    return AuditResult(audit.mechanism, audit.epsilon, audit.delta, trials, confidence, 1.0 - alpha, eps_lb,
                       delta_lb, best, tests, audit.details, seed, seconds)


def make_audit(mechanism: str, *, epsilon: float | None = None, delta: float | None = None, trials: int = 10**6,
               noise: str = "discrete", f_c: float = 0.85) -> MechanismAudit:
    """The :class:`MechanismAudit` of a named mechanism (see :data:`MECHANISMS`, :data:`DEFAULTS`)."""
    if mechanism not in MECHANISMS:
        raise parameter_error("mechanism (--mechanism)", mechanism, "one of " + ", ".join(MECHANISMS))
    eps0, delta0 = DEFAULTS[mechanism]
    eps = eps0 if epsilon is None else epsilon
    dlt = delta0 if delta is None else delta
    if mechanism == "localalg":
        if not (isinstance(f_c, (int, float)) and 0.0 < f_c < 1.0):
            raise parameter_error("f_c (--f-c)", f_c, "strictly between 0 and 1")
        return localalg_audit(eps, dlt, f_c=f_c, trials=trials)
    if mechanism == "headlist":
        return headlist_audit(eps, dlt, noise=noise, trials=trials)
    if mechanism == "optin-estimate":
        return optin_estimate_audit(eps, dlt, noise=noise)
    return local_only_audit(eps, dlt)


def audit(mechanism: str, *, epsilon: float | None = None, delta: float | None = None, trials: int = 10**6,
          seed: int | None = None, confidence: float = 0.99, noise: str = "discrete", f_c: float = 0.85,
          ) -> AuditResult:
    """Audit a named mechanism: ``hybriddp audit`` as a function.

    Parameters
    ----------
    mechanism : ``localalg``, ``headlist``, ``optin-estimate`` or ``local-only``.
    epsilon, delta : the claim to audit; default :data:`DEFAULTS` of the mechanism.
    trials : mechanism runs on each neighbouring input.
    seed : reproducible audit; default OS randomness.
    confidence : joint confidence of the bounds.
    noise : curator noise (``headlist``, ``optin-estimate``): ``discrete`` (default) or ``laplace``.
    f_c : LocalAlg's query share of the budget (``localalg``).
    """
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise parameter_error("trials (--trials)", trials, "an integer >= 1")
    spec = make_audit(mechanism, epsilon=epsilon, delta=delta, trials=int(trials), noise=noise, f_c=f_c)
    return run_audit(spec, int(trials), make_rng(seed), confidence=confidence, seed=seed)


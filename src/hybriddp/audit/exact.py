"""Exact audit: the worst-case hockey-stick divergence of a release, from its exact output distribution.

The sampling audit (:func:`hybriddp.audit.run_audit`) bounds ε from below; it cannot test δ = 1e-5, whose
events are too rare to count. This module computes δ itself:

  δ(e^ε) = sup over neighbouring x, x' of Σ_o max(0, P_x(o) − e^ε·P_x'(o)) = E_{P_x}[(1 − e^{ε − L})₊],

L = ln(P_x(o)/P_x'(o)) the privacy loss (+∞ where P_x'(o) = 0), exactly (in double precision) from the
mechanism's output law (ALGORITHM.md §3.5):

* ``headlist`` — CreateHeadList with its released noisy counts (ALGORITHM.md §3, §3.3), discrete Laplace noise
  (the default): per distinct record the output is ⊥ (not kept) or the integer N + Y > τ_d; records are
  independent, so L is a sum of independent per-record losses, each with a few atoms
  (:func:`record_loss_law`). A neighbour moves one user's ≤ m_O sampled records: counts fall on some records
  and rise on others, each by at most m_O in total (a user may hold one record several times). The search is
  exhaustive over every such move and every count of the touched records (:func:`headlist_exact`).
  The law comes from the library: the pmf and tails of :mod:`hybriddp.core.noise`, τ_d from the noise class's
  ``head_list_threshold``, the scale t ≥ :func:`hybriddp.core.params.head_list_scale`; and a model check runs
  :func:`hybriddp.curator.mechanisms.create_head_list_with_counts` itself on replayed draws and confirms it releases
  exactly what the law says (ALGORITHM.md §3.3: ⊥ iff N + Y ≤ τ_d, else N + Y, the draw that kept it).
* ``optin-estimate`` — EstimateOptinProbabilities' noisy counts (ALGORITHM.md §4), the same per-record losses
  without a threshold; (ε, 0)-DP, so δ(e^ε) must be 0. Model check through
  :func:`hybriddp.curator.mechanisms.estimate_optin_probabilities`.
* ``localalg`` — LocalAlg (ALGORITHM.md §5) on the audit's head list (3 queries of 2 URLs): the closed form
  :func:`hybriddp.core.reportlaw.output_distribution` of the parameters the library builds, and
  :func:`hybriddp.core.reportlaw.privacy_loss_delta` over every pair of records.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybriddp.audit.client import _audit_head_list
from hybriddp.audit.curator import check_m_o
from hybriddp.audit.run import MAX_EPSILON, check_m_o_for
from hybriddp.core import reportlaw as _law
from hybriddp.core.errors import parameter_error
from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import DiscreteLaplaceNoise, discrete_laplace_pmf, discrete_laplace_tail, rational_scale
from hybriddp.core.params import check_delta, check_head_list_params, check_local_budget, head_list_scale
from hybriddp.curator import mechanisms as _curator

EXACT_MECHANISMS = ("headlist", "optin-estimate", "localalg")
"""The mechanisms with an exact audit."""

EXACT_DEFAULTS: dict[str, tuple[float, float]] = {
    "headlist": (4.0, 1e-5),
    "optin-estimate": (4.0, 0.0),
    "localalg": (1.0, 1e-5),
}
"""(ε, δ) of the exact audit when none is given: the paper's claims (Fig. 10 for the head list)."""


# ----- privacy-loss distributions with finitely many atoms ---------------------------------------------------


@dataclass(frozen=True)
class LossLaw:
    """A privacy-loss distribution under P_x: finite losses ``loss`` with P_x-masses ``prob``, and the mass
    ``p_inf`` of the outputs x' cannot give (loss +∞)."""

    loss: np.ndarray
    prob: np.ndarray
    p_inf: float

    @classmethod
    def of(cls, atoms: Sequence[tuple[float, float]], p_inf: float = 0.0) -> LossLaw:
        """From (loss, probability) pairs: zero masses dropped, equal losses merged, losses sorted."""
        loss = np.array([a for a, p in atoms if p > 0.0], dtype=np.float64)
        prob = np.array([p for _, p in atoms if p > 0.0], dtype=np.float64)
        return cls._merged(loss, prob, p_inf)

    @classmethod
    def _merged(cls, loss: np.ndarray, prob: np.ndarray, p_inf: float) -> LossLaw:
        uniq, inv = np.unique(loss, return_inverse=True)
        return cls(uniq, np.bincount(inv.ravel(), weights=prob, minlength=len(uniq)), float(p_inf))

    @property
    def max_loss(self) -> float:
        """The largest finite loss (−∞ when there is none)."""
        return float(self.loss[-1]) if len(self.loss) else -math.inf

    def compose(self, other: LossLaw) -> LossLaw:
        """The loss of two independent releases together: the sum of their losses (+∞ if either is)."""
        loss = np.add.outer(self.loss, other.loss).ravel()
        prob = np.multiply.outer(self.prob, other.prob).ravel()
        return LossLaw._merged(loss, prob, self.p_inf + other.p_inf - self.p_inf * other.p_inf)

    def delta(self, epsilon: float) -> float:
        """E_{P_x}[(1 − e^{ε − L})₊] = Σ_o max(0, P_x(o) − e^ε·P_x'(o)), the hockey-stick divergence at e^ε."""
        over = self.loss > epsilon
        return self.p_inf + float(np.sum(self.prob[over] * -np.expm1(epsilon - self.loss[over])))


def record_loss_law(c: int, c_prime: int, t: float, tau: int | None) -> LossLaw:
    """The privacy loss of one record's release under P_x, the record's count being c on x and c' on x'.

    ``tau`` = τ_d (CreateHeadList, ALGORITHM.md §3.2–§3.3): a record of count 0 is not in D_S and gives ⊥;
    a record of count c ≥ 1 gives ⊥ with probability P[c + Y ≤ τ_d], else the integer v = c + Y > τ_d.
    ``tau`` = None (EstimateOptinProbabilities, ALGORITHM.md §4): every count, 0 included, gives v = c + Y.
    Y is discrete Laplace at scale t (P[Y = y] ∝ e^{−|y|/t}).

    Atoms: ⊥ with loss ln(P[c + Y ≤ τ]/P[c' + Y ≤ τ]); the released values, whose loss
    (|v − c'| − |v − c|)/t is (c' − c)/t for v ≤ min(c, c'), (c − c')/t for v ≥ max(c, c') (each a tail
    block) and takes |c − c'| − 1 values in between; +∞ for the released values when c' = 0 (x' never
    releases the record).
    """
    def tail(k: int) -> float:  # P[Y ≥ k], any integer k
        return discrete_laplace_tail(int(k), t)

    def loss_of(v: int) -> float:
        return (abs(v - c_prime) - abs(v - c)) / t

    atoms: list[tuple[float, float]] = []
    if tau is not None:
        if c == 0:  # never in D_S on x: ⊥ for sure
            p_bot_prime = 1.0 if c_prime == 0 else tail(c_prime - tau)  # P[c' + Y ≤ τ] = P[Y ≥ c' − τ]
            return LossLaw.of([(-math.log(p_bot_prime), 1.0)])
        p_bot = tail(c - tau)
        if c_prime == 0:  # x' never releases it: ⊥ there for sure
            return LossLaw.of([(math.log(p_bot), p_bot)], p_inf=tail(tau + 1 - c))
        atoms.append((math.log(p_bot) - math.log(tail(c_prime - tau)), p_bot))
    lo, hi = min(c, c_prime), max(c, c_prime)
    first = None if tau is None else tau + 1  # the smallest released value
    if first is None:  # v ≤ min(c, c')
        atoms.append((loss_of(lo), tail(c - lo)))
    elif first <= lo:
        atoms.append((loss_of(lo), tail(first - c) - tail(lo + 1 - c)))
    start = lo + 1 if first is None else max(first, lo + 1)
    for v in range(start, hi):  # min < v < max
        atoms.append((loss_of(v), float(discrete_laplace_pmf(v - c, t))))
    top = hi if first is None else max(first, hi)
    atoms.append((loss_of(top), tail(top - c)))  # v ≥ max(c, c')
    return LossLaw.of(atoms)


# ----- neighbouring datasets: moves of one user's records -----------------------------------------------------


def partitions(m: int, largest: int | None = None) -> list[tuple[int, ...]]:
    """The partitions of m into positive parts, each non-increasing: how m units of count split over records."""
    if m == 0:
        return [()]
    largest = m if largest is None else largest
    return [(p, *rest) for p in range(min(m, largest), 0, -1) for rest in partitions(m - p, p)]


def group_configs(parts: tuple[int, ...], n_counts: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every multiset of (part, count index) with the given parts; count indices in [0, n_counts).

    Records with equal parts are exchangeable (their losses add), so counts are taken as a multiset among them.
    """
    sizes = sorted(set(parts), reverse=True)
    per_size = [itertools.combinations_with_replacement(range(n_counts), parts.count(s)) for s in sizes]
    for choice in itertools.product(*[list(x) for x in per_size]):
        yield tuple((s, i) for s, idx in zip(sizes, choice, strict=True) for i in idx)


@dataclass
class _Group:
    """The configurations of one side of a move (the records whose counts fall, or those whose counts rise)."""

    records: list[tuple[tuple[int, int], ...]]  # per configuration: (c on x, c on x') of each record
    laws: list[LossLaw]


def _groups(m: int, cap: int, t: float, tau: int | None) -> tuple[_Group, _Group]:
    """Falling and rising sides of every move of m units: each side is a partition of m over records.

    Falling record with part s: counts (c' + s, c') with c' ∈ [0, cap]; rising: (c, c + s) with c ∈ [0, cap].
    """
    cache: dict[tuple[int, int], LossLaw] = {}

    def law(c: int, cp: int) -> LossLaw:
        if (c, cp) not in cache:
            cache[(c, cp)] = record_loss_law(c, cp, t, tau)
        return cache[(c, cp)]

    sides = []
    for sign in (-1, 1):
        grp = _Group([], [])
        for parts in partitions(m):
            for cfg in group_configs(parts, cap + 1):
                recs = tuple((i + s, i) if sign < 0 else (i, i + s) for s, i in cfg)
                total = law(*recs[0])
                for rec in recs[1:]:
                    total = total.compose(law(*rec))
                grp.records.append(recs)
                grp.laws.append(total)
        sides.append(grp)
    return sides[0], sides[1]


@dataclass
class WorstCase:
    """The largest δ(e^ε) over all moves searched, and the move that reaches it."""

    delta: float
    falling: tuple[tuple[int, int], ...]
    rising: tuple[tuple[int, int], ...]
    pairs: int


def worst_move(falling: _Group, rising: _Group, epsilon: float) -> WorstCase:
    """max over (falling, rising) configurations of δ(e^ε) of the composed loss.

    The two sides are independent, so δ = P[L = ∞] + Σ_b P(b)·g(ε − l_b) over the rising side's finite atoms b,
    with g(x) = Σ_{l_a > x} P(a)(1 − e^{x − l_a}) over the falling side's finite atoms (suffix sums and one
    binary search per atom). Pairs whose largest finite losses add up to at most ε get no finite term (none
    of their atoms exceeds ε).
    """
    n_r = len(rising.laws)
    r_max = np.array([law.max_loss for law in rising.laws])
    order = np.argsort(-r_max, kind="stable")  # rising configs by their largest loss, decreasing
    r_max_sorted = r_max[order]
    flat_loss = np.concatenate([rising.laws[i].loss for i in order])
    flat_prob = np.concatenate([rising.laws[i].prob for i in order])
    sizes = np.array([len(rising.laws[i].loss) for i in order])
    owner = np.repeat(np.arange(n_r), sizes)
    ends = np.cumsum(sizes)
    r_inf = np.array([rising.laws[i].p_inf for i in order])
    best = (-1.0, 0, 0)
    for d, law in enumerate(falling.laws):
        deltas = law.p_inf + r_inf - law.p_inf * r_inf
        k = int(np.searchsorted(-r_max_sorted, -(epsilon - law.max_loss), side="left"))  # r_max > ε − max_D
        if k > 0 and len(law.loss):
            n_atoms = int(ends[k - 1])
            x = epsilon - flat_loss[:n_atoms]
            s1 = np.concatenate([np.cumsum(law.prob[::-1])[::-1], [0.0]])
            s2 = np.concatenate([np.cumsum((law.prob * np.exp(-law.loss))[::-1])[::-1], [0.0]])
            j = np.searchsorted(law.loss, x, side="right")
            g = np.maximum(s1[j] - np.exp(x) * s2[j], 0.0)
            deltas[:k] += np.bincount(owner[:n_atoms], weights=flat_prob[:n_atoms] * g, minlength=k)
        i = int(np.argmax(deltas))
        if deltas[i] > best[0]:
            best = (float(deltas[i]), d, int(order[i]))
    value, d, i = best
    return WorstCase(value, falling.records[d], rising.records[i], len(falling.laws) * n_r)


# ----- model checks: the library releases what the law says ------------------------------------------------------


class ReplayNoise:
    """A noise source that hands out given draws (zeros once they run out) and records every request
    (scale, size); its name, threshold, survival and variance are the real noise class's."""

    def __init__(self, real: DiscreteLaplaceNoise, draws: np.ndarray) -> None:
        self.real = real
        self.name = real.name
        self.label = real.label
        self.draws = np.asarray(draws, dtype=np.float64)
        self.pos = 0
        self.requests: list[tuple[float, int]] = []

    def sample(self, scale: float, size: int) -> np.ndarray:
        """The next ``size`` draws."""
        self.requests.append((scale, size))
        out = np.zeros(size)
        got = self.draws[self.pos:self.pos + size]
        out[:len(got)] = got
        self.pos += size
        return out

    def variance(self, scale: float) -> float:
        """The real class's variance."""
        return self.real.variance(scale)

    def survival(self, x: float, scale: float) -> float:
        """The real class's P[Y > x]."""
        return self.real.survival(x, scale)

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        """The real class's τ."""
        return self.real.head_list_threshold(epsilon, delta, m_o)


def headlist_model_check(epsilon: float, delta: float, m_o: int) -> dict[str, Any]:
    """Run :func:`hybriddp.curator.mechanisms.create_head_list_with_counts` once on records of counts 1 … τ_d + m_O +
    2, each
    with every draw y in [−(τ_d + m_O + 2), m_O + 2] (replayed), and compare with the law of
    :func:`record_loss_law`: the record is kept iff c + y > τ_d, and then released with count c + y; the library
    asks for one draw per distinct record at scale :func:`hybriddp.core.params.head_list_scale` (ε, m_O)."""
    real = DiscreteLaplaceNoise(np.random.default_rng(0))
    tau = int(real.head_list_threshold(epsilon, delta, m_o))
    c, y = np.meshgrid(np.arange(1, tau + m_o + 3), np.arange(-(tau + m_o + 2), m_o + 3), indexing="ij")
    c, y = c.ravel(), y.ravel()
    codes = np.arange(len(c), dtype=np.int64)
    rows = np.repeat(codes, c)
    replay = ReplayNoise(real, y)  # records are drawn for in key order, i.e. in code order
    hl, s_counts = _curator.create_head_list_with_counts(rows, rows, epsilon=epsilon, delta=delta, m_o=m_o,
                                                         noise=replay)
    e = hl.map_records(codes, codes)
    kept = ~hl.is_wildcard[e]
    want = c + y > tau
    wrong_keep = int(np.count_nonzero(kept != want))
    both = kept & want
    wrong_count = int(np.count_nonzero(s_counts[e[both]] != (c + y)[both]))
    draws_ok = replay.requests == [(head_list_scale(epsilon, m_o), len(c))]
    return {"function": "hybriddp.curator.mechanisms.create_head_list_with_counts", "cases": len(c),
            "wrong_keep_decisions": wrong_keep, "wrong_released_counts": wrong_count,
            "noise_requests": [[s, n] for s, n in replay.requests], "draws_as_modelled": draws_ok,
            "passed": wrong_keep == 0 and wrong_count == 0 and draws_ok}


def optin_model_check(epsilon: float, m_o: int) -> dict[str, Any]:
    """Run :func:`hybriddp.curator.mechanisms.estimate_optin_probabilities` once on an HL_S of records with counts 0
    … m_O + 3
    in D_T, each with every draw y in [−(m_O + 3), m_O + 3] (replayed), M = all records (nothing trimmed), and
    check p̂_O·|D_T| = N + y for every record and one draw per entry at scale
    :func:`hybriddp.core.params.head_list_scale` (ε, m_O)."""
    real = DiscreteLaplaceNoise(np.random.default_rng(0))
    c, y = np.meshgrid(np.arange(0, m_o + 4), np.arange(-(m_o + 3), m_o + 4), indexing="ij")
    c, y = c.ravel(), y.ravel()
    n_rec = len(c)
    codes = np.arange(n_rec, dtype=np.int64)
    hl_s = HeadList.from_lists([0], [codes])
    replay = ReplayNoise(real, np.concatenate([y, [0, 0]]))  # entries in CSR order: the URLs, ⟨0,*⟩, ⟨*,*⟩
    url = np.repeat(codes, c)
    est = _curator.estimate_optin_probabilities(np.zeros(len(url), dtype=np.int64), url, hl_s, epsilon=epsilon,
                                                m_o=m_o, head_list_size=n_rec, noise=replay)
    e = est.head_list.map_records(np.zeros(n_rec, dtype=np.int64), codes)
    vals = np.rint(est.p_record[e] * est.n)
    wrong = int(np.count_nonzero(vals != c + y)) + int(np.count_nonzero(est.head_list.is_wildcard[e]))
    draws_ok = replay.requests == [(head_list_scale(epsilon, m_o), n_rec + 2)]
    return {"function": "hybriddp.curator.mechanisms.estimate_optin_probabilities", "cases": n_rec,
            "wrong_released_counts": wrong, "noise_requests": [[s, n] for s, n in replay.requests],
            "draws_as_modelled": draws_ok, "passed": wrong == 0 and draws_ok}


# ----- the exact audits -------------------------------------------------------------------------------------------


@dataclass
class ExactResult:
    """The exact audit's outcome; :meth:`to_json` is what ``hybriddp audit --exact --json`` prints."""

    mechanism: str
    epsilon_claimed: float
    delta: float
    delta_exact: float
    m_o: int | None
    noise: str | None
    worst: dict[str, Any]
    details: dict[str, Any]
    model_check: dict[str, Any] | None = None
    seconds: float = 0.0
    method: str = field(default="exact hockey-stick divergence sup_{x~x'} sum_o max(0, P_x(o) - e^eps P_x'(o)) "
                                    "over the mechanism's exact output law")

    @property
    def violation(self) -> bool:
        """True when the exact δ(e^ε) exceeds the claimed δ, or the library does not release what the law says."""
        return self.delta_exact > self.delta or (self.model_check is not None and not self.model_check["passed"])

    def to_json(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "mode": "exact", "epsilon_claimed": self.epsilon_claimed,
                "delta": self.delta, "delta_exact": self.delta_exact, "violation": self.violation,
                "m_o": self.m_o, "noise": self.noise, "method": self.method, "worst": self.worst,
                "details": self.details, "model_check": self.model_check, "seconds": round(self.seconds, 3)}


def _describe(records: tuple[tuple[int, int], ...]) -> list[str]:
    return [f"{c}->{cp}" for c, cp in records]


def headlist_delta(epsilon: float, delta: float, m_o: int, at_epsilon: float | None = None) -> tuple[WorstCase,
                                                                                                      dict[str, Any]]:
    """δ(e^{ε'}) of CreateHeadList with its released counts, discrete noise (ALGORITHM.md §3.5), maximized over
    every move of one user's m_O records, at ε' = ``at_epsilon`` (default the claimed ε, which sets τ_d and t).

    Searched, exhaustively: every pair of partitions of m_O (the units of count that fall, over records, and
    those that rise, over other records; fewer than m_O either way is a post-processing of a move of m_O, so it
    cannot give more), and for every touched record every count from 0 to τ_d on its smaller side (x' for a
    falling record, x for a rising one); a record whose smaller count is ≥ τ_d has the same loss law as one
    with τ_d (⊥ and the values ≤ min(c, c') then have the same loss), so larger counts add nothing.
    Records with equal parts are taken as multisets.
    """
    check_m_o(m_o)
    check_head_list_params(epsilon, delta, m_o)
    noise = DiscreteLaplaceNoise(np.random.default_rng(0))  # only the class's threshold is used
    tau = int(noise.head_list_threshold(epsilon, delta, m_o))
    b = head_list_scale(epsilon, m_o)
    t = float(rational_scale(b))
    falling, rising = _groups(m_o, tau, t, tau)
    worst = worst_move(falling, rising, epsilon if at_epsilon is None else at_epsilon)
    details = {"b": b, "noise_scale": t, "tau": tau, "falling_configurations": len(falling.laws),
               "rising_configurations": len(rising.laws), "pairs_searched": worst.pairs,
               "max_finite_loss": 2 * m_o / t, "counts_searched": f"0..{tau} on each touched record's smaller side"}
    return worst, details


def headlist_exact(epsilon: float = 4.0, delta: float = 1e-5, m_o: int = 1) -> ExactResult:
    """The exact audit of CreateHeadList with its released noisy counts (see :func:`headlist_delta`), with the
    model check :func:`headlist_model_check`."""
    start = time.perf_counter()
    worst, details = headlist_delta(epsilon, delta, m_o)
    model = headlist_model_check(epsilon, delta, m_o)
    return ExactResult("headlist", float(epsilon), float(delta), worst.delta, m_o, "discrete",
                       {"falling": _describe(worst.falling), "rising": _describe(worst.rising)}, details, model,
                       time.perf_counter() - start)


def optin_delta(epsilon: float, m_o: int, at_epsilon: float | None = None) -> tuple[WorstCase, dict[str, Any]]:
    """δ(e^{ε'}) of EstimateOptinProbabilities' noisy counts (ALGORITHM.md §4), discrete noise, over every move
    of m_O units (every pair of partitions of m_O; without a threshold a record's loss law depends on its shift
    only)."""
    check_m_o(m_o)
    b = head_list_scale(epsilon, m_o)
    t = float(rational_scale(b))
    falling, rising = _groups(m_o, 0, t, None)
    worst = worst_move(falling, rising, epsilon if at_epsilon is None else at_epsilon)
    return worst, {"b": b, "noise_scale": t, "pairs_searched": worst.pairs, "max_finite_loss": 2 * m_o / t}


def optin_exact(epsilon: float = 4.0, delta: float = 0.0, m_o: int = 1) -> ExactResult:
    """The exact audit of the opt-in noisy counts (Theorem 2: (ε, 0)-DP, so δ(e^ε) must be 0), with the model
    check :func:`optin_model_check`."""
    start = time.perf_counter()
    worst, details = optin_delta(epsilon, m_o)
    model = optin_model_check(epsilon, m_o)
    return ExactResult("optin-estimate", float(epsilon), float(delta), worst.delta, m_o, "discrete",
                       {"falling": _describe(worst.falling), "rising": _describe(worst.rising)}, details, model,
                       time.perf_counter() - start)


def localalg_exact(epsilon: float = 1.0, delta: float = 1e-5, f_c: float = 0.85) -> ExactResult:
    """LocalAlg (ALGORITHM.md §5, Theorem 3) on the audit's head list, m_C = 1: max over pairs of records of the
    hockey-stick divergence of :func:`hybriddp.core.reportlaw.output_distribution` for the parameters
    :meth:`hybriddp.core.reportlaw.LocalAlgParams.build` makes (the closed form both samplers are tested against)."""
    start = time.perf_counter()
    check_delta(delta)
    check_local_budget(epsilon, f_c, 1)
    hl, names = _audit_head_list()
    lp = _law.LocalAlgParams.build(hl, epsilon, delta, f_c, 1)
    P = _law.output_distribution(lp)
    value = _law.privacy_loss_delta(P, epsilon)
    with np.errstate(divide="ignore"):
        loss = np.log(P[:, None, :]) - np.log(P[None, :, :])  # ln P[y|x]/P[y|x'], every (x, x', y)
    div = np.maximum(P[:, None, :] - math.exp(epsilon) * P[None, :, :], 0.0).sum(axis=2)
    np.fill_diagonal(div, -1.0)
    worst_loss = loss.max(axis=2)
    np.fill_diagonal(worst_loss, -np.inf)
    i, j = np.unravel_index(int(np.lexsort((-worst_loss.ravel(), -div.ravel()))[0]), div.shape)
    return ExactResult("localalg", float(epsilon), float(delta), value, None, None,
                       {"x": names[i], "x_prime": names[j]},
                       {"head_list": names, "f_c": f_c, "m_c": 1, "t": lp.t, "tq": lp.tq.tolist(),
                        "max_finite_loss": float(worst_loss[i, j])}, None,
                       time.perf_counter() - start,
                       "exact hockey-stick divergence max_{x,x'} sum_y max(0, P[y|x] - e^eps P[y|x']) of the "
                       "closed-form LocalAlg distribution")


def exact_audit(mechanism: str, *, epsilon: float | None = None, delta: float | None = None, m_o: int | None = None,
                noise: str = "discrete", f_c: float = 0.85) -> ExactResult:
    """``hybriddp audit --exact`` as a function: the exact audit of a named mechanism (:data:`EXACT_MECHANISMS`),
    at the claim (ε, δ) (default :data:`EXACT_DEFAULTS`)."""
    if mechanism not in EXACT_MECHANISMS:
        raise parameter_error("mechanism (--mechanism)", mechanism, "one of " + ", ".join(EXACT_MECHANISMS)
                              + " with --exact", "Audit local-only by sampling (without --exact).")
    check_m_o_for(mechanism, m_o)
    if mechanism != "localalg" and noise != "discrete":
        raise parameter_error("noise (--noise)", noise, "'discrete' with --exact (the exact audit enumerates the "
                              "discrete Laplace output law; Laplace noise is continuous)",
                              "Drop --noise, or audit Laplace noise by sampling (without --exact).")
    eps0, delta0 = EXACT_DEFAULTS[mechanism]
    eps = eps0 if epsilon is None else epsilon
    dlt = delta0 if delta is None else delta
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps)
            and 0 < eps <= MAX_EPSILON):
        raise parameter_error("epsilon (--epsilon)", eps, f"a finite number > 0 and <= {MAX_EPSILON:.2f}")
    m = 1 if m_o is None else int(m_o)
    if mechanism == "headlist":
        return headlist_exact(eps, dlt, m)
    if mechanism == "optin-estimate":
        if not (isinstance(dlt, (int, float)) and not isinstance(dlt, bool) and 0.0 <= dlt < 1.0):
            raise parameter_error("delta (--delta)", dlt, "in [0, 1) (0 for the pure epsilon-DP claim)")
        return optin_exact(eps, dlt, m)
    if not (isinstance(f_c, (int, float)) and 0.0 < f_c < 1.0):
        raise parameter_error("f_c (--f-c)", f_c, "strictly between 0 and 1")
    return localalg_exact(eps, dlt, f_c)

"""Privacy-loss-distribution accounting of the curator's mechanisms over rounds (ALGORITHM.md §14).

Each round's mechanism gets one privacy loss distribution (PLD) that dominates it: for every pair of neighbouring
inputs, its hockey-stick divergence δ(ε) is at least the mechanism's, at every ε. Composing such PLDs with
Google's ``dp-accounting`` bounds the composition of the rounds (dominating pairs compose: Zhu, Dong & Wang
2022), which is tighter than adding the rounds' ε.

How a round's PLD is built. The exact audit (:mod:`hybriddp.audit.exact`) computes the mechanism's privacy
profile δ*(ε) = max over every move of one user's m_O records of the exact δ(e^ε) of that move — both directions
of the neighbour relation are moves of the same family, so the profile is symmetric. Its values on a grid from
−L to L (L the largest finite privacy loss, 2·m_O/t) feed "Connect the Dots" (Doroshenko, Ghazi, Kamath, Kumar &
Manurangsi 2022, dp-accounting's pessimistic ``create_pmf_pessimistic_connect_dots``). As a function of e^ε every
move's profile is convex, so the chord between two grid points lies above it: the connect-the-dots PLD of the
maximum dominates every move between grid points; above L its mass at +∞ is δ*(L), at least every move's δ; below
−L every profile is 1 − e^ε, which it equals. The mechanism's own δ (a record that passes the threshold on one
side only) is the mass at +∞.

Covered: CreateHeadList with its released counts (the S group) and EstimateOptinProbabilities' counts (the T
group), discrete noise, the mechanisms the exact audit enumerates; and a device's LocalAlg reports given the head
list's shape (:func:`localalg_delta`, exact from the law's structure; m_C reports composed). Continuous noise, and
devices without the head list's shape, are accounted by their (ε, δ) alone (``from_privacy_parameters``): valid,
and no tighter than basic composition.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.privacy.budget import TOLERANCE

DISCRETIZATION = 1e-3
"""Spacing of the privacy losses the PLDs are supported on (dp-accounting's value discretization)."""
GRID_POINTS = 241
"""Points of the connect-the-dots grid over [−L, L] (more: tighter and slower; any grid is pessimistic)."""
KINDS = ("headlist", "optin", "optin-any", "local", "stated")
"""headlist (S), optin (T), optin-any (an opt-in user of a round, in S or in T: the service charges before the
split), local (a device), stated (any release accounted by its claimed (ε, δ) alone)."""
MAX_EXACT_M_O = 3
"""The largest m_O whose opt-in mechanisms the exact audit enumerates; beyond it a round is accounted as stated."""


@dataclass(frozen=True)
class Mechanism:
    """One round's release for one group: ``kind`` (:data:`KINDS`), its claimed (ε, δ) and m_O (the records each
    opt-in user contributes). A device (local) with the head list's URLs per query ``kq`` (wildcards included,
    ⟨*,*⟩ last, as :attr:`HeadList.kq`), ``f_c`` and ``m_c`` gets its exact PLD (:func:`localalg_delta`); without
    ``kq`` it is accounted by its (ε, δ)."""

    kind: str
    epsilon: float
    delta: float
    m_o: int = 1
    kq: tuple[int, ...] = ()
    f_c: float = 0.85
    m_c: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise parameter_error("kind", self.kind, "one of " + ", ".join(KINDS))
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise parameter_error("epsilon", self.epsilon, "a finite number > 0")
        if not 0 <= self.delta < 1:
            raise parameter_error("delta", self.delta, "a number in [0, 1)")


def localalg_law(mech: Mechanism) -> Any:
    """LocalAlg's parameters (one report, ALGORITHM.md §5) for a device mechanism with ``kq``."""
    from hybriddp.core.reportlaw import LocalAlgParams
    return LocalAlgParams.of_shape(np.array(mech.kq), mech.epsilon, mech.delta, mech.f_c, mech.m_c)


def localalg_delta(lp: Any, epsilon: float) -> float:
    """max over pairs of records x ≠ x' of Σ_y max(P[y|x] − e^ε·P[y|x'], 0), LocalAlg's exact δ(ε) for one
    report, from the law's structure (:func:`hybriddp.core.reportlaw.output_distribution`): two entries of one
    query differ only on their own two outputs; entries of queries q ≠ q' differ only on the outputs of q and q',
    so the maximum runs over URL counts, not over entries (tests/test_pld.py checks it against all pairs)."""
    k, kq, t, tq = lp.k, np.asarray(lp.kq), lp.t, np.asarray(lp.tq)
    if k == 1 and int(kq[0]) == 1:
        return 0.0
    e = math.exp(epsilon)
    best = 0.0
    count = Counter(zip(kq.tolist(), tq.tolist(), strict=True))  # queries per (URL count, t_q)
    sizes = sorted(count)
    same = max(1.0 - e, 0.0)  # ε < 0: an output both records give the same probability adds (1 − e^ε)·P
    for n, p in sizes:  # two entries of one query
        if n >= 2:
            a, b = t * p, t * (1.0 - p) / (n - 1)
            best = max(best, max(a - e * b, 0.0) + max(b - e * a, 0.0) + same * (1.0 - a - b))
    if k >= 2:
        for s1 in sizes:  # entries of two queries q (size n1) and q' (size n2)
            for s2 in sizes:
                if s1 == s2 and count[s1] < 2:
                    continue
                (n1, p1), (n2, p2) = s1, s2
                a1, b1, c1 = t * p1, t * (1.0 - p1) / max(n1 - 1, 1), (1.0 - t) / ((k - 1) * n1)
                a2, b2, c2 = t * p2, t * (1.0 - p2) / max(n2 - 1, 1), (1.0 - t) / ((k - 1) * n2)
                on_q = max(a1 - e * c1, 0.0) + (n1 - 1) * max(b1 - e * c1, 0.0)
                on_q2 = max(c2 - e * a2, 0.0) + (n2 - 1) * max(c2 - e * b2, 0.0)
                rest = 1.0 - (a1 + (n1 - 1) * b1) - n2 * c2  # x's mass outside q and q'
                best = max(best, on_q + on_q2 + same * rest)
    return min(best, 1.0)


def _localalg_max_loss(lp: Any) -> float:
    """The largest finite |ln P[y|x]/P[y|x']| of LocalAlg's law (every probability it uses is positive)."""
    k, kq, t, tq = lp.k, np.asarray(lp.kq), lp.t, np.asarray(lp.tq)
    probs = [t * tq]
    multi = kq >= 2
    if multi.any():
        probs.append(t * (1.0 - tq[multi]) / (kq[multi] - 1))
    if k >= 2:
        probs.append((1.0 - t) / ((k - 1) * kq))
    vals = np.concatenate(probs)
    vals = vals[vals > 0]
    return float(math.log(vals.max() / vals.min())) if vals.size else 0.0


def _profile(mech: Mechanism) -> tuple[Any, float]:
    """(δ*(ε) as a function, L) of an exactly audited mechanism."""
    from hybriddp.audit.exact import headlist_delta, optin_delta
    if mech.kind == "local":
        lp = localalg_law(mech)
        return (lambda e: localalg_delta(lp, e)), _localalg_max_loss(lp)
    if mech.kind == "optin-any":  # in S or in T: the larger δ at every ε dominates both, and a max of convex
        parts = [_profile(Mechanism(k, mech.epsilon, mech.delta, mech.m_o)) for k in ("headlist", "optin")]
        return (lambda e: max(f(e) for f, _ in parts)), max(loss for _, loss in parts)  # profiles is convex
    if mech.kind == "headlist":
        _, details = headlist_delta(mech.epsilon, mech.delta, mech.m_o)
        return (lambda e: headlist_delta(mech.epsilon, mech.delta, mech.m_o, at_epsilon=e)[0].delta,
                details["max_finite_loss"])
    _, details = optin_delta(mech.epsilon, mech.m_o)
    return lambda e: optin_delta(mech.epsilon, mech.m_o, at_epsilon=e)[0].delta, details["max_finite_loss"]


def grid(max_loss: float, points: int = GRID_POINTS, discretization: float = DISCRETIZATION) -> np.ndarray:
    """The connect-the-dots grid: integer multiples of ``discretization`` from −L to L, about ``points`` of them."""
    hi = math.ceil(max_loss / discretization)
    return np.unique(np.round(np.linspace(-hi, hi, points)).astype(np.int64))


@functools.lru_cache(maxsize=64)
def round_pld(mech: Mechanism, points: int = GRID_POINTS) -> Any:
    """The dominating PLD of one round of ``mech`` (module docstring)."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as pld
    if mech.kind == "stated" or (mech.kind == "local" and not mech.kq):
        return pld.from_privacy_parameters(_params(mech), value_discretization_interval=DISCRETIZATION)
    profile, max_loss = _profile(mech)
    rounded = grid(max(max_loss, DISCRETIZATION), points)
    deltas = np.array([profile(float(r) * DISCRETIZATION) for r in rounded])
    deltas = np.minimum.accumulate(np.clip(deltas, 0.0, 1.0))  # exact values; guards rounding at 1e-16
    one = pld.PrivacyLossDistribution(pld_pmf.create_pmf_pessimistic_connect_dots(DISCRETIZATION, rounded, deltas))
    return one.self_compose(mech.m_c) if mech.kind == "local" and mech.m_c > 1 else one


def _params(mech: Mechanism) -> Any:
    from dp_accounting.pld.common import DifferentialPrivacyParameters
    return DifferentialPrivacyParameters(mech.epsilon, mech.delta)


def compose(mechanisms: Sequence[Mechanism]) -> Any:
    """The PLD of the rounds ``mechanisms`` one after the other (one user's history)."""
    if not mechanisms:
        raise parameter_error("mechanisms", "[]", "at least one round")
    total = None
    for mech, count in _counted(mechanisms):
        part = round_pld(mech).self_compose(count) if count > 1 else round_pld(mech)
        total = part if total is None else total.compose(part)
    return total


def _counted(mechanisms: Sequence[Mechanism]) -> list[tuple[Mechanism, int]]:
    counts: dict[Mechanism, int] = {}
    for m in mechanisms:
        counts[m] = counts.get(m, 0) + 1
    return list(counts.items())


@dataclass(frozen=True)
class Totals:
    """A history's guarantee three ways, at the target δ: basic and advanced composition, and PLD accounting."""

    rounds: int
    basic: tuple[float, float]
    advanced: tuple[float, float]
    pld_epsilon: float
    target_delta: float

    def to_json(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "basic_epsilon": self.basic[0], "basic_delta": self.basic[1],
                "advanced_epsilon": self.advanced[0], "advanced_delta": self.advanced[1],
                "pld_epsilon": self.pld_epsilon, "pld_delta": self.target_delta}


def totals(mechanisms: Sequence[Mechanism], target_delta: float) -> Totals:
    """Basic composition (Σε, Σδ), advanced composition at δ' = target δ − Σδ (when positive), and the PLD's ε at
    the target δ."""
    from hybriddp.privacy.ledger import advanced_composition, basic_composition
    eps = [m.epsilon for m in mechanisms]
    dels = [m.delta for m in mechanisms]
    basic = basic_composition(eps, dels)
    slack = target_delta - basic[1]
    advanced = advanced_composition(eps, dels, slack) if slack > 0 else (math.inf, basic[1])
    pld_eps = float(compose(mechanisms).get_epsilon_for_delta(target_delta))
    return Totals(len(mechanisms), basic, (min(advanced[0], basic[0]), advanced[1]), pld_eps, target_delta)


def round_mechanism(kind: str, params: dict[str, Any], charge: tuple[float, float] | None = None) -> Mechanism:
    """What an opt-in user of a service round went through, for accounting: a BLENDER round with discrete noise
    and m_O ≤ :data:`MAX_EXACT_M_O` is ``optin-any`` (exact); any other round (a mean round, Laplace noise, a
    larger m_O) is ``stated``: its (ε, δ) alone, as basic composition counts it. ``charge``: the (ε, δ) the ledger
    charged, in place of the parameters'."""
    if charge is not None:
        params = {**params, "epsilon": charge[0], "delta": charge[1]}
    eps = float(params["epsilon"])
    delta = float(params.get("delta", 0.0)) if kind == "blender" else 0.0
    m_o = int(params.get("m_o", 1))
    if (kind == "blender" and params.get("noise", "discrete") == "discrete" and m_o <= MAX_EXACT_M_O
            and 0.0 < delta < 1.0):
        return Mechanism("optin-any", eps, delta, m_o)
    return Mechanism("stated", eps, max(delta, 0.0), 1)


@functools.lru_cache(maxsize=1024)
def _history_epsilon(history: tuple[tuple[Mechanism, int], ...], target_delta: float) -> float:
    mechanisms = [m for m, n in history for _ in range(n)]
    basic_eps = sum(m.epsilon for m in mechanisms)
    basic_delta = sum(m.delta for m in mechanisms)
    basic = basic_eps if basic_delta <= target_delta * (1 + TOLERANCE) else math.inf
    return min(basic, float(compose(mechanisms).get_epsilon_for_delta(target_delta)))


def history_epsilon(mechanisms: Sequence[Mechanism], target_delta: float) -> float:
    """A user's total ε at ``target_delta`` after ``mechanisms``: the tighter of basic composition (Σε, when
    Σδ ≤ the target) and PLD accounting, never looser than basic composition. Cached per multiset of mechanisms
    (the users of a series share a few histories)."""
    history = tuple(sorted(_counted(mechanisms), key=lambda mn: repr(mn[0])))
    return _history_epsilon(history, float(target_delta))


def within_lifetime(mechanisms: Sequence[Mechanism], lifetime_epsilon: float, lifetime_delta: float) -> bool:
    """Whether a history stays within the lifetime budget by the rule the service enforces: its
    :func:`history_epsilon` at the lifetime δ is at most the lifetime ε (up to the ledger's relative TOLERANCE)."""
    return history_epsilon(mechanisms, lifetime_delta) <= lifetime_epsilon * (1 + TOLERANCE)


PLD_MAX_EPSILON = 700.0
"""Rounds of at least this ε are not composed by the PLD accountant (its e^ε overflows a float beyond ~709.8); such a
round exceeds any lifetime budget a service accepts many times over, and basic composition counts it."""


def admitted_rounds(mech: Mechanism, lifetime_epsilon: float, lifetime_delta: float, most: int) -> tuple[int, int]:
    """(by basic composition, by the enforced rule): how many rounds of ``mech`` one user can take part in within
    the lifetime budget. The first is ⌊ε_L/ε⌋ (and ⌊δ_L/δ⌋), uncapped; the second extends it, one round at a time up
    to ``most``, while :func:`within_lifetime` holds (it is the first when that already reaches ``most``)."""
    by_eps = math.floor(lifetime_epsilon / mech.epsilon + 1e-9)
    by_delta = math.floor(lifetime_delta / mech.delta + 1e-9) if mech.delta > 0 else by_eps
    basic = max(0, min(by_eps, by_delta))
    if mech.epsilon >= PLD_MAX_EPSILON:  # the accountant's e^ε overflows: basic composition's count stands
        return basic, basic
    k = basic
    while k < most and within_lifetime([mech] * (k + 1), lifetime_epsilon, lifetime_delta):
        k += 1
    return basic, k


class _DeviceAccountant:
    """The device ledger's tighter accountant (:class:`hybriddp.device.ledger.Accountant`): a round kept with its
    head list's shape is LocalAlg's exact mechanism, any other its (ε, δ) (ALGORITHM.md §15)."""

    @staticmethod
    def mechanisms(history: Sequence[tuple[float, float, dict[str, Any] | None]]) -> list[Mechanism]:
        out = []
        for e, d, shape in history:
            if e <= 0:  # a charge of nothing composes to nothing
                continue
            if shape is None:
                out.append(Mechanism("local", float(e), float(d)))
            else:
                out.append(Mechanism("local", float(e), float(d), kq=tuple(int(x) for x in shape["kq"]),
                                     f_c=float(shape["f_c"]), m_c=int(shape["m_c"])))
        return out

    def within(self, history: Sequence[tuple[float, float, dict[str, Any] | None]], lifetime_epsilon: float,
               lifetime_delta: float) -> bool:
        return within_lifetime(self.mechanisms(history), lifetime_epsilon, lifetime_delta)

    def epsilon(self, history: Sequence[tuple[float, float, dict[str, Any] | None]], delta: float) -> float:
        return history_epsilon(self.mechanisms(history), delta)


def device_accountant() -> _DeviceAccountant:
    """The accountant :func:`hybriddp.device.ledger.open_device_ledger` is given by the SDK and the CLI."""
    return _DeviceAccountant()

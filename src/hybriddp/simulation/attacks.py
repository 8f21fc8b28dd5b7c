"""Fake device reports against a BLENDER round (ALGORITHM.md §7.2; ``hybriddp experiment poisoning``).

An attacker controls F fake devices, F = φ·n for n honest reports, and wants one *target* query to rank high in
the published suggestions. Each attack returns the report counts per head-list entry its devices add (the server
counts well-formed messages; it cannot tell a fake from a real one):

* ``direct`` — every fake reports the target's most popular record ⟨q, u⟩ outright (output manipulation);
* ``randomizer`` — every fake holds that record and runs the honest randomizer LocalAlg on it;
* ``spread`` — the fakes report the target query's entries (its URLs and ⟨q,*⟩) in turn, so no single entry
  carries all of them;
* ``adaptive`` — knows the defense, its thresholds included, and the population (not the opt-in group's noise):
  spreads its reports evenly over the target's entries (the query's estimate moves the same, each record's
  less), and sends the largest number whose *expected* anchor z (shipped code: :mod:`hybriddp.server.anchor`) stays
  ``margin`` below the critical value — the most it can move the target while expecting to pass the test.
  Its report count is capped at φ·n like the others'.
* ``oracle`` — knows everything the server publishes and computes (the opt-in estimates, the honest report counts,
  each entry's s, κ_i and κ_q: it runs the shipped defense itself, :class:`OracleAttack`) and sends the fewest fakes
  that push the target query's guarded ranking score to its maximum p̂_O + min(κ_i, κ_q)·s and its estimate to
  p̂_O + κ_i·s without the check flagging anything; when no number does both unflagged, the most it can send
  unflagged. Its fakes go to the target's entries so that each entry's client estimate rises in proportion to its
  σ_D: every record's z rises alike, the most a query moves while no record's z outgrows the others'
  (:func:`hybriddp.experiments.poisoning.oracle_attack`). Capped at φ·n like the others'.
  Its measured shift against the bound (≤ 1 by ALGORITHM.md §7.2, "The bound") is what the experiment reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hybriddp.core.headlist import HeadList
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution

ATTACKS = ("direct", "randomizer", "spread", "adaptive", "oracle")
"""The attacks of :func:`fake_counts`."""


@dataclass(frozen=True)
class Target:
    """The attacked query: its position in the head list and its entries (URLs first, then ⟨q,*⟩)."""

    query: int
    entries: np.ndarray
    top_entry: int  # the entry a direct attack reports: the query's most popular record


def target_of(hl: HeadList, query: int, p_record: np.ndarray) -> Target:
    """The target query at list position ``query``; ``p_record`` (the population's) picks its top record."""
    entries = np.flatnonzero(hl.entry_query == query)
    top = int(entries[np.argmax(p_record[entries])])
    return Target(query, entries, top)


def fake_counts(attack: str, fakes: int, target: Target, hl: HeadList, lp: LocalAlgParams,
                rng: np.random.Generator, *, adaptive_budget: Callable[[np.ndarray], int] | None = None,
                oracle: OracleAttack | None = None) -> np.ndarray:
    """Report counts per entry added by ``fakes`` fake devices running ``attack`` against ``target``.

    ``adaptive_budget`` (adaptive only) maps the attack's direction (fake reports per entry, summing to 1) to the
    number of fakes it sends; ``oracle`` (oracle only) is the attacker that has run the defense on this round's
    reports. The result never exceeds ``fakes``.
    """
    out = np.zeros(hl.n_entries, dtype=np.int64)
    if fakes <= 0:
        return out
    if attack == "direct":
        out[target.top_entry] = fakes
    elif attack == "randomizer":
        out += rng.multinomial(fakes, output_distribution(lp)[target.top_entry])
    elif attack == "spread":
        share = np.full(target.entries.size, fakes // target.entries.size)
        share[: fakes % target.entries.size] += 1
        out[target.entries] = share
    elif attack == "adaptive":
        if adaptive_budget is None:
            raise ValueError("the adaptive attack needs adaptive_budget")
        direction = np.zeros(hl.n_entries)
        direction[target.entries] = 1.0 / target.entries.size
        f = min(fakes, adaptive_budget(direction))
        out[target.entries] = np.floor(direction[target.entries] * f).astype(np.int64)
        out[target.top_entry] += f - int(out.sum())
    elif attack == "oracle":
        if oracle is None:
            raise ValueError("the oracle attack needs oracle (an OracleAttack on this round)")
        out += oracle.fake_counts(fakes)
    else:
        raise ValueError(f"unknown attack {attack!r}; one of {', '.join(ATTACKS)}")
    return out


TOLERANCE = 1e-12
"""Absolute slack (probability units) within which a published value counts as at its cap (float rounding)."""


@dataclass(frozen=True)
class Seen:
    """What a round publishes about the target query (ALGORITHM.md §7.2): its guarded ranking score and its estimate
    (before the final clipping into [0, 1]), the most each can be, p̂_O + min(κ_i, κ_q)·s (in [0, 1]) and
    p̂_O + κ_i·s, and whether the check flagged any entry or query."""

    rank_score: float
    rank_cap: float
    estimate: float
    estimate_cap: float
    flagged: bool

    @property
    def at_caps(self) -> bool:
        """Both the ranking score and the estimate are at their maxima."""
        return self.rank_score >= self.rank_cap - TOLERANCE and self.estimate >= self.estimate_cap - TOLERANCE


@dataclass
class OracleAttack:
    """The attacker that knows the bound (module docstring, ``oracle``) on one round.

    ``publish`` maps the fakes' report counts (per entry) to what the defended server then publishes about the
    target (:class:`Seen`): the oracle runs the defense itself on the honest reports plus its own. ``direction``
    (per entry, summing to 1 over the target's entries) spreads the fakes; ``most`` bounds the search. The search
    bisects on the number of fakes (``rel_tol``: to within that share, at least 1): first the most fakes that raise
    no flag (no limit when the honest round is flagged already), then the fewest below that which put both the
    ranking score and the estimate at their caps; each evaluation is one run of the defense.
    """

    target: Target
    direction: np.ndarray
    publish: Callable[[np.ndarray], Seen]
    most: int
    rel_tol: float = 0.005
    _seen: dict[int, Seen] = field(default_factory=dict, repr=False)
    _plan: int | None = field(default=None, repr=False)

    def counts(self, f: int) -> np.ndarray:
        """``f`` fake reports over the target's entries in proportion to ``direction`` (largest remainders)."""
        e = self.target.entries
        out = np.zeros(self.direction.size, dtype=np.int64)
        raw = self.direction[e] * f
        base = np.floor(raw).astype(np.int64)
        extra = f - int(base.sum())
        base[np.argsort(-(raw - base), kind="stable")[:extra]] += 1
        out[e] = base
        return out

    def seen(self, f: int) -> Seen:
        """What the round publishes with ``f`` fakes (cached)."""
        if f not in self._seen:
            self._seen[f] = self.publish(self.counts(f))
        return self._seen[f]

    def _first(self, pred: Callable[[Seen], bool], lo: int, hi: int) -> tuple[int, int]:
        """(lo, hi) with pred false at lo and true at hi, hi − lo ≤ max(1, rel_tol·hi); pred monotone in f."""
        while hi - lo > max(1, int(self.rel_tol * hi)):
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if pred(self.seen(mid)) else (mid, hi)
        return lo, hi

    def plan(self) -> int:
        """The fakes the oracle sends without a cap (module docstring), ≤ ``most``."""
        if self._plan is None:
            limit = self.most
            if not self.seen(0).flagged and self.seen(limit).flagged:
                limit = self._first(lambda s: s.flagged, 0, limit)[0]
            if self.seen(limit).at_caps:
                self._plan = 0 if self.seen(0).at_caps else self._first(lambda s: s.at_caps, 0, limit)[1]
            else:
                self._plan = limit
        return self._plan

    def fake_counts(self, cap: int) -> np.ndarray:
        """The oracle's reports when it may send at most ``cap`` fakes."""
        return self.counts(min(self.plan(), max(cap, 0)))

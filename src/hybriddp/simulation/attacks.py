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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hybriddp.core.headlist import HeadList
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution

ATTACKS = ("direct", "randomizer", "spread", "adaptive")
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
                rng: np.random.Generator, *, adaptive_budget: Callable[[np.ndarray], int] | None = None
                ) -> np.ndarray:
    """Report counts per entry added by ``fakes`` fake devices running ``attack`` against ``target``.

    ``adaptive_budget`` (adaptive only) maps the attack's direction (fake reports per entry, summing to 1) to the
    number of fakes it sends; the result never exceeds ``fakes``.
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
    else:
        raise ValueError(f"unknown attack {attack!r}; one of {', '.join(ATTACKS)}")
    return out

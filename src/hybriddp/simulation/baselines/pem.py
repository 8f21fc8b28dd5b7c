"""PEM, the prefix extending method: ε-LDP heavy-hitter identification over OLH.

Wang, Li, Jha, "Locally differentially private heavy hitter identification", IEEE TDSC 2019
(arXiv:1708.06674), the "Prefix Extending Method" (PEM), with OLH as the frequency oracle (Wang,
Blocki, Li, Jha, USENIX Security 2017; :mod:`hybriddp.simulation.baselines.olh`).

Items are ``L``-bit integers. The users are split uniformly at random into ``R`` disjoint
groups, one per round. Round ``j = 1..R``'s group reports, through OLH, the first
``s_j = min(L, γ + j·η)`` bits of its item (the last round: all L bits). In round 1 the
aggregator estimates the frequency of *every* ``(γ + η)``-bit prefix and keeps the top ``k``;
in round ``j > 1`` the candidates are the ``k`` prefixes kept in round ``j − 1``, each extended
by all ``2^{s_j − s_{j−1}}`` suffixes (``2^η·k`` candidates), and the top ``k`` are kept again.
The last round's top ``k`` are the heavy hitters, with their estimated frequencies.

Parameters and defaults
-----------------------
* ``k`` — heavy hitters wanted (the head-list size M for the local-only baseline).
* ``γ`` (``gamma``) — the start length; default ``⌈log₂ k⌉``, so round 1 enumerates
  ``2^{γ+η} ≈ 2^η·k`` prefixes, about as many candidates as every later round.
* ``η`` (``eta``) — bits added per round. A larger η means fewer rounds, hence more users per
  round and less noise per estimate, but ``2^η·k`` candidates per round: more chances for a
  noisy tail prefix to push out a true heavy one, and ``2^η·k`` hash evaluations per user.
  The default (:func:`default_eta`) is the largest η ≤ :data:`MAX_ETA` (= 4) whose total work
  ``n·2^η·k`` (user, candidate) hash evaluations fits :data:`WORK_BUDGET`: η = 4 at AOL scale
  (k = 50), η = 2 at Yandex scale (k = 500); never below 1. On the aol preset η ∈ [2, 7]
  gives the same utility within noise; discovery is limited by the users per round.
* The number of rounds is ``R = ⌈(L − γ)/η⌉`` (at least 1); the users are split into ``R``
  groups of equal size.

Privacy: every user belongs to exactly one group and sends exactly one
OLH report, which is ε-LDP; the groups are disjoint, so by parallel composition PEM is ε-LDP
for every user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hybriddp.simulation.baselines.olh import VALUE_BITS, olh_estimate, olh_perturb

WORK_BUDGET = 6e9
"""Default bound on the (user, candidate) hash evaluations of a PEM run (≈ 8 s on two cores)."""

MAX_ETA = 4
"""Largest η :func:`default_eta` picks."""


def default_eta(n_users: int, k: int, work_budget: float = WORK_BUDGET) -> int:
    """Largest η in ``[1, MAX_ETA]`` with ``n_users·2^η·k ≤ work_budget`` (1 if none fits)."""
    eta = 1
    for e in range(1, MAX_ETA + 1):
        if n_users * (1 << e) * k <= work_budget:
            eta = e
    return eta


def prefix_schedule(n_bits: int, k: int, eta: int, gamma: int | None = None) -> list[int]:
    """Prefix length ``s_j = min(L, γ + j·η)`` of each round ``j = 1..R``, the last equal to L.

    ``γ`` defaults to ``⌈log₂ k⌉``.
    """
    if n_bits < 1 or n_bits > VALUE_BITS:
        raise ValueError(f"n_bits must be in [1, {VALUE_BITS}], got {n_bits}")
    if eta < 1:
        raise ValueError(f"eta must be >= 1, got {eta}")
    gamma = math.ceil(math.log2(max(k, 1))) if gamma is None else int(gamma)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    schedule = [min(n_bits, gamma + eta)]
    if schedule[0] > 24:
        raise ValueError(f"gamma + eta = {gamma + eta}: the first round would enumerate 2^{schedule[0]} prefixes")
    while schedule[-1] < n_bits:
        schedule.append(min(n_bits, schedule[-1] + eta))
    return schedule


@dataclass
class PEMResult:
    """Output of :func:`pem`.

    Attributes
    ----------
    items : int64 array, shape (≤ k,)
        The heavy hitters (L-bit item codes), by estimated frequency descending.
    freq : float64 array
        Their estimated frequencies among the last round's users (unbiased, may be < 0).
    eta : bits added per round.
    prefix_bits, users_per_round, candidates_per_round : per-round bookkeeping.
    """

    items: np.ndarray
    freq: np.ndarray
    eta: int = 0
    prefix_bits: list[int] = field(default_factory=list)
    users_per_round: list[int] = field(default_factory=list)
    candidates_per_round: list[int] = field(default_factory=list)

    @property
    def n_rounds(self) -> int:
        return len(self.prefix_bits)


def pem(values: np.ndarray, n_bits: int, epsilon: float, rng: np.random.Generator, *, k: int,
        eta: int | None = None, gamma: int | None = None, domain_size: int | None = None,
        threads: int | None = None) -> PEMResult:
    """PEM heavy hitters of ``values`` under ε-LDP (Wang, Li, Jha 2019, prefix extending method).

    Parameters
    ----------
    values : int array, shape (n,), one L-bit item per user (``0 ≤ v < 2^n_bits``).
    n_bits : L, the item length in bits (≤ 32, :data:`~hybriddp.simulation.baselines.olh.VALUE_BITS`).
    epsilon : every user's LDP parameter (spent once, in the user's only round).
    rng : source of the group split and of every OLH report.
    k : number of heavy hitters.
    eta, gamma : bits added per round and start length (see the module docstring; defaults
        :func:`default_eta` and ``⌈log₂ k⌉``).
    domain_size : if given, items are known to lie in ``[0, domain_size)`` (public), and prefixes
        that no such item has are not candidates.
    threads : threads for OLH support counting.

    Returns
    -------
    :class:`PEMResult` with the top ``min(k, candidates)`` items of the last round.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    v = np.asarray(values, dtype=np.int64)
    if v.size and (v.min() < 0 or int(v.max()) >= 1 << n_bits):
        raise ValueError(f"values must lie in [0, 2^{n_bits})")
    eta = default_eta(len(v), k) if eta is None else int(eta)
    schedule = prefix_schedule(n_bits, k, eta, gamma)
    groups = np.array_split(rng.permutation(len(v)), len(schedule))
    result = PEMResult(np.zeros(0, dtype=np.int64), np.zeros(0), eta)
    kept = np.zeros(1, dtype=np.int64)  # the empty prefix
    prev_bits = 0
    for bits, group in zip(schedule, groups, strict=True):
        step = bits - prev_bits
        cand = ((kept[:, None] << np.int64(step)) | np.arange(1 << step, dtype=np.int64)[None, :]).ravel()
        if domain_size is not None:
            cand = cand[(cand << np.int64(n_bits - bits)) < domain_size]
        prefixes = v[group] >> np.int64(n_bits - bits)
        reports = olh_perturb(prefixes, epsilon, rng)
        est = olh_estimate(reports, cand, threads=threads)
        order = np.argsort(-est, kind="stable")[:k]
        kept = cand[order]
        result.prefix_bits.append(bits)
        result.users_per_round.append(len(group))
        result.candidates_per_round.append(len(cand))
        result.items = kept
        result.freq = est[order] / max(len(group), 1)
        prev_bits = bits
    return result

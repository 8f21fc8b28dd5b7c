"""Whether a log is large enough for an algorithm's groups, decided before any work (ALGORITHM.md §2, §3).

CreateHeadList keeps a record only when its noisy count passes τ, so the group S must hold
more than τ sampled records; T and the clients need a user each. :func:`check_group_sizes`
refuses a log that cannot form a head list and says what would work (a larger opt-in
fraction, a larger log, or one user per row); :func:`check_algorithm_params` refuses
parameters that depend on the log or the algorithm.
"""

from __future__ import annotations

import math

from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.noise import noise_factory
from hybriddp.core.params import BlenderParams, check_local_budget
from hybriddp.core.records import RecordLog

OLH_MAX_EPSILON = math.log(2**31 - 2)
"""≈ 21.49: the local-only baselines' OLH hash range g = round(e^ε + 1) must stay below 2^31."""


def check_algorithm_params(algorithm: str, params: BlenderParams, log: RecordLog) -> None:
    """What depends on the log or the algorithm: LocalAlg on a log without URLs spends the whole budget
    on the query (f_C = 1), and the local-only baselines' OLH needs e^ε + 1 < 2^31."""
    if not log.has_urls:
        check_local_budget(params.epsilon, 1.0, params.m_c, url_level=False)
    if algorithm.startswith("local-only") and params.epsilon > OLH_MAX_EPSILON:
        raise parameter_error("epsilon (--epsilon)", params.epsilon,
                              f"<= {OLH_MAX_EPSILON:.4f} with --algorithm {algorithm}: its OLH reports hash into "
                              "g = round(e^epsilon + 1) values, which must stay below 2^31")


def _min_optin(f_o: float, need_s: int, need_t: int) -> int:
    """The smallest opt-in group n_O that splits into |S| = round(f_O·n_O) ≥ need_s and |T| ≥ need_t."""
    estimate = max((need_s - 0.5) / f_o, (need_t - 0.5) / (1.0 - f_o), 1.0)
    start = max(1, math.floor(estimate) - 2)
    for n_o in range(start, start + 1000):  # Python's round (banker's) moves the answer by a step or two
        if round(f_o * n_o) >= need_s and n_o - round(f_o * n_o) >= need_t:
            return n_o
    return start + 1000


def _min_users(c: float, f_o: float, need_s: int, need_t: int, need_clients: int) -> int:
    """The smallest number of users whose opt-in group round(c·n) splits into |S| ≥ need_s, |T| ≥ need_t and
    leaves ≥ need_clients clients (Python's round, as :func:`hybriddp.simulation.pipeline.split_optin`)."""
    n_o = _min_optin(f_o, need_s, need_t)
    start = max(1, math.floor((n_o - 0.5) / c) - 2)
    for n in range(start, start + 1000):
        k = round(c * n)
        if round(f_o * k) >= need_s and k - round(f_o * k) >= need_t and n - k >= need_clients:
            return n
    return start + 1000


def check_group_sizes(log: RecordLog, params: BlenderParams, algorithm: str, noise: str, source: str) -> None:
    """Refuse a log too small for the hybrid model before any work, saying what would work.

    CreateHeadList keeps a record when its count plus noise exceeds τ, so S must hold more than τ
    sampled records (a record at count ⌊τ⌋ + 1 passes with probability ≥ 1/2); T and the clients
    need a user each (``central``: S and T out of all users; the local-only baselines: no groups).
    """
    if algorithm.startswith("local-only"):
        return
    n = log.n_users
    tau = noise_factory(noise)(None).head_list_threshold(params.epsilon, params.delta, params.m_o)
    need_records = math.floor(tau) + 1
    need_s = math.ceil(need_records / params.m_o)
    if algorithm == "central":
        n_o, need_clients = n, 0
    else:
        n_o, need_clients = round(params.optin_fraction * n), 1
    n_s = round(params.f_o * n_o)
    n_t, clients = n_o - n_s, n - n_o
    if n_s >= need_s and n_t >= 1 and clients >= need_clients:
        return
    rows = f"; or --row-per-user if every row is its own user (the log has {log.n_records:,} rows)" \
        if log.n_records >= 2 * n else ""
    what = (f"{source} has {n:,} users: with --f-o {params.f_o:g} that is {n_s:,} in S and {n_t:,} in T"
            if algorithm == "central" else
            f"{source} has {n:,} users: with --optin-fraction {params.optin_fraction:g} that is {n_o:,} opt-in "
            f"users ({n_s:,} in S, {n_t:,} in T) and {clients:,} clients")
    need = (f"CreateHeadList needs at least {need_records} sampled records in S to pass tau = {tau:.2f} "
            f"({need_s} users at --m-o {params.m_o}), and T{'' if algorithm == 'central' else ' and the clients'} "
            "at least one user")
    fixes = []
    if algorithm != "central":
        n_o_ok = _min_optin(params.f_o, need_s, 1)
        if n_o_ok < n:
            fixes.append(f"--optin-fraction {n_o_ok / n:.3g} or more ({n_o_ok} opt-in users of these {n:,})")
        c = params.optin_fraction
    else:
        c = 1.0 - 1e-12
    if n_t < 1 and n_s >= need_s:
        fixes.append("a smaller --f-o (T gets the rest of the opt-in group)")
    fixes.append(f"a log of at least {_min_users(c, params.f_o, need_s, 1, need_clients):,} users at these settings")
    raise DataError(f"{what}. {need}. What would work: {'; or '.join(fixes)}{rows}.")

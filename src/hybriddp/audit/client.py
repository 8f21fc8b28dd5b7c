"""The client-side mechanisms: LocalAlg and the local-only baseline's OLH report.

The adapters run the library's randomizers, looked up on their modules at call time (so a patched or changed
function is what the audit measures): :func:`hybriddp.device.batch.randomize_batch` with
:meth:`hybriddp.core.reportlaw.LocalAlgParams.build` — what the simulated clients of ``hybriddp run`` and the
local-only baseline call; its pure-Python twin on devices, :func:`hybriddp.device.localalg.local_alg`, gives the same
report on the same uniforms (``tests/test_localalg.py``) — and :func:`hybriddp.simulation.baselines.olh.olh_perturb`,
what
PEM's users call.
"""

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
    best_event,
)
from hybriddp.core import reportlaw as _law
from hybriddp.core.errors import parameter_error
from hybriddp.core.headlist import HeadList
from hybriddp.core.params import check_delta, check_local_budget
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.device import batch as _randomizer
from hybriddp.simulation.baselines import olh as _olh
from hybriddp.simulation.baselines.olh import OLHReports, olh_g, olh_hash
from hybriddp.simulation.baselines.olh import keep_probability as olh_keep_probability


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
    """LocalAlg (ALGORITHM.md §5, Fig. 6; Theorem 3: (ε, δ)-LDP) on a 3-query head list, 2 URLs each.

    The pair of records and the event come from the closed form of the *claimed* parameters
    (:func:`best_event` on :func:`~hybriddp.core.reportlaw.output_distribution`); the samples come
    from :func:`hybriddp.device.batch.randomize_batch` with ``lp`` — by default the parameters the library
    builds for the claim (:meth:`hybriddp.core.reportlaw.LocalAlgParams.build`, as production does), or
    deliberately broken parameters to test the audit.
    """
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise parameter_error("epsilon (--epsilon)", epsilon, "a finite number > 0")
    check_delta(delta)
    hl, names = _audit_head_list()
    check_local_budget(epsilon, f_c, m_c)
    claimed = _law.LocalAlgParams.build(hl, epsilon, delta, f_c, m_c)
    used = lp if lp is not None else claimed
    P = output_distribution(claimed)
    i, j, members, predicted = best_event(P, delta, trials, _z(0.01 / 8))
    event_name = "report in {" + ", ".join(names[m] for m in members) + "}"

    def adapter(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        out_x = _randomizer.randomize_batch(np.full(n, i, dtype=np.int64), hl, used, rng=rng)
        out_xp = _randomizer.randomize_batch(np.full(n, j, dtype=np.int64), hl, used, rng=rng)
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


def local_only_audit(epsilon: float = 1.0, delta: float = 0.0, *, v: int = 1, v_prime: int = 2) -> MechanismAudit:
    """The local-only baseline's discovery report: OLH (ε-LDP) of a PEM user's value v vs v'.

    The adapter is :func:`hybriddp.simulation.baselines.olh.olh_perturb` (hash seeds and GRR) on
    ``trials`` copies of v and of v'. The privacy loss of a report (H, y) is ±ε when exactly one of
    H(v), H(v') equals y and 0 otherwise, so E = {y = H(v) ≠ H(v')} is the optimal event.
    """
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and 0 < epsilon <= 20):
        raise parameter_error("epsilon (--epsilon)", epsilon, "a number in (0, 20]")
    _check_delta_or_zero(delta)
    g = olh_g(epsilon)

    def adapter(rng: np.random.Generator, n: int) -> tuple[OLHReports, OLHReports]:
        return (_olh.olh_perturb(np.full(n, v, dtype=np.int64), epsilon, rng),
                _olh.olh_perturb(np.full(n, v_prime, dtype=np.int64), epsilon, rng))

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

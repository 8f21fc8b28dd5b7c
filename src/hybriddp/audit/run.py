"""The driver: the audited mechanisms and their default claims, :func:`run_audit`, :func:`make_audit`, :func:`audit`."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import numpy as np

from hybriddp.audit.bounds import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    delta_lower_bound,
    epsilon_lower_bound,
)
from hybriddp.audit.client import local_only_audit, localalg_audit
from hybriddp.audit.curator import check_m_o, headlist_audit, optin_estimate_audit
from hybriddp.audit.result import AuditResult, EventTest
from hybriddp.audit.scenario import MechanismAudit
from hybriddp.core.errors import parameter_error
from hybriddp.core.params import LN_MAX, check_seed
from hybriddp.core.rng import make_rng

log = logging.getLogger("hybriddp.audit")  # one logger for the whole audit package

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

MAX_TRIALS = 10**9
"""Largest ``trials``: the slowest mechanism (headlist: four scenarios, each a call of the library's
CreateHeadList per block of trials) runs ~0.1 million trials per second on one core, so 10⁹ trials take about
three hours."""

MAX_EPSILON = LN_MAX
"""Largest claimed ε (≈ 709.78): δ_lb = p_lo − e^ε·p'_hi needs e^ε finite."""


def check_trials(trials: int) -> None:
    """``trials`` is an integer in [1, :data:`MAX_TRIALS`]."""
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or not 1 <= trials <= MAX_TRIALS:
        raise parameter_error("trials (--trials)", trials, f"an integer from 1 to {MAX_TRIALS:,} (about three hours "
                              "for the slowest mechanism on one core)", "The default 1,000,000 takes seconds.")


def _point_estimate(k: int, kp: int, n: int, delta: float) -> float | None:
    """ln((k/n − δ)/(k'/n)): 0 when k/n ≤ δ, None (unbounded) when k' = 0."""
    p, pp = k / n, kp / n
    if p - delta <= 0:
        return 0.0
    if pp == 0:
        return None
    return math.log((p - delta) / pp)


def run_audit(audit: MechanismAudit, trials: int, rng: np.random.Generator, *, confidence: float = 0.99,
              seed: int | None = None, chunk: int = CHUNK,
              progress: Callable[[int, int], object] | None = None) -> AuditResult:
    """Run every scenario ``trials`` times on x and on x', count the events, bound ε and δ.

    Parameters
    ----------
    audit : the mechanism, its claim and scenarios (e.g. from :func:`make_audit`).
    trials : runs of the mechanism on each of x and x' (per scenario).
    rng : randomness of the mechanism runs.
    confidence : joint confidence of all the Clopper–Pearson bounds (Bonferroni).
    seed : recorded in the result only.
    chunk : trials per adapter call (bounded memory).
    progress : ``progress(done, trials)`` after every chunk.
    """
    check_trials(trials)
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
        if progress is not None:
            progress(done, trials)
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
               noise: str = "discrete", f_c: float = 0.85, m_o: int | None = None) -> MechanismAudit:
    """The :class:`MechanismAudit` of a named mechanism (see :data:`MECHANISMS`, :data:`DEFAULTS`).

    ``m_o`` (records per opt-in user, 1, 2 or 3; default 1) applies to ``headlist`` and ``optin-estimate`` only.
    """
    if mechanism not in MECHANISMS:
        raise parameter_error("mechanism (--mechanism)", mechanism, "one of " + ", ".join(MECHANISMS))
    check_m_o_for(mechanism, m_o)
    eps0, delta0 = DEFAULTS[mechanism]
    eps = eps0 if epsilon is None else epsilon
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps)
            and 0 < eps <= MAX_EPSILON):
        raise parameter_error("epsilon (--epsilon)", eps, f"a finite number > 0 and <= {MAX_EPSILON:.2f} (the delta "
                              "bound p_lo - e^epsilon * p'_hi needs e^epsilon finite)")
    dlt = delta0 if delta is None else delta
    if mechanism == "localalg":
        if not (isinstance(f_c, (int, float)) and 0.0 < f_c < 1.0):
            raise parameter_error("f_c (--f-c)", f_c, "strictly between 0 and 1")
        return localalg_audit(eps, dlt, f_c=f_c, trials=trials)
    if mechanism == "headlist":
        return headlist_audit(eps, dlt, noise=noise, trials=trials, m_o=1 if m_o is None else m_o)
    if mechanism == "optin-estimate":
        return optin_estimate_audit(eps, dlt, noise=noise, m_o=1 if m_o is None else m_o)
    return local_only_audit(eps, dlt)


CURATOR_MECHANISMS = ("headlist", "optin-estimate")
"""The mechanisms with an m_O (records per opt-in user)."""


def check_m_o_for(mechanism: str, m_o: int | None) -> None:
    """``m_o`` is None (the default, 1) or one of 1, 2, 3 for a curator mechanism; None for the others."""
    if m_o is None:
        return
    if mechanism not in CURATOR_MECHANISMS:
        raise parameter_error("m_o (--m-o)", m_o, f"left out for {mechanism}: m_O is the number of records per "
                              "opt-in user, which only headlist and optin-estimate have")
    check_m_o(m_o)


def audit(mechanism: str, *, epsilon: float | None = None, delta: float | None = None, trials: int = 10**6,
          seed: int | None = None, confidence: float = 0.99, noise: str = "discrete", f_c: float = 0.85,
          m_o: int | None = None, progress: Callable[[int, int], object] | None = None) -> AuditResult:
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
    m_o : records per opt-in user, 1, 2 or 3 (``headlist``, ``optin-estimate``; default 1).
    progress : ``progress(done, trials)`` while the mechanism runs.
    """
    check_trials(trials)
    check_seed(seed)
    spec = make_audit(mechanism, epsilon=epsilon, delta=delta, trials=int(trials), noise=noise, f_c=f_c, m_o=m_o)
    return run_audit(spec, int(trials), make_rng(seed), confidence=confidence, seed=seed, progress=progress)

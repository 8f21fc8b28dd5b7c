"""Empirical privacy audit: a statistical lower bound on ε from the real mechanism code.

Issue "Privacy assurance". The closed-form checks (ALGORITHM.md §5, §12) prove that the *formulas* are
private; this module checks that the *code* is, the way DP auditing does it (Jagielski, Ullman,
Oprea, "Auditing differentially private machine learning: how private is private SGD?",
NeurIPS 2020; Nasr, Song, Thakurta, Papernot, Carlini, "Adversary instantiation: lower bounds
for differentially private machine learning", IEEE S&P 2021):

1. fix two neighbouring inputs x, x' (ALGORITHM.md §1: one user's record changes value) on which the
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
outputs_x')`` and the events on its outputs). Every adapter calls the library function production calls,
looked up on its module at call time, so the audit measures the code that ships (a patched or changed
function included); a block of trials is one call on disjoint copies of the scenario's records:

* ``localalg`` — LocalAlg (ALGORITHM.md §5, paper Fig. 6) through :func:`hybriddp.device.batch.randomize_batch`
  on a small head list (3 queries of 2 URLs); x, x' and E are the pair of records and the
  Neyman–Pearson output set with the best predicted bound, found from
  :func:`~hybriddp.core.reportlaw.output_distribution` (E = {report = x} against a record of
  another query: likelihood ratio e^{ε'_Q}·k_q·e^{ε'_U}/(e^{ε'_U} + k_q − 1) ≈ e^{0.95ε}).
* ``headlist`` — CreateHeadList with its released noisy counts (ALGORITHM.md §3, §3.3, Fig. 3) through
  :func:`hybriddp.curator.mechanisms.create_head_list_with_counts`, m_O ∈ {1, 2, 3} (one user's m_O records move
  together, so counts move by m_O). Four pairs (:func:`~hybriddp.audit.curator.headlist_audit`): the
  ε-tight keep decisions of two records in the geometric tails; the δ-dominated presence of a record
  (P[E|x] ≤ δ/2, P[E|x'] = 0: it bounds δ only); the released counts of the swap; and the released
  counts near the threshold, where a count that is not the draw that kept the record (a fresh draw)
  reaches e^{1.5ε}. The default δ is 1e-2 rather than the paper's 1e-5: at 1e-5 the presence event
  has probability ≤ 5e-6 (7.3e-7 with the discrete threshold, which rounds τ up to an integer) and
  10^6 trials see ~5 events (or ~1), too few to measure; at 1e-2 it is 5e-3 (2.2e-3 discrete), and the
  δ bound δ_lb = p_lo − e^ε·p'_hi is positive at 10^6 trials. Sampling cannot test δ = 1e-5 with a
  feasible number of trials: the exact audit below is the δ test there.
* ``optin-estimate`` — the noisy counts of EstimateOptinProbabilities (ALGORITHM.md §4, Fig. 4,
  Theorem 2: (ε, 0)-DP) through :func:`hybriddp.curator.mechanisms.estimate_optin_probabilities`, m_O ∈ {1, 2, 3};
  x: N(r1) = m_O, N(r2) = 0, x': the other way round; E = {N̂(r1) ≥ m_O, N̂(r2) ≤ 0}
  (N̂ = p̂_O·|D_T|), likelihood ratio e^{2m_O/b} = e^ε.
* ``local-only`` — the OLH report of a PEM discovery user (:func:`hybriddp.simulation.baselines.olh.olh_perturb`,
  ε-LDP); values v ≠ v'; E = {y = H(v) ≠ H(v')}, likelihood ratio exactly e^ε.

The exact audit (:mod:`hybriddp.audit.exact`, ALGORITHM.md §3.5; ``hybriddp audit --exact``) computes
the worst-case δ(e^ε) itself from the exact output law of ``headlist`` (with its released counts,
m_O ∈ {1, 2, 3}), ``optin-estimate`` and ``localalg``, and checks that the library releases what that
law says.

The Clopper–Pearson bounds are computed here (regularized incomplete beta by Lentz's continued
fraction, inverted by safeguarded Newton), so SciPy stays a test-only dependency.
"""

from __future__ import annotations

# ``X as X``: the audit's public names, reachable as ``hybriddp.audit.X``; the private helpers live in the
# submodules (module-level state — the defaults, the logger — in ``run``).
from hybriddp.audit.bounds import beta_ppf as beta_ppf
from hybriddp.audit.bounds import betainc as betainc
from hybriddp.audit.bounds import clopper_pearson_lower as clopper_pearson_lower
from hybriddp.audit.bounds import clopper_pearson_upper as clopper_pearson_upper
from hybriddp.audit.bounds import delta_lower_bound as delta_lower_bound
from hybriddp.audit.bounds import epsilon_lower_bound as epsilon_lower_bound
from hybriddp.audit.client import local_only_audit as local_only_audit
from hybriddp.audit.client import localalg_audit as localalg_audit
from hybriddp.audit.curator import head_list_release as head_list_release
from hybriddp.audit.curator import headlist_audit as headlist_audit
from hybriddp.audit.curator import optin_estimate_audit as optin_estimate_audit
from hybriddp.audit.curator import optin_release as optin_release
from hybriddp.audit.exact import EXACT_DEFAULTS as EXACT_DEFAULTS
from hybriddp.audit.exact import EXACT_MECHANISMS as EXACT_MECHANISMS
from hybriddp.audit.exact import ExactResult as ExactResult
from hybriddp.audit.exact import exact_audit as exact_audit
from hybriddp.audit.result import AuditResult as AuditResult
from hybriddp.audit.result import EventTest as EventTest
from hybriddp.audit.run import CHUNK as CHUNK
from hybriddp.audit.run import DEFAULTS as DEFAULTS
from hybriddp.audit.run import MECHANISMS as MECHANISMS
from hybriddp.audit.run import audit as audit
from hybriddp.audit.run import make_audit as make_audit
from hybriddp.audit.run import run_audit as run_audit
from hybriddp.audit.scenario import Adapter as Adapter
from hybriddp.audit.scenario import Event as Event
from hybriddp.audit.scenario import MechanismAudit as MechanismAudit
from hybriddp.audit.scenario import Scenario as Scenario
from hybriddp.audit.scenario import best_event as best_event
from hybriddp.audit.scenario import predicted_lower_bound as predicted_lower_bound

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
outputs_x')`` running the real code vectorized over trials, and the events on its outputs):

* ``localalg`` — LocalAlg (ALGORITHM.md §5, paper Fig. 6) through :func:`~hybriddp.randomizer.randomize_batch`
  on a small head list (3 queries of 2 URLs); x, x' and E are the pair of records and the
  Neyman–Pearson output set with the best predicted bound, found from
  :func:`~hybriddp.randomizer.output_distribution` (E = {report = x} against a record of
  another query: likelihood ratio e^{ε'_Q}·k_q·e^{ε'_U}/(e^{ε'_U} + k_q − 1) ≈ e^{0.95ε}).
* ``headlist`` — CreateHeadList (ALGORITHM.md §3, Fig. 3). Three pairs. (a) The ε-tight one: r1 seen
  c1 times and r2 c2 times in x, one user moved from r1 to r2 in x'; E = {r1 kept, r2 not kept},
  with (c1, c2) around τ (searched on the closed form) so that both keep decisions sit in the
  geometric tails of the noise: likelihood ratio e^{2/b} = e^ε. (b) The δ-dominated one: r once
  in x, absent from x'; E = {r ∈ HL} has P[E|x] ≤ δ/2 and P[E|x'] = 0, so it can only bound δ
  (p_lo − δ < 0: ε_lb is 0 for any δ). (c) The released noisy counts (ALGORITHM.md §3.3): the swap
  pair of (a) whose output is the count N(r) + Y of each kept record, and E = {r1 released with count
  ≥ s, r2 not released or released with count ≤ s2}, searched on the closed form.
  The default δ is 1e-2 rather than the paper's 1e-5: at 1e-5 the survival probability is ≤ 5e-6
  (7.3e-7 with the discrete threshold, which rounds τ up to an integer) and 10^6 trials see ~5
  events (or ~1), too few to measure; at 1e-2 it is 5e-3 (2.2e-3 discrete), and the δ bound
  δ_lb = p_lo − e^ε·p'_hi is positive at 10^6 trials. The price is on the ε-tight pair: δ is
  subtracted from P[E|x] (ε_E = 3.99 with discrete noise, 3.72 with Laplace, where the best
  P[E|x] is only ≈ 0.2).
* ``optin-estimate`` — the noisy counts of EstimateOptinProbabilities (ALGORITHM.md §4, Fig. 4,
  Theorem 2: (ε, 0)-DP); x: N(r1) = 1, N(r2) = 0, x': the other way round;
  E = {N̂(r1) ≥ 1, N̂(r2) ≤ 0} (N̂ = p̂_O·|D_T|), likelihood ratio e^{2/b} = e^ε.
* ``local-only`` — the OLH report of a PEM discovery user (:mod:`hybriddp.baselines.olh`,
  ε-LDP); values v ≠ v'; E = {y = H(v) ≠ H(v')}, likelihood ratio exactly e^ε.

The Clopper–Pearson bounds are computed here (regularized incomplete beta by Lentz's continued
fraction, inverted by safeguarded Newton), so SciPy stays a test-only dependency.
"""

from __future__ import annotations

# ``X as X``: the public names of the former single module, still reachable as ``hybriddp.audit.X``.
# The private helpers live in the submodules (module-level state — the defaults, the logger — in ``run``).
from hybriddp.audit.bounds import beta_ppf as beta_ppf
from hybriddp.audit.bounds import betainc as betainc
from hybriddp.audit.bounds import clopper_pearson_lower as clopper_pearson_lower
from hybriddp.audit.bounds import clopper_pearson_upper as clopper_pearson_upper
from hybriddp.audit.bounds import delta_lower_bound as delta_lower_bound
from hybriddp.audit.bounds import epsilon_lower_bound as epsilon_lower_bound
from hybriddp.audit.client import local_only_audit as local_only_audit
from hybriddp.audit.client import localalg_audit as localalg_audit
from hybriddp.audit.curator import headlist_audit as headlist_audit
from hybriddp.audit.curator import optin_estimate_audit as optin_estimate_audit
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

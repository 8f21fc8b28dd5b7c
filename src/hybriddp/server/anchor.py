"""The opt-in group as the anchor against poisoning (ALGORITHM.md §7.2).

Anyone can send device messages, so the clients' estimates may carry fake reports; the opt-in estimates cannot
(the curator sees real users' data). After the blend (§7) every head-list entry and every query is checked
against its opt-in estimate, and the client side's influence is bounded whatever the reports say:

* **Test.** z_i = (p̂_C,i − p̂_O,i)/σ_D,i with σ²_D = σ²_O + σ²_C, both variances evaluated at the *anchor*
  a_i = p̂_O,i clamped into [0, 1], which no device can move. Two-sided p-values, Holm's step-down procedure
  over all entries and queries at family-wise level α: an honest round raises any flag with probability ≤ α.
  A flag is the operator's alarm and starts the cleaning below; it does not change what the bound publishes.
* **Bound, chosen per round.** Every entry's published estimate is the blend clamped into p̂_O,i ± κ_i·s_i,
  s_i = σ²_O,i/σ_D,i the standard deviation of (blend − opt-in estimate) in an honest round (s_i ≤ σ_O,i). κ_i
  is the smallest whose clamp costs an honest estimate at most a share c of its variance, s_i²·g(κ_i) ≤ c·σ²_B,i
  (:mod:`hybriddp.server.clamp`), or a fixed κ. No fraction of fake reports
  moves an entry further from its opt-in estimate than κ_i·s_i (ALGORITHM.md §7.2 derives it as a function of the
  fake fraction, the opt-in group's size and ε).
* **Honest error bars.** The published variance is the mean squared error of the published estimate on honest
  data, the blend's variance with the clamp's cost (:func:`~hybriddp.server.clamp.clamped_variance`).
* **The suggestions' ranking.** Queries are also ranked by a guarded score, the published estimate capped at
  p̂_O + κ_q·s (at p̂_O for a flagged query): fake devices can lift a query's rank by at most that, whatever κ_i
  lets its estimate move (:meth:`Side.rank`, ``p_rank``). κ_q is chosen per round (``auto``, the default): the fixed
  0.1 where the opt-in estimates rank the queries well enough that it costs an honest ranking at most
  :data:`FIXED_GUARD_TOLERANCE` of NDCG@10, otherwise the smallest whose cap costs at most ``rank_cost``
  (:mod:`hybriddp.server.rankguard`); or a fixed number.
* **Evidence.** The reports on flagged entries beyond what the population the opt-in estimates describe would
  send, n·r̂_i − n·r_i(a), summed: a lower estimate of the number of fake reports. Per entry, the fake reports
  that would explain its gap, F̂_i = n(r̂_i − r_i(a))/(1 − r_i(a)) (:attr:`Side.fakes`), and the z, p-value and
  Holm level that flagged it, so an operator can tell an attack from noise.

Everything here is a function of two DP releases (the opt-in estimates and the clients' report counts) and of
public sizes: post-processing, no privacy cost (ALGORITHM.md §7.2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.server.clamp import clamped_variance, round_kappa
from hybriddp.server.client_estimates import _Geometry, client_variances
from hybriddp.server.rankguard import rank_cost, rank_kappa
from hybriddp.server.tails import normal_laplace_p
from hybriddp.server.weights import Blended

if TYPE_CHECKING:
    from hybriddp.core.reportlaw import LocalAlgParams
    from hybriddp.curator.estimates import OptinEstimates
    from hybriddp.server.blend import BlendOutput
    from hybriddp.server.client_estimates import ClientEstimates

DEFAULT_ALPHA = 0.005
"""Family-wise false-alarm rate of the anchor test per round (Holm): an honest round is flagged at most this often."""

DEFAULT_KAPPA: float | None = None
"""The estimates' bound, in honest standard deviations s_i of (blend − opt-in estimate): None chooses it per entry
and round from :data:`DEFAULT_HONEST_COST` (:func:`round_kappa`; ALGORITHM.md §7.2), a number fixes it."""

DEFAULT_HONEST_COST = 0.05
"""c: the largest share of an honest estimate's variance the bound may add (σ²_B → at most (1 + c)·σ²_B, its RMSE at
most 2.5% larger): the per-round bound is as tight as that allows (ALGORITHM.md §7.2, "Honest cost")."""

FIXED_KAPPA_QUERY = 0.1
"""The fixed ranking guard an operator may choose (``--anchor-kappa-query 0.1``), and the guard of a round stored
before the per-round choice was the default: the tightest at a large opt-in group (aol preset, 26,000 opt-in users:
an attacker that saturates it puts a target of rank ≥ 20 in the top 10 in 3 of 78 rounds), but where the opt-in
estimates are noisy against the gaps between ranks it costs the honest ranking more than it protects (docs/RESULTS.md
"Issue 40: the ranking guard where deployments are")."""

FIXED_GUARD_TOLERANCE = 0.005
"""``auto`` keeps :data:`FIXED_KAPPA_QUERY` in a round where the opt-in group ranks the queries well enough that the
fixed guard's expected honest NDCG@10 cost, computed on the opt-in estimates (fakes cannot move them; the reports'
number moves it by a percent or so: :meth:`Side.fixed_guard_cost`), is at most this: issue 28's tolerance for the
defense's honest cost. Measured: kept in 29 of 30 rounds of the aol preset (26,000 opt-in users: 0.0019–0.0054),
given up at 5,000–10,000 opt-in users on the same log (0.009–0.029) and mostly at 1,000 (0.0036–0.0083), where the
opt-in estimates alone already misrank the top 10 (docs/RESULTS.md "Issue 40: the ranking guard where deployments
are")."""

DEFAULT_KAPPA_QUERY: float | None = None
"""The suggestions' ranking guard κ_q (a query ranks by its estimate capped at p̂_O + κ_q·s): None (``auto``, the
default) chooses it per round: the fixed guard where it is nearly free (:data:`FIXED_GUARD_TOLERANCE`), elsewhere the
tightest whose expected honest NDCG@10 cost is at most :data:`DEFAULT_RANK_COST`
(:func:`~hybriddp.server.rankguard.rank_kappa`); a number fixes it (:data:`FIXED_KAPPA_QUERY`)."""

DEFAULT_RANK_COST = 0.0025
"""With κ_q ``auto``: the largest expected NDCG@10 the defense may cost an honest round's ranking, by the joint model
of :mod:`hybriddp.server.rankguard` (1,000 opt-in users measure −0.0027 against the truth; docs/RESULTS.md)."""

MEAN_DEFAULT_KAPPA = 3.0
"""The bound of a mean round (§7.2, §11): one estimate, whose clients' side usually carries most of the weight, so
a tight bound would give up the blend's gain; at 3 an honest round is bounded with probability 0.27%."""

DEFENSES = ("anchor", "none")
"""``--defense`` choices: the anchor test and bound (default), or the undefended blend (§7 alone)."""


@dataclass(frozen=True)
class AnchorPolicy:
    """The defense's knobs: ``alpha`` (family-wise false-alarm rate of the test) and ``kappa`` (the bound in honest
    standard deviations)."""

    alpha: float = DEFAULT_ALPHA
    kappa: float | None = DEFAULT_KAPPA
    kappa_query: float | None = DEFAULT_KAPPA_QUERY
    honest_cost: float = DEFAULT_HONEST_COST
    rank_cost: float = DEFAULT_RANK_COST

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, (int, float)) and 0.0 < self.alpha < 1.0):
            raise parameter_error("anchor alpha (--anchor-alpha)", self.alpha, "strictly between 0 and 1",
                                  f"The default {DEFAULT_ALPHA} flags an honest round at most 0.5% of the time.")
        for name, value, hint in (("--anchor-kappa", self.kappa, "the default, auto, chooses it per round; 0 "
                                   "publishes the opt-in estimates alone"),
                                  ("--anchor-kappa-query", self.kappa_query, "the default, auto, chooses it per "
                                   "round; 0 ranks the suggestions by the opt-in estimates alone")):
            if value is None:
                continue
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)
                                               and value >= 0.0):
                raise parameter_error(f"anchor bound ({name})", value, "a finite number >= 0", f"{hint[0].upper()}"
                                      f"{hint[1:]}.")
        if isinstance(self.honest_cost, bool) or not (isinstance(self.honest_cost, (int, float))
                                                      and 0.0 < self.honest_cost < 1.0):
            raise parameter_error("anchor honest cost (--anchor-honest-cost)", self.honest_cost,
                                  "strictly between 0 and 1", f"The default {DEFAULT_HONEST_COST} lets the bound add "
                                  "at most 5% to an honest estimate's variance.")
        if isinstance(self.rank_cost, bool) or not (isinstance(self.rank_cost, (int, float))
                                                    and 0.0 < self.rank_cost < 1.0):
            raise parameter_error("anchor ranking cost (--anchor-rank-cost)", self.rank_cost,
                                  "strictly between 0 and 1", f"The default {DEFAULT_RANK_COST} lets the ranking "
                                  "guard cost an honest round's NDCG@10 at most that per query.")

    def to_dict(self) -> dict[str, Any]:
        return {"defense": "anchor", "alpha": self.alpha, "kappa": "auto" if self.kappa is None else self.kappa,
                "kappa_query": "auto" if self.kappa_query is None else self.kappa_query,
                "honest_cost": self.honest_cost, "rank_cost": self.rank_cost}


def policy_named(defense: str, alpha: float = DEFAULT_ALPHA, kappa: float | None = DEFAULT_KAPPA,
                 kappa_query: float | None = DEFAULT_KAPPA_QUERY, honest_cost: float = DEFAULT_HONEST_COST,
                 rank_cost: float = DEFAULT_RANK_COST) -> AnchorPolicy | None:
    """The policy ``--defense`` names: an :class:`AnchorPolicy` for ``anchor``, None for ``none``."""
    if defense not in DEFENSES:
        raise parameter_error("defense (--defense)", defense, " or ".join(repr(d) for d in DEFENSES))
    return AnchorPolicy(alpha, kappa, kappa_query, honest_cost, rank_cost) if defense == "anchor" else None


@dataclass
class Side:
    """The check of one level (records or queries): per entry z, flag, bound and what was published."""

    z: np.ndarray  # a flagged entry's z is the one that flagged it (reports as received, or the pass it was flagged)
    flagged: np.ndarray
    bound: np.ndarray  # κ_i·s_i: the largest distance allowed from the opt-in estimate
    clamped: np.ndarray  # entries the bound moved
    undefended: np.ndarray  # the blend of §7 before the defense
    defended: Blended
    p_value: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the test's p-value (of z above)
    level: np.ndarray = field(default_factory=lambda: np.zeros(0))  # Holm's level a flagged p-value met (NaN: not)
    reports: np.ndarray = field(default_factory=lambda: np.zeros(0))  # reports received on the entry (query)
    fakes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # F̂ = n(r̂ − r(a))/(1 − r(a)), ALGORITHM.md §7.2
    kappa: np.ndarray = field(default_factory=lambda: np.zeros(0))  # κ_i (per round, or the fixed κ)
    anchor: np.ndarray = field(default_factory=lambda: np.zeros(0))  # p̂_O,i, the centre of the bound
    s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # s_i, the bound's unit
    share: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the noise share f of (blend − p̂_O)
    kappa_rank: np.ndarray = field(default_factory=lambda: np.zeros(0))  # κ_q per query (:meth:`guard`)
    honest_sd: Callable[[np.ndarray], np.ndarray] | None = None  # σ of (blend − p̂_O) at given estimates, honest data
    anchor_spread: np.ndarray | None = None  # ρ at the opt-in estimates (records' too): σ there over s, no report moves

    @property
    def suggested(self) -> np.ndarray:
        """The queries the suggestions rank: every listed one but the last, ``*``."""
        return np.arange(self.s.size) < self.s.size - 1

    def guard(self, published: np.ndarray, policy: AnchorPolicy) -> Side:
        """The queries' side with the ranking guard's κ_q per query for ``published`` (the final estimates): the
        policy's fixed κ_q, or (``auto``) :data:`FIXED_KAPPA_QUERY` where its expected honest NDCG@10 cost, computed
        on the opt-in estimates' positions (which no report moves), is at most :data:`FIXED_GUARD_TOLERANCE`, and
        elsewhere the round's smallest κ whose expected cost on the published ranking is at most ``rank_cost``
        (:func:`~hybriddp.server.rankguard.rank_kappa`); the listed queries only (the last, ``*``, is not
        suggested), at most κ_i (the estimate is bounded there already); 0 for a flagged query."""
        if policy.kappa_query is None and self.fixed_guard_cost() <= FIXED_GUARD_TOLERANCE:
            kq = np.minimum(FIXED_KAPPA_QUERY, np.nan_to_num(self.kappa))
        elif policy.kappa_query is None:
            spread = None
            if self.honest_sd is not None:
                with np.errstate(invalid="ignore", divide="ignore"):
                    spread = self.honest_sd(np.clip(np.nan_to_num(published), 0.0, 1.0)) / self.s
            kq = rank_kappa(published, self.s, self.share, self.suggested, policy.rank_cost, self.kappa, spread)
        else:
            kq = np.full(self.s.shape, float(policy.kappa_query))
        return replace(self, kappa_rank=np.where(self.flagged, 0.0, kq))

    def fixed_guard_cost(self) -> float:
        """The fixed guard's expected honest NDCG@10 cost (:func:`~hybriddp.server.rankguard.rank_cost` at
        :data:`FIXED_KAPPA_QUERY`) with the opt-in estimates standing for the published ones and their spread at the
        opt-in estimates: a function of the opt-in release and the number of reports (after cleaning) only, so where
        the reports fall does not move it, and their number only slightly (10% more reports: at most +1.5% in
        tests/test_rankguard.py); ``auto`` keeps the fixed guard where it is at most :data:`FIXED_GUARD_TOLERANCE`."""
        a = np.clip(np.nan_to_num(self.anchor), 0.0, 1.0)
        bound = np.nan_to_num(self.kappa, nan=np.inf)
        return rank_cost(np.minimum(FIXED_KAPPA_QUERY, bound), a, self.s, self.share, self.suggested,
                         self.anchor_spread, bound)

    def rank(self, published: np.ndarray) -> np.ndarray:
        """The guarded ranking score of ``published`` (this level's final estimates): at most p̂_O + κ_q·s with the
        κ_q of :meth:`guard` (a flagged entry: at most p̂_O, the test found reports beyond chance), then clipped into
        [0, 1]; NaN stays NaN (ALGORITHM.md §7.2, "The suggestions' ranking"). One-sided: fakes can only add reports,
        so what lifts a query is its own; a competitor falls only by dilution, which the estimates' bound and the
        cleaning answer."""
        with np.errstate(invalid="ignore"):  # s infinite (no opt-in data) and κ 0: no cap, NaN, not known below
            hi = self.anchor + self.kappa_rank * self.s
        known = np.isfinite(hi)
        return np.clip(np.where(known, np.minimum(published, np.where(known, hi, 0.0)), published), 0.0, 1.0)


@dataclass
class AnchorCheck:
    """The anchor check of one round (ALGORITHM.md §7.2): both levels, the evidence and the policy."""

    policy: AnchorPolicy
    records: Side
    queries: Side
    excess_reports: float
    reports: int
    critical_z: float = field(default=math.inf)

    @property
    def fake_fraction_lower(self) -> float:
        """Excess reports on flagged entries over all reports: a lower estimate of the share of fake reports."""
        return self.excess_reports / self.reports if self.reports else 0.0

    @property
    def flagged_any(self) -> bool:
        return bool(self.records.flagged.any() or self.queries.flagged.any())

    def summary(self) -> dict[str, Any]:
        """The check as the results document shows it (FORMATS.md, ``anchor_check``)."""
        r, q = self.records, self.queries

        def moved(side: Side) -> float:
            d = np.abs(side.defended.p - side.undefended)
            return float(d[np.isfinite(d)].max(initial=0.0))
        return {
            **self.policy.to_dict(),
            "critical_z": self.critical_z,
            "flagged_records": int(r.flagged.sum()), "flagged_queries": int(q.flagged.sum()),
            "clamped_records": int(r.clamped.sum()), "clamped_queries": int(q.clamped.sum()),
            "max_abs_z": float(max(_max_abs(r.z), _max_abs(q.z))),
            "excess_reports": self.excess_reports, "fake_fraction_lower": self.fake_fraction_lower,
            "largest_change_record": moved(r), "largest_change_query": moved(q),
            **({"kappa_query_round": float(q.kappa_rank.max(initial=0.0))} if self.policy.kappa_query is None
               and q.kappa_rank.size else {}),
            "verdict": ("flagged: client reports disagree with the opt-in group beyond chance; every estimate "
                        "stays within its bound of the opt-in group's" if self.flagged_any else
                        "no entry's client estimate disagrees with the opt-in group beyond chance"),
        }


def _max_abs(z: np.ndarray) -> float:
    a = np.abs(z[np.isfinite(z)])
    return float(a.max(initial=0.0))


def holm_levels(p_values: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's level of each p-value: α/(m − j + 1) for the j-th smallest (j from 1; NaN sorts last), the level it
    is compared with (:func:`holm`)."""
    p = np.where(np.isnan(p_values), 1.0, p_values)
    m = p.size
    out = np.empty(m)
    out[np.argsort(p, kind="stable")] = alpha / (m - np.arange(m))
    return out


def holm(p_values: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's step-down rejections at family-wise level ``alpha``: sort ascending, reject p_(j) while
    p_(j) ≤ α/(m − j + 1) (j from 1), stop at the first that is not. NaN p-values are never rejected."""
    p = np.where(np.isnan(p_values), 1.0, p_values)
    m = p.size
    order = np.argsort(p, kind="stable")
    ok = p[order] <= alpha / (m - np.arange(m))
    stop = int(np.argmin(ok)) if not ok.all() else m
    out = np.zeros(m, dtype=bool)
    out[order[:stop]] = True
    return out


MAX_CLEANING_PASSES = 4
"""At most this many passes of test → remove excess reports → re-estimate (:func:`anchor_blend`)."""


def anchor_blend(optin: OptinEstimates, lp: LocalAlgParams, counts: np.ndarray, policy: AnchorPolicy,
                 estimate: Callable[[np.ndarray], tuple[ClientEstimates, BlendOutput]],
                 project: bool) -> tuple[ClientEstimates, BlendOutput, AnchorCheck]:
    """The defended blend, the clients' estimates from the reports as received, and the check (ALGORITHM.md §7.2).

    ``estimate`` maps report counts to (client estimates, undefended blend of §7). Pass 1 tests the reports as
    received. While entries are flagged, their *excess reports* (beyond what the opt-in estimates imply) are
    taken out of the counts — fakes dilute every honest entry, and this undoes it — and the clients' estimates,
    the blend and the test are made again from the cleaned counts; an entry flagged once stays flagged.
    """
    from hybriddp.server.blend import BlendOutput, project_to_simplex

    hl = optin.head_list
    a_r = np.clip(np.nan_to_num(optin.p_record), 0.0, 1.0)
    a_q = np.clip(np.nan_to_num(optin.p_query), 0.0, 1.0)
    vo_r, vo_q = optin.variances_at(a_r, a_q)
    received = np.asarray(counts, dtype=np.float64)
    n_r = hl.n_entries
    flags = np.zeros(n_r + hl.k, dtype=bool)
    z_at, p_at, level_at = np.full(n_r + hl.k, np.nan), np.full(n_r + hl.k, np.nan), np.full(n_r + hl.k, np.nan)
    cleaned = received
    first: BlendOutput | None = None
    received_client: ClientEstimates | None = None
    for _ in range(MAX_CLEANING_PASSES):
        client, blended = estimate(np.rint(cleaned).astype(np.int64))
        if received_client is None:  # the clients' estimates of the reports as received
            received_client = client
        if first is None:  # the test's variances: one opt-in standard deviation above the anchor (an opt-in
            first = blended  # estimate that came out low, even negative, must not shrink them), which no report
            x_r = np.clip(a_r + np.sqrt(vo_r), 0.0, 1.0)  # moves
            x_q = np.clip(a_q + np.sqrt(vo_q), 0.0, 1.0)
            to_r, to_q = optin.variances_at(x_r, x_q)
            noise = np.concatenate(optin.variances_at(np.zeros_like(a_r), np.zeros_like(a_q)))  # at p = 0: noise only
        tc_r, tc_q = client_variances(x_r, x_q, hl, lp, client.n)
        raw = (_zs(optin.p_record, client.p_record, to_r, tc_r), _zs(optin.p_query, client.p_query, to_q, tc_q))
        with np.errstate(invalid="ignore", divide="ignore"):
            share = noise / np.concatenate([to_r + tc_r, to_q + tc_q])
        p_values = normal_laplace_p(np.concatenate(raw), np.nan_to_num(share))
        new = flags | holm(p_values, policy.alpha)
        fresh = new & ~flags  # flagged in this pass: keep the z, p-value and level that flagged them
        z_at[fresh], p_at[fresh] = np.concatenate(raw)[fresh], p_values[fresh]
        level_at[fresh] = holm_levels(p_values, policy.alpha)[fresh]
        done = bool((new == flags).all())
        flags = new
        if done or not flags.any():
            break
        cleaned = received - _excess(hl, lp, a_r, a_q, received, flags[:n_r], flags[n_r:])
    m = flags.size
    critical = NormalDist().inv_cdf(1.0 - policy.alpha / (2.0 * m)) if m else math.inf
    assert first is not None
    # The bound's variances: the test's, at x (one opt-in standard deviation above the anchor, which no report
    # moves), so that an opt-in estimate that came out low does not shrink the bound to nothing.
    z = np.where(flags, z_at, np.concatenate(raw))
    p_final = np.where(flags, p_at, p_values)
    f = np.nan_to_num(share)
    rec = _side(optin.p_record, _flagged_as_received(blended.records, first.records, flags[:n_r]), z[:n_r],
                flags[:n_r], to_r, tc_r, f[:n_r], policy, critical, first.records.p)
    qry = _side(optin.p_query, _flagged_as_received(blended.queries, first.queries, flags[n_r:]), z[n_r:],
                flags[n_r:], to_q, tc_q, f[n_r:], policy, critical, first.queries.p)
    c_q = np.bincount(hl.entry_query, weights=received, minlength=hl.k)
    f_r, f_q = fake_reports(hl, lp, a_r, a_q, received, c_q)
    rec = replace(rec, p_value=p_final[:n_r], level=level_at[:n_r], reports=received, fakes=f_r)
    qry = replace(qry, p_value=p_final[n_r:], level=level_at[n_r:], reports=c_q, fakes=f_q)
    excess = float((received - cleaned).sum())
    projected = project_to_simplex(rec.defended.p) if project else None
    q_final = np.clip(qry.defended.p, 0.0, 1.0)
    p_rec = np.clip(np.nan_to_num(rec.defended.p), 0.0, 1.0)

    def honest_sd(p_query: np.ndarray, p_records: np.ndarray = p_rec) -> np.ndarray:
        """σ of (blend − p̂_O) per query on honest data at ``p_query`` (and ``p_records``): σ²_O/√(σ²_O + σ²_C)."""
        v_o = optin.query_variances_at(p_query, p_records)
        v_c = client_variances(p_records, p_query, hl, lp, client.n)[1]
        with np.errstate(invalid="ignore", divide="ignore"):
            return v_o / np.sqrt(v_o + v_c)
    with np.errstate(invalid="ignore", divide="ignore"):
        at_anchor = honest_sd(a_q, a_r) / qry.s
    qry = replace(qry, honest_sd=honest_sd, anchor_spread=at_anchor).guard(q_final, policy)
    out = BlendOutput(rec.defended, qry.defended, projected, q_final, qry.rank(q_final))
    assert received_client is not None
    return received_client, out, AnchorCheck(policy, rec, qry, excess, int(received.sum()), critical)


def _zs(p_o: np.ndarray, p_c: np.ndarray, var_o: np.ndarray, var_c: np.ndarray) -> np.ndarray:
    """(p̂_C − p̂_O)/σ_D; NaN where either group has no data (infinite variance) or σ_D is 0."""
    sd = np.sqrt(var_o + var_c)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (np.asarray(p_c, dtype=np.float64) - p_o) / sd
    return np.where(np.isfinite(sd) & (sd > 0), z, np.nan)


def _flagged_as_received(cleaned: Blended, received: Blended, flagged: np.ndarray) -> Blended:
    """The blend the bound clamps: of the cleaned reports (fakes on flagged entries no longer dilute the others),
    but a flagged entry's own of the reports as received. Cleaning sets a flagged entry's count to what its opt-in
    estimate implies, so its cleaned blend would be the opt-in estimate: under a false alarm that would publish
    the opt-in group's (far noisier) estimate, under an attack it gains nothing the bound does not give."""
    return Blended(np.where(flagged, received.p, cleaned.p), np.where(flagged, received.var, cleaned.var),
                   np.where(flagged, received.weight_optin, cleaned.weight_optin))


def _side(p_o: np.ndarray, blend: Blended, z: np.ndarray, flagged: np.ndarray, vo: np.ndarray, vc: np.ndarray,
          share: np.ndarray, policy: AnchorPolicy, cap: float, undefended: np.ndarray) -> Side:
    """One level's defense: every entry (flagged or not) publishes its blend clamped into p̂_O ± κ_i·s_i, κ_i per
    entry (:func:`~hybriddp.server.clamp.round_kappa` with the noise share ``share``, at most ``cap``, the test's
    critical z) or the policy's fixed κ, with variance σ²_B + s_i²·G(κ_i)
    (:func:`~hybriddp.server.clamp.clamp_cost`), the estimate's mean squared error on honest data (ALGORITHM.md
    §7.2)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(np.isfinite(vo) & np.isfinite(vc), vo / np.sqrt(vo + vc), np.inf)
    s = np.where(np.isnan(s), 0.0, s)
    kappa = (round_kappa(s, blend.var, policy.honest_cost, cap, share) if policy.kappa is None
             else np.full(s.shape, float(policy.kappa)))
    with np.errstate(invalid="ignore"):
        bound = np.where(np.isfinite(s), kappa * s, np.inf)
        var = np.where(np.isfinite(s), clamped_variance(blend.var, np.where(np.isfinite(s), s, 0.0), kappa, share),
                       blend.var)
    lo, hi = p_o - bound, p_o + bound
    clamped = np.isfinite(bound) & ((blend.p < lo) | (blend.p > hi))
    p = np.where(clamped, np.clip(blend.p, lo, hi), blend.p)
    return Side(z, flagged, bound, clamped, np.asarray(undefended, dtype=np.float64).copy(),
                Blended(p, var, blend.weight_optin), kappa=kappa,
                anchor=np.asarray(p_o, dtype=np.float64).copy(), s=s, share=np.asarray(share, dtype=np.float64))


def fake_reports(hl: Any, lp: LocalAlgParams, a_r: np.ndarray, a_q: np.ndarray, counts: np.ndarray,
                 counts_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entry and per query, the fake reports that would explain its count alone (ALGORITHM.md §7.2): with the
    honest reports at the frequencies r(a) the opt-in estimates imply and F fakes all reporting it,
    count = (n − F)·r(a) + F, so F̂ = (count − n·r(a))/(1 − r(a)) = n(r̂ − r(a))/(1 − r(a)). Negative: fewer
    reports than the opt-in group implies (fakes elsewhere dilute every entry)."""
    if lp.k == 1:  # one query, ⟨*,*⟩: every report lands on it and no count can tell fakes apart
        return np.zeros_like(counts, dtype=np.float64), np.zeros_like(counts_q, dtype=np.float64)
    r_rec, r_q = _Geometry(hl, lp).frequencies(a_r, a_q)
    n = float(np.sum(counts))
    with np.errstate(invalid="ignore", divide="ignore"):
        return ((counts - n * r_rec) / np.maximum(1.0 - r_rec, 1e-12),
                (counts_q - n * r_q) / np.maximum(1.0 - r_q, 1e-12))


def _excess(hl: Any, lp: LocalAlgParams, a_r: np.ndarray, a_q: np.ndarray, counts: np.ndarray,
            flagged_rec: np.ndarray, flagged_q: np.ndarray) -> np.ndarray:
    """Reports per entry beyond what a population matching the opt-in estimates would send (r(a): LocalAlg's
    report frequencies at the anchor, ALGORITHM.md §6), on flagged entries and on the entries of flagged queries.

    Each report received is counted against n = the reports that are not excess, found by fixed point (the
    fakes are not part of the population whose frequencies r(a) describe). A flagged record gives up its own
    excess; a flagged query gives up its excess over n·r_q(a), taken from its entries in proportion to their
    own excess (or their counts, when none has any).
    """
    r_rec, r_q = _Geometry(hl, lp).frequencies(a_r, a_q)
    eq, k = hl.entry_query, hl.k
    total = counts.sum()
    out = np.zeros_like(counts)
    for _ in range(20):
        n = total - out.sum()
        own = np.maximum(counts - n * r_rec, 0.0)
        q_excess = np.maximum(np.bincount(eq, weights=counts, minlength=k) - n * r_q, 0.0)
        basis = np.where(np.bincount(eq, weights=own, minlength=k)[eq] > 0, own, counts)
        share = basis / np.maximum(np.bincount(eq, weights=basis, minlength=k)[eq], 1e-300)
        new = np.maximum(np.where(flagged_rec, own, 0.0), np.where(flagged_q[eq], q_excess[eq] * share, 0.0))
        new = np.minimum(new, counts)
        if np.abs(new - out).max(initial=0.0) < 0.5:
            return new
        out = new
    return out


def anchor_mean(mean_o: float, var_o: float, mean_c: float, var_c: float, blended: float,
                policy: AnchorPolicy) -> tuple[float, dict[str, Any]]:
    """The anchor for a mean round (ALGORITHM.md §7.2, §11): one test, z = (μ̂_C − μ̂_O)/√(σ²_O + σ²_C) with the
    expected squared errors of the two estimates (functions of public sizes and of the opt-in group's σ², which no
    device moves), at level α; flagged → the opt-in mean, else the hybrid mean clamped into μ̂_O ± κ·σ²_O/σ_D.
    Returns the published mean and the check's summary."""
    sd = math.sqrt(var_o + var_c) if var_o + var_c > 0 else 0.0
    z = (mean_c - mean_o) / sd if sd > 0 and math.isfinite(sd) else math.nan
    critical = NormalDist().inv_cdf(1.0 - policy.alpha / 2.0)
    flagged = bool(math.isfinite(z) and abs(z) > critical)
    bound = policy.kappa * var_o / sd if sd > 0 and math.isfinite(sd) else math.inf
    if flagged:
        published = mean_o
    else:
        published = min(max(blended, mean_o - bound), mean_o + bound)
    return published, {**policy.to_dict(), "z": z if math.isfinite(z) else None, "critical_z": critical,
                       "flagged": flagged, "bound": bound if math.isfinite(bound) else None,
                       "clamped": (not flagged) and published != blended, "undefended": blended,
                       "verdict": ("flagged: the devices' mean disagrees with the opt-in group's beyond chance; the "
                                   "opt-in mean is published" if flagged else
                                   "the devices' mean agrees with the opt-in group's")}

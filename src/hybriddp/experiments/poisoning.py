"""``hybriddp experiment poisoning``: fake devices against the published suggestions, undefended vs defended by the
opt-in anchor (ALGORITHM.md §7.2).

Each trial is an honest BLENDER round (fresh seed: split, sampling, curator noise, devices) on one log. A target
query of true rank in ``ranks`` is drawn; for every attack of :mod:`hybriddp.simulation.attacks` and fake fraction
φ, F = round(φ·n) fake devices add their reports to the honest counts, and the server estimates the round twice
from the same counts, undefended (§7) and defended (§7.2). Per row: the target's published rank among the listed
queries (by the guarded ranking score), whether it entered the top 10, whether the check flagged it (or anything),
the target's shift against the bound (defended rows; ALGORITHM.md §7.2, "The bound"), and for φ = 0 the honest
round's NDCG/L1. Rows are what ``trials.csv`` holds; :func:`summarize` makes the table of the report.
:func:`honest_cost` is the defended default's cost on fresh honest populations at several opt-in sizes (issue 40).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog
from hybriddp.server.anchor import FIXED_KAPPA_QUERY, AnchorCheck, AnchorPolicy, _zs
from hybriddp.server.client_estimates import client_variances, estimate_client_probabilities
from hybriddp.server.party import server_side
from hybriddp.simulation.attacks import ATTACKS, OracleAttack, Seen, Target, fake_counts, target_of
from hybriddp.simulation.evaluate import ground_truth, score, truth_vectors
from hybriddp.simulation.pipeline import BlenderRun, run_blender

FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
"""Fake reports as a share of the honest ones (0.1% … 10%)."""

TOP = 10
"""A target "succeeds" when it ranks in the top 10 published queries (the suggestions a page shows first)."""

ADAPTIVE_MARGIN = 1.0
"""The adaptive attacker aims its expected z this far below the test's critical value."""

HONEST_COST_SIZES = (1_000, 2_000, 10_000, 50_000)
"""Opt-in group sizes of :func:`honest_cost` (issue 40's)."""


@dataclass(frozen=True)
class PoisoningConfig:
    """What :func:`poisoning_rows` runs."""

    trials: int = 20
    attacks: tuple[str, ...] = ATTACKS
    fractions: tuple[float, ...] = FRACTIONS
    ranks: tuple[int, int] = (11, 50)  # true ranks of the targets, inclusive
    policy: AnchorPolicy = field(default_factory=AnchorPolicy)
    seed: int = 0
    honest_trials: int = 0  # honest rounds beyond the attacked trials (false alarms need many: 1% of 40 is 0.4)


def poisoning_rows(log: RecordLog, params: BlenderParams, config: PoisoningConfig,
                   progress: Any = None) -> Iterator[dict[str, Any]]:
    """One row per (trial, attack, φ, defended) and per honest (trial, defended); see the module docstring.

    An honest row also records where the trial's target ranks by the opt-in estimates alone (``floor_rank``):
    what κ = 0 publishes whatever the reports, the floor of every attack's success (ALGORITHM.md §7.2)."""
    for trial in range(max(config.trials, config.honest_trials)):
        seed = config.seed * 1_000_003 + trial
        run = run_blender(log, params, seed=seed)
        truth, held = ground_truth(run.log, (run.curator.sampled_s, run.curator.sampled_t, run.sampled_c))
        tq, tr = truth_vectors(run.head_list, truth)
        rng = np.random.default_rng([seed, 0x9015])  # the attack's own stream (target, randomizer fakes)
        order = np.argsort(-tq, kind="stable")  # listed queries by true frequency
        lo, hi = config.ranks
        ranks = np.arange(lo, min(hi, order.size) + 1)
        target = rank = None
        if ranks.size:
            rank = int(rng.choice(ranks))
            target = target_of(run.head_list, int(order[rank - 1]), tr)
        floor = (None if target is None else
                 _published_rank(np.clip(run.curator.optin.p_query, 0.0, 1.0), target.query))
        honest = _estimate(run, run.report_counts, config.policy)
        for row in _honest_rows(run, trial, truth, held, config, honest):
            if floor is not None:
                row.update(target_true_rank=rank, floor_rank=floor, floor_success=floor <= TOP)
            yield row
        if target is not None and trial < config.trials:
            oracle = (oracle_attack(run, target, config.policy, round(max(config.fractions) * run.client.n))
                      if "oracle" in config.attacks else None)
            for attack in config.attacks:
                for phi in config.fractions:
                    yield from _attack_rows(run, trial, attack, phi, rank, target, config, rng, honest.check,
                                            oracle)
        if progress is not None:
            progress(trial + 1)


def _estimate(run: BlenderRun, counts: np.ndarray, policy: AnchorPolicy | None) -> Any:
    return server_side(run.release, counts, run.params.project, run.params.estimator, policy)


def _published_rank(p_query: np.ndarray, query: int) -> int:
    """1 + the number of listed queries published above ``query`` (the wildcard query, last, excluded)."""
    listed = p_query[:-1]
    return 1 + int((listed > listed[query]).sum())


def _honest_rows(run: BlenderRun, trial: int, truth: Any, held: np.ndarray, config: PoisoningConfig,
                 defended_out: Any) -> Iterator[dict[str, Any]]:
    for defended in (False, True):
        out = defended_out if defended else _estimate(run, run.report_counts, None)
        m = score(run.head_list, out.blended.records_final, out.blended.queries_final, truth, run.log, held,
                  out.blended.queries_rank)
        yield {"trial": trial, "attack": "honest", "fraction": 0.0, "defended": defended,
               "flagged_any": bool(out.check.flagged_any) if out.check else False,
               "ndcg": m["ndcg"], "ndcg_queries_at_10": m["ndcg_queries_at_10"], "l1": m["l1"],
               "l1_union": m.get("l1_union"), "optin_users": run.n_users_optin}


def _attack_rows(run: BlenderRun, trial: int, attack: str, phi: float, rank: int, target: Target,
                 config: PoisoningConfig, rng: np.random.Generator, honest: AnchorCheck | None,
                 oracle: OracleAttack | None) -> Iterator[dict[str, Any]]:
    fakes = round(phi * run.client.n)
    extra = fake_counts(attack, fakes, target, run.head_list, run.lp, rng,
                        adaptive_budget=lambda d: adaptive_budget(run, d, fakes, config.policy), oracle=oracle)
    counts = run.report_counts + extra
    for defended in (False, True):
        out = _estimate(run, counts, config.policy if defended else None)
        r = _published_rank(out.blended.queries_ranking, target.query)
        check = out.check
        row = {"trial": trial, "attack": attack, "fraction": phi, "defended": defended, "fakes": int(extra.sum()),
               "target_true_rank": rank, "target_rank": r, "success": r <= TOP,
               "flagged_any": bool(check.flagged_any) if check else False,
               "target_flagged": bool(check.queries.flagged[target.query]
                                      or check.records.flagged[target.entries].any()) if check else False,
               "fake_fraction_lower": check.fake_fraction_lower if check else None}
        if check is not None:
            row.update(shifts(check, out.blended.queries_ranking, target.query, honest))
        yield row


def shifts(check: AnchorCheck, ranking: np.ndarray, query: int, honest: AnchorCheck | None = None) -> dict[str, float]:
    """The target query's shifts from its opt-in estimate in units of the round's bounds (ALGORITHM.md §7.2): the
    estimate's (before clipping into [0, 1]) over κ_i·s_i (``shift``; ≤ 1 whatever the reports), the undefended
    blend's over the same (``shift_undefended``: what the attack moves without the defense), the guarded ranking
    score's from a = p̂_O clipped into [0, 1] (the score is clipped too) in units of s (``rank_shift``; ≤ κ_q, the
    round's guard for the query, ``kappa_rank``), its excess over its largest, p̂_O + min(κ_q, κ_i)·s clipped into
    [0, 1] (:func:`_rank_cap`), in units of s (``rank_excess``; ≤ 0 whatever the reports) and its share of that
    largest (``rank_reach``; NaN where that is a), the largest |p̂ − p̂_O|/(κ_i·s_i) over every entry and query
    (``max_shift_all``), the target's bound over the honest round's (``bound_growth``, B(β)/B(0) of "The bound") and
    the largest rise of any entry's or query's bound, (B(β) − B(0))/s_i(0) (``bound_rise_all``: in units of s, since a
    ratio of two tiny κ on the 0.01 grid says little)."""
    q = check.queries
    bound, anchor, unit = float(q.bound[query]), float(q.anchor[query]), float(q.s[query])
    a = min(max(anchor, 0.0), 1.0)
    cap = _rank_cap(check, query)
    ratios = [np.abs(side.defended.p - side.anchor)[np.isfinite(side.bound) & (side.bound > 0)]
              / side.bound[np.isfinite(side.bound) & (side.bound > 0)] for side in (check.records, q)]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {"shift": (float(q.defended.p[query]) - anchor) / bound if bound > 0 else float("nan"),
               "shift_undefended": (float(q.undefended[query]) - anchor) / bound if bound > 0 else float("nan"),
               "rank_shift": (float(ranking[query]) - a) / unit if unit > 0 else float("nan"),
               "rank_excess": (float(ranking[query]) - cap) / unit if unit > 0 else float("nan"),
               "rank_reach": (float(ranking[query]) - a) / (cap - a) if cap > a else float("nan"),
               "max_shift_all": float(max((r.max(initial=0.0) for r in ratios), default=0.0)),
               "kappa": float(q.kappa[query]), "kappa_rank": float(q.kappa_rank[query])}
    if honest is not None and honest.queries.bound[query] > 0:
        out["bound_growth"] = bound / float(honest.queries.bound[query])
    if honest is not None:
        rise = [(now.bound[ok] - then.bound[ok]) / then.s[ok]
                for now, then in ((check.records, honest.records), (q, honest.queries))
                for ok in [np.isfinite(then.bound) & np.isfinite(now.bound) & np.isfinite(then.s) & (then.s > 0)]]
        out["bound_rise_all"] = float(max(r.max(initial=0.0) for r in rise))
    return out


def _rank_cap(check: AnchorCheck, query: int) -> float:
    """The most ``query``'s guarded ranking score can be in this round: p̂_O + min(κ_q, κ_i)·s clipped into [0, 1]
    (the score is at most the estimate, which is at most p̂_O + κ_i·s; ALGORITHM.md §7.2)."""
    q = check.queries
    kappa = min(float(q.kappa_rank[query]), float(q.kappa[query]))
    return min(max(float(q.anchor[query]) + kappa * float(q.s[query]), 0.0), 1.0)


def oracle_attack(run: BlenderRun, target: Target, policy: AnchorPolicy, most: int) -> OracleAttack:
    """The oracle of :mod:`hybriddp.simulation.attacks` on ``run``: it publishes by running the shipped defense on
    the honest reports plus its own, and spreads its fakes over the target's entries so that each entry's client
    estimate rises in proportion to its σ_D at the test's point x = a + σ_O(a) (ALGORITHM.md §7.2, "Test"): every
    record's z moves alike. The client estimator is linear in the counts (§6: a report on ⟨q,u⟩ also raises p̂_C,q,
    which lowers the other ⟨q,·⟩), so the split solves J·d = σ_D for the Jacobian J of the target's entries'
    estimates in their counts (negative shares dropped)."""
    hl, lp, optin, e = run.head_list, run.lp, run.release.optin, target.entries
    a_r, a_q = (np.clip(np.nan_to_num(p), 0.0, 1.0) for p in (optin.p_record, optin.p_query))
    vo_r, vo_q = optin.variances_at(a_r, a_q)
    x_r, x_q = np.clip(a_r + np.sqrt(vo_r), 0.0, 1.0), np.clip(a_q + np.sqrt(vo_q), 0.0, 1.0)
    sd = np.sqrt(optin.variances_at(x_r, x_q)[0] + client_variances(x_r, x_q, hl, lp, run.client.n)[0])[e]
    step = max(1, round(1e-3 * run.client.n))

    def p_c(extra: np.ndarray) -> np.ndarray:
        return estimate_client_probabilities(run.report_counts + extra, hl, lp, run.params.m_c).p_record[e]
    base = p_c(np.zeros(hl.n_entries, dtype=np.int64))
    jac = np.column_stack([(p_c(np.where(np.arange(hl.n_entries) == i, step, 0)) - base) / step for i in e])
    try:
        w = np.maximum(np.linalg.solve(jac, np.where(np.isfinite(sd), sd, 0.0)), 0.0)
    except np.linalg.LinAlgError:
        w = np.zeros(e.size)
    direction = np.zeros(hl.n_entries)
    direction[e] = w / w.sum() if w.sum() > 0 else 1.0 / e.size
    t = target.query

    def publish(extra: np.ndarray) -> Seen:
        out = _estimate(run, run.report_counts + extra, policy)
        q = out.check.queries
        return Seen(float(out.blended.queries_ranking[t]), _rank_cap(out.check, t), float(q.defended.p[t]),
                    float(q.anchor[t] + q.bound[t]), bool(out.check.flagged_any))
    return OracleAttack(target, direction, publish, most)


def adaptive_budget(run: BlenderRun, direction: np.ndarray, cap: int, policy: AnchorPolicy) -> int:
    """The most fakes (≤ ``cap``) in ``direction`` whose expected anchor z stays :data:`ADAPTIVE_MARGIN` below the
    critical value on every entry and query: the attacker knows the honest report counts and takes the clients'
    estimates as the opt-in group's (it cannot see the opt-in noise), and uses the shipped z (§7.2)."""
    hl, lp = run.head_list, run.lp
    m = hl.n_entries + hl.k
    limit = NormalDist().inv_cdf(1.0 - policy.alpha / (2.0 * m)) - ADAPTIVE_MARGIN
    honest = estimate_client_probabilities(run.report_counts, hl, lp, run.params.m_c)
    a_r, a_q = np.clip(honest.p_record, 0.0, 1.0), np.clip(honest.p_query, 0.0, 1.0)
    vo_r, vo_q = run.curator.optin.variances_at(a_r, a_q)
    vc_r, vc_q = client_variances(a_r, a_q, hl, lp, honest.n)

    def z_max(f: int) -> float:
        c = estimate_client_probabilities(run.report_counts + np.floor(direction * f).astype(np.int64), hl, lp,
                                          run.params.m_c)
        z = np.concatenate([_zs(honest.p_record, c.p_record, vo_r, vc_r), _zs(honest.p_query, c.p_query, vo_q, vc_q)])
        return float(np.nanmax(z))
    lo, hi = 0, cap
    if z_max(hi) <= limit:
        return cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if z_max(mid) <= limit else (lo, mid)
    return lo


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (attack, φ, defended): trials, success rate, detection rate, mean target rank (attacks); per defended:
    false-alarm rate and mean NDCG/L1 (honest)."""
    groups: dict[tuple[str, float, bool], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["attack"], r["fraction"], r["defended"]), []).append(r)
    out = []
    for (attack, phi, defended), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "honest", kv[0])):
        s: dict[str, Any] = {"attack": attack, "fraction": phi, "defended": defended, "trials": len(rs),
                             "flag_rate": float(np.mean([r["flagged_any"] for r in rs]))}
        if attack == "honest":
            for k in ("ndcg", "ndcg_queries_at_10", "l1", "l1_union"):
                vals = [r[k] for r in rs if r.get(k) is not None]
                s[k] = float(np.mean(vals)) if vals else None
        else:
            s.update(success_rate=float(np.mean([r["success"] for r in rs])),
                     detection_rate=float(np.mean([r["target_flagged"] for r in rs])),
                     mean_target_rank=float(np.mean([r["target_rank"] for r in rs])),
                     mean_true_rank=float(np.mean([r["target_true_rank"] for r in rs])),
                     mean_fakes=float(np.mean([r["fakes"] for r in rs])))
            for key, how in (("shift", "mean"), ("shift", "max"), ("shift_undefended", "mean"), ("rank_shift", "mean"),
                             ("rank_shift", "max"), ("rank_excess", "max"), ("kappa_rank", "mean"),
                             ("max_shift_all", "max"), ("bound_growth", "max"),
                             ("bound_rise_all", "max")):
                vals = np.array([r[key] for r in rs if r.get(key) is not None], dtype=np.float64)
                vals = vals[np.isfinite(vals)]
                if vals.size:
                    s[key if key == "max_shift_all" else f"{how}_{key}"] = float(getattr(np, how)(vals))
        out.append(s)
    return out


def honest_cost(rounds: int, seed: int, sizes: Sequence[int] = HONEST_COST_SIZES,
                progress: Any = None) -> list[dict[str, Any]]:
    """The defended default against the undefended blend on fresh honest populations (issue 40's instrument,
    :func:`hybriddp.simulation.defended_calibration.calibrate_defended`: 20 × the opt-in group's users, 48 Zipf
    records over 12 queries, ε = 4, M = 100, the published ``p_blended``), per opt-in size: RMSE of each and their
    ratio (records, queries; entries listed in ≥ 10% of the rounds) and NDCG@10 of each and the difference; and the
    NDCG@10 of the fixed ranking guard (``--anchor-kappa-query 0.1``, ``ndcg10_fixed``)."""
    from hybriddp.simulation.defended_calibration import calibrate_defended, defense_name

    fixed = AnchorPolicy(kappa_query=FIXED_KAPPA_QUERY)
    out = []
    for i, n in enumerate(sizes):
        cal = calibrate_defended(n, rounds=rounds, seed=seed, defenses=("anchor", None, fixed))
        nd_fixed = float(np.nanmean(cal.runs[defense_name(fixed)].ndcg10))
        nd_none = float(np.nanmean(cal.runs["none"].ndcg10))
        row = cal.row("anchor", column="p_blended")
        out.append({"optin_users": n, "users": int(cal.settings["n_users"]), "rounds": cal.listed_rounds,
                    "rmse_records": row["records"]["rmse"], "rmse_queries": row["queries"]["rmse"],
                    "rmse_records_undefended": cal.rmse("none", "records"),
                    "rmse_queries_undefended": cal.rmse("none", "queries"),
                    "rmse_ratio_records": row["records"]["rmse_over_reference"],
                    "rmse_ratio_queries": row["queries"]["rmse_over_reference"],
                    "ndcg10": row["ndcg10"], "ndcg10_undefended": nd_none,
                    "ndcg10_diff": row["ndcg10_minus_reference"], "ndcg10_fixed": nd_fixed,
                    "ndcg10_diff_fixed": nd_fixed - nd_none,
                    "flagged_rounds": row["flagged_rounds"],
                    "seconds": round(cal.seconds, 1)})
        if progress is not None:
            progress(i + 1)
    return out

"""``hybriddp experiment poisoning``: fake devices against the published suggestions, undefended vs defended by the
opt-in anchor (ALGORITHM.md §7.2).

Each trial is an honest BLENDER round (fresh seed: split, sampling, curator noise, devices) on one log. A target
query of true rank in ``ranks`` is drawn; for every attack of :mod:`hybriddp.simulation.attacks` and fake fraction
φ, F = round(φ·n) fake devices add their reports to the honest counts, and the server estimates the round twice
from the same counts, undefended (§7) and defended (§7.2). Per row: the target's published rank among the listed
queries, whether it entered the top 10, whether the check flagged it (or anything), and for φ = 0 the honest
round's NDCG/L1. Rows are what ``trials.csv`` holds; :func:`summarize` makes the table of the report.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog
from hybriddp.server.anchor import AnchorPolicy, _zs
from hybriddp.server.client_estimates import client_variances, estimate_client_probabilities
from hybriddp.server.party import server_side
from hybriddp.simulation.attacks import ATTACKS, Target, fake_counts, target_of
from hybriddp.simulation.evaluate import ground_truth, score, truth_vectors
from hybriddp.simulation.pipeline import BlenderRun, run_blender

FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
"""Fake reports as a share of the honest ones (0.1% … 10%)."""

TOP = 10
"""A target "succeeds" when it ranks in the top 10 published queries (the suggestions a page shows first)."""

ADAPTIVE_MARGIN = 1.0
"""The adaptive attacker aims its expected z this far below the test's critical value."""


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
        for row in _honest_rows(run, trial, truth, held, config):
            if floor is not None:
                row.update(target_true_rank=rank, floor_rank=floor, floor_success=floor <= TOP)
            yield row
        if target is not None and trial < config.trials:
            for attack in config.attacks:
                for phi in config.fractions:
                    yield from _attack_rows(run, trial, attack, phi, rank, target, config, rng)
        if progress is not None:
            progress(trial + 1)


def _estimate(run: BlenderRun, counts: np.ndarray, policy: AnchorPolicy | None) -> Any:
    return server_side(run.release, counts, run.params.project, run.params.estimator, policy)


def _published_rank(p_query: np.ndarray, query: int) -> int:
    """1 + the number of listed queries published above ``query`` (the wildcard query, last, excluded)."""
    listed = p_query[:-1]
    return 1 + int((listed > listed[query]).sum())


def _honest_rows(run: BlenderRun, trial: int, truth: Any, held: np.ndarray,
                 config: PoisoningConfig) -> Iterator[dict[str, Any]]:
    for defended in (False, True):
        out = _estimate(run, run.report_counts, config.policy if defended else None)
        m = score(run.head_list, out.blended.records_final, out.blended.queries_final, truth, run.log, held,
                  out.blended.queries_rank)
        yield {"trial": trial, "attack": "honest", "fraction": 0.0, "defended": defended,
               "flagged_any": bool(out.check.flagged_any) if out.check else False,
               "ndcg": m["ndcg"], "ndcg_queries_at_10": m["ndcg_queries_at_10"], "l1": m["l1"],
               "l1_union": m.get("l1_union")}


def _attack_rows(run: BlenderRun, trial: int, attack: str, phi: float, rank: int, target: Target,
                 config: PoisoningConfig, rng: np.random.Generator) -> Iterator[dict[str, Any]]:
    fakes = round(phi * run.client.n)
    extra = fake_counts(attack, fakes, target, run.head_list, run.lp, rng,
                        adaptive_budget=lambda d: adaptive_budget(run, d, fakes, config.policy))
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
        yield row


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
                     mean_true_rank=float(np.mean([r["target_true_rank"] for r in rs])))
        out.append(s)
    return out

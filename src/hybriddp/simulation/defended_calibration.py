"""Calibration of what a round publishes, defended and not, on fresh honest populations (ALGORITHM.md §7, §7.2).

Each round draws a fresh population: ``n_users`` users holding one record each, drawn i.i.d. from a Zipf law over
``records`` ⟨query, URL⟩ records (:meth:`hybriddp.simulation.selection.Population.zipf`: p_k ∝ k^−``zipf``, record
k in query k mod ``queries``). ``n_optin`` of them are the opt-in group, the rest devices. The round runs the
library's own pipeline, the calls ``hybriddp run`` makes (:func:`hybriddp.simulation.pipeline.run_blender`): the
curator (:func:`hybriddp.curator.party.curate`: S/T split, CreateHeadList, the opt-in estimates, S reused), the
devices' vectorized LocalAlg (:func:`hybriddp.device.party.simulate_devices`), then, on the same report counts,
:func:`hybriddp.server.party.server_side` once per defense: the client estimates, the blend of ``estimator`` and
the defense (``"anchor"``: the shipped default policy; an :class:`~hybriddp.server.anchor.AnchorPolicy`; None:
the undefended blend).

The truth (``truth``): ``"law"`` (default) is the distribution p the users are drawn from, the estimand the
variance formulas describe (every group an independent i.i.d. sample, §4, §6); ``"sample"`` is the round's users'
own frequencies, what ``hybriddp run`` scores against. With ``"sample"`` an estimate's mean squared error is
smaller by about p(1 − p)/``n_users``, so reported variances look that much too large.

The head list changes per round, so entries are keyed by identity: a population record ⟨q,u⟩, a ⟨q,*⟩ (its truth
is the mass of q's records not listed under q in that round), ⟨*,*⟩; queries by query, ``*`` included. Per entry,
over the rounds that list it: bias, its z (bias over its standard error, the errors' standard deviation over √n),
the empirical MSE, the mean reported variance (``var_blended``) over the MSE, of either published column
(``p_blended``: records projected when ``project``, queries clipped; or ``p_blended_raw``). Per round: NDCG@10 of
the published query ranking against the truth (§9). Used by ``benchmarks/anchor_calibration.py`` and the tests.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybriddp.core.errors import EmptyHeadListError, parameter_error
from hybriddp.core.headlist import HeadList, record_keys
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog, SyntheticVocabulary
from hybriddp.core.reportlaw import LocalAlgParams
from hybriddp.curator.party import curate
from hybriddp.curator.release import CuratorRelease
from hybriddp.device.party import sample_clients, simulate_devices
from hybriddp.server.anchor import AnchorPolicy
from hybriddp.server.party import DEFAULT_DEFENSE, server_side
from hybriddp.simulation.scoring import Truth, query_ndcg
from hybriddp.simulation.selection import Population

Defense = str | AnchorPolicy | None
COLUMNS = ("p_blended", "p_blended_raw")
LEVELS = ("records", "queries")


def defense_name(defense: Defense) -> str:
    """The label of a defense in results and tables: ``anchor``, ``none`` or the policy's knobs."""
    if defense is None or defense == "none":
        return "none"
    if defense == "anchor":
        return "anchor"
    if isinstance(defense, AnchorPolicy):
        kappa = "auto" if defense.kappa is None else f"{defense.kappa:g}"
        kq = (f"auto,rank_cost={defense.rank_cost:g}" if defense.kappa_query is None
              else f"{defense.kappa_query:g}")
        return f"anchor(alpha={defense.alpha:g},kappa={kappa},kappa_query={kq},cost={defense.honest_cost:g})"
    raise parameter_error("defense", defense, "'anchor', None (or 'none') or an AnchorPolicy",
                          "'anchor' applies the shipped default policy (ALGORITHM.md §7.2).")


def _policy(defense: Defense) -> AnchorPolicy | None:
    """What :func:`~hybriddp.server.party.server_side` is given for ``defense``."""
    name = defense_name(defense)
    if name == "none":
        return None
    return defense if isinstance(defense, AnchorPolicy) else DEFAULT_DEFENSE


@dataclass
class DefenseRuns:
    """One defense's published numbers: rounds × entry keys (NaN where the round does not list the entry)."""

    values: dict[tuple[str, str], np.ndarray]  # (level, column) → estimates
    variances: dict[str, np.ndarray]  # level → var_blended
    ndcg10: np.ndarray  # per round (NaN: empty head list)
    flagged: np.ndarray  # per round: the anchor test flagged an entry
    clamped: np.ndarray  # per round: share of the listed entries and queries the bound moved


@dataclass
class DefendedCalibration:
    """The rounds of :func:`calibrate_defended`: truth and, per defense, what was published."""

    truth: dict[str, np.ndarray]  # level → rounds × keys
    labels: dict[str, list[str]]  # level → label of each key
    runs: dict[str, DefenseRuns]
    settings: dict[str, Any]
    empty_rounds: int = 0
    seconds: float = 0.0
    listed_rounds: int = field(init=False)

    def __post_init__(self) -> None:
        self.listed_rounds = int(self.settings["rounds"]) - self.empty_rounds

    def entries(self, defense: str, level: str = "records", column: str = "p_blended",
                min_listed: float = 0.10) -> dict[str, np.ndarray]:
        """Per entry (``level`` "records") or query listed in ≥ ``min_listed`` of the rounds with a head list: key,
        rounds n, bias, its standard error and z, MSE, mean reported variance / MSE (inf: no error at all) and that
        ratio's standard error (delta method over the rounds' reported variances and squared errors: near τ both
        vary, and they covary)."""
        if level not in LEVELS or column not in COLUMNS:
            raise parameter_error("level, column", (level, column), f"one of {LEVELS} and one of {COLUMNS}")
        err = self.runs[defense].values[(level, column)] - self.truth[level]
        ok = np.isfinite(err)
        n = ok.sum(axis=0)
        keep = np.flatnonzero(n >= max(2.0, min_listed * self.listed_rounds))
        err, ok, n = err[:, keep], ok[:, keep], n[keep]
        e0 = np.where(ok, err, 0.0)
        bias = e0.sum(axis=0) / n
        mse = (e0**2).sum(axis=0) / n
        se = np.sqrt(np.maximum(mse - bias**2, 0.0) * n / (n - 1) / n)
        v0 = np.where(ok, self.runs[defense].variances[level][:, keep], 0.0)
        var = v0.sum(axis=0) / n
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            z = np.where(bias == 0.0, 0.0, bias / se)
            ratio = np.where(mse > 0.0, var / mse, np.inf)
            dv, de = np.where(ok, v0 - var, 0.0) / var, np.where(ok, e0**2 - mse, 0.0) / mse  # delta method
            ratio_se = ratio * np.sqrt(np.maximum(((dv - de) ** 2).sum(axis=0) / (n - 1), 0.0) / n)
        return {"key": keep, "label": np.array(self.labels[level], dtype=object)[keep], "rounds": n, "bias": bias,
                "se": se, "z": z, "mse": mse, "reported_var": var, "ratio": ratio, "ratio_se": ratio_se}

    def rmse(self, defense: str, level: str = "records", column: str = "p_blended", min_listed: float = 0.10) -> float:
        """√(mean over the entries of :meth:`entries` of their MSE): one number per level."""
        return math.sqrt(float(self.entries(defense, level, column, min_listed)["mse"].mean()))

    def row(self, defense: str, column: str = "p_blended", min_listed: float = 0.10, z_limit: float = 4.0,
            reference: str | None = "none") -> dict[str, Any]:
        """The headline numbers of one defense (issue 40's table): per level max |z|, entries with |z| > ``z_limit``
        of the entries kept, reported var / MSE min–max and the largest |ratio − 1| in the ratio's standard errors,
        RMSE; NDCG@10; against ``reference`` (when run and not this defense) the RMSE ratios and the NDCG
        difference."""
        r = self.runs[defense]
        out: dict[str, Any] = {"defense": defense, "column": column, "rounds": self.listed_rounds,
                               "ndcg10": float(np.nanmean(r.ndcg10)), "flagged_rounds": float(r.flagged.mean()),
                               "clamped_share": float(np.nanmean(r.clamped))}
        for level in LEVELS:
            e = self.entries(defense, level, column, min_listed)
            az = np.abs(e["z"])
            with np.errstate(divide="ignore", invalid="ignore"):
                dev = np.abs(e["ratio"] - 1.0) / e["ratio_se"]
            out[level] = {"entries": len(e["key"]), "max_abs_z": float(az.max(initial=0.0)),
                          "over_z_limit": int((az > z_limit).sum()), "ratio_min": float(e["ratio"].min(initial=np.inf)),
                          "ratio_max": float(e["ratio"].max(initial=0.0)),
                          "ratio_max_dev_se": float(np.nan_to_num(dev, nan=np.inf).max(initial=0.0)),
                          "rmse": float(math.sqrt(e["mse"].mean()))}
        if reference is not None and reference != defense and reference in self.runs:
            for level in LEVELS:
                out[level]["rmse_over_reference"] = out[level]["rmse"] / self.rmse(reference, level, column, min_listed)
            out["ndcg10_minus_reference"] = out["ndcg10"] - float(np.nanmean(self.runs[reference].ndcg10))
        return out


def _entry_keys(hl: HeadList, sorted_keys: np.ndarray, order: np.ndarray, n_queries: int) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """Each entry's key (its population record's index; R + query id for ⟨q,*⟩; R + Q for ⟨*,*⟩) and each query
    position's key (query id; Q for ``*``). ``sorted_keys`` = the population's record keys sorted by ``order``."""
    qkey = np.append(hl.query_ids, n_queries)
    real = ~hl.is_wildcard
    keys = len(order) + qkey[hl.entry_query]
    keys[real] = order[np.searchsorted(sorted_keys, record_keys(hl.query_ids[hl.entry_query[real]],
                                                                hl.entry_url[real]))]
    return keys, qkey


def _honest_round(pop: Population, n_optin: int, n_users: int, params: BlenderParams,
                  vocab: tuple[SyntheticVocabulary, SyntheticVocabulary], rng: np.random.Generator,
                  round_seed: int) -> tuple[CuratorRelease, np.ndarray, np.ndarray] | None:
    """One fresh population through the curator and the devices: (release, report counts per entry, users per
    population record), or None when the head list came out empty. The users are i.i.d., so they are drawn as
    counts, grouped by record: the curator splits S/T by a random permutation and every device randomizes on its
    own, so the order of the users changes no law."""
    c_opt, c_dev = rng.multinomial(n_optin, pop.p), rng.multinomial(n_users - n_optin, pop.p)
    rec = np.concatenate([np.repeat(np.arange(len(pop.p)), c_opt), np.repeat(np.arange(len(pop.p)), c_dev)])
    log = RecordLog(np.arange(n_users + 1), pop.query[rec].astype(np.int32), pop.url[rec].astype(np.int32), *vocab)
    try:
        rel, _ = curate(log, params, optin_users=np.arange(n_optin), seed=round_seed, with_charges=False)
    except EmptyHeadListError:
        return None
    lp = LocalAlgParams.build(rel.head_list, params.epsilon, params.delta, rel.f_c, params.m_c)
    d_c = sample_clients(log, np.arange(n_optin, n_users), params.m_c, round_seed)
    return rel, simulate_devices(d_c, rel.head_list, lp, seed=round_seed), c_opt + c_dev


def calibrate_defended(n_optin: int, *, n_users: int | None = None, records: int = 48, queries: int = 12,
                       zipf: float = 1.1, epsilon: float = 4.0, head_list_size: int = 100, rounds: int, seed: int,
                       defenses: tuple[Defense, ...] = ("anchor", None), estimator: str = "reuse",
                       project: bool = True, truth: str = "law") -> DefendedCalibration:
    """``rounds`` honest rounds of ``n_users`` users (default 20 × ``n_optin``: 5% opt in), each through the curator,
    the devices and, for every defense, the server on the same reports (module docstring). δ = 1e-5, f_O = 0.95,
    f_C = 0.85, m_O = m_C = 1, discrete Laplace noise: the defaults of ``hybriddp run``."""
    n_users = 20 * n_optin if n_users is None else n_users
    if not (isinstance(n_optin, int) and n_optin >= 2):
        raise parameter_error("n_optin", n_optin, "an integer >= 2", "The issue-40 sizes are 1000 to 50000.")
    if not (isinstance(n_users, int) and n_users > n_optin):
        raise parameter_error("n_users", n_users, f"an integer > n_optin = {n_optin}",
                              "The devices are the users outside the opt-in group; leave it None for 20 x n_optin.")
    if not (isinstance(rounds, int) and rounds >= 2):
        raise parameter_error("rounds", rounds, "an integer >= 2", "Hundreds are needed for a z-test.")
    if truth not in ("law", "sample"):
        raise parameter_error("truth", truth, "'law' or 'sample'", "'law' scores against the distribution p.")
    names = [defense_name(d) for d in defenses]
    if not names or len(set(names)) != len(names):
        raise parameter_error("defenses", defenses, "a non-empty tuple of distinct defenses", "e.g. ('anchor', None).")
    params = BlenderParams(epsilon=epsilon, head_list_size=head_list_size, estimator=estimator, project=project,
                           optin_fraction=n_optin / n_users)
    pop = Population.zipf(n_records=records, n_queries=queries, exponent=zipf)
    pop_keys = record_keys(pop.query, pop.url)
    order = np.argsort(pop_keys)
    n_r, n_q = records + queries + 1, queries + 1
    labels = {"records": [f"<q{q},u{u}>" for q, u in zip(pop.query.tolist(), pop.url.tolist(), strict=True)]
              + [f"<q{q},*>" for q in range(queries)] + ["<*,*>"],
              "queries": [f"q{q}" for q in range(queries)] + ["*"]}
    width = {"records": n_r, "queries": n_q}

    def nan(level: str) -> np.ndarray:
        return np.full((rounds, width[level]), np.nan)
    out = DefendedCalibration({lvl: nan(lvl) for lvl in LEVELS}, labels, {
        name: DefenseRuns({(lvl, c): nan(lvl) for lvl in LEVELS for c in COLUMNS}, {lvl: nan(lvl) for lvl in LEVELS},
                          np.full(rounds, np.nan), np.zeros(rounds, dtype=bool), np.full(rounds, np.nan))
        for name in names}, {"n_optin": n_optin, "n_users": n_users, "records": records, "queries": queries,
                             "zipf": zipf, "epsilon": epsilon, "head_list_size": head_list_size, "rounds": rounds,
                             "seed": seed, "estimator": estimator, "project": project, "truth": truth})
    vocab = (SyntheticVocabulary(queries, "q"), SyntheticVocabulary(records, "u"))
    policies = [_policy(d) for d in defenses]
    start = time.perf_counter()
    for i in range(rounds):
        drawn = _honest_round(pop, n_optin, n_users, params, vocab, np.random.default_rng([seed, i]),
                              seed * 1_000_003 + i)
        if drawn is None:
            out.empty_rounds += 1
            continue
        rel, counts, counts_users = drawn
        hl = rel.head_list
        freq = pop.p if truth == "law" else counts_users / n_users
        keys, qkeys = _entry_keys(hl, pop_keys[order], order, queries)
        p_entry = np.bincount(hl.map_records(pop.query, pop.url), weights=freq, minlength=hl.n_entries)
        out.truth["records"][i, keys] = p_entry
        out.truth["queries"][i, qkeys] = np.bincount(hl.entry_query, weights=p_entry, minlength=hl.k)
        scored = Truth(np.arange(queries), np.bincount(pop.query, weights=freq, minlength=queries),
                       pop_keys[order], freq[order], n_users)
        for name, policy in zip(names, policies, strict=True):
            res = server_side(rel, counts, project, estimator, policy)
            b, r = res.blended, out.runs[name]
            for lvl, idx, final, blended in (("records", keys, b.records_final, b.records),
                                             ("queries", qkeys, b.queries_final, b.queries)):
                r.values[(lvl, "p_blended")][i, idx] = final
                r.values[(lvl, "p_blended_raw")][i, idx] = blended.p
                r.variances[lvl][i, idx] = blended.var
            r.ndcg10[i] = query_ndcg(hl, b.queries_ranking, scored, 10)
            if res.check is not None:
                r.flagged[i] = res.check.flagged_any
                moved = res.check.records.clamped.sum() + res.check.queries.clamped.sum()
                r.clamped[i] = moved / (hl.n_entries + hl.k)
            else:
                r.clamped[i] = 0.0
    out.seconds = time.perf_counter() - start
    return out

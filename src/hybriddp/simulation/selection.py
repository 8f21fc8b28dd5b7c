"""Selection-bias harness: the whole round on a fresh i.i.d. population each time, scored against the population
(ALGORITHM.md §3.3, §4.1, §7).

The calibration rounds of :mod:`hybriddp.server.calibration` fix the head list, so every record there sits far
above τ. Here each round draws a new population sample and runs what ships: the opt-in group split into S and T,
CreateHeadList with its threshold and its released counts (exact discrete Laplace noise), EstimateOptinProbabilities
and the reuse of S (:mod:`hybriddp.curator.mechanisms`, the keep rule attached as a release does), the clients'
reports from LocalAlg's exact report law (:func:`hybriddp.core.reportlaw.output_distribution`), the client estimator
and the server's blend of each estimator (:mod:`hybriddp.server`). A record whose expected S count is near τ is
listed in some rounds only; its bias is the mean error over the rounds that list it (what a reader of those rounds
sees), against the population probability. Used by ``benchmarks/selection_bias.py`` and the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hybriddp.core.estimators import Blend, Release, estimator_named
from hybriddp.core.noise import DiscreteLaplaceNoise
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.curator.kept import kept_count_for
from hybriddp.curator.mechanisms import create_head_list_with_counts, estimate_optin_probabilities, reuse_s
from hybriddp.server.blend import blend_strategy
from hybriddp.server.client_estimates import estimate_client_probabilities
from hybriddp.server.consistency import make_consistent
from hybriddp.server.weights import Blended


@dataclass(frozen=True)
class Population:
    """Records ⟨query, URL⟩ with their probabilities: every user holds one record drawn i.i.d. from ``p``."""

    query: np.ndarray
    url: np.ndarray
    p: np.ndarray

    @classmethod
    def zipf(cls, n_records: int = 48, n_queries: int = 12, exponent: float = 1.1) -> Population:
        """``n_records`` records with p_k ∝ k^−exponent (k = 1 the most probable); record k belongs to query
        (k − 1) mod ``n_queries``, so every query holds records of every rank band (URL ids are distinct)."""
        rank = np.arange(n_records)
        w = (rank + 1.0) ** -exponent
        return cls(rank % n_queries, rank, w / w.sum())


@dataclass(frozen=True)
class Setting:
    """One harness configuration (the defaults are issue 28's: 40,000 users, 5% opt in, f_O = 0.95, ε = 4, M = 100)."""

    users: int = 40_000
    optin_fraction: float = 0.05
    f_o: float = 0.95
    f_c: float = 0.85
    epsilon: float = 4.0
    delta: float = 1e-5
    head_list_size: int = 100

    @property
    def sizes(self) -> tuple[int, int, int]:
        """|D_S|, |D_T| and the number of clients (one record per user, Python's round as the pipeline)."""
        n_o = round(self.optin_fraction * self.users)
        n_s = round(self.f_o * n_o)
        return n_s, n_o - n_s, self.users - n_o


@dataclass
class SelectionRuns:
    """Per estimator, rounds × population records: the blended record estimate (NaN where not listed) and its
    reported variance; ``p`` is the truth."""

    p: np.ndarray
    estimates: dict[str, np.ndarray] = field(default_factory=dict)
    variances: dict[str, np.ndarray] = field(default_factory=dict)
    empty_rounds: int = 0

    def listed(self, name: str) -> np.ndarray:
        """Share of the rounds that list each record."""
        return np.isfinite(self.estimates[name]).mean(axis=0)

    def summary(self, name: str, min_listed: float = 0.10) -> dict[str, np.ndarray]:
        """Per record listed in ≥ ``min_listed`` of the rounds: the rounds listing it, bias, RMSE, z of the bias,
        mean reported variance / MSE, and the record's index and p."""
        est, var = self.estimates[name], self.variances[name]
        keep = np.flatnonzero(self.listed(name) >= min_listed)
        err = est[:, keep] - self.p[keep]
        ok = np.isfinite(err)
        n = ok.sum(axis=0)
        e0 = np.where(ok, err, 0.0)
        bias = e0.sum(axis=0) / n
        mse = (e0**2).sum(axis=0) / n
        sd = np.sqrt(np.maximum(mse - bias**2, 0.0) * n / np.maximum(n - 1, 1))
        ratio = np.where(ok, var[:, keep], 0.0).sum(axis=0) / n / mse
        return {"record": keep, "p": self.p[keep], "rounds": n, "bias": bias, "rmse": np.sqrt(mse),
                "z": bias / (sd / np.sqrt(n)), "ratio": ratio}

    def table_row(self, name: str, min_listed: float = 0.10) -> dict[str, float]:
        """The headline numbers: mean RMSE, max |bias|/RMSE, max |z|, range of reported variance / MSE."""
        s = self.summary(name, min_listed)
        rel = np.abs(s["bias"]) / s["rmse"]
        return {"records": float(len(s["record"])), "mean_rmse": float(s["rmse"].mean()),
                "max_bias_over_rmse": float(rel.max()), "max_abs_z": float(np.abs(s["z"]).max()),
                "ratio_min": float(s["ratio"].min()), "ratio_max": float(s["ratio"].max())}


def _releases(pop: Population, counts_s: np.ndarray, counts_t: np.ndarray, setting: Setting, seed: int,
              releases: set[Release]) -> dict[Release, OptinEstimates] | None:
    """The curator's round on one sample: CreateHeadList on S, the estimates on T, per release (same noise draws)."""
    n_s = int(counts_s.sum())
    rs, rt = np.repeat(np.arange(len(pop.p)), counts_s), np.repeat(np.arange(len(pop.p)), counts_t)
    hl_s, s_counts = create_head_list_with_counts(
        pop.query[rs], pop.url[rs], epsilon=setting.epsilon, delta=setting.delta, m_o=1,
        noise=DiscreteLaplaceNoise(np.random.default_rng([seed, 1])))
    if hl_s.n_queries == 0:
        return None
    kept = kept_count_for(setting.epsilon, setting.delta, 1, DiscreteLaplaceNoise.name, n_s)
    out = {}
    for rel in releases:
        reuses = rel is Release.REUSE_S
        est = estimate_optin_probabilities(
            pop.query[rt], pop.url[rt], hl_s, epsilon=setting.epsilon, m_o=1, head_list_size=setting.head_list_size,
            noise=DiscreteLaplaceNoise(np.random.default_rng([seed, 2])), s_counts=s_counts, n_s=n_s,
            rank_with_s=reuses)
        out[rel] = reuse_s(est, kept) if reuses else est  # as a curator round does
    return out


def run_selection(pop: Population, setting: Setting, estimators: tuple[str, ...], *, rounds: int,
                  seed: int) -> SelectionRuns:
    """``rounds`` rounds, each on a fresh sample of ``setting.users`` users from ``pop``; every estimator blends the
    same round (same S, T, noise and reports; ``consistent`` starts from that round's pooled blend). Unprojected
    record blends, as the calibration rounds (ALGORITHM.md §7)."""
    rng = np.random.default_rng(seed)
    n_s, n_t, n_c = setting.sizes
    counts_s = rng.multinomial(n_s, pop.p, size=rounds)
    counts_t = rng.multinomial(n_t, pop.p, size=rounds)
    specs = {e: estimator_named(e) for e in estimators}
    runs = SelectionRuns(pop.p, {e: np.full((rounds, len(pop.p)), np.nan) for e in estimators},
                         {e: np.full((rounds, len(pop.p)), np.nan) for e in estimators})
    for i in range(rounds):  # one round per pass; every step inside is vectorized over records
        rels = _releases(pop, counts_s[i], counts_t[i], setting, seed * 1_000_003 + i,
                         {s.release for s in specs.values()})
        if rels is None:
            runs.empty_rounds += 1
            continue
        hl = next(iter(rels.values())).head_list
        lp = LocalAlgParams.build(hl, setting.epsilon, setting.delta, setting.f_c, 1)
        entry_of = hl.map_records(pop.query, pop.url)  # every population record's entry on the final list
        p_entry = np.bincount(entry_of, weights=pop.p, minlength=hl.n_entries)
        reports = rng.multinomial(n_c, np.clip(p_entry @ output_distribution(lp), 0.0, None))
        client = estimate_client_probabilities(reports, hl, lp)
        pooled: dict[Release, tuple[Blended, Blended]] = {}
        for e, spec in specs.items():
            opt = rels[spec.release]
            if spec.blend is Blend.CONSISTENT and spec.release in pooled:
                rec = make_consistent(opt, client, lp, *pooled[spec.release])[0]
            else:
                b = blend_strategy(spec.blend, opt, client, False, lp=lp)
                rec = b.records
                if spec.blend is Blend.POOLED:
                    pooled[spec.release] = (b.records, b.queries)
            own = ~hl.is_wildcard[entry_of]  # the population records that are entries themselves
            runs.estimates[e][i, own] = rec.p[entry_of[own]]
            runs.variances[e][i, own] = rec.var[entry_of[own]]
    return runs


def format_table(runs: SelectionRuns, names: tuple[str, ...], min_listed: float = 0.10) -> str:
    """The issue-28 table: one line per estimator."""
    lines = ["| estimator | records | mean RMSE | max |bias|/RMSE | max |z| | reported var / MSE |",
             "|---|---|---|---|---|---|"]
    for name in names:
        r = runs.table_row(name, min_listed)
        lines.append(f"| {name} | {r['records']:.0f} | {r['mean_rmse']:.3g} | {r['max_bias_over_rmse']:.3f} | "
                     f"{r['max_abs_z']:.1f} | {r['ratio_min']:.2f}–{r['ratio_max']:.2f} |")
    return "\n".join(lines)


def z_bound(rounds: int) -> float:
    """The |bias|/RMSE a z-test over ``rounds`` rounds flags at |z| = 3: about 3/√rounds."""
    return 3.0 / math.sqrt(rounds)

"""The population model synthetic populations are drawn from: fitted to the DP files, or the built-in prior.

"TUNE.md model, item i" refers to item i of docs/TUNE.md, "The population model".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybriddp.core.records import NO_URL, RecordLog, SyntheticVocabulary
from hybriddp.tune.constants import EXTRAPOLATION_COUNT, LAW_UNCERTAINTY, MAX_EXTRAPOLATED, PRIOR_PRESET
from hybriddp.tune.inputs import PrivatizedInputs
from hybriddp.tune.law import (
    CuratorObservation,
    LawFit,
    RankFrequencyLaw,
    _CountNoise,
    _noise_scale,
    _PassProbability,
    _threshold,
    fit_rank_law,
)


@dataclass
class PopulationModel:
    """A distribution of records from which synthetic populations are drawn.

    Attributes
    ----------
    record_query : int array
        Query index of each head record (queries ``0..n_queries-1``).
    record_p : float array
        Probability of each head record.
    query_tail : float array, one per query
        Mass of the query outside its head records (each draw: a fresh URL of the query).
    url_level : bool
        False: records are queries (single-item logs).
    source : str
        ``'privatized'`` (fitted to the curator's DP outputs) or ``'prior'``.
    description : str
        One line on where the model comes from.
    parameters : dict
        The fitted / prior parameters, for the output.
    """

    record_query: np.ndarray
    record_p: np.ndarray
    query_tail: np.ndarray
    url_level: bool
    source: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def n_queries(self) -> int:
        return len(self.query_tail)

    @property
    def singleton_mass(self) -> float:
        """Mass of the records that occur once (fresh query and URL per draw)."""
        return max(0.0, 1.0 - float(self.record_p.sum()) - float(self.query_tail.sum()))

    def sample_log(self, n_users: int, rng: np.random.Generator) -> RecordLog:
        """N users with one record each, drawn i.i.d. from the model.

        Head record ``j`` has URL id ``j``; a draw of a query tail or of the singleton mass gets
        a fresh URL id (and a singleton a fresh query id too).
        """
        n_rec = len(self.record_p)
        tails = np.flatnonzero(self.query_tail > 0)
        prob = np.concatenate([self.record_p, self.query_tail[tails], [self.singleton_mass]])
        cum = np.cumsum(prob)
        cat = np.minimum(np.searchsorted(cum, rng.random(n_users) * cum[-1], side="right"), len(prob) - 1)
        query = np.empty(n_users, dtype=np.int64)
        url = np.empty(n_users, dtype=np.int64)
        head = cat < n_rec
        query[head] = self.record_query[cat[head]]
        url[head] = cat[head]
        fresh = np.flatnonzero(~head)
        is_tail = cat[fresh] < n_rec + len(tails)
        query[fresh[is_tail]] = tails[cat[fresh[is_tail]] - n_rec]
        single = fresh[~is_tail]
        query[single] = self.n_queries + np.arange(len(single))
        url[fresh] = n_rec + np.arange(len(fresh))
        if not self.url_level:
            url[:] = NO_URL
        n_q = self.n_queries + len(single)
        n_u = n_rec + len(fresh)
        return RecordLog(np.arange(n_users + 1, dtype=np.int64), query.astype(np.int32), url.astype(np.int32),
                         SyntheticVocabulary(n_q, "query "), SyntheticVocabulary(max(n_u, 1), "http://www.site"),
                         self.url_level)

    def head_list_s_moments(self, n_s: int, epsilon: float, delta: float, noise: str) -> tuple[float, float]:
        """Mean and variance of |HL_S| when CreateHeadList runs on ``n_s`` records drawn from the model.

        Record r passes when Poisson(n_s·p_r) + Y > τ, independently (Poisson approximation of the
        multinomial); query tails and singletons (fresh ids, seen once) essentially never pass.
        """
        scale = _noise_scale(noise, epsilon, 1)
        pp = _PassProbability(_CountNoise(noise, scale), _threshold(noise, epsilon, delta, 1))(n_s * self.record_p)
        return float(pp.sum()), float((pp * (1.0 - pp)).sum())

    def safe_head_list_size(self, n_s: int, epsilon: float, delta: float, noise: str, z: float = 2.326) -> int:
        """The M that CreateHeadList reaches with probability ~99% (normal approximation of |HL_S|)."""
        mean, var = self.head_list_s_moments(n_s, epsilon, delta, noise)
        return max(0, math.floor(mean - z * math.sqrt(var)))

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "description": self.description, "parameters": self.parameters}


def _shrink(estimate: np.ndarray, var: np.ndarray, prior: np.ndarray, prior_sd: np.ndarray) -> np.ndarray:
    """Precision-weighted blend of an estimate (variance ``var``) and a prior value (sd ``prior_sd``)."""
    pv = np.maximum(prior_sd, 1e-15) ** 2
    w = pv / (pv + np.maximum(var, 1e-30))
    return w * estimate + (1.0 - w) * prior


def _listed_records(inputs: PrivatizedInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query index, estimate p̂_O and its variance of each listed record (without URLs: each listed query)."""
    hl, est = inputs.head_list, inputs.optin
    if inputs.url_level:
        real = np.flatnonzero(~hl.is_wildcard)
        return hl.entry_query[real], est.p_record[real], est.var_record[real]
    k = hl.n_queries
    return np.arange(k), est.p_query[:k], est.var_query[:k]


def _listed_probabilities(law: RankFrequencyLaw, rec_est: np.ndarray, rec_var: np.ndarray) -> np.ndarray:
    """Probability of each listed record: the law at its noisy rank, shrunk to its estimate (TUNE.md model, item 1)."""
    m = len(rec_est)
    rank = np.empty(m)
    rank[np.argsort(-rec_est, kind="stable")] = np.arange(1, m + 1)
    law_p = law.density(rank)
    return np.maximum(_shrink(rec_est, rec_var, law_p, LAW_UNCERTAINTY * law_p), 0.05 * law_p)


def _query_tails(inputs: PrivatizedInputs, listed_mass: np.ndarray, m: int) -> tuple[np.ndarray, float, float]:
    """Tail mass of each listed query, the tail ratio ρ and the new-query rate ν (TUNE.md model, items 1-2)."""
    k = inputs.head_list.n_queries
    if not inputs.url_level:
        return np.zeros(k), 0.0, 1.0
    wc = inputs.head_list.wildcard_entry[:k]
    t_est = np.maximum(inputs.optin.p_record[wc], 0.0)
    rho = float(np.clip(t_est.sum() / max(listed_mass.sum(), 1e-12), 0.0, 10.0))
    t_q = np.maximum(_shrink(t_est, inputs.optin.var_record[wc], rho * listed_mass, rho * listed_mass), 0.0)
    return t_q, rho, k / m


def _extrapolated_probabilities(law: RankFrequencyLaw, m: int, p_cut: float, budget: float,
                                rho: float, nu: float) -> np.ndarray:
    """The law past the m listed ranks down to ``p_cut``, within 98% of the mass ``budget`` (TUNE.md model, item 1)."""
    r_end = int(min(max(law.rank_of(p_cut), m), m + MAX_EXTRAPOLATED))
    ext_p = law.density(np.arange(m + 1, r_end + 1))
    grow = np.cumsum(ext_p * (1.0 + rho * nu))
    n_ext = int(np.searchsorted(grow, max(budget, 0.0) * 0.98, side="right"))
    return ext_p[:n_ext]


def _attach_extrapolated(ext_p: np.ndarray, query_mass: np.ndarray, k: int, rho: float, nu: float, url_level: bool,
                         seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Query index of each extrapolated record and whether it opens a new query (TUNE.md model, item 1).

    ``query_mass``: the mass of each of the ``k`` listed queries (listed records and tail), the weights of the
    preferential attachment; ``rng`` draws first which records are new, then the attachments.
    """
    rng = np.random.default_rng(seed)
    is_new = rng.random(len(ext_p)) < nu
    if not url_level:
        is_new[:] = True
    new_id = k + np.cumsum(is_new) - 1  # query index of a new query
    # preferential attachment: weights of queries in creation order (listed, then new ones)
    weights = np.concatenate([query_mass, ext_p[is_new] * (1.0 + rho)])
    cum_w = np.cumsum(weights)
    n_before = k + np.cumsum(is_new) - is_new  # queries that exist when record j arrives
    att = np.flatnonzero(~is_new)
    ext_q = np.where(is_new, new_id, 0)
    if len(att):
        total_before = cum_w[n_before[att] - 1]
        ext_q[att] = np.minimum(np.searchsorted(cum_w, rng.random(len(att)) * total_before, side="right"),
                                n_before[att] - 1)
    return ext_q, is_new


def _model_records(rec_q: np.ndarray, p_listed: np.ndarray, t_q: np.ndarray, ext_q: np.ndarray, ext_p: np.ndarray,
                   is_new: np.ndarray, k: int, rho: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query and probability of each head record, and each query's tail mass; total <= 1 (TUNE.md model, items 1-3)."""
    attached_listed = np.bincount(ext_q[ext_q < k], weights=ext_p[ext_q < k], minlength=k)
    tails = np.concatenate([np.maximum(t_q - attached_listed, 0.0), rho * ext_p[is_new]])
    record_q = np.concatenate([rec_q, ext_q]).astype(np.int64)
    record_p = np.concatenate([p_listed, ext_p])
    total = record_p.sum() + tails.sum()
    if total > 1.0:  # the listed estimates alone can exceed 1 by noise: renormalize
        record_p, tails = record_p / total, tails / total
    return record_q, record_p, tails


def _model_parameters(fit: LawFit, obs: CuratorObservation, inputs: PrivatizedInputs, m: int, rho: float, nu: float,
                      p_cut: float, n_ext: int, record_q: np.ndarray, record_p: np.ndarray,
                      tails: np.ndarray) -> dict[str, Any]:
    """The fitted law, the fit's diagnostics and the model's masses, for :attr:`PopulationModel.parameters`."""
    law, hl, k = fit.law, inputs.head_list, inputs.head_list.n_queries
    n_q = len(tails)  # the k listed queries, then one per new extrapolated query
    star = float(inputs.optin.p_record[hl.wildcard_entry[k]])
    outside = 1.0 - float(np.bincount(record_q, weights=record_p, minlength=n_q)[:k].sum() + tails[:k].sum())
    return {
        "law": "p(r) = A r^-alpha_head (r <= break_rank), continued with slope alpha_tail",
        "amplitude": round(law.amplitude, 6), "alpha_head": round(law.alpha_head, 4),
        "alpha_tail": round(law.alpha_tail, 4), "break_rank": law.break_rank,
        "fit_objective": round(fit.objective, 4), "fit_evaluations": fit.evaluations,
        "loglog_start": {"amplitude": round(fit.start[0], 6), "alpha": round(fit.start[1], 4)},
        "listed_records": m, "listed_queries": k, "n_t": obs.n_t, "n_s": obs.n_s,
        "curator_noise": obs.noise, "curator_tau": obs.tau,
        "head_list_s_records": obs.head_list_s_records,
        "head_list_s_records_fitted": round(fit.expected_head_list_s, 1),
        "new_query_rate": round(nu, 4), "query_tail_ratio": round(rho, 4),
        "extrapolated_records": n_ext, "extrapolated_to_p": p_cut,
        "head_mass": round(float(record_p.sum()), 5), "query_tail_mass": round(float(tails.sum()), 5),
        "singleton_mass": round(max(0.0, 1.0 - float(record_p.sum() + tails.sum())), 5),
        "mass_outside_listed_queries": {"estimated": round(star, 5), "model": round(outside, 5)},
    }


def model_from_inputs(inputs: PrivatizedInputs, *, population: int, optin_fraction: float,
                      reps: int = 48, seed: int | None = 0) -> PopulationModel:
    """Fit a :class:`PopulationModel` to the curator's DP outputs (docs/TUNE.md, "The population model").

    Parameters
    ----------
    inputs : the head list and opt-in estimates (:func:`load_privatized`); nothing else.
    population, optin_fraction : N and c of the deployment being tuned; they set how far the law
        is extrapolated (down to an expected count of 0.2 in the opt-in group c·N).
    reps, seed : replicas and seed of the law fit and of the query assignment.

    Returns
    -------
    PopulationModel with ``source = 'privatized'``.
    """
    obs = CuratorObservation.from_inputs(inputs)
    fit = fit_rank_law(obs, reps=reps, seed=seed)
    k = inputs.head_list.n_queries
    rec_q, rec_est, rec_var = _listed_records(inputs)
    m = len(rec_est)
    p_listed = _listed_probabilities(fit.law, rec_est, rec_var)
    listed_mass = np.bincount(rec_q, weights=p_listed, minlength=k)
    t_q, rho, nu = _query_tails(inputs, listed_mass, m)
    # extrapolation past the list, each record on a new query or attached to an earlier one
    p_cut = EXTRAPOLATION_COUNT / (optin_fraction * population)
    ext_p = _extrapolated_probabilities(fit.law, m, p_cut, 1.0 - p_listed.sum() - t_q.sum(), rho, nu)
    ext_q, is_new = _attach_extrapolated(ext_p, listed_mass + t_q, k, rho, nu, inputs.url_level, seed)
    record_q, record_p, tails = _model_records(rec_q, p_listed, t_q, ext_q, ext_p, is_new, k, rho)
    params = _model_parameters(fit, obs, inputs, m, rho, nu, p_cut, len(ext_p), record_q, record_p, tails)
    desc = (f"fitted to the privatized head list ({m} records, {k} queries) and opt-in estimates "
            f"(|D_T| = {obs.n_t:,}) in {inputs.paths[0]}, {inputs.paths[1]}")
    return PopulationModel(record_q, record_p, tails, inputs.url_level, "privatized", desc, params)


def prior_model(preset: str = PRIOR_PRESET) -> PopulationModel:
    """The fallback prior: the head records of a built-in synthetic preset, the rest singletons.

    Parameters
    ----------
    preset : ``'aol'`` (default) or ``'yandex'``; its head queries with their URL shares
        (:func:`hybriddp.datasets.synth.head_record_probabilities`).
    """
    from hybriddp.datasets.synth import get_preset, head_record_probabilities

    q, _, p = head_record_probabilities(preset)
    n_q = int(get_preset(preset).head_size)
    params = {"preset": preset, "head_records": len(p), "head_queries": n_q,
              "head_mass": round(float(p.sum()), 5), "smallest_head_p": float(p.min()),
              "singleton_mass": round(1.0 - float(p.sum()), 5)}
    desc = (f"prior: the record distribution of the built-in {preset} preset's head "
            f"({len(p):,} records of {n_q:,} queries), the rest singletons; no curator files given")
    return PopulationModel(np.asarray(q, dtype=np.int64), np.asarray(p, dtype=np.float64), np.zeros(n_q), True,
                           "prior", desc, params)

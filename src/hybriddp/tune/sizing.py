"""Sizing a round before it starts: what its opt-in group can list, and how many opt-in users it needs.

A round's head list holds the records whose noisy count in S (the share f_O of the opt-in group) exceeds the
threshold τ (ALGORITHM.md §3, Fig. 3 line 2): τ depends only on ε, δ and m_O, so a small opt-in group lists
nothing however popular its records are. :func:`forecast_round` says, from the round's public parameters and the
opt-in group's expected size, before anything is collected or charged:

* τ, the noisy count a record needs in S;
* the head list's likely size: E|HL_S| and a 90% range (capped at M), and the probability that it is empty;
* the opt-in users the round needs for one record (with 99% probability) and for all M (99%, ``None``
  past 10⁹ users);
* with the devices' expected number too, the expected generalized NDCG (ALGORITHM.md §9) from ``trials``
  simulated rounds of the library's own pipeline on populations drawn from the model.

The population model is :func:`hybriddp.tune.prior_model` (the built-in aol preset's head records, the rest
records seen once), or any :class:`~hybriddp.tune.PopulationModel` (e.g. fitted by ``hybriddp tune`` to a past
round's published documents). A record passes with P[N ≥ 1 and N + Y > τ], N ~ Poisson(|D_S|·p) (one record per
user: with m_O > 1 the noise scale and τ grow with m_O and the counts are taken as one record per user, so the
forecast is conservative), independently across records: E|HL_S| = Σ P_r, Var = Σ P_r(1 − P_r), P(empty) =
Π(1 − P_r) (docs/TUNE.md "The law fit" uses the same pass probability). Everything here reads public parameters
and a model, never data: a forecast costs no privacy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from hybriddp.core.errors import HeadListError
from hybriddp.core.noise import noise_factory
from hybriddp.core.params import BlenderParams
from hybriddp.tune.law import _CountNoise, _noise_scale, _PassProbability, _threshold
from hybriddp.tune.model import PopulationModel, prior_model

LIKELY = 0.90
"""The head list's likely range: its central 90% (normal approximation of |HL_S|)."""
SURE = 0.99
"""The opt-in users "needed" for a list size: enough that it forms with this probability."""
MAX_OPTIN = 10**9
"""Beyond this many opt-in users a list size counts as out of reach under the model."""
EMPTY_WARNING = 0.5
"""A forecast warns that the round will likely list nothing above this probability of an empty list."""
SHORT_WARNING = 0.5
"""... and that the list will likely be short when its expected size is below this share of M."""


@lru_cache(maxsize=2)
def default_model() -> PopulationModel:
    """The built-in prior (computed once per process)."""
    return prior_model()


def _prior_text(model: PopulationModel) -> str:
    p = model.parameters
    return (f"the built-in prior: the {p.get('preset', 'aol')} preset's {p.get('head_records', 0):,} head records "
            f"({p.get('head_mass', 0):.1%} of the searches), the rest seen once — your log's shape may differ")


@dataclass(frozen=True)
class RoundForecast:
    """What a round can expect (:func:`forecast_round`); every count is of opt-in users or records, never data."""

    epsilon: float
    delta: float
    m_o: int
    f_o: float
    head_list_size: int
    noise: str
    tau: float = field(metadata={"doc": "The noisy count in S a record needs to be listed (ALGORITHM.md §3)."})
    optin_for_one: int | None = field(metadata={"doc": "Opt-in users for one listed record with 99% probability."})
    optin_for_full: int | None = field(metadata={"doc": "Opt-in users for all M records (99%); null: out of reach."})
    model: str = field(metadata={"doc": "The population model the forecast assumes."})
    optin_users: int | None = field(default=None, metadata={"doc": "The opt-in users it was made for."})
    devices: int | None = field(default=None, metadata={"doc": "The devices expected to report (for the NDCG)."})
    head_list_mean: float | None = field(default=None, metadata={"doc": "Expected |HL_S| (before the cut at M)."})
    head_list_range: list[int] | None = field(
        default=None, metadata={"doc": "The list's likely size, 90% range, at most M."})
    p_empty: float | None = field(default=None, metadata={"doc": "Probability that the head list is empty."})
    ndcg: float | None = field(default=None, metadata={"doc": "Expected generalized NDCG (with devices)."})
    ndcg_trials: int = field(default=0, metadata={"doc": "Simulated rounds the NDCG is the mean of."})
    warnings: list[str] = field(default_factory=list, metadata={"doc": "A round that will likely list nothing "
                                                                       "or a short list, with the fix."})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The forecast as short sentences, for the CLI and the pages."""
        out = [f"τ = {self.tau:.4g}: a record is listed only when its noisy count among the f_O = {self.f_o:g} "
               f"share of the opt-in users exceeds it (ε = {self.epsilon:g}, δ = {self.delta:g}, m_O = {self.m_o})."]
        if self.optin_users is not None and self.head_list_mean is not None and self.head_list_range is not None:
            lo, hi = self.head_list_range
            about = min(self.head_list_mean, self.head_list_size)
            likely = f"{lo}" if lo == hi else f"{lo}–{hi}"
            out.append(f"With {self.optin_users:,} opt-in users: about {about:.0f} of M = {self.head_list_size} "
                       f"records listed (90%: {likely}); P(empty list) = {_percent(self.p_empty or 0.0)}.")
        one = f"{self.optin_for_one:,}" if self.optin_for_one is not None else f"more than {MAX_OPTIN:,}"
        full = f"{self.optin_for_full:,}" if self.optin_for_full is not None else f"more than {MAX_OPTIN:,}"
        out.append(f"Opt-in users needed (99%): {one} for one record, {full} for all M = {self.head_list_size}.")
        if self.ndcg is not None:
            out.append(f"Expected NDCG with {self.devices:,} devices: {self.ndcg:.3f} "
                       f"(mean of {self.ndcg_trials} simulated rounds).")
        out.append(f"Model: {self.model}.")
        return out


def _percent(p: float) -> str:
    return f"{100 * p:.2g}%" if p >= 0.001 else "< 0.1%"


class _Passes:
    """Pass probabilities of the model's records at a given S size (one noise law and τ per forecast)."""

    def __init__(self, model: PopulationModel, epsilon: float, delta: float, m_o: int, noise: str) -> None:
        noise_factory(noise)  # validates the name
        self.tau = _threshold(noise, epsilon, delta, m_o)
        self.prob = _PassProbability(_CountNoise(noise, _noise_scale(noise, epsilon, m_o)), self.tau)
        self.p = np.asarray(model.record_p, dtype=np.float64)

    def moments(self, n_s: int) -> tuple[float, float, float]:
        """E|HL_S|, Var|HL_S| and P(|HL_S| = 0) with ``n_s`` records in S."""
        pp = np.clip(self.prob(n_s * self.p), 0.0, 1.0)
        with np.errstate(divide="ignore"):
            log_empty = float(np.log1p(-np.minimum(pp, 1.0 - 1e-300)).sum())
        return float(pp.sum()), float((pp * (1.0 - pp)).sum()), math.exp(log_empty)

    def reaches(self, n_s: int, size: int) -> bool:
        """Whether |HL_S| ≥ ``size`` with probability ≥ :data:`SURE` (normal approximation; size 1: exact)."""
        mean, var, empty = self.moments(n_s)
        if size <= 1:
            return 1.0 - empty >= SURE
        return mean - _z(SURE) * math.sqrt(var) >= size

    def needed(self, size: int, f_o: float) -> int | None:
        """The fewest opt-in users (S = f_O of them) for :meth:`reaches` (bisection; monotone in n_s)."""
        def ok(n: int) -> bool:
            return self.reaches(max(1, round(f_o * n)), size)
        if not ok(MAX_OPTIN):
            return None
        lo, hi = 1, MAX_OPTIN
        while hi - lo > max(1, lo // 200):  # to within 0.5%
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        return hi


def _z(p: float) -> float:
    """The standard normal's p-quantile (p in (0.5, 1))."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def forecast_round(params: BlenderParams, *, noise: str = "discrete", optin_users: int | None = None,
                   devices: int | None = None, model: PopulationModel | None = None, ndcg_trials: int = 2,
                   seed: int | None = None) -> RoundForecast:
    """The forecast of a BLENDER round with ``params`` (ε, δ, m_O, f_O, M and, for the NDCG, f_C and the
    estimator): see the module docstring. ``optin_users``/``devices``: the expected group sizes (None: not
    known; the NDCG needs both and ``ndcg_trials`` ≥ 1). ``seed`` only draws the simulated populations."""
    described = model.description if model is not None else _prior_text(default_model())
    model = model or default_model()
    passes = _Passes(model, params.epsilon, params.delta, params.m_o, noise)
    m = params.head_list_size
    base = dict(epsilon=params.epsilon, delta=params.delta, m_o=params.m_o, f_o=params.f_o, head_list_size=m,
                noise=noise, tau=passes.tau, optin_for_one=passes.needed(1, params.f_o),
                optin_for_full=passes.needed(m, params.f_o), model=described)
    if optin_users is None:
        return RoundForecast(**base)  # type: ignore[arg-type]
    mean, var, empty = passes.moments(max(0, round(params.f_o * optin_users)))
    half = _z(0.5 + LIKELY / 2) * math.sqrt(var)
    likely = [min(m, max(0, math.floor(mean - half))), min(m, math.ceil(mean + half))]  # (lo, hi)
    warnings = []
    if empty > EMPTY_WARNING:
        warnings.append(f"this round will likely list nothing: with {optin_users:,} opt-in users P(empty list) = "
                        f"{_percent(empty)}, and an empty list still charges every opt-in user and ends the round; "
                        f"enrol about {base['optin_for_one'] or MAX_OPTIN:,} opt-in users, or raise ε or δ")
    elif mean < SHORT_WARNING * m:
        need = base["optin_for_full"]
        warnings.append(f"the head list will likely be short: about {mean:.0f} of M = {m} records with "
                        f"{optin_users:,} opt-in users; all {m} need about "
                        f"{f'{need:,}' if need is not None else f'more than {MAX_OPTIN:,}'}, or a smaller M")
    ndcg = None
    trials = 0
    if devices is not None and devices > 0 and ndcg_trials > 0 and empty < 1.0 - 1e-9:
        ndcg, trials = _simulated_ndcg(model, params, noise, optin_users, devices, ndcg_trials, seed)
    return RoundForecast(**base, optin_users=optin_users, devices=devices, head_list_mean=mean,  # type: ignore[arg-type]
                         head_list_range=likely, p_empty=empty, ndcg=ndcg, ndcg_trials=trials, warnings=warnings)


def _simulated_ndcg(model: PopulationModel, params: BlenderParams, noise: str, optin_users: int, devices: int,
                    trials: int, seed: int | None) -> tuple[float, int]:
    """Mean generalized NDCG of ``trials`` BLENDER simulations on populations of optin_users + devices users drawn
    from ``model`` (an empty head list scores 0)."""
    from dataclasses import replace

    from hybriddp.simulation.pipeline import run_blender
    from hybriddp.simulation.scoring import Truth, generalized_ndcg

    n = optin_users + devices
    run_params = replace(params, optin_fraction=min(max(optin_users / n, 1e-9), 1 - 1e-9))
    scores = []
    for child in np.random.SeedSequence(seed).spawn(trials):
        a, b = child.generate_state(2)
        log = model.sample_log(n, np.random.default_rng(int(a)))
        try:
            run = run_blender(log, run_params, seed=int(b), noise_factory=noise_factory(noise))
        except HeadListError:
            scores.append(0.0)
            continue
        scores.append(generalized_ndcg(run.head_list, run.blended.queries_final, run.blended.records_final,
                                       Truth.from_records(log.query, log.url), log.has_urls))
    return float(np.mean(scores)), trials

"""Scores and results: 95% intervals over trials, a scored candidate, and what :func:`tune` returns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybriddp.core.stats import t_quantile_975
from hybriddp.tune.constants import PRIVACY_NOTE
from hybriddp.tune.model import PopulationModel


@dataclass(frozen=True)
class Interval:
    """Mean over trials with a Student-t 95% interval (clipped to ``[lo_bound, hi_bound]``)."""

    mean: float
    lo: float
    hi: float
    values: tuple[float, ...] = ()

    @classmethod
    def of(cls, values: Sequence[float], lo_bound: float = -math.inf, hi_bound: float = math.inf) -> Interval:
        v = np.asarray(values, dtype=np.float64)
        mean = float(v.mean())
        half = t_quantile_975(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v)) if len(v) > 1 else math.inf
        lo, hi = max(mean - half, lo_bound), min(mean + half, hi_bound)
        return cls(mean, lo, hi, tuple(float(x) for x in v))

    def to_json(self) -> dict[str, float | None]:
        return {k: (round(v, 6) if math.isfinite(v) else None)
                for k, v in (("mean", self.mean), ("lo", self.lo), ("hi", self.hi))}


@dataclass(frozen=True)
class CandidateScore:
    """A scored (f_O, f_C, M) over a set of trials.

    Attributes
    ----------
    f_o, f_c, head_list_size : the candidate.
    ndcg, l1 : generalized NDCG and record L1 over the trials.
    reached : the final head list had M records in every trial.
    min_records : the smallest head list over the trials.
    """

    f_o: float
    f_c: float
    head_list_size: int
    ndcg: Interval
    l1: Interval
    reached: bool
    min_records: int

    def to_json(self) -> dict[str, Any]:
        return {"f_o": self.f_o, "f_c": self.f_c, "head_list_size": self.head_list_size,
                "ndcg": self.ndcg.to_json(), "l1": self.l1.to_json(), "reached": self.reached,
                "min_head_list_records": self.min_records}


@dataclass
class TuneResult:
    """What :func:`tune` recommends, with the evidence.

    Attributes
    ----------
    chosen : the recommended (f_O, f_C, M), scored on fresh trials.
    paper_defaults : f_O = 0.95, f_C = 0.85 at the same M, on the same fresh trials.
    met : whether ``chosen``'s mean NDCG reaches ``target_ndcg`` (and M forms in every trial).
    model : the population model (fit source and parameters).
    knobs : when not met, the NDCG of ``chosen`` with twice the opt-in fraction and with ε + 1.
    search : grids, largest formable M per f_O, per-M best, number of simulations, seconds.
    """

    chosen: CandidateScore
    paper_defaults: CandidateScore
    met: bool
    target_ndcg: float
    model: PopulationModel
    population: int
    optin_fraction: float
    epsilon: float
    delta: float
    noise: str
    trials: int
    seed: int | None
    search: dict[str, Any]
    knobs: dict[str, Any] = field(default_factory=dict)

    @property
    def estimator(self) -> str:
        """The estimator the simulations ran (``--estimator``): the knobs are chosen for it alone."""
        return str(self.search["estimator"])

    @property
    def recommendation(self) -> str:
        return self._recommendation() + ("" if self.model.url_level else " f_C = 1: the head list has no URLs, "
                                         "so a client spends its whole budget on the query.")

    def _recommendation(self) -> str:
        c = self.chosen
        caveat = ""
        if self.search.get("fixed_head_list_size_forms_99pct") is False:
            caveat = (f" Caution: a list of {c.head_list_size} records formed in every simulated population, but the "
                      "model gives it less than a 99% chance in a round; some rounds may publish fewer records.")
        if self.met:
            return (f"Use f_O = {c.f_o:g}, f_C = {c.f_c:g}, M = {c.head_list_size}: expected NDCG "
                    f"{c.ndcg.mean:.3f} (95% interval {c.ndcg.lo:.3f}-{c.ndcg.hi:.3f}) reaches the target "
                    f"{self.target_ndcg:g}; the paper's defaults give {self.paper_defaults.ndcg.mean:.3f} at this M."
                    + caveat)
        if self.search.get("fixed_head_list_size") is not None and not c.reached:
            line = (f"M = {c.head_list_size} did not form in every simulated population (smallest list: "
                    f"{c.min_records} records); the best knobs for it are f_O = {c.f_o:g}, f_C = {c.f_c:g} "
                    f"(NDCG {c.ndcg.mean:.3f} where it forms).")
            caveat = ""
        elif self.search.get("fixed_head_list_size") is not None:
            line = (f"M = {c.head_list_size} does not reach NDCG {self.target_ndcg:g}: the best is f_O = {c.f_o:g}, "
                    f"f_C = {c.f_c:g} (NDCG {c.ndcg.mean:.3f}).")
        else:
            line = (f"No head-list size reaches NDCG {self.target_ndcg:g}: the best is M = {c.head_list_size} with "
                    f"f_O = {c.f_o:g}, f_C = {c.f_c:g} (NDCG {c.ndcg.mean:.3f}).")
        if self.knobs:
            best = max(self.knobs.values(), key=lambda v: v["ndcg"]["mean"])
            line += f" Turn up {best['option']} first: {best['label']} gives NDCG {best['ndcg']['mean']:.3f}."
        else:
            line += " Increase --optin-fraction (more opt-in users) or --epsilon."
        return line + caveat

    def to_json(self) -> dict[str, Any]:
        c = self.chosen
        out: dict[str, Any] = {
            "f_o": c.f_o, "f_c": c.f_c, "head_list_size": c.head_list_size,
            "ndcg": c.ndcg.to_json(), "l1": c.l1.to_json(), "reached": c.reached,
            "paper_defaults": self.paper_defaults.to_json(),
            "fit": self.model.to_json(),
            "target_ndcg": self.target_ndcg, "met": self.met,
            "recommendation": self.recommendation,
            "population": self.population, "optin_fraction": self.optin_fraction,
            "epsilon": self.epsilon, "delta": self.delta, "noise": self.noise, "trials": self.trials,
            "seed": self.seed, "privacy": PRIVACY_NOTE,
            "interval": "Student-t 95% interval of the mean over fresh simulated trials (simulation randomness "
                        "under the fitted model; the fit's own uncertainty is not included)",
            "search": self.search,
        }
        if self.knobs:
            out["knobs"] = self.knobs
        return out

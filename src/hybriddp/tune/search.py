"""The search: :func:`tune`, its input checks, the M grid and the paired comparisons of candidates.

"TUNE.md search, i" (or "search, i") refers to step i of docs/TUNE.md, "The search".
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hybriddp.core.errors import HeadListError, parameter_error
from hybriddp.core.estimators import DEFAULT_ESTIMATOR
from hybriddp.core.noise import noise_factory
from hybriddp.core.params import (
    LN_MAX,
    check_delta,
    check_epsilon_for_head_list,
    check_fraction,
    check_head_list_params,
    check_positive_int,
    check_seed,
)
from hybriddp.core.stages import StatusFn
from hybriddp.simulation.scoring import Truth
from hybriddp.tune.constants import (
    COARSE_F_C,
    GRID_F_C,
    GRID_F_O,
    L1_TOLERANCE,
    M_FLOOR,
    M_RATIO,
    MAX_POPULATION,
    MAX_POPULATION_TRIALS,
    MIN_POPULATION,
    NDCG_TIE,
    PAPER_F_C,
    PAPER_F_O,
)
from hybriddp.tune.inputs import PrivatizedInputs
from hybriddp.tune.model import PopulationModel, model_from_inputs, prior_model
from hybriddp.tune.result import CandidateScore, Interval, TuneResult
from hybriddp.tune.simulate import _POPULATIONS, _SETTINGS, _Population, _Simulator

MAX_EPSILON = LN_MAX - 1.0
"""≈ 708.78: the simulations run LocalAlg with f_C up to 1 (a log without URLs) and, when the target is out of
reach, at ε + 1; e^{ε'} must stay finite."""


def m_grid(m_max: int, ratio: float = M_RATIO, floor: int = M_FLOOR) -> list[int]:
    """Geometric grid of head-list sizes from ``m_max`` down to ``min(floor, m_max)``, descending."""
    floor = max(1, min(floor, m_max))
    out = [m_max]
    x = float(m_max)
    while True:
        x /= ratio
        m = round(x)
        if m < floor:
            break
        if m < out[-1]:
            out.append(m)
    if out[-1] > floor:
        out.append(floor)
    return out


def check_tune_inputs(population: int, optin_fraction: float, epsilon: float, delta: float,
                      target_ndcg: float, trials: int, head_list_size: int | None = None) -> None:
    """Validate the knobs of :func:`tune`; errors name the option, the value and the fix."""
    if head_list_size is not None:
        check_positive_int("head_list_size", head_list_size)
    if (isinstance(population, bool) or not isinstance(population, int)
            or not MIN_POPULATION <= population <= MAX_POPULATION):
        raise parameter_error("population (--population)", population,
                              f"an integer from {MIN_POPULATION:,} to {MAX_POPULATION:,}",
                              "Give the number of users of your deployment; beyond, the simulated populations do "
                              "not fit in memory.")
    check_fraction("optin_fraction", optin_fraction)
    if isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > MAX_EPSILON:
        raise parameter_error("epsilon (--epsilon)", epsilon, f"<= {MAX_EPSILON:.2f}: tune simulates LocalAlg with "
                              "f_C up to 1 and at epsilon + 1, and e^(epsilon + 1) must stay finite",
                              "Values above ~20 keep every report unchanged with probability ~1 anyway.")
    check_epsilon_for_head_list(epsilon)
    check_delta(delta)
    check_head_list_params(epsilon, delta, 1)
    if not (isinstance(target_ndcg, (int, float)) and 0.0 < target_ndcg <= 1.0):
        raise parameter_error("target_ndcg (--target-ndcg)", target_ndcg, "in (0, 1]",
                              "The paper's bar is 0.95.")
    if isinstance(trials, bool) or not isinstance(trials, int) or not 2 <= trials <= 100:
        raise parameter_error("trials (--trials)", trials, "an integer between 2 and 100",
                              "A 95% interval needs at least 2 trials; 3 is the default.")
    if trials * population > MAX_POPULATION_TRIALS:
        raise parameter_error("trials (--trials)", trials, f"at most {MAX_POPULATION_TRIALS // population:,} with "
                              f"--population {population:,}: 2 x trials synthetic populations are held in memory "
                              f"(~45 bytes per user), and trials x population must stay <= {MAX_POPULATION_TRIALS:,}",
                              "3 trials (the default) give 95% intervals.")


def check_inputs_consistent(inputs: PrivatizedInputs, population: int) -> None:
    """The curator's files must fit the deployment: its opt-in group cannot exceed the population."""
    n_optin = inputs.sizes.get("optin_users")
    if isinstance(n_optin, int) and n_optin > population:
        raise parameter_error("population (--population)", population,
                              f">= the {n_optin:,} opt-in users {inputs.paths[1]} was computed from",
                              "Give the number of users of the whole deployment (opt-in users and clients).")


def default_delta(population: int) -> float:
    """The paper's δ for the scale: 1e-5 below a million users (AOL), 1e-7 above (Yandex)."""
    return 1e-5 if population < 1_000_000 else 1e-7


def tune(
    population: int, optin_fraction: float, epsilon: float, delta: float | None = None, *,
    target_ndcg: float = 0.95, inputs: PrivatizedInputs | None = None, trials: int = 3,
    seed: int | None = None, noise: str = "discrete", workers: int | None = None,
    progress: StatusFn | None = None, head_list_size: int | None = None, estimator: str = DEFAULT_ESTIMATOR,
) -> TuneResult:
    """Pick f_O, f_C and the largest M whose expected generalized NDCG reaches ``target_ndcg``.

    Parameters
    ----------
    population : N, the number of users of the deployment (>= 1,000).
    optin_fraction : c, the share of them in the opt-in group, in (0, 1).
    epsilon, delta : the privacy budget every user gets (ε > ln 2; δ in (0, 1), default
        :func:`default_delta`).
    target_ndcg : the generalized NDCG to reach, in (0, 1].
    inputs : the curator's DP outputs (:func:`load_privatized`); None uses the prior
        (:func:`prior_model`). Raw records are never an input.
    trials : simulated populations per candidate (and fresh ones for the final scores), >= 2.
    seed : seed of the fit and the simulations (None: OS randomness). Tuning handles DP outputs
        only, so a seed costs no privacy here.
    noise : curator noise to simulate: ``'discrete'`` (hybriddp's default) or ``'laplace'``.
    workers : worker processes (default: the number of CPUs); 1 runs everything in-process.
    progress : optional callback receiving a short status line.
    head_list_size : fix M instead of searching it (e.g. the 10 records a device can hold): only
        (f_O, f_C) are chosen, by one probe at that M; ``met`` tells whether the target is reached.

    Returns
    -------
    TuneResult

    Raises
    ------
    ParameterError
        A knob out of range (message names the option, value and fix).
    HeadListError
        No head list forms in the simulated populations at all.
    """
    delta = default_delta(population) if delta is None else delta
    check_tune_inputs(population, optin_fraction, epsilon, delta, target_ndcg, trials, head_list_size)
    check_seed(seed)
    noise_factory(noise)  # validates the name
    say = progress or (lambda msg: None)
    started = time.perf_counter()
    ss = np.random.SeedSequence(seed)
    fit_ss, search_ss, fresh_ss = ss.spawn(3)
    if inputs is not None:
        say("fitting the population model to the privatized files")
        model = model_from_inputs(inputs, population=population, optin_fraction=optin_fraction,
                                  seed=int(fit_ss.generate_state(1)[0]))
    else:
        model = prior_model()
    fit_seconds = time.perf_counter() - started
    say(f"drawing {2 * trials} synthetic populations of {population:,} users")
    for group, gss in (("search", search_ss), ("fresh", fresh_ss)):
        pops = []
        for child in gss.spawn(trials):
            a, b = child.generate_state(2)
            log = model.sample_log(population, np.random.default_rng(int(a)))
            pops.append(_Population(log, Truth.from_records(log.query, log.url), int(b)))
        _POPULATIONS[group] = pops
    _SETTINGS.update(delta=delta, noise=noise, estimator=estimator)
    workers = max(1, min(workers or os.cpu_count() or 1, 32))
    try:
        with _Simulator(workers, epsilon, optin_fraction) as sim:
            result = _search(sim, model, population, optin_fraction, epsilon, delta, target_ndcg, trials, seed,
                             noise, say, head_list_size)
    finally:
        _POPULATIONS.clear()
    result.search["simulations"] = sim.simulations
    result.search["estimator"] = estimator
    result.search["fit_seconds"] = round(fit_seconds, 2)
    result.search["seconds"] = round(time.perf_counter() - started, 2)
    result.search["workers"] = workers
    return result


_Accepted = tuple[CandidateScore, CandidateScore]
"""A passing probe's fresh scores: the chosen candidate and the paper's defaults at the same M."""


def _search(sim: _Simulator, model: PopulationModel, population: int, c: float, epsilon: float, delta: float,
            target: float, trials: int, seed: int | None, noise: str, say: StatusFn,
            fixed_m: int | None = None) -> TuneResult:
    """The recommendation: the largest passing M and its best (f_O, f_C), else the best probed (TUNE.md search)."""
    safe, formable, m_max, fixed_safe = _formable_sizes(sim, model, population, c, epsilon, delta, noise, say,
                                                        fixed_m)
    grid = [fixed_m] if fixed_m is not None else m_grid(m_max)
    url_level = model.url_level  # without URLs f_C does not matter: LocalAlg spends the whole budget on the query
    probes = _Probes(sim, grid, formable, target, url_level, say)
    chosen = _largest_passing(probes)
    met = chosen is not None
    knobs: dict[str, Any] = {}
    if chosen is None:
        chosen, knobs = _out_of_reach(sim, probes, c, epsilon, say)
    if not url_level:  # simulated at the paper's f_C, which the pipeline replaces by 1 for a log without URLs
        chosen = (replace(chosen[0], f_c=1.0), replace(chosen[1], f_c=1.0))
    search = {
        "f_o_grid": list(GRID_F_O), "f_c_grid": list(GRID_F_C) if url_level else [1.0], "m_grid": grid,
        "max_formable_m": {f"{fo:g}": int(v) for fo, v in formable.items()},
        "head_list_s_99pct": {f"{fo:g}": int(v) for fo, v in safe.items()}, "path": probes.path,
        "fixed_head_list_size": fixed_m, "fixed_head_list_size_forms_99pct": fixed_safe,
    }
    return TuneResult(chosen[0], chosen[1], met, target, model, population, c, epsilon, delta, noise, trials, seed,
                      search, knobs)


def _formable_sizes(sim: _Simulator, model: PopulationModel, population: int, c: float, epsilon: float,
                    delta: float, noise: str, say: StatusFn,
                    fixed_m: int | None) -> tuple[dict[float, int], dict[float, int], int, bool | None]:
    """Per f_O the ~99% |HL_S| and the largest formable M; their maximum; does ``fixed_m`` form at 99% (search, 1)."""
    say("finding the largest head list each f_O can form")
    n_optin = round(c * population)
    safe = {fo: model.safe_head_list_size(round(fo * n_optin), epsilon, delta, noise) for fo in GRID_F_O}
    in_trials = {fo: min(sim.head_list_s("search", fo)) for fo in GRID_F_O}
    formable = {fo: min(in_trials[fo], safe[fo]) for fo in GRID_F_O}
    m_max = max(formable.values())
    fixed_safe = None
    if fixed_m is not None:
        fixed_safe = fixed_m <= m_max
        if not fixed_safe and fixed_m <= max(in_trials.values()):
            # the user's M forms in every simulated trial but not with the model's 99%: still choose
            # the best knobs for it, among the f_O that formed it, and say so in the recommendation
            formable, m_max = in_trials, max(in_trials.values())
    _check_forms(m_max, fixed_m, population, c, epsilon, delta)
    return safe, formable, m_max, fixed_safe


def _check_forms(m_max: int, fixed_m: int | None, population: int, c: float, epsilon: float, delta: float) -> None:
    """Raise :class:`HeadListError` when ``fixed_m`` (or, without it, any head list) cannot form."""
    if fixed_m is not None and fixed_m > m_max:
        raise HeadListError(
            f"no f_O forms a head list of {fixed_m} records: with {population:,} users and opt-in fraction {c:g} "
            f"the simulated opt-in group forms at most {m_max} (epsilon {epsilon:g}, delta {delta:g}). Lower "
            "--head-list-size, or increase --optin-fraction or --epsilon.")
    if m_max < 1:
        raise HeadListError(
            f"no head list forms: with {population:,} users and opt-in fraction {c:g} no record of the simulated "
            f"opt-in group passes the privacy threshold (epsilon {epsilon:g}, delta {delta:g}). Increase "
            "--optin-fraction or --epsilon.")


@dataclass
class _Probes:
    """The probes of one search (TUNE.md search, 2) and the state they carry from one to the next.

    Attributes
    ----------
    fc_cur : the f_C the next probe's f_O scan runs at (the paper's, then the last probe's best).
    path : one row per probe, in order, for the output.
    results : per probed grid index, the best candidate and, when the probe passed, its fresh scores.
    """

    sim: _Simulator
    grid: list[int]
    formable: dict[float, int]
    target: float
    url_level: bool
    say: StatusFn
    fc_cur: float = PAPER_F_C
    path: list[dict[str, Any]] = field(default_factory=list)
    results: dict[int, tuple[CandidateScore, _Accepted | None]] = field(default_factory=dict)

    def probe(self, i: int) -> bool:
        """Best (f_O, f_C) at M = grid[i]; True when it reaches the target on fresh populations too."""
        m = self.grid[i]
        self.say(f"M = {m}: scanning f_O and f_C")
        best = self._best_knobs(m)
        self.fc_cur = best.f_c
        row: dict[str, Any] = {"head_list_size": m, "f_o": best.f_o, "f_c": best.f_c if self.url_level else 1.0,
                               "ndcg_search": round(best.ndcg.mean, 5)}
        self.path.append(row)
        accepted = self._confirm(best, m, row) if best.ndcg.mean >= self.target else None
        self.results[i] = (best, accepted)
        return accepted is not None

    def _best_knobs(self, m: int) -> CandidateScore:
        """The best search-trial candidate at M = ``m``: f_O scan at the current f_C, then the f_C climb."""
        fos = [fo for fo in sorted(GRID_F_O, reverse=True) if self.formable[fo] >= m]  # the default 0.95 first
        best = _best(self.sim.score("search", [(fo, self.fc_cur, m) for fo in fos]), self.target)
        if self.url_level:
            if not self.results:  # first probe: a coarse f_C scan before the local climb
                coarse = self.sim.score("search", [(best.f_o, fc, m) for fc in COARSE_F_C])
                best = _best([best, *coarse], self.target)
            best = _climb_f_c(self.sim, best, self.target)
        return best

    def _confirm(self, best: CandidateScore, m: int, row: dict[str, Any]) -> _Accepted | None:
        """Fresh scores of ``best`` and of the paper's defaults at M = ``m``, when ``best`` still passes on them."""
        self.say(f"M = {m}: re-simulating on fresh populations")
        fresh, paper = self.sim.score("fresh", [(best.f_o, best.f_c, m), (PAPER_F_O, PAPER_F_C, m)])
        row["ndcg_fresh"] = round(fresh.ndcg.mean, 5)
        row["reached_fresh"] = fresh.reached
        if fresh.reached and fresh.ndcg.mean >= self.target:
            return (fresh, paper)
        return None


def _largest_passing(probes: _Probes) -> _Accepted | None:
    """Fresh scores of the largest passing M of the grid (largest, smallest, then bisection: TUNE.md search, 3)."""
    last = len(probes.grid) - 1
    if probes.probe(0):
        return probes.results[0][1]
    if last > 0 and probes.probe(last):
        lo, hi = 0, last  # grid[lo] fails, grid[hi] passes: bisect for the largest passing M
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probes.probe(mid):
                hi = mid
            else:
                lo = mid
        return probes.results[hi][1]
    return None


def _out_of_reach(sim: _Simulator, probes: _Probes, c: float, epsilon: float,
                  say: StatusFn) -> tuple[_Accepted, dict[str, Any]]:
    """Fresh scores of the best probed candidate; its NDCG at twice the opt-in fraction and at ε + 1 (search, 3)."""
    best_seen = max((b for b, _ in probes.results.values()), key=_key)
    m = best_seen.head_list_size
    fresh, paper = sim.score("fresh", [(best_seen.f_o, best_seen.f_c, m), (PAPER_F_O, PAPER_F_C, m)])
    say("no M reaches the target: trying a larger opt-in fraction and epsilon")
    cand = [(fresh.f_o, fresh.f_c, m)]
    knobs: dict[str, Any] = {}
    c2 = min(2 * c, 0.5)
    if c2 > c:
        s = sim.score("fresh", cand, optin_fraction=c2)[0]
        knobs["optin_fraction"] = {"option": "--optin-fraction", "label": f"--optin-fraction {c2:g}",
                                   "value": c2, "ndcg": s.ndcg.to_json()}
    s = sim.score("fresh", cand, epsilon=epsilon + 1.0)[0]
    knobs["epsilon"] = {"option": "--epsilon", "label": f"--epsilon {epsilon + 1:g}", "value": epsilon + 1.0,
                        "ndcg": s.ndcg.to_json()}
    return (fresh, paper), knobs


def _key(s: CandidateScore) -> tuple[bool, float]:
    return (s.reached, s.ndcg.mean)


def _better(a: CandidateScore, b: CandidateScore, target: float | None = None) -> bool:
    """Is challenger ``a`` clearly better than incumbent ``b`` (scored on the same trials)?

    Reaching M comes first. Then the mean generalized NDCG decides when the paired difference
    exceeds :data:`NDCG_TIE` and two paired standard errors — except that once the incumbent
    already reaches ``target``, a higher NDCG does not buy a clearly worse L1 (higher by more than
    two paired standard errors and by more than :data:`L1_TOLERANCE` of the incumbent's): the
    target is met, so L1 (trend estimation) is not traded away for NDCG nobody asked for.
    Otherwise (an NDCG tie) ``a`` wins only with a mean NDCG at least the incumbent's and a lower
    L1 by more than two paired standard errors. Ties keep the incumbent, so a knob moves away
    from the paper's default only on evidence, never on simulation noise.
    """
    if a.reached != b.reached:
        return a.reached
    d, se = _paired(a.ndcg, b.ndcg)
    dl, sel = _paired(a.l1, b.l1)
    if abs(d) > max(NDCG_TIE, 2.0 * se):
        if d < 0:
            return False
        l1_clearly_worse = dl > 2.0 * sel and dl > L1_TOLERANCE * abs(b.l1.mean)
        return not (target is not None and b.ndcg.mean >= target and l1_clearly_worse)
    return d >= 0 and dl < 0 and -dl > 2.0 * sel


def _paired(a: Interval, b: Interval) -> tuple[float, float]:
    """Mean paired difference a − b over the trials and its standard error."""
    if len(a.values) != len(b.values) or not a.values:
        return a.mean - b.mean, 0.0
    diff = np.asarray(a.values) - np.asarray(b.values)
    se = float(diff.std(ddof=1)) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
    return float(diff.mean()), se


def _best(scores: Sequence[CandidateScore], target: float | None = None) -> CandidateScore:
    """The best of ``scores`` by :func:`_better`, in order (the first is the incumbent: it wins ties)."""
    best = scores[0]
    for s in scores[1:]:
        if _better(s, best, target):
            best = s
    return best


def _climb_f_c(sim: _Simulator, best: CandidateScore, target: float | None = None) -> CandidateScore:
    """Hill-climb f_C by 0.05 from ``best`` (at its f_O and M) while the candidate improves (:func:`_better`)."""
    for direction in (+1, -1):
        while True:
            fc = round(best.f_c + 0.05 * direction, 2)
            if not GRID_F_C[0] - 1e-9 <= fc <= GRID_F_C[-1] + 1e-9:
                break
            s = sim.score("search", [(best.f_o, fc, best.head_list_size)])[0]
            if _better(s, best, target):
                best = s
            else:
                break
    return best

"""The rank-frequency law, the expected replay of the curator under a law, and the simulated-moments fit."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hybriddp.core.errors import DataError
from hybriddp.core.noise import effective_scale, noise_factory
from hybriddp.core.params import head_list_scale
from hybriddp.tune.constants import MIN_PASS_PROBABILITY
from hybriddp.tune.inputs import PrivatizedInputs

logger = logging.getLogger("hybriddp.tune")  # the package's logger, as before the split into modules


@dataclass(frozen=True)
class RankFrequencyLaw:
    """p(r) = A·r^(−α₁) for 1 ≤ r ≤ B, then p(B)·(r/B)^(−α₂): two power laws joined at B.

    Attributes
    ----------
    amplitude : A, the probability of rank 1.
    alpha_head : α₁, the slope over the ranks the curator's list shows.
    alpha_tail : α₂, the slope past them (extrapolation).
    break_rank : B.
    """

    amplitude: float
    alpha_head: float
    alpha_tail: float
    break_rank: int

    def density(self, r: np.ndarray | float) -> np.ndarray:
        """p(r) for ranks r ≥ 1."""
        r = np.asarray(r, dtype=np.float64)
        b = float(self.break_rank)
        head = self.amplitude * r ** -self.alpha_head
        tail = self.amplitude * b ** -self.alpha_head * (r / b) ** -self.alpha_tail
        return np.where(r <= b, head, tail)

    def rank_of(self, p: float) -> float:
        """The (real) rank r at which p(r) = p."""
        b = float(self.break_rank)
        pb = self.amplitude * b ** -self.alpha_head
        if p >= pb:
            return float((self.amplitude / p) ** (1.0 / self.alpha_head))
        return float(b * (pb / p) ** (1.0 / self.alpha_tail))


@dataclass(frozen=True)
class CuratorObservation:
    """What the curator published that the law is fitted to (all DP outputs or public sizes).

    Attributes
    ----------
    counts : float array, descending
        p̂_O·|D_T| of the listed (non-wildcard) records: noisy counts in T. A release that reuses S
        (ALGORITHM.md §4.1) estimates them from S ∪ T: p̂_O·(|D_S| + |D_T|), ``n_counted`` records.
    n_t, n_s : int
        |D_T| and |D_S| (records sampled from T and S).
    noise : str
        ``'discrete'`` or ``'laplace'``: the curator's noise on counts.
    scale : float
        Its scale, 2·m_O/ε (the rational scale actually used for discrete noise).
    tau : float
        CreateHeadList's threshold for that noise.
    head_list_s_records : int or None
        |HL_S|, the records CreateHeadList kept (None when the file does not say).
    n_counted : int
        The records behind ``counts``: |D_T|, or |D_S| + |D_T| when S is reused (0 means |D_T|). The
        fit then treats the listed counts as counts in that many records, ranked by themselves, which
        is how ``reuse`` trims; the S counts' selection above τ and their second noise draw are left out of
        the model.
    """

    counts: np.ndarray
    n_t: int
    n_s: int
    noise: str
    scale: float
    tau: float
    head_list_s_records: int | None = None
    n_counted: int = 0

    @property
    def n_counts(self) -> int:
        """Records behind the listed counts (:attr:`n_counted`, or |D_T|)."""
        return self.n_counted or self.n_t

    @classmethod
    def from_inputs(cls, inputs: PrivatizedInputs) -> CuratorObservation:
        """Collect the observation from the two files."""
        params, sizes = inputs.params, inputs.sizes
        eps, delta, m_o = float(params["epsilon"]), float(params["delta"]), int(params.get("m_o", 1))
        noise = str(inputs.estimates.get("noise", "laplace"))
        if noise not in ("discrete", "laplace"):
            raise DataError(f"{inputs.paths[1]}: unknown curator noise {noise!r} (expected 'discrete' or 'laplace')")
        hl, est = inputs.head_list, inputs.optin
        if inputs.url_level:
            values = est.p_record[~hl.is_wildcard]
            hls = sizes.get("head_list_s_records")
        else:
            values = est.p_query[:hl.n_queries]
            hls = sizes.get("head_list_s_queries")
        n_t = int(est.n)
        n_s = sizes.get("records_s")
        if not isinstance(n_s, int) or n_s < 1:
            f_o = float(params["f_o"])
            n_s = max(1, round(n_t * f_o / (1.0 - f_o)))
        n_counted = n_t + int(est.n_s) if est.reused is not None else n_t
        return cls(np.sort(values * n_counted)[::-1], n_t, int(n_s), noise, _noise_scale(noise, eps, m_o),
                   _threshold(noise, eps, delta, m_o), int(hls) if isinstance(hls, int) else None, n_counted)


def _noise_scale(noise: str, epsilon: float, m_o: int) -> float:
    return effective_scale(noise, head_list_scale(epsilon, m_o))


def _threshold(noise: str, epsilon: float, delta: float, m_o: int) -> float:
    return float(noise_factory(noise)(np.random.default_rng(0)).head_list_threshold(epsilon, delta, m_o))


class _CountNoise:
    """The curator's noise for the fit: survival function and (simulation-only) samples."""

    def __init__(self, kind: str, scale: float) -> None:
        self.kind, self.scale = kind, scale
        self.q = math.exp(-1.0 / scale)

    def survival(self, x: np.ndarray) -> np.ndarray:
        """P[Y > x]."""
        x = np.asarray(x, dtype=np.float64)
        if self.kind == "laplace":
            return np.where(x >= 0, 0.5 * np.exp(-np.abs(x) / self.scale), 1.0 - 0.5 * np.exp(-np.abs(x) / self.scale))
        k = np.floor(x) + 1.0  # P[Y ≥ k]; P[Y ≥ k] = 1 − P[Y ≥ 1 − k] for k ≤ 0
        upper = np.exp(-np.abs(k) / self.scale) / (1.0 + self.q)
        lower = 1.0 - np.exp(-np.abs(1.0 - k) / self.scale) / (1.0 + self.q)
        return np.where(k >= 1, upper, lower)

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        if self.kind == "laplace":
            return rng.laplace(0.0, self.scale, shape)
        p = 1.0 - self.q  # two-sided geometric = difference of two geometrics on {0, 1, ...}
        return (rng.geometric(p, shape) - rng.geometric(p, shape)).astype(np.float64)


class _PassProbability:
    """P[N ≥ 1 and N + Y > τ], N ~ Poisson(λ): the chance a record with expected S-count λ enters HL_S.

    A record enters only if it occurs in D_S (N ≥ 1; ALGORITHM.md §3). Computed exactly on a fine grid of
    log λ once, then interpolated (the function is smooth in log λ).
    """

    def __init__(self, noise: _CountNoise, tau: float) -> None:
        k0 = math.ceil(tau + 40.0 * noise.scale) + 2
        k = np.arange(k0, dtype=np.float64)
        log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, k0)))])
        survival = noise.survival(tau - k)
        survival[0] = 0.0  # N = 0: the record is not in D_S
        self.lo, self.hi = 1e-4, 8.0 * k0 + 200.0
        self.grid = np.linspace(math.log(self.lo), math.log(self.hi), 4000)
        lam = np.exp(self.grid)[:, None]
        pmf = np.exp(-lam + k[None, :] * np.log(lam) - log_factorial[None, :])
        self.values = np.clip((pmf * survival[None, :]).sum(1) + np.clip(1.0 - pmf.sum(1), 0.0, 1.0), 0.0, 1.0)
        self.values[-1] = 1.0

    def __call__(self, lam: np.ndarray) -> np.ndarray:
        lam = np.asarray(lam, dtype=np.float64)
        out = np.interp(np.log(np.clip(lam, self.lo, self.hi)), self.grid, self.values)
        return np.where(lam < self.lo, lam / self.lo * self.values[0], out)


class _CuratorReplay:
    """Expected sorted listed counts and |HL_S| under a law, by replicas with common random numbers."""

    KMAX = 80  # Poisson counts below this are drawn exactly by inversion; above, normal approximation

    def __init__(self, obs: CuratorObservation, reps: int, seed: int | None, max_ranks: int = 50_000) -> None:
        self.obs = obs
        self.reps = reps
        self.max_ranks = max_ranks
        self.noise = _CountNoise(obs.noise, obs.scale)
        self.pass_probability = _PassProbability(self.noise, obs.tau)
        self.rng = np.random.default_rng(seed)
        self.columns = 0
        self.u_pass = np.empty((reps, 0))
        self.u_count = np.empty((reps, 0))
        self.z = np.empty((reps, 0))
        self.y = np.empty((reps, 0))
        grid = np.geomspace(1e-4, 200.0, 3000)
        pp = self.pass_probability(grid)
        self.lam_min = float(grid[min(int(np.searchsorted(pp, MIN_PASS_PROBABILITY)), len(grid) - 1)])
        self.log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, self.KMAX + 1)))])

    def _ensure(self, n: int) -> None:
        """Draw the common random numbers of ranks ``columns..n-1`` (earlier ones never change)."""
        if n <= self.columns:
            return
        n = min(max(n, 2 * self.columns, 1024), self.max_ranks)
        extra = (self.reps, n - self.columns)
        self.u_pass = np.hstack([self.u_pass, self.rng.random(extra)])
        self.u_count = np.hstack([self.u_count, self.rng.random(extra)])
        self.z = np.hstack([self.z, self.rng.standard_normal(extra)])
        self.y = np.hstack([self.y, self.noise.sample(self.rng, extra)])
        self.columns = n

    def ranks(self, law: RankFrequencyLaw) -> int:
        """Ranks worth replaying: P(enter HL_S) ≥ MIN_PASS_PROBABILITY, at least the listed ones."""
        r = law.rank_of(self.lam_min / self.obs.n_s)
        return int(min(max(r, len(self.obs.counts)), self.max_ranks))

    def moments(self, law: RankFrequencyLaw) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(mean, variance) of the sorted listed counts, and of |HL_S|."""
        obs = self.obs
        m = len(obs.counts)
        rc = self.ranks(law)
        self._ensure(rc)
        p = law.density(np.arange(1, rc + 1))
        pp = self.pass_probability(obs.n_s * p)
        passed = self.u_pass[:, :rc] < pp[None, :]
        h = passed.sum(1)
        rep, rank = np.nonzero(passed)
        lam = obs.n_counts * p[rank]
        count = np.empty(len(rank))
        big = lam >= 40.0
        count[big] = np.maximum(np.round(lam[big] + np.sqrt(lam[big]) * self.z[rep[big], rank[big]]), 0.0)
        small = ~big
        if small.any():
            ls = lam[small][:, None]
            k = np.arange(self.KMAX + 1)
            cdf = np.cumsum(np.exp(-ls + k * np.log(np.maximum(ls, 1e-300)) - self.log_factorial), axis=1)
            count[small] = (cdf < self.u_count[rep[small], rank[small]][:, None]).sum(1)
        value = count + self.y[rep, rank]
        width = max(int(h.max(initial=0)), m)
        mat = np.full((self.reps, width), -2.0 * self.noise.scale)  # a missing listed record: a low count
        first = np.searchsorted(rep, np.arange(self.reps))
        mat[rep, np.arange(len(rep)) - first[rep]] = value
        mat = -np.sort(-mat, axis=1)[:, :m]
        hl_s = float(pp.sum())
        return mat.mean(0), mat.var(0), hl_s, float((pp * (1.0 - pp)).sum())


@dataclass(frozen=True)
class LawFit:
    """The fitted law and how well it reproduces the curator's outputs.

    Attributes
    ----------
    law : the fitted :class:`RankFrequencyLaw`.
    objective : mean squared standardized distance of the sorted counts (+ the |HL_S| term).
    expected_head_list_s : |HL_S| the law predicts at the curator's |D_S|.
    start : the log-log least-squares start (A, α).
    evaluations : objective evaluations of the optimizer.
    """

    law: RankFrequencyLaw
    objective: float
    expected_head_list_s: float
    start: tuple[float, float]
    evaluations: int


def fit_rank_law(obs: CuratorObservation, *, reps: int = 48, seed: int | None = 0) -> LawFit:
    """Fit (A, α₁, α₂) to the curator's published outputs by simulated moments (module docstring).

    Parameters
    ----------
    obs : the sorted noisy counts of the listed records, |D_T|, |D_S|, the noise, τ and |HL_S|.
    reps : replicas of the curator per objective evaluation (common random numbers).
    seed : seed of those replicas (the fit is then deterministic).

    Returns
    -------
    LawFit
    """
    counts = obs.counts
    m = len(counts)
    if m < 3:
        raise DataError(f"{m} listed records are too few to fit a rank-frequency law (need >= 3)")
    ranks = np.arange(1, m + 1, dtype=np.float64)
    slope, icpt = np.polyfit(np.log(ranks), np.log(np.maximum(counts, 0.5) / obs.n_counts), 1)
    a0 = float(np.clip(-slope, 0.3, 3.0))
    start = (float(math.exp(icpt)), a0)
    replay = _CuratorReplay(obs, reps, seed)
    use_hls = obs.head_list_s_records is not None
    evaluations = 0

    def objective(theta: np.ndarray) -> float:
        nonlocal evaluations
        evaluations += 1
        log_a, a1 = float(theta[0]), float(theta[1])
        a2 = float(theta[2]) if use_hls else a1
        if not (0.1 < a1 < 5.0 and 0.1 < a2 < 8.0 and -20.0 < log_a < 0.0):
            return 1e12
        law = RankFrequencyLaw(math.exp(log_a), a1, a2, m)
        mean, var, hl_s, var_hl_s = replay.moments(law)
        value = float(np.mean((counts - mean) ** 2 / (var + 0.25)))
        if use_hls:
            value += (obs.head_list_s_records - hl_s) ** 2 / (var_hl_s + 1.0)
        return value

    x0 = [math.log(start[0]), a0] + ([a0] if use_hls else [])
    x, value = _nelder_mead(objective, np.array(x0), np.array([0.3, 0.2, 0.3][:len(x0)]), tol=1e-4)
    a2 = float(x[2]) if use_hls else float(x[1])
    law = RankFrequencyLaw(float(math.exp(x[0])), float(x[1]), a2, m)
    _, _, hl_s, _ = replay.moments(law)
    logger.info("law fit: A=%.4g alpha1=%.3f alpha2=%.3f objective=%.3f (%d evaluations)",
                law.amplitude, law.alpha_head, law.alpha_tail, value, evaluations)
    return LawFit(law, value, hl_s, start, evaluations)


def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: np.ndarray, *, max_iter: int = 300,
                 tol: float = 1e-5) -> tuple[np.ndarray, float]:
    """Minimize ``f`` with the Nelder-Mead simplex (standard coefficients 1, 2, ½, ½)."""
    n = len(x0)
    pts = [x0.astype(np.float64)] + [x0 + np.eye(n)[i] * step[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for it in range(max_iter):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if it > 10 and abs(vals[-1] - vals[0]) <= tol * (abs(vals[0]) + 1e-9):
            break
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2.0 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = pts[0] + 0.5 * (pts[i] - pts[0])
                    vals[i] = f(pts[i])
    i = int(np.argmin(vals))
    return pts[i], float(vals[i])

"""Simulation workers: BLENDER runs on the trial populations, in forked processes sharing them copy-on-write.

:data:`_POPULATIONS` and :data:`_SETTINGS` live here and only here: :func:`hybriddp.tune.search.tune`
fills them before the worker pool forks, and the workers read them.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hybriddp.core.errors import HeadListError
from hybriddp.core.noise import noise_factory
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog
from hybriddp.simulation.pipeline import curator_side, run_blender, split_optin
from hybriddp.simulation.scoring import Truth, generalized_ndcg, l1_queries, l1_records
from hybriddp.tune.constants import PAPER_F_C
from hybriddp.tune.result import CandidateScore, Interval


@dataclass
class _Population:
    log: RecordLog
    truth: Truth
    run_seed: int


_POPULATIONS: dict[str, list[_Population]] = {}
_SETTINGS: dict[str, Any] = {}


def _simulate(task: tuple[str, str, int, float, float, int, float, float]) -> tuple[int, float, float]:
    """One BLENDER run: (records in the final list, NDCG, L1); ``kind = 'hls'`` runs the curator only."""
    kind, group, i, f_o, f_c, m, epsilon, c = task
    pop = _POPULATIONS[group][i]
    log = pop.log
    params = BlenderParams(epsilon=epsilon, delta=_SETTINGS["delta"], optin_fraction=c, f_o=f_o, f_c=f_c,
                           head_list_size=m, estimator=_SETTINGS["estimator"])
    noise = noise_factory(_SETTINGS["noise"])
    try:
        if kind == "hls":
            optin, _ = split_optin(log.n_users, c, pop.run_seed)
            cur = curator_side(log, optin, params, seed=pop.run_seed, noise_factory=noise)
            hs = cur.head_list_s
            return (hs.n_records if log.has_urls else hs.n_queries), math.nan, math.nan
        run = run_blender(log, params, seed=pop.run_seed, noise_factory=noise)
    except HeadListError:
        return 0, 0.0, math.nan
    hl = run.head_list
    p_rec, p_q = run.blended.records_final, run.blended.queries_final
    ndcg = generalized_ndcg(hl, p_q, p_rec, pop.truth, log.has_urls)
    l1 = l1_records(hl, p_rec, pop.truth) if log.has_urls else l1_queries(hl, p_q, pop.truth)
    return (hl.n_records if log.has_urls else hl.n_queries), ndcg, l1


def _ignore_interrupt() -> None:
    """Workers ignore Ctrl-C: the parent gets it, terminates the pool and prints one line (no worker tracebacks)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Simulator:
    """Runs candidates over the trial populations, in parallel, with a cache."""

    def __init__(self, workers: int, epsilon: float, optin_fraction: float) -> None:
        self.workers = workers
        self.epsilon = epsilon
        self.c = optin_fraction
        self.cache: dict[tuple, tuple[int, float, float]] = {}
        self.simulations = 0
        self.pool: Any = None

    def __enter__(self) -> _Simulator:
        if self.workers > 1 and "fork" in mp.get_all_start_methods():
            self.pool = mp.get_context("fork").Pool(self.workers, initializer=_ignore_interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def run(self, tasks: list[tuple]) -> list[tuple[int, float, float]]:
        todo = [t for t in dict.fromkeys(tasks) if t not in self.cache]
        if todo:
            if self.pool is not None and len(todo) > 1:
                chunk = max(1, len(todo) // (4 * self.workers))
                results = self.pool.map(_simulate, todo, chunksize=chunk)
            else:
                results = [_simulate(t) for t in todo]
            self.cache.update(zip(todo, results, strict=True))
            self.simulations += sum(t[0] == "run" for t in todo)
        return [self.cache[t] for t in tasks]

    def head_list_s(self, group: str, f_o: float) -> list[int]:
        n = len(_POPULATIONS[group])
        return [r[0] for r in self.run([("hls", group, i, f_o, PAPER_F_C, 1, self.epsilon, self.c)
                                        for i in range(n)])]

    def score(self, group: str, cands: Sequence[tuple[float, float, int]], *, epsilon: float | None = None,
              optin_fraction: float | None = None) -> list[CandidateScore]:
        n = len(_POPULATIONS[group])
        eps = self.epsilon if epsilon is None else epsilon
        c = self.c if optin_fraction is None else optin_fraction
        tasks = [("run", group, i, fo, fc, m, eps, c) for fo, fc, m in cands for i in range(n)]
        res = self.run(tasks)
        out = []
        for j, (fo, fc, m) in enumerate(cands):
            rows = res[j * n:(j + 1) * n]
            sizes = [r[0] for r in rows]
            l1 = [r[2] for r in rows if not math.isnan(r[2])]
            out.append(CandidateScore(fo, fc, m, Interval.of([r[1] for r in rows], 0.0, 1.0),
                                      Interval.of(l1, 0.0) if l1 else Interval(math.nan, math.nan, math.nan),
                                      all(s == m for s in sizes), min(sizes)))
        return out

"""BLENDER(ε, δ, O, C, m_O, m_C, f_O, f_C, M), the five steps of paper Fig. 2 (ALGORITHM.md §2).

:func:`run_blender` is the simulation used by ``hybriddp run``: users are assigned to the
opt-in group at random and clients go through the batch randomizer. The curator side and
the client side are separate functions so the file-based commands (``headlist``,
``randomize``, ``estimate``) run exactly the same code with the same random streams.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from hybriddp.backends import CountingBackend, default_backend
from hybriddp.blend import Blended, blend, project_to_simplex
from hybriddp.client_estimates import ClientEstimates, estimate_client_probabilities
from hybriddp.curator import OptinEstimates, create_head_list, estimate_optin_probabilities, require_nonempty
from hybriddp.headlist import HeadList
from hybriddp.noise import DiscreteLaplaceNoise, NoiseSource
from hybriddp.params import BlenderParams
from hybriddp.randomizer import LocalAlgParams, randomize_batch
from hybriddp.records import RecordLog, SampledRecords, sample_records
from hybriddp.rng import stage_rng

NoiseFactory = Callable[[np.random.Generator], NoiseSource]


@dataclass
class Stages:
    """Records the wall time of each named stage; calls ``on_stage(name)`` when one starts."""

    on_stage: Callable[[str], None] | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.on_stage:
            self.on_stage(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def split_optin(n_users: int, optin_fraction: float, seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Simulation: round(c·|U|) users drawn at random are opt-in; the rest are clients.

    Returns sorted (opt-in user indices, client user indices); stream ``partition``.
    """
    rng = stage_rng(seed, "partition")
    n_optin = round(optin_fraction * n_users)
    optin = np.zeros(n_users, dtype=bool)
    optin[rng.choice(n_users, size=n_optin, replace=False)] = True
    return np.flatnonzero(optin), np.flatnonzero(~optin)


@dataclass
class CuratorOutput:
    """What the trusted curator computes from the opt-in group (Fig. 2 lines 1-3)."""

    head_list_s: HeadList
    optin: OptinEstimates
    sampled_s: SampledRecords
    sampled_t: SampledRecords
    n_users_s: int
    n_users_t: int
    noise: str
    tau: float
    users_s: np.ndarray | None = None  # user indices of S and T (for the privacy ledger)
    users_t: np.ndarray | None = None


def curator_side(
    log: RecordLog, optin_users: np.ndarray, params: BlenderParams, *, seed: int | None,
    noise_factory: NoiseFactory = DiscreteLaplaceNoise, backend: CountingBackend | None = None,
    stages: Stages | None = None,
) -> CuratorOutput:
    """Partition O into S and T (|S| = round(f_O·|O|)), CreateHeadList on S, estimates on T."""
    stages = stages or Stages()
    backend = backend or default_backend()
    with stages.stage("sample opt-in records"):
        perm = stage_rng(seed, "split").permutation(np.asarray(optin_users, dtype=np.int64))
        n_s = round(params.f_o * len(perm))
        users_s, users_t = np.sort(perm[:n_s]), np.sort(perm[n_s:])  # Fig. 2 line 1
        rng = stage_rng(seed, "sample_optin")
        d_s = sample_records(log, users_s, params.m_o, rng)
        d_t = sample_records(log, users_t, params.m_o, rng)
    with stages.stage("create head list"):  # Fig. 2 line 2
        noise_s = noise_factory(stage_rng(seed, "headlist_noise"))
        tau = noise_s.head_list_threshold(params.epsilon, params.delta, params.m_o)
        hl_s = create_head_list(d_s.query, d_s.url, epsilon=params.epsilon, delta=params.delta,
                                m_o=params.m_o, noise=noise_s, backend=backend)
        require_nonempty(hl_s, n_records_s=len(d_s), tau=tau)
    with stages.stage("estimate opt-in probabilities"):  # Fig. 2 line 3
        optin = estimate_optin_probabilities(
            d_t.query, d_t.url, hl_s, epsilon=params.epsilon, m_o=params.m_o,
            head_list_size=params.head_list_size, noise=noise_factory(stage_rng(seed, "optin_noise")),
            url_level=log.has_urls, backend=backend)
    return CuratorOutput(hl_s, optin, d_s, d_t, len(users_s), len(users_t), noise_s.name, tau, users_s, users_t)


def client_f_c(params: BlenderParams, url_level: bool) -> float:
    """f_C used by devices: a log without a URL level spends the whole budget on the query."""
    return params.f_c if url_level else 1.0


def sample_clients(log: RecordLog, client_users: np.ndarray, m_c: int, seed: int | None) -> SampledRecords:
    """D_C: ≤ m_C records per client, stream ``sample_clients``."""
    return sample_records(log, client_users, m_c, stage_rng(seed, "sample_clients"))


def client_side_batch(
    d_c: SampledRecords, hl: HeadList, lp: LocalAlgParams, *, seed: int | None,
    backend: CountingBackend | None = None,
) -> np.ndarray:
    """Every client's LocalAlg (vectorized), then report counts per HL entry (Fig. 2 line 4)."""
    backend = backend or default_backend()
    reports = randomize_batch(hl.map_records(d_c.query, d_c.url), hl, lp, stage_rng(seed, "randomizer"))
    return backend.count_entries(reports, hl.n_entries)


def ledger_charges(log: RecordLog, params: BlenderParams, cur: CuratorOutput,
                   client_users: np.ndarray | None = None) -> list:
    """What one round costs each user: S (ε, δ) (Theorem 1), T (ε, 0) (Theorem 2), clients (ε, δ)."""
    from hybriddp.ledger import Charge

    charges = [Charge("optin-S", log.user_keys(cur.users_s), params.epsilon, params.delta),
               Charge("optin-T", log.user_keys(cur.users_t), params.epsilon, 0.0)]
    if client_users is not None:
        charges.append(Charge("clients", log.user_keys(client_users), params.epsilon, params.delta))
    return charges


@dataclass
class BlendOutput:
    """Record- and query-level blends (Fig. 2 line 5), raw and projected."""

    records: Blended
    queries: Blended
    records_projected: np.ndarray | None
    queries_final: np.ndarray

    @property
    def records_final(self) -> np.ndarray:
        return self.records_projected if self.records_projected is not None else self.records.p


def blend_estimates(optin: OptinEstimates, client: ClientEstimates, project: bool = True) -> BlendOutput:
    """BlendProbabilities for records and for queries (ALGORITHM.md §7)."""
    rec = blend(optin.p_record, optin.var_record, client.p_record, client.var_record)
    qry = blend(optin.p_query, optin.var_query, client.p_query, client.var_query)
    projected = project_to_simplex(rec.p) if project else None
    return BlendOutput(rec, qry, projected, qry.p)


@dataclass
class BlenderRun:
    """Everything one BLENDER run computed (inputs to :mod:`hybriddp.result`)."""

    params: BlenderParams
    log: RecordLog
    curator: CuratorOutput
    lp: LocalAlgParams
    f_c_used: float
    report_counts: np.ndarray
    client: ClientEstimates
    blended: BlendOutput
    n_users_optin: int
    n_users_clients: int
    sampled_c: SampledRecords | None
    seed: int | None
    stages: Stages
    client_users: np.ndarray | None = None

    @property
    def head_list(self) -> HeadList:
        return self.curator.optin.head_list


def run_blender(
    log: RecordLog, params: BlenderParams, *, seed: int | None = None,
    noise_factory: NoiseFactory = DiscreteLaplaceNoise, backend: CountingBackend | None = None,
    stages: Stages | None = None,
) -> BlenderRun:
    """Simulate BLENDER on a log: Fig. 2 lines 1-5 (ALGORITHM.md §2)."""
    stages = stages or Stages()
    backend = backend or default_backend()
    with stages.stage("assign opt-in users"):
        optin_users, client_users = split_optin(log.n_users, params.optin_fraction, seed)
    cur = curator_side(log, optin_users, params, seed=seed, noise_factory=noise_factory,
                       backend=backend, stages=stages)
    hl = cur.optin.head_list
    f_c = client_f_c(params, log.has_urls)
    lp = LocalAlgParams.build(hl, params.epsilon, params.delta, f_c, params.m_c)
    with stages.stage("sample client records"):
        d_c = sample_clients(log, client_users, params.m_c, seed)
    with stages.stage("randomize clients"):
        counts = client_side_batch(d_c, hl, lp, seed=seed, backend=backend)
    with stages.stage("estimate client probabilities"):
        client = estimate_client_probabilities(counts, hl, lp, params.m_c)
    with stages.stage("blend"):
        blended = blend_estimates(cur.optin, client, params.project)
    return BlenderRun(params, log, cur, lp, f_c, counts, client, blended, len(optin_users),
                      len(client_users), d_c, seed, stages, client_users)

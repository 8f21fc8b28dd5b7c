"""BLENDER(ε, δ, O, C, m_O, m_C, f_O, f_C, M) as a simulation: the composition of the three
parties (paper Fig. 1, Fig. 2; ALGORITHM.md §2).

:func:`run_blender` assigns users to the opt-in group at random, runs the curator
(:func:`hybriddp.curator.party.curate`), every client's device through the vectorized
randomizer (:func:`hybriddp.device.party.simulate_devices`) and the server
(:func:`hybriddp.server.party.server_side`). The file commands (``headlist``,
``randomize``, ``estimate``) and the collection service call the same party functions with
the same random streams, so they reproduce a seeded simulation exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hybriddp.core.counting import CountingBackend, default_backend
from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import DiscreteLaplaceNoise
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog, SampledRecords
from hybriddp.core.reportlaw import LocalAlgParams
from hybriddp.core.rng import stage_rng
from hybriddp.core.stages import Stages
from hybriddp.curator.party import CuratorOutput, NoiseFactory, client_f_c, curate, curator_side
from hybriddp.curator.release import CuratorRelease
from hybriddp.device.party import sample_clients, simulate_devices
from hybriddp.privacy.guarantees import blender_guarantees, charges
from hybriddp.server.anchor import AnchorCheck, AnchorPolicy
from hybriddp.server.blend import BlendOutput
from hybriddp.server.client_estimates import ClientEstimates
from hybriddp.server.party import DEFAULT_DEFENSE, server_side
from hybriddp.server.result import BlendParts, Result
from hybriddp.simulation.evaluate import ground_truth, score, truth_vectors

if TYPE_CHECKING:
    from hybriddp.privacy.ledger import Charge

__all__ = [
    "BlenderRun", "CuratorOutput", "NoiseFactory", "Stages", "client_f_c", "curator_side", "result_from_run",
    "round_charges", "run_blender", "split_optin",
]


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
class BlenderRun:
    """Everything one simulated BLENDER round computed."""

    params: BlenderParams
    log: RecordLog
    release: CuratorRelease
    curator: CuratorOutput
    lp: LocalAlgParams
    report_counts: np.ndarray
    client: ClientEstimates
    blended: BlendOutput
    n_users_optin: int
    n_users_clients: int
    sampled_c: SampledRecords | None
    seed: int | None
    stages: Stages
    client_users: np.ndarray | None = None
    check: AnchorCheck | None = None  # the anchor check of the blend (ALGORITHM.md §7.2); None: undefended

    @property
    def head_list(self) -> HeadList:
        return self.release.head_list

    @property
    def f_c_used(self) -> float:
        return self.release.f_c

    def result(self, *, with_metrics: bool = True) -> Result:
        """The run's :class:`~hybriddp.server.result.Result`, scored against the truth (ALGORITHM.md §9)."""
        return result_from_run(self, with_metrics=with_metrics)


def run_blender(
    log: RecordLog, params: BlenderParams, *, seed: int | None = None,
    noise_factory: NoiseFactory = DiscreteLaplaceNoise, backend: CountingBackend | None = None,
    stages: Stages | None = None, with_charges: bool = False, defense: AnchorPolicy | None = DEFAULT_DEFENSE,
    carry: tuple[np.ndarray, np.ndarray] | None = None,
) -> BlenderRun:
    """Simulate BLENDER on a log: curator → devices → server (Fig. 2 lines 1-5, ALGORITHM.md §2), the server
    defended by the opt-in anchor (``defense``, §7.2; None: the undefended blend of §7).

    ``with_charges`` also computes the opt-in users' ledger charges (``run.release.charges``). ``carry``: records
    of earlier published head lists kept listed (a series, ALGORITHM.md §13.1).
    """
    stages = stages or Stages()
    backend = backend or default_backend()
    with stages.stage("assign opt-in users"):
        optin_users, client_users = split_optin(log.n_users, params.optin_fraction, seed)
    rel, cur = curate(log, params, optin_users=optin_users, seed=seed, noise_factory=noise_factory,
                      backend=backend, stages=stages, with_charges=with_charges, carry=carry)
    hl = rel.head_list
    with stages.stage("sample client records"):
        d_c = sample_clients(log, client_users, params.m_c, seed)
    lp = LocalAlgParams.build(hl, params.epsilon, params.delta, rel.f_c, params.m_c)
    with stages.stage("randomize clients"):
        counts = simulate_devices(d_c, hl, lp, seed=seed, backend=backend)
    with stages.stage("estimate client probabilities"):
        out = server_side(rel, counts, params.project, params.estimator, defense)
    return BlenderRun(params, log, rel, cur, out.lp, counts, out.client, out.blended, len(optin_users),
                      len(client_users), d_c, seed, stages, client_users, out.check)


def result_from_run(run: BlenderRun, *, with_metrics: bool = True) -> Result:
    """Build the result of a simulation, with ground truth and metrics (ALGORITHM.md §9)."""
    cur = run.curator
    hl = run.head_list
    sizes = {
        "users": run.log.n_users, "records": run.log.n_records,
        "optin_users": run.n_users_optin, "optin_users_s": cur.n_users_s, "optin_users_t": cur.n_users_t,
        "clients": run.n_users_clients, "records_s": len(cur.sampled_s), "records_t": len(cur.sampled_t),
        "reports": run.client.n, "head_list_s_records": cur.head_list_s.n_records,
        "head_list_s_queries": cur.head_list_s.n_queries,
    }
    parts = BlendParts(cur.optin, run.client, run.blended, run.f_c_used, cur.noise, run.check)
    res = Result.blender(run.params, hl, run.log.queries, run.log.urls, parts, sizes, run.seed, run.log.has_urls)
    if with_metrics and run.sampled_c is not None:
        truth, held = ground_truth(run.log, (cur.sampled_s, cur.sampled_t, run.sampled_c))
        res.truth_query, res.truth_record = truth_vectors(hl, truth)
        res.metrics = score(hl, run.blended.records_final, run.blended.queries_final, truth, run.log, held,
                            run.blended.queries_rank)
    return res


def round_charges(run: BlenderRun) -> list[Charge]:
    """Simulation: what the round costs each user — S and T (the curator's releases) and every
    client (LocalAlg), from the round's numeric guarantees (:mod:`hybriddp.privacy.guarantees`)."""
    cur, p = run.curator, run.params
    users: dict[str, Any] = {}
    if cur.users_s is not None and cur.users_t is not None:
        users.update({"optin-S": run.log.user_keys(cur.users_s), "optin-T": run.log.user_keys(cur.users_t)})
    if run.client_users is not None:
        users["clients"] = run.log.user_keys(run.client_users)
    return charges(blender_guarantees(p.epsilon, p.delta, run.f_c_used, p.m_c), users)

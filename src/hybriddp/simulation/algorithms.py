"""BLENDER and the baselines a privacy engineer would otherwise choose, behind one interface.

* ``blender``: the hybrid algorithm (ALGORITHM.md §2);
* ``optin-only``: the curator alone — head list from S, estimates from T, no clients;
* ``client-only``: clients alone over the opt-in head list, no blending;
* ``local-only``: no opt-in group at all — PEM heavy-hitter discovery over OLH, then the clients'
  two-stage LocalAlg estimation (:mod:`hybriddp.simulation.baselines.local_only`), with an aggregator that
  holds a dictionary of the existing records (the strongest local-only baseline);
* ``local-only-hashed``: the same with no dictionary — records hashed to 32 bits, PEM over the
  whole code space, false discoveries kept as records of true frequency 0;
* ``central``: everyone trusts the curator — CreateHeadList and EstimateOptinProbabilities over
  all users (the upper bound).

Every algorithm returns a :class:`hybriddp.server.result.Result` scored by :func:`hybriddp.simulation.evaluate.score`
against the truth of its own sampled records. ``blender``, ``optin-only`` and ``client-only``
come from one BLENDER run (:func:`blender_family`), so they share the head list, the samples
and the truth: their comparison is paired.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from hybriddp.core.noise import DiscreteLaplaceNoise
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog
from hybriddp.privacy.guarantees import LOCAL, Guarantee, curator_guarantees
from hybriddp.server.anchor import AnchorPolicy
from hybriddp.server.blend import project_to_simplex
from hybriddp.server.party import DEFAULT_DEFENSE, server_side
from hybriddp.server.result import Result
from hybriddp.simulation.evaluate import ground_truth, score, truth_vectors
from hybriddp.simulation.pipeline import BlenderRun, NoiseFactory, Stages, curator_side, result_from_run, run_blender

ALGORITHMS = ("blender", "optin-only", "client-only", "local-only", "local-only-hashed", "central")

HASHED_ITEM_BITS = 32
"""Code length of ``local-only-hashed``: the shortest that keeps collisions rare (~n²/2^33)."""


def _finish(res: Result, log: RecordLog, parts: tuple, project: bool, p_rank: np.ndarray | None = None) -> Result:
    """Truth and metrics of a derived result (queries ranked by ``p_rank`` when given, ALGORITHM.md §7.2)."""
    truth, held = ground_truth(log, parts)
    res.truth_query, res.truth_record = truth_vectors(res.head_list, truth)
    if project:
        res.p_record = project_to_simplex(res.p_record)
    res.metrics = score(res.head_list, res.p_record, res.p_query, truth, log, held, p_rank)
    return res


BLENDER_FAMILY = ("blender", "optin-only", "client-only", "blender-pooled")
"""What one BLENDER run gives (:func:`blender_family`), in this order."""


def blender_family(
    log: RecordLog, params: BlenderParams, *, seed: int | None = None,
    noise_factory: NoiseFactory = DiscreteLaplaceNoise, stages: Stages | None = None,
    members: Iterable[str] = BLENDER_FAMILY, defense: AnchorPolicy | None = DEFAULT_DEFENSE,
) -> dict[str, Result]:
    """``blender``, ``optin-only``, ``client-only`` and ``blender-pooled`` (the same estimates blended with
    pooled weights, ALGORITHM.md §7) from one BLENDER run (paired); only the ``members`` asked for are built.
    ``defense``: the server's check (§7.2) of the blends; None gives BLENDER as published."""
    run = run_blender(log, params, seed=seed, noise_factory=noise_factory, stages=stages, defense=defense)
    members = tuple(members)
    full = result_from_run(run, with_metrics="blender" in members)
    cur = run.curator
    parts = (cur.sampled_s, cur.sampled_t, run.sampled_c)

    def derived(name: str, p_record: np.ndarray, p_query: np.ndarray, guarantees: tuple[Guarantee, ...],
                p_rank: np.ndarray | None = None, project: bool = params.project) -> Result:
        res = Result(name, params, run.head_list, log.queries, log.urls, p_record.copy(), p_query.copy(), log.has_urls,
                     full.sizes, guarantees, seed)
        return _finish(res, log, parts, project, p_rank)

    def pooled() -> Result:  # the same reports, blended with pooled weights and checked as the run was (§7.2)
        b = server_side(run.release, run.report_counts, params.project, "pooled", run.check and run.check.policy)
        return derived("blender-pooled", b.blended.records_final, b.blended.queries_final, full.guarantees,
                       b.blended.queries_rank, project=False)  # final already: projected and agreed (§7.3)

    build: dict[str, Callable[[], Result]] = {
        "blender": lambda: full,
        "optin-only": lambda: derived("optin-only", cur.optin.p_record, cur.optin.p_query,
                                      curator_guarantees(params.epsilon, params.delta)),
        "client-only": lambda: derived("client-only", run.client.p_record, run.client.p_query, full.guarantees),
        "blender-pooled": pooled,
    }
    return {name: build[name]() for name in members}


def reblended(run: BlenderRun, estimator: str) -> BlenderRun:
    """The same run (head list, samples, reports) blended with another estimator that makes the same
    opt-in estimates (the same :class:`~hybriddp.core.estimators.Release`), e.g. ``consistent`` from a ``reuse``
    run (ALGORITHM.md §7.1): a paired comparison."""
    params = replace(run.params, estimator=estimator)
    if params.estimator_spec.release is not run.params.estimator_spec.release:
        raise ValueError(f"a {run.params.estimator!r} run cannot be reblended as {estimator!r}: "
                         "their opt-in estimates differ")
    out = server_side(run.release, run.report_counts, params.project, estimator, run.check and run.check.policy)
    return replace(run, params=params, client=out.client, blended=out.blended, check=out.check)


def run_central(log: RecordLog, params: BlenderParams, *, seed: int | None = None,
                noise_factory: NoiseFactory = DiscreteLaplaceNoise, stages: Stages | None = None) -> Result:
    """Everyone trusts the curator: S and T split all users (|S| = round(f_O·|U|))."""
    cur = curator_side(log, np.arange(log.n_users), params, seed=seed, noise_factory=noise_factory, stages=stages)
    sizes = {"users": log.n_users, "records": log.n_records, "users_s": cur.n_users_s, "users_t": cur.n_users_t,
             "head_list_s_records": cur.head_list_s.n_records}
    g = Guarantee("all-users", "CreateHeadList + EstimateOptinProbabilities", params.epsilon, params.delta,
                  "trusted-curator", "Theorems 1, 2", "S and T split all users")
    res = Result("central", params, cur.optin.head_list, log.queries, log.urls, cur.optin.p_record.copy(),
                 cur.optin.p_query.copy(), log.has_urls, sizes, (g,), seed)
    return _finish(res, log, (cur.sampled_s, cur.sampled_t), params.project)


def run_local(log: RecordLog, params: BlenderParams, *, seed: int | None = None,
              stages: Stages | None = None, item_bits: int | None = None) -> Result:
    """No opt-in group: PEM discovery + the clients' LocalAlg (see the baselines package).

    ``item_bits`` None: the dictionary coding (``local-only``); an integer: hashed codes with no
    dictionary (``local-only-hashed`` uses :data:`HASHED_ITEM_BITS`).
    """
    from hybriddp.simulation.baselines.local_only import run_local_only

    out = run_local_only(log, params, seed=seed, stages=stages, item_bits=item_bits)
    g = Guarantee("all-users", "PEM/OLH discovery + LocalAlg", params.epsilon, params.delta, LOCAL,
                  "Theorem 3", "discovery users ε-LDP, estimation users LocalAlg; disjoint groups")
    name = "local-only" if item_bits is None else "local-only-hashed"
    res = Result(name, params, out.head_list, log.queries, log.urls, out.p_record_raw.copy(),
                 out.p_query, log.has_urls, out.sizes, (g,), seed)
    return _finish(res, log, (out.sampled,), params.project)


def run_algorithm(name: str, log: RecordLog, params: BlenderParams, *, seed: int | None = None,
                  noise_factory: NoiseFactory = DiscreteLaplaceNoise, stages: Stages | None = None) -> Result:
    """Run one of :data:`ALGORITHMS` on a log."""
    if name in ("blender", "optin-only", "client-only"):
        return blender_family(log, params, seed=seed, noise_factory=noise_factory, stages=stages, members=(name,))[name]
    if name == "central":
        return run_central(log, params, seed=seed, noise_factory=noise_factory, stages=stages)
    if name == "local-only":
        return run_local(log, params, seed=seed, stages=stages)
    if name == "local-only-hashed":
        return run_local(log, params, seed=seed, stages=stages, item_bits=HASHED_ITEM_BITS)
    from hybriddp.core.errors import parameter_error
    raise parameter_error("algorithm (--algorithm)", name, "one of " + ", ".join(ALGORITHMS))

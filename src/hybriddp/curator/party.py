"""The trusted curator (paper Fig. 1, Fig. 2 lines 1–3; ALGORITHM.md §2–§4).

:func:`curate` takes the opt-in users' raw records and the parameters and returns a
:class:`~hybriddp.curator.release.CuratorRelease`: the device head list and the opt-in
estimates documents (hash-bound), their in-memory form, and the ledger charges of the
round. Raw records stay inside; only differentially private outputs leave.

Every run is charged, whatever it outputs: an empty head list (ALGORITHM.md §3.4) is itself an
output of CreateHeadList, so :func:`curate` raises :class:`~hybriddp.core.errors.EmptyHeadListError`
carrying the same ledger charges a release of the run would carry, for the caller to charge.

Randomness: with ``seed=None`` (production) the curator's noise comes from the OS CSPRNG
(``noise_class(None)``, see :mod:`hybriddp.core.noise`) and the S/T split and the per-user sampling
from a NumPy generator seeded from OS entropy; a ``seed`` makes every stage reproducible for
experiments and gives no privacy: such a release is marked ``non_private`` in both documents and its
charges are ``private=False``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hybriddp.core.counting import CountingBackend, default_backend
from hybriddp.core.errors import EmptyHeadListError
from hybriddp.core.estimators import Release
from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import DiscreteLaplaceNoise, NoiseSource
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog, SampledRecords, sample_records
from hybriddp.core.rng import stage_rng
from hybriddp.core.stages import Stages
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.curator.kept import kept_count_for
from hybriddp.curator.mechanisms import (
    create_head_list_with_counts,
    estimate_optin_probabilities,
    require_nonempty,
    reuse_s,
)
from hybriddp.curator.release import CuratorRelease, estimates_document, mark_non_private
from hybriddp.privacy.guarantees import charges, curator_guarantees
from hybriddp.privacy.ledger import Charge

NoiseFactory = Callable[[np.random.Generator | None], NoiseSource]
"""A noise class: called with a seeded generator (experiments) or None (OS randomness)."""


@dataclass
class CuratorOutput:
    """What the trusted curator computes from the opt-in group (Fig. 2 lines 1-3).

    Working data of one round, raw samples included: it never leaves the curator (the release
    documents are built from it) and simulations use it to score against the truth.
    """

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


def noise_for(factory: NoiseFactory, seed: int | None, stream: str) -> NoiseSource:
    """The curator's noise for one stream: OS randomness without a seed, else the seeded stream."""
    return factory(None if seed is None else stage_rng(seed, stream))


def client_f_c(params: BlenderParams, url_level: bool) -> float:
    """f_C used by devices: a log without a URL level spends the whole budget on the query."""
    return params.f_c if url_level else 1.0


def curator_charges(log: RecordLog, params: BlenderParams, users_s: np.ndarray, users_t: np.ndarray,
                    seed: int | None) -> list[Charge]:
    """The ledger charges of one curator run: (ε, δ) to the users of S (Theorem 1), (ε, 0) to those of T
    (Theorem 2), from :func:`hybriddp.privacy.guarantees.curator_guarantees`; ``private=False`` when seeded."""
    users = {"optin-S": log.user_keys(users_s), "optin-T": log.user_keys(users_t)}
    return charges(curator_guarantees(params.epsilon, params.delta), users, private=seed is None)


def curator_side(
    log: RecordLog, optin_users: np.ndarray, params: BlenderParams, *, seed: int | None,
    noise_factory: NoiseFactory = DiscreteLaplaceNoise, backend: CountingBackend | None = None,
    stages: Stages | None = None, with_charges: bool = True, carry: tuple[np.ndarray, np.ndarray] | None = None,
) -> CuratorOutput:
    """Partition O into S and T (|S| = round(f_O·|O|)), CreateHeadList on S, estimates on T (and on
    S's released noisy counts too when the estimator's release is :attr:`Release.REUSE_S`, ALGORITHM.md §4.1).

    An empty head list raises :class:`~hybriddp.core.errors.EmptyHeadListError` with the run's charges
    (:func:`curator_charges`; none with ``with_charges=False``): that outcome is a release too.

    ``carry`` (query ids, URL ids in ``log``'s vocabularies): records of earlier published head lists of a series
    that stay listed whatever S says (ALGORITHM.md §13.1); they are estimated from T alone.
    """
    stages = stages or Stages()
    backend = backend or default_backend()
    reuses = params.estimator_spec.release is Release.REUSE_S
    with stages.stage("sample opt-in records"):
        perm = stage_rng(seed, "split").permutation(np.asarray(optin_users, dtype=np.int64))
        n_s = round(params.f_o * len(perm))
        users_s, users_t = np.sort(perm[:n_s]), np.sort(perm[n_s:])  # Fig. 2 line 1
        rng = stage_rng(seed, "sample_optin")
        d_s = sample_records(log, users_s, params.m_o, rng)
        d_t = sample_records(log, users_t, params.m_o, rng)
    with stages.stage("create head list"):  # Fig. 2 line 2
        noise_s = noise_for(noise_factory, seed, "headlist_noise")
        tau = noise_s.head_list_threshold(params.epsilon, params.delta, params.m_o)
        hl_s, s_counts = create_head_list_with_counts(d_s.query, d_s.url, epsilon=params.epsilon,
                                                      delta=params.delta, m_o=params.m_o, noise=noise_s,
                                                      backend=backend, carry=carry)
        try:
            require_nonempty(hl_s, tau=tau, epsilon=params.epsilon, delta=params.delta, m_o=params.m_o,
                             n_optin_users=len(perm))
        except EmptyHeadListError as exc:
            if with_charges:
                exc.charges = curator_charges(log, params, users_s, users_t, seed)
            raise
    with stages.stage("estimate opt-in probabilities"):  # Fig. 2 line 3
        optin = estimate_optin_probabilities(
            d_t.query, d_t.url, hl_s, epsilon=params.epsilon, m_o=params.m_o,
            head_list_size=params.head_list_size, noise=noise_for(noise_factory, seed, "optin_noise"),
            url_level=log.has_urls, backend=backend, s_counts=s_counts, n_s=len(d_s),
            rank_with_s=reuses)
    if reuses:  # S's counts corrected for having passed τ (ALGORITHM.md §4.1)
        optin = reuse_s(optin, kept_count_for(params.epsilon, params.delta, params.m_o, noise_s.name, len(d_s)))
    return CuratorOutput(hl_s, optin, d_s, d_t, len(users_s), len(users_t), noise_s.name, tau, users_s, users_t)


def release(log: RecordLog, params: BlenderParams, cur: CuratorOutput, seed: int | None, *,
            with_charges: bool = True) -> CuratorRelease:
    """Turn the curator's working output into its release (documents + ledger charges).

    A seeded release is marked ``"non_private": true`` in the device head list (devices see it) and
    in the estimates, and its charges are ``private=False``.
    """
    hl = cur.optin.head_list
    hdoc = hl.to_device_json(log.queries, log.urls, epsilon=params.epsilon, delta=params.delta,
                             f_c=client_f_c(params, log.has_urls), m_c=params.m_c, url_level=log.has_urls)
    if seed is not None:
        hdoc = mark_non_private(hdoc)
    sizes = {"optin_users": cur.n_users_s + cur.n_users_t, "optin_users_s": cur.n_users_s,
             "optin_users_t": cur.n_users_t, "records_s": len(cur.sampled_s), "records_t": len(cur.sampled_t),
             "head_list_s_records": cur.head_list_s.n_records, "head_list_s_queries": cur.head_list_s.n_queries}
    edoc = estimates_document(cur.optin, hdoc, params, cur.noise, seed, sizes)
    rel = CuratorRelease(hdoc, edoc, hl, log.queries, log.urls, cur.optin, params, cur.noise, seed)
    if with_charges and cur.users_s is not None and cur.users_t is not None:
        rel.charges = curator_charges(log, params, cur.users_s, cur.users_t, seed)
    return rel


def curate(
    log: RecordLog, params: BlenderParams, *, optin_users: np.ndarray | None = None, seed: int | None = None,
    noise_factory: NoiseFactory = DiscreteLaplaceNoise, backend: CountingBackend | None = None,
    stages: Stages | None = None, with_charges: bool = True, carry: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[CuratorRelease, CuratorOutput]:
    """The curator's round: opt-in records + parameters → (release, working output).

    ``optin_users``: indices of the opt-in users in ``log`` (default: every user of ``log``).
    ``with_charges=False`` skips computing the ledger charges (simulations without a ledger).
    The working output holds raw samples: keep it inside the curator (simulations score with it).

    Raises :class:`~hybriddp.core.errors.EmptyHeadListError` when the head list is empty; it carries the
    charges this release would have carried: a caller with a ledger charges them (every run is charged).
    """
    users = np.arange(log.n_users) if optin_users is None else np.asarray(optin_users, dtype=np.int64)
    cur = curator_side(log, users, params, seed=seed, noise_factory=noise_factory, backend=backend, stages=stages,
                       with_charges=with_charges, carry=carry)
    return release(log, params, cur, seed, with_charges=with_charges), cur

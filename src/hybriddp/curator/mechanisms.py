"""The trusted curator's side: CreateHeadList and EstimateOptinProbabilities (ALGORITHM.md §3, §4).

Both run on raw opt-in records, the most sensitive data hybriddp holds; only their noisy
outputs (the head list, the estimates) leave this module.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from hybriddp.core.counting import CountingBackend, default_backend
from hybriddp.core.errors import EmptyHeadListError
from hybriddp.core.headlist import HeadList, record_keys, split_keys
from hybriddp.core.noise import NoiseSource
from hybriddp.core.params import check_head_list_params, check_positive_int, head_list_scale
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.curator.kept import KeptCount

if TYPE_CHECKING:
    from hybriddp.privacy.ledger import Charge

log = logging.getLogger(__name__)


def create_head_list(
    query: np.ndarray, url: np.ndarray, *, epsilon: float, delta: float, m_o: int,
    noise: NoiseSource, backend: CountingBackend | None = None,
) -> HeadList:
    """CreateHeadList(ε, δ, S, m_O) — paper Fig. 3, ALGORITHM.md §3: HL_S only
    (see :func:`create_head_list_with_counts`, which also returns the kept records' noisy counts)."""
    return create_head_list_with_counts(query, url, epsilon=epsilon, delta=delta, m_o=m_o, noise=noise,
                                        backend=backend)[0]


def create_head_list_with_counts(
    query: np.ndarray, url: np.ndarray, *, epsilon: float, delta: float, m_o: int,
    noise: NoiseSource, backend: CountingBackend | None = None,
    carry: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[HeadList, np.ndarray]:
    """CreateHeadList(ε, δ, S, m_O) — paper Fig. 3, ALGORITHM.md §3 — and its noisy counts.

    Parameters
    ----------
    query, url : the sampled records D_S of the users in S (≤ m_O per user).
    noise : draws Y ~ Laplace(0, b_S) (or exact discrete Laplace), one per distinct record; it also
        gives the threshold τ for its own distribution.

    Returns
    -------
    HL_S: the kept records grouped by query, plus ⟨q,*⟩ for each kept q and ⟨*,*⟩; and, per entry of
    HL_S, the noisy count N(r, D_S) + Y_r that kept the record (NaN for the wildcards, which were
    never counted). Releasing the kept records' noisy counts with them costs nothing beyond
    Theorem 1 (ALGORITHM.md §3.3). Only records that occur in D_S can be kept (no external dictionary).

    ``carry`` (query ids, URL ids): records listed whatever S says, taken from earlier *published* head lists of
    a series (ALGORITHM.md §13.1). They join the list with no S count (NaN: their noisy counts are not
    released), so the release from S is the one above and the list is still (ε, δ)-DP post-processing.
    """
    check_head_list_params(epsilon, delta, m_o)
    tau = noise.head_list_threshold(epsilon, delta, m_o)  # Fig. 3 line 2 (recomputed for discrete noise)
    b = head_list_scale(epsilon, m_o)  # b_S = 2·m_O/ε (Fig. 3 line 1)
    backend = backend or default_backend()
    keys, counts = backend.count_distinct(record_keys(query, url))  # N(r, D_S) for r ∈ D_S
    noisy = counts + noise.sample(b, len(keys))
    keep = noisy > tau  # Fig. 3 lines 3-6
    q, u = split_keys(keys[keep])
    log.debug("CreateHeadList: %d of %d distinct records passed tau=%.4f", keep.sum(), len(keys), tau)
    listed = keys[keep] if carry is None else np.union1d(keys[keep], record_keys(*carry))
    hl = HeadList.from_records(*split_keys(listed))
    s_counts = np.full(hl.n_entries, np.nan)
    s_counts[hl.map_records(q, u)] = noisy[keep]  # a record without URL level is its query's ⟨q,*⟩
    return hl, s_counts


def estimate_optin_probabilities(
    query: np.ndarray, url: np.ndarray, head_list_s: HeadList, *, epsilon: float, m_o: int,
    head_list_size: int, noise: NoiseSource, url_level: bool = True,
    backend: CountingBackend | None = None, s_counts: np.ndarray | None = None, n_s: int = 0,
    rank_with_s: bool = False,
) -> OptinEstimates:
    """EstimateOptinProbabilities(ε, T, m_O, HL_S, M) — paper Fig. 4, ALGORITHM.md §4.

    1. Map every record of D_T onto HL_S (q ∉ HL_S → ⟨*,*⟩; u ∉ HL_S[q] → ⟨q,*⟩).
    2. p̂_O,r = (N(r, D_T) + Y_r)/|D_T| with one Y_r ~ Laplace(0, 2m_O/ε) per entry
       (wildcards included) — (ε, 0)-DP (Theorem 2).
    3. Keep the M non-wildcard records with the largest p̂_O; fold the rest into ⟨q,*⟩, or
       into ⟨*,*⟩ when q keeps no URL; J counts the draws each estimate sums.
    4. Variances by :func:`optin_variance`; query level = sums over the query's entries.

    ``url_level=False`` (single-item logs): the records are the ⟨q,*⟩ entries themselves, so
    trimming ranks and drops whole queries.

    ``s_counts`` (per HL_S entry, from :func:`create_head_list_with_counts`) and ``n_s`` = |D_S|:
    the estimates remember S's count of every record that stays in the final list, for :func:`reuse_s`;
    the estimates themselves are still T's. ``rank_with_s`` (``--estimator reuse``, ALGORITHM.md §4.1):
    trimming ranks the records by their S ∪ T estimate instead of T's alone.
    """
    check_positive_int("head_list_size", head_list_size)
    backend = backend or default_backend()
    b = head_list_scale(epsilon, m_o)
    hl = head_list_s
    n = len(query)
    counts = backend.count_entries(hl.map_records(query, url), hl.n_entries)
    p = (counts + noise.sample(b, hl.n_entries)) / max(n, 1)
    if n == 0:
        p = np.zeros(hl.n_entries)

    # --- trim to M records and fold (ALGORITHM.md §4 "Trim") ---------------------------------------
    entry_q = hl.entry_query
    star_q = hl.k - 1
    if url_level:
        candidate = ~hl.is_wildcard
    else:
        candidate = hl.is_wildcard & (entry_q != star_q)
    cand_idx = np.flatnonzero(candidate)
    rank = p
    if rank_with_s:
        if s_counts is None:
            raise ValueError("rank_with_s needs S's counts (s_counts)")
        rank = np.where(np.isfinite(s_counts), (p * n + np.nan_to_num(s_counts)) / max(n + n_s, 1), p)
    order = cand_idx[np.lexsort((-rank[cand_idx],))]  # lexsort is stable: ties keep the head list's order
    kept = np.zeros(hl.n_entries, dtype=bool)
    kept[order[:head_list_size]] = True
    keeps_url = np.bincount(entry_q[kept], minlength=hl.k) > 0  # q keeps ≥ 1 record
    # (the * query, never listed, has only ⟨*,*⟩, which maps to itself whatever keeps_url says of it)
    # target of every old entry: itself if kept; ⟨q,*⟩ if q stays; else ⟨*,*⟩
    stays = keeps_url[entry_q]
    target_old = np.where(kept | (hl.is_wildcard & stays), np.arange(hl.n_entries),
                          np.where(stays, hl.wildcard_entry[entry_q], hl.wildcard_entry[star_q]))
    # --- build the final HL: queries by p̂_O,q desc, URLs by p̂_O desc, wildcards last -------
    # full lengths without minlength: the last entry, ⟨*,*⟩ of the last query, maps to itself
    p_folded = np.bincount(target_old, weights=p)
    draws_folded = np.bincount(target_old).astype(np.int64)
    p_q_old = np.bincount(entry_q, weights=p_folded)
    listed = np.flatnonzero(keeps_url[:star_q])
    listed = listed[np.lexsort((-p_q_old[listed],))]
    new_query_ids, new_urls, old_entries = [], [], []
    for qi in listed.tolist():  # loop over head-list queries (≤ M), not over records
        lo, hi = hl.url_offsets[qi], hl.url_offsets[qi + 1] - 1
        mine = np.arange(lo, hi)
        mine = mine[kept[mine]]
        mine = mine[np.lexsort((-p_folded[mine],))]
        new_query_ids.append(int(hl.query_ids[qi]))
        new_urls.append(hl.entry_url[mine].tolist())
        old_entries.extend([*mine.tolist(), hi])
    old_entries.append(hl.wildcard_entry[star_q])
    final = HeadList.from_lists(new_query_ids, new_urls)
    old_entries_arr = np.array(old_entries)  # never empty (⟨*,*⟩): integers
    p_rec = p_folded[old_entries_arr]
    j_rec = draws_folded[old_entries_arr]
    final_s = None
    if s_counts is not None:  # a kept record is its HL_S entry, never folded into (§4.1)
        final_s = np.where(kept[old_entries_arr], s_counts[old_entries_arr], np.nan)
    return _estimates(final, p_rec, j_rec, n, noise.variance(b), None, n_s if final_s is not None else 0, final_s)


def _estimates(hl: HeadList, p_rec: np.ndarray, j_rec: np.ndarray, n: int, var_y: float, reused: np.ndarray | None,
               n_s: int, s_counts: np.ndarray | None, kept: KeptCount | None = None) -> OptinEstimates:
    """Query sums and every variance from the record estimates (ALGORITHM.md §4, §4.1)."""
    p_query = np.bincount(hl.entry_query, weights=p_rec)  # length hl.k: ⟨*,*⟩ is last
    j_query = np.bincount(hl.entry_query, weights=j_rec).astype(np.int64)
    est = OptinEstimates(hl, p_rec, p_rec, j_rec, p_query, p_query, j_query, n, var_y, reused, n_s, s_counts, kept)
    est.var_record, est.var_query = est.variances_at(p_rec, p_query)
    return est


def reuse_s(optin: OptinEstimates, kept: KeptCount | None = None) -> OptinEstimates:
    """Reuse S (ALGORITHM.md §4.1): every final record with a released S count is estimated from S ∪ T,

      p̂_O,r = (X̃_r + N̂_T,r)/(|D_S| + |D_T|),  J_r = 2,

    with X̃_r S's released count corrected for having passed τ by ``kept`` (:mod:`hybriddp.curator.kept`:
    unbiased given that the record was listed), or the count as released when ``kept`` is None. The other
    entries (wildcards) stay T's. Needs estimates made with ``s_counts``; estimates that already reuse S
    come back unchanged.
    """
    if optin.reused is not None:
        return optin
    if optin.s_counts is None:
        raise ValueError("these opt-in estimates were made without S's counts (pass s_counts to "
                         "estimate_optin_probabilities)")
    reused = np.isfinite(optin.s_counts)
    n = optin.n + optin.n_s
    x = np.nan_to_num(optin.s_counts)
    if kept is not None:
        x = np.where(reused, kept.corrected(x), 0.0)
    p_rec = np.where(reused, (optin.p_record * optin.n + x) / max(n, 1), optin.p_record)
    return _estimates(optin.head_list, p_rec, optin.draws_record + reused, optin.n, optin.noise_variance, reused,
                      optin.n_s, optin.s_counts, kept)


def require_nonempty(hl: HeadList, *, tau: float, epsilon: float, delta: float, m_o: int, n_optin_users: int,
                     charges: list[Charge] | None = None) -> None:
    """Raise :class:`EmptyHeadListError` when CreateHeadList kept nothing (ALGORITHM.md §3, §3.4).

    The empty outcome is an output of the mechanism: the error carries the run's ledger
    ``charges``, and its message names only public parameters (τ, ε, δ, m_O, the number of
    opt-in users) and the knobs to turn, never a count of the data.
    """
    if hl.n_queries == 0:
        raise EmptyHeadListError(
            f"the head list is empty: CreateHeadList kept no record (none passed the privacy threshold "
            f"τ = {tau:.4g} at ε = {epsilon:g}, δ = {delta:g}, m_O = {m_o}, from {n_optin_users:,} opt-in users). "
            "For a non-empty head list: more opt-in users (--optin-fraction, or --f-o for more of them in S), "
            "a larger --epsilon or --delta, or a smaller --m-o.",
            tau=tau, epsilon=epsilon, delta=delta, m_o=m_o, n_optin_users=n_optin_users, charges=charges)

"""The trusted curator's side: CreateHeadList and EstimateOptinProbabilities (ALGORITHM.md §3, §4).

Both run on raw opt-in records, the most sensitive data hybriddp holds; only their noisy
outputs (the head list, the estimates) leave this module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from hybriddp.backends import CountingBackend, default_backend
from hybriddp.errors import HeadListError
from hybriddp.headlist import HeadList, record_keys, split_keys
from hybriddp.noise import NoiseSource
from hybriddp.params import check_head_list_params, check_positive_int, head_list_scale

log = logging.getLogger(__name__)


def create_head_list(
    query: np.ndarray, url: np.ndarray, *, epsilon: float, delta: float, m_o: int,
    noise: NoiseSource, backend: CountingBackend | None = None,
) -> HeadList:
    """CreateHeadList(ε, δ, S, m_O) — paper Fig. 3, ALGORITHM.md §3.

    Parameters
    ----------
    query, url : the sampled records D_S of the users in S (≤ m_O per user).
    noise : draws Y ~ Laplace(0, b_S) (or exact discrete Laplace), one per distinct record; it also
        gives the threshold τ for its own distribution.

    Returns
    -------
    HL_S: the kept records grouped by query, plus ⟨q,*⟩ for each kept q and ⟨*,*⟩.
    Only records that occur in D_S can be kept (no external dictionary).
    """
    check_head_list_params(epsilon, delta, m_o)
    tau = noise.head_list_threshold(epsilon, delta, m_o)  # Fig. 3 line 2 (recomputed for discrete noise)
    b = head_list_scale(epsilon, m_o)  # b_S = 2·m_O/ε (Fig. 3 line 1)
    backend = backend or default_backend()
    keys, counts = backend.count_distinct(record_keys(query, url))  # N(r, D_S) for r ∈ D_S
    keep = counts + noise.sample(b, len(keys)) > tau  # Fig. 3 lines 3-6
    q, u = split_keys(keys[keep])
    log.info("CreateHeadList: %d of %d distinct records passed tau=%.4f", keep.sum(), len(keys), tau)
    return HeadList.from_records(q, u)


@dataclass
class OptinEstimates:
    """Output of EstimateOptinProbabilities (ALGORITHM.md §4): the final HL and its estimates.

    Arrays indexed by entry of ``head_list`` (record level) or by query position (query
    level); ``draws_*`` is J, the number of noise draws an estimate sums.
    """

    head_list: HeadList
    p_record: np.ndarray
    var_record: np.ndarray
    draws_record: np.ndarray
    p_query: np.ndarray
    var_query: np.ndarray
    draws_query: np.ndarray
    n: int  # |D_T|
    noise_variance: float  # variance of one draw, Var(Y)


def optin_variance(p: np.ndarray, draws: np.ndarray, n: int, noise_variance: float) -> np.ndarray:
    """σ̂²_O = p̂(1−p̂)/(n−1) + J·Var(Y)/(n(n−1))  (Theorem 4 corrected, ALGORITHM.md §4).

    With Laplace noise Var(Y) = 2b², ALGORITHM.md's 2·J·b²/(|D_T|(|D_T|−1)). p̂ is clamped into
    [0, 1] inside p(1−p) only. Fewer than 2 records give an infinite variance (no data).
    """
    if n < 2:
        return np.full(len(p), np.inf)
    pc = np.clip(p, 0.0, 1.0)
    return pc * (1.0 - pc) / (n - 1) + draws * noise_variance / (n * (n - 1))


def estimate_optin_probabilities(
    query: np.ndarray, url: np.ndarray, head_list_s: HeadList, *, epsilon: float, m_o: int,
    head_list_size: int, noise: NoiseSource, url_level: bool = True,
    backend: CountingBackend | None = None,
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
    order = cand_idx[np.lexsort((-p[cand_idx],))]  # lexsort is stable: ties keep the head list's order
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
    var_y = noise.variance(b)
    fq = final.entry_query
    p_query = np.bincount(fq, weights=p_rec)  # length final.k: ⟨*,*⟩ is last
    j_query = np.bincount(fq, weights=j_rec).astype(np.int64)
    return OptinEstimates(
        head_list=final,
        p_record=p_rec, var_record=optin_variance(p_rec, j_rec, n, var_y), draws_record=j_rec,
        p_query=p_query, var_query=optin_variance(p_query, j_query, n, var_y), draws_query=j_query,
        n=n, noise_variance=var_y,
    )


def require_nonempty(hl: HeadList, *, n_records_s: int, tau: float) -> None:
    """Fail with the knobs to turn when CreateHeadList kept nothing."""
    if hl.n_queries == 0:
        raise HeadListError(
            f"the opt-in group produced an empty head list: no record occurred often enough among "
            f"the {n_records_s} sampled records of S to pass the privacy threshold tau = {tau:.2f}. "
            "Increase --optin-fraction (more opt-in users), --f-o (more of them build the list), "
            "--epsilon or --delta, or collect more opt-in data."
        )

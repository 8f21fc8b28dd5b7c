"""Generating a synthetic search log calibrated to AOL or Yandex (ALGORITHM.md §10): :func:`generate`.

:func:`generate` builds a :class:`~hybriddp.core.records.RecordLog` of a preset (:mod:`.presets`)
directly as integer arrays -- no Python loop and no string per record.

The generative model
--------------------
Every user ``i`` gets ``n_i`` records, ``n_i = ceil(X)`` with ``X`` lognormal (mean and
spread per preset), written in user order (CSR, no sort). Record ``j`` of a user:

1. **Query.** With probability ``repeat_query`` (never for the first record) it repeats the
   user's previous query; otherwise it is an independent draw from the global query
   distribution ``P``. Repeating keeps every record's marginal distribution equal to ``P``,
   so the per-user-sampled probability the paper reports (one uniform record per user,
   ``p_q = mean over users of the share of the user's records that are q``) has expectation
   ``P(q)`` exactly, while heavy users repeat themselves as real users do.
2. **URL.** A repeated query keeps the previous URL with probability ``repeat_url`` (the
   record is repeated); otherwise the URL is drawn from the query's URL distribution. This
   again keeps the record marginal ``P(q)·P(u | q)``.

``P`` has three parts, in id order:

* **Head** (ids ``0 .. head_size-1``): the named queries with fixed probabilities (AOL: the
  paper's Figure 9), then a piecewise power law ``p(r) ∝ r^(-α)`` in the rank ``r`` fitted
  to the real rank-frequency curve. Each head query has its own small categorical URL
  distribution: ``1 + Poisson(λ)`` URLs (λ grows with the query's probability: a few to
  dozens), a dominant first URL with share ~ Beta (``named_dominant_share`` for the named,
  navigational queries) and the rest split Zipf-like, so the URLs of a head query are
  realistically skewed and an estimator can rank them (ALGORITHM.md §9's generalized NDCG).
* **Pool** (ids ``head_size .. head_size+J-1``): the same power law continued past the head
  over ``J`` ranks, sampled by its analytic inverse CDF.
* **Fresh**: the remaining mass; each draw is a new query id (a query seen once, apart
  from the user's own repeats).

``J`` is solved at generation time so that the expected number of distinct queries equals
the target (``scale`` × the published count), given the realised number of independent draws.
At ``scale < 1`` each pool item stands for ``1/scale`` real ranks merged, so the distinct
counts scale with the number of users while the head probabilities do not change.

A tail (pool or fresh) query ``q`` has URL "slots" ``k = 0, 1, 2, 3`` (``k ≥ 1`` with total
probability ``tail_alt_url``, halving per slot): most tail queries therefore have one URL.
Slot ``(q, k)`` maps deterministically (hash) either to a *shared* URL from a power-law URL
pool (URLs are shared across queries: 1.6 M URLs for 4.8 M queries in AOL) or to a URL of
its own. The shared pool's size is solved like ``J`` so the distinct URL count hits its
target.

Ids are stable for a preset: head query / head URL ``i`` is the same population item for
every seed, and so is pool query ``j`` (for the same ``scale``). Vocabularies are
:class:`~hybriddp.core.records.SyntheticVocabulary`: named items keep their names, and a named query's
other URLs are named after its dominant one (``"http://www.google.com/page2"`` …,
:func:`~hybriddp.datasets.presets.head_urls`); the others are ``"query 123"`` / ``"http://www.site123"``.
``len(log.queries)`` counts pool ids never drawn too, so it can exceed the number of distinct queries in the log.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.core.records import LoadStats, RecordLog, SyntheticVocabulary
from hybriddp.core.rng import make_rng
from hybriddp.core.stages import ProgressFn
from hybriddp.datasets.presets import HeadUrls, RankLaw, SynthPreset, get_preset, head_urls

logger = logging.getLogger("hybriddp.datasets.synth")
"""The one logger of the synthetic logs (generation and writing)."""

QUERY_PREFIX = "query "
URL_PREFIX = "http://www.site"

_TAIL_SLOTS = 4  # URL slots k = 0..3 of a tail query
_GENERATION_STAGES = 5
_BLOCK = 1 << 22  # elements per block of the pool / hash maths


# --------------------------------------------------------------------------------------
# Pool sizes: expected distinct counts
# --------------------------------------------------------------------------------------


def _solve_pool(law: RankLaw, r0: float, scale: float, n_draws: float, available: float,
                target: float, fixed: float, what: str) -> tuple[int, float]:
    """Pool size J (items of ``1/scale`` merged ranks from rank ``r0``) for a distinct count.

    Each of ``n_draws`` independent draws lands on pool item ``j`` with its mass ``m_j`` and
    beyond the pool (a new item every time) with the rest of ``available``. The expected
    number of distinct items, ``fixed + Σ_{j<J} (1 − e^{−n·m_j}) + n·(available − M(J))``,
    decreases with J; it is evaluated by quadrature over a log grid of ranks (merged item
    masses ≈ p(r)/scale, ``scale`` items per unit rank) and solved for ``target``.

    Returns
    -------
    (J, M) : pool items and the pool's mass.
    """
    c0 = float(law.cumulative(r0))
    r_end = float(law.inverse(c0 + available))
    # never more pool items than 50 × the target or 10 × the draws
    r_cap = r0 + min(50.0 * max(target, 1.0), 10.0 * n_draws + 1000.0) / scale
    r_end = min(r_end, r_cap) if math.isfinite(r_end) else r_cap
    grid = r0 + np.concatenate([[0.0], np.geomspace(1e-3, r_end - r0, 4000)])
    mass = np.minimum(law.cumulative(grid) - c0, available)
    g = scale * -np.expm1(-n_draws * law.density(grid) / scale)  # distinct items per unit rank
    hit = np.concatenate([[0.0], np.cumsum(0.5 * (g[1:] + g[:-1]) * np.diff(grid))])
    expected = fixed + hit + n_draws * (available - mass)
    i = int(np.searchsorted(-expected, -target))  # first grid point with expected <= target
    # tiny scales cannot reach the targets (the unscaled head alone may exceed them)
    report = logger.info if scale < 0.01 else logger.warning
    if i == 0:
        r = grid[0]
        if expected[0] < 0.99 * target:
            report("synthetic %s: at most %.0f distinct expected, below the target %.0f",
                   what, expected[0], target)
    elif i >= len(grid):
        r = grid[-1]
        report("synthetic %s: at least %.0f distinct expected, above the target %.0f",
               what, expected[-1], target)
    else:
        t = (expected[i - 1] - target) / (expected[i - 1] - expected[i])
        r = grid[i - 1] + t * (grid[i] - grid[i - 1])
    n_items = round((r - r0) * scale)
    pool_mass = float(min(law.cumulative(r0 + n_items / scale) - c0, available))
    return n_items, pool_mass


def _pool_items(law: RankLaw, r0: float, scale: float, n_items: int, mass: np.ndarray) -> np.ndarray:
    """Pool item (0..n_items-1) of each mass offset in [0, M(J)) (inverse CDF)."""
    r = law.inverse(float(law.cumulative(r0)) + mass)
    j = np.floor((r - r0) * scale)
    return np.clip(np.nan_to_num(j, nan=0.0, posinf=n_items - 1), 0, max(n_items - 1, 0)).astype(np.int64)


def _uniform_hash(x: np.ndarray, key: int) -> np.ndarray:
    """A keyed splitmix64 of int64 ``x`` as uniforms in [0, 1) (the population's fixed hash)."""
    z = x.astype(np.uint64) ^ np.uint64(key & 0xFFFFFFFFFFFFFFFF)
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


# --------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------


def _records_per_user(rng: np.random.Generator, n_users: int, pre: SynthPreset) -> np.ndarray:
    """``ceil(X)``, X lognormal with E[ceil X] ≈ mean_records (E[ceil X] ≈ E[X] + ½)."""
    sigma = pre.records_sigma
    mu = math.log(max(pre.mean_records - 0.5, 0.5)) - 0.5 * sigma * sigma
    x = rng.lognormal(mu, sigma, n_users)
    return np.minimum(np.ceil(x), pre.max_records).astype(np.int64)


def _forward_fill(repeat: np.ndarray) -> np.ndarray:
    """Index of the latest non-repeated position at or before each position."""
    idx = np.arange(len(repeat), dtype=np.int32 if len(repeat) < 2**31 else np.int64)
    idx[repeat] = 0
    np.maximum.accumulate(idx, out=idx)
    return idx


def generate(preset: str = "aol", *, seed: int | None = None, scale: float = 1.0,
             progress: ProgressFn | None = None, head_weights: np.ndarray | None = None) -> RecordLog:
    """Generate a synthetic search log calibrated to a real one (ALGORITHM.md §10).

    Parameters
    ----------
    preset : ``'aol'`` or ``'yandex'`` (see :data:`PRESETS`).
    seed : seed of the draws (reproducible experiments); None draws 128 bits from the OS.
    scale : multiplies the number of users, and so the records and distinct counts; the head
        probabilities do not change. ``scale=0.005`` makes a small AOL-like log for tests.
    progress : optional ``progress(stages_done, total_stages)``.
    head_weights : multipliers of the head queries' probabilities (one per head query, > 0), rescaled so that
        the head keeps its total mass: a period of a log whose popularity drifts (:mod:`.drift`).

    Returns
    -------
    RecordLog grouped by user, int32 query / URL ids, synthetic vocabularies.

    Raises
    ------
    ParameterError
        Unknown preset, or a scale that gives no user.
    """
    pre = get_preset(preset)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise parameter_error("scale", scale, "a positive number", "e.g. 0.01 for a small log")
    n_users = round(scale * pre.n_users)
    if n_users < 1:
        raise parameter_error("scale", scale, f">= {0.5 / pre.n_users:.3g} (at least one user)")
    rng = make_rng(seed)

    def step(done: int) -> None:
        if progress is not None:
            progress(done, _GENERATION_STAGES)

    # 1. records per user (CSR: users in order, no sort needed)
    counts = _records_per_user(rng, n_users, pre)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    del counts
    n = int(offsets[-1])
    step(1)

    # 2. which records repeat the user's previous query / whole record
    repeat_q = rng.random(n, dtype=np.float32) < pre.repeat_query
    repeat_q[offsets[:-1]] = False
    repeat_r = repeat_q.copy()
    repeat_r[repeat_q] = rng.random(int(repeat_q.sum()), dtype=np.float32) < pre.repeat_url
    step(2)

    # 3. queries: independent draws from P, forward-filled over the repeats
    q_independent, n_pool_q, n_query_ids = _draw_queries(rng, pre, scale, int(n - repeat_q.sum()),
                                                         weighted_head(pre, head_weights))
    query = np.empty(n, dtype=np.int32)
    query[~repeat_q] = q_independent
    del q_independent
    query = query[_forward_fill(repeat_q)]
    del repeat_q
    step(3)

    # 4. URLs given the query, forward-filled over the repeated records
    hu = head_urls(pre)
    drawn = ~repeat_r
    u_drawn, n_pool_u, n_url_ids = _draw_urls(rng, pre, scale, hu, query[drawn], n_query_ids)
    url = np.empty(n, dtype=np.int32)
    url[drawn] = u_drawn
    del u_drawn, drawn
    url = url[_forward_fill(repeat_r)]
    del repeat_r
    step(4)

    queries = SyntheticVocabulary(n_query_ids, QUERY_PREFIX, pre.named_queries)
    urls = SyntheticVocabulary(n_url_ids, URL_PREFIX, hu.named)
    log = RecordLog(offsets, query, url, queries, urls, True, LoadStats(rows_read=n))
    step(5)
    logger.info("synthetic %s log (scale %g): %d users, %d records; pools of %d queries and %d URLs",
                pre.name, scale, n_users, n, n_pool_q, n_pool_u)
    return log


def weighted_head(pre: SynthPreset, weights: np.ndarray | None) -> np.ndarray:
    """The head queries' probabilities times ``weights``, rescaled to the head's total mass (None: as they are)."""
    head_p = pre.head_probabilities
    if weights is None:
        return head_p
    w = np.asarray(weights, dtype=float)
    if w.shape != head_p.shape or not (np.isfinite(w).all() and (w > 0).all()):
        raise parameter_error("head_weights", f"shape {w.shape}", f"{head_p.size} finite numbers > 0, one per head "
                              "query")
    out = head_p * w
    return out * (head_p.sum() / out.sum())


def _draw_queries(rng: np.random.Generator, pre: SynthPreset, scale: float,
                  m: int, head_p: np.ndarray) -> tuple[np.ndarray, int, int]:
    """``m`` independent draws from P: head | pool (size solved for the distinct target) | fresh.

    Returns
    -------
    (ids, J, n_ids) : int32 query ids, the pool size, and the number of query ids in use
        (head + pool + fresh).
    """
    head_mass = float(head_p.sum())
    n_head = len(head_p)
    fixed = float(-np.expm1(-m * head_p).sum())  # expected distinct head queries
    n_pool, pool_mass = _solve_pool(pre.head_law, pre.pool_start, scale, m, 1.0 - head_mass,
                                    scale * pre.distinct_queries, fixed, "queries")
    u = rng.random(m)
    q = np.empty(m, dtype=np.int32)
    in_head = u < head_mass
    q[in_head] = np.minimum(np.searchsorted(np.cumsum(head_p), u[in_head], side="right"), n_head - 1)
    in_pool = ~in_head & (u < head_mass + pool_mass)
    for part in _blocks(np.flatnonzero(in_pool)):
        q[part] = n_head + _pool_items(pre.head_law, pre.pool_start, scale, n_pool, u[part] - head_mass)
    del u
    fresh = np.flatnonzero(~(in_head | in_pool))
    q[fresh] = n_head + n_pool + np.arange(len(fresh), dtype=np.int32)
    return q, n_pool, n_head + n_pool + len(fresh)


def _blocks(index: np.ndarray) -> list[np.ndarray]:
    """``index`` in pieces of at most ``_BLOCK`` (bounds the temporaries of the vector maths)."""
    return [index[i:i + _BLOCK] for i in range(0, len(index), _BLOCK)]


def _draw_urls(rng: np.random.Generator, pre: SynthPreset, scale: float, hu: HeadUrls,
               qd: np.ndarray, n_query_ids: int) -> tuple[np.ndarray, int, int]:
    """A URL for each query in ``qd`` (the records whose URL is drawn, not repeated).

    Head queries draw from their categorical URL distribution. A tail query's click goes to
    its URL slot k (0 mostly); slot (q, k) hashes to a shared pool URL, or to a URL of its own
    when the hash falls outside the pool, whose size is solved for the distinct target.

    Returns
    -------
    (ids, J, n_ids) : int32 URL ids, the shared pool's size, the number of URL ids.
    """
    n_head = pre.head_size
    out = np.empty(len(qd), dtype=np.int32)
    is_head = qd < n_head
    qh = qd[is_head]
    fixed = _expected_head_urls(hu, np.bincount(qh, minlength=n_head))
    slot = np.searchsorted(hu.key, qh + rng.random(len(qh)), side="right")
    out[is_head] = hu.ids[np.minimum(slot, hu.ptr[qh + 1] - 1)]
    del qh, slot
    tail = np.flatnonzero(~is_head).astype(np.int32)
    del is_head
    # slot k of each tail click; pair = (tail query index)·SLOTS + k
    k = np.zeros(len(tail), dtype=np.int8)
    alt = rng.random(len(tail)) < pre.tail_alt_url
    k[alt] = np.minimum(rng.geometric(0.5, int(alt.sum())), _TAIL_SLOTS - 1)
    del alt
    pair = qd[tail].astype(np.int64)
    pair -= n_head
    pair *= _TAIL_SLOTS
    pair += k
    del k, qd  # qd: the caller's temporary, freed here
    used = np.zeros((n_query_ids - n_head) * _TAIL_SLOTS, dtype=bool)
    used[pair] = True
    n_pairs = int(used.sum())
    n_pool, pool_mass = _solve_pool(pre.url_pool_law, 1.0, scale, n_pairs, 1.0,
                                    scale * pre.distinct_urls, fixed, "URLs")
    tail_url = np.empty(len(tail), dtype=np.int32)
    private = np.zeros(len(tail), dtype=bool)
    for a in range(0, len(tail), _BLOCK):
        part = slice(a, a + _BLOCK)
        h = _uniform_hash(pair[part], pre.structure_seed)
        own = h >= pool_mass
        private[part] = own
        tail_url[part][~own] = hu.n_urls + _pool_items(pre.url_pool_law, 1.0, scale, n_pool, h[~own])
    # private URLs, numbered densely in (query, slot) order
    used[:] = False
    used[pair[private]] = True
    base = hu.n_urls + n_pool
    rank = np.cumsum(used, dtype=np.int32)
    del used
    n_private = int(rank[-1]) if len(rank) else 0
    tail_url[private] = rank[pair[private]] + np.int32(base - 1)
    del rank, private, pair
    out[tail] = tail_url
    return out, n_pool, base + n_private


def _expected_head_urls(hu: HeadUrls, draws_per_query: np.ndarray) -> float:
    """Expected distinct head URLs given how many URL draws each head query got."""
    owner = np.repeat(np.arange(len(draws_per_query)), np.diff(hu.ptr))
    log_miss = draws_per_query[owner] * np.log1p(-np.minimum(hu.share, 1.0 - 1e-15))
    miss = np.exp(np.bincount(hu.ids, weights=log_miss, minlength=hu.n_urls))
    return float((1.0 - miss).sum())

"""Seeded synthetic search logs calibrated to the AOL and Yandex logs (ALGORITHM.md §10).

The real logs cannot be shipped (AOL: research-only licence; Yandex: 16 GB), so experiments
and tests run on synthetic logs whose statistics match the published ones
(docs/ALGORITHM.md §10; paper Figures 8 and 9). :func:`generate` builds a
:class:`~hybriddp.records.RecordLog` directly as integer arrays — no Python loop and no
string per record — and :func:`write_log` writes any log as Parquet or in the original AOL
TSV format.

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
:class:`~hybriddp.records.SyntheticVocabulary`: named items keep their names, the others are
``"query 123"`` / ``"http://www.site123"``. ``len(log.queries)`` counts pool ids never drawn
too, so it can exceed the number of distinct queries in the log.

Calibration (``benchmarks/check_synth.py``, seed 1, full scale)
---------------------------------------------------------------
* AOL: 519,371 users, 19.4 M records, 4.81 M distinct queries, 1.62 M URLs; Figure 9's top
  nine per-user-sampled probabilities within ±0.0002; 0.911 of the mass outside the top-50
  records (paper 0.9108). ~5 s, < 1 GB.
* Yandex: 4.97 M users, 37 M records, 13.17 M queries, 12.70 M URLs; record rank 600 at
  2.1e-4, ~830 records expected in CreateHeadList's list at 1.5% opt-in. ~8 s, < 1.5 GB.

Known limit: fitting both Figure 9's top-50 mass and the real rank-frequency slope makes the
AOL head a little fat past rank 50 (record 100 at 3e-4), so CreateHeadList at 5% opt-in keeps
~130 records where the paper's Figure 13a suggests about 50 (harmless for M = 50).
"""

from __future__ import annotations

import functools
import gzip
import itertools
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hybriddp.errors import DataError, parameter_error
from hybriddp.io.atomic import atomic_path, check_output_path
from hybriddp.records import NO_URL, ArrayVocabulary, LoadStats, RecordLog, SyntheticVocabulary, Vocabulary
from hybriddp.rng import make_rng

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], Any]
"""``progress(done, total)``: generation stages done, or records written."""

QUERY_PREFIX = "query "
URL_PREFIX = "http://www.site"
AOL_COLUMNS = ("AnonID", "Query", "QueryTime", "ItemRank", "ClickURL")
WRITE_FORMATS = ("parquet", "aol")

_TAIL_SLOTS = 4  # URL slots k = 0..3 of a tail query
_CHUNK_RECORDS = 1 << 21  # records per written chunk (bounded memory)
_GENERATION_STAGES = 5
_BLOCK = 1 << 22  # elements per block of the pool / hash maths
_GZIP_LEVEL = 1
_STRUCTURAL = re.compile("[\t\n\r]")  # characters an unquoted TSV value cannot hold


# --------------------------------------------------------------------------------------
# Rank-frequency laws
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankLaw:
    """A continuous piecewise power law ``p(r)`` over ranks ``r ≥ start``.

    ``p(r) = amplitude · r^(-exponents[0])`` on ``[start, breaks[0])``, then exponent
    ``exponents[i]`` on ``[breaks[i-1], breaks[i])``, continuous at every break. The mass of a
    rank interval is the integral of ``p``, so sampling uses the analytic inverse CDF.
    """

    amplitude: float
    start: float
    breaks: tuple[float, ...]
    exponents: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.exponents) != len(self.breaks) + 1:
            raise ValueError("RankLaw needs one more exponent than breaks")
        if any(b <= a for a, b in itertools.pairwise((self.start, *self.breaks))):
            raise ValueError("RankLaw breaks must increase from start")

    @functools.cached_property
    def _segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per segment: lower rank, coefficient c (p = c·r^-a), exponent a, mass below it."""
        lo = np.array((self.start, *self.breaks), dtype=np.float64)
        a = np.array(self.exponents, dtype=np.float64)
        c = np.empty_like(a)
        c[0] = self.amplitude
        for i in range(1, len(a)):
            c[i] = c[i - 1] * lo[i] ** (a[i] - a[i - 1])
        below = np.zeros_like(a)
        for i in range(1, len(a)):
            below[i] = below[i - 1] + _segment_mass(c[i - 1], a[i - 1], lo[i - 1], lo[i])
        return lo, c, a, below

    def density(self, r: np.ndarray | float) -> np.ndarray:
        """``p(r)``."""
        lo, c, a, _ = self._segments
        r = np.asarray(r, dtype=np.float64)
        i = np.searchsorted(lo, r, side="right") - 1
        i = np.clip(i, 0, len(lo) - 1)
        return c[i] * r ** (-a[i])

    def cumulative(self, r: np.ndarray | float) -> np.ndarray:
        """Mass of ``[start, r]``."""
        lo, c, a, below = self._segments
        r = np.asarray(r, dtype=np.float64)
        i = np.clip(np.searchsorted(lo, r, side="right") - 1, 0, len(lo) - 1)
        return below[i] + _segment_mass(c[i], a[i], lo[i], r)

    def inverse(self, mass: np.ndarray | float) -> np.ndarray:
        """The rank ``r`` with ``cumulative(r) = mass`` (vectorized)."""
        lo, c, a, below = self._segments
        mass = np.asarray(mass, dtype=np.float64)
        i = np.clip(np.searchsorted(below, mass, side="right") - 1, 0, len(lo) - 1)
        rest = mass - below[i]
        ai, ci, li = a[i], c[i], lo[i]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            one = np.abs(ai - 1.0) < 1e-12
            e = np.where(one, 0.5, 1.0 - ai)  # placeholder exponent where a = 1
            base = li ** e + rest * e / ci
            r_pow = np.where(base > 0, base, np.nan) ** (1.0 / e)
            r_log = li * np.exp(rest / ci)
            out = np.where(one, r_log, r_pow)
        return np.where(np.isfinite(out), out, np.inf)


def _segment_mass(c: np.ndarray | float, a: np.ndarray | float, lo: np.ndarray | float,
                  hi: np.ndarray | float) -> np.ndarray:
    """∫_lo^hi c·r^(-a) dr, vectorized (a = 1 handled by the logarithm)."""
    c, a, lo, hi = (np.asarray(x, dtype=np.float64) for x in (c, a, lo, hi))
    one = np.abs(a - 1.0) < 1e-12
    e = np.where(one, 0.5, 1.0 - a)
    powered = c * (hi ** e - lo ** e) / e
    logged = c * np.log(hi / lo)
    return np.where(one, logged, powered)


# --------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SynthPreset:
    """Every calibration constant of one synthetic log, with where it comes from.

    Targets (``n_users``, ``distinct_queries``, ``distinct_urls``) are the published
    statistics of the real log (paper Figure 8, docs/ALGORITHM.md §10); the generator solves
    the pool sizes to hit the distinct counts. The shape constants are documented per preset
    in :data:`PRESETS`.

    Attributes
    ----------
    name, description : label and one-paragraph provenance.
    n_users : users at ``scale = 1``.
    distinct_queries, distinct_urls : targets for the number of distinct queries / URLs among
        the records (scaled by ``scale``).
    mean_records : mean records (clicks) per user.
    records_sigma : σ of the lognormal behind the records-per-user count.
    max_records : cap on one user's records.
    repeat_query : P(a record repeats the user's previous query).
    repeat_url : P(it also repeats the previous URL | it repeats the query).
    named_queries, named_probabilities : the top queries and their per-user-sampled
        probabilities (ids 0, 1, ...).
    named_urls : the dominant URL of each named query (equal strings are one URL).
    named_dominant_share : share of that URL among the named query's clicks.
    head_law : rank-frequency law of the queries after the named ones (rank = position in
        ``P`` counting from 1; it starts at ``len(named_queries) + 1``).
    head_size : queries with their own URL distribution (the rest are pool / fresh).
    url_lambda, url_growth, url_max : head query ``r`` has ``1 + Poisson(λ_r)`` URLs (at most
        ``url_max``) with ``λ_r = url_lambda · (p_r / p_last_head)^url_growth``.
    dominant_beta : Beta(a, b) of an unnamed head query's dominant-URL share.
    url_zipf : the other URLs of a head query share the rest ∝ ``k^-url_zipf`` (jittered).
    tail_alt_url : P(a tail-query click goes to one of its URL slots k ≥ 1).
    url_pool_law : rank-frequency law of the shared URL pool of tail queries.
    structure_seed : seed of the population (head URL lists, hashes): fixed, so every
        generation seed samples the same population.
    """

    name: str
    description: str
    n_users: int
    distinct_queries: int
    distinct_urls: int
    mean_records: float
    records_sigma: float
    max_records: int
    repeat_query: float
    repeat_url: float
    named_queries: tuple[str, ...]
    named_probabilities: tuple[float, ...]
    named_urls: tuple[str, ...]
    named_dominant_share: float
    head_law: RankLaw
    head_size: int
    url_lambda: float
    url_growth: float
    url_max: int
    dominant_beta: tuple[float, float]
    url_zipf: float
    tail_alt_url: float
    url_pool_law: RankLaw
    structure_seed: int

    @functools.cached_property
    def head_probabilities(self) -> np.ndarray:
        """P(q) of the head queries 0 .. head_size-1 (named first, then the law)."""
        named = np.asarray(self.named_probabilities, dtype=np.float64)
        ranks = np.arange(len(named) + 1, self.head_size + 1, dtype=np.float64)
        p = np.concatenate([named, self.head_law.density(ranks)])
        p.flags.writeable = False
        return p

    @property
    def pool_start(self) -> float:
        """Continuous rank where the pool begins (just after the last head rank)."""
        return self.head_size + 0.5


# AOL: per-user-sampled probabilities of the top queries, paper Figure 9 (column 2).
_AOL_NAMED = (
    ("google", 0.0213, "http://www.google.com"),
    ("yahoo", 0.0067, "http://www.yahoo.com"),
    ("google.com", 0.0067, "http://www.google.com"),
    ("myspace.com", 0.0057, "http://www.myspace.com"),
    ("mapquest", 0.0054, "http://www.mapquest.com"),
    ("yahoo.com", 0.0043, "http://www.yahoo.com"),
    ("www.google.com", 0.0034, "http://www.google.com"),
    ("myspace", 0.0033, "http://www.myspace.com"),
    ("ebay", 0.0028, "http://www.ebay.com"),
)

# Fitted to the real AOL rank-frequency curve (the 1,043 most frequent queries, counts over
# all 36,389,567 log lines; rank 1 = google): a continuous two-piece log-log least-squares fit
# over ranks 10..1043 (break at 50, the best of 30/50/100/200) gives
# count(r) ≈ 316,207 · r^-0.892 for 10 ≤ r < 50 and slope -0.737 beyond.
AOL_COUNT_AMPLITUDE = 316_207 / 36_389_567  # as a share of log lines
AOL_COUNT_BREAK = 50.0
AOL_COUNT_EXPONENTS = (0.892, 0.737)
# Per-user-sampled probabilities are not line shares: heavy users' repeats count once per user.
# The nine Figure 9 queries have 0.0596 per user against 0.0292 of the lines (x2.04), and the
# paper's own head-list sizes pin down the per-user record probabilities just past rank 50:
# a head list of M = 50 records "does not begin until 4.5%" opt-in (Fig. 13a, ε = 4) and
# "does not begin until ε = 3" at 5% (Fig. 15a). The line-share slope (-0.737) would give
# ~135 records at 5% (far above 50), so between query ranks 50 and 200 the per-user law falls
# with slope -2 (expected CreateHeadList sizes: ~67 at 5%, ~61 at 4.5%, ~54 at ε = 3, ~40
# at ε = 2), and beyond 200 with slope -0.6, which the distinct-query target (4.81 M from
# 19.4 M records) then fixes. The factor is solved (bisection on the population's record
# probabilities) so that the 50 most probable records carry 0.0892 (Figure 9: 0.9108
# outside the M = 50 head list) with this preset's URL splits.
AOL_PER_USER_FACTOR = 2.183
AOL_PER_USER_BREAKS = (50.0, 200.0)
AOL_PER_USER_EXPONENTS = (AOL_COUNT_EXPONENTS[0], 2.0, 0.6)

PRESETS: dict[str, SynthPreset] = {
    "aol": SynthPreset(
        name="aol",
        description=(
            "AOL 2006 search log (paper Figure 8): 519,371 users, 4,811,646 distinct queries, "
            "1,620,064 distinct URLs, 19,442,629 click records (36,389,567 lines, 47% without "
            "a click). Head = Figure 9's per-user-sampled probabilities, then the fitted AOL "
            "rank-frequency power law."),
        n_users=519_371,
        distinct_queries=4_811_646,
        distinct_urls=1_620_064,
        # 19,442,629 click records / 519,371 users = 37.4 per user.
        mean_records=19_442_629 / 519_371,
        # The 117 clicking users of the real 20k-line sample have log-sd 1.72 of their click
        # counts; that sample is heavier than average (97 clicks per user), so slightly less.
        records_sigma=1.6,
        max_records=100_000,
        # Real sample: 50% of a user's clicks repeat the previous click's query, 13% repeat
        # the whole record (so 0.26 of query repeats keep the URL).
        repeat_query=0.45,
        repeat_url=0.26,
        named_queries=tuple(q for q, _, _ in _AOL_NAMED),
        named_probabilities=tuple(p for _, p, _ in _AOL_NAMED),
        named_urls=tuple(u for _, _, u in _AOL_NAMED),
        named_dominant_share=0.9,  # navigational queries: one URL takes most clicks
        head_law=RankLaw(AOL_PER_USER_FACTOR * AOL_COUNT_AMPLITUDE, 10.0, AOL_PER_USER_BREAKS,
                         AOL_PER_USER_EXPONENTS),
        head_size=2_000,
        url_lambda=1.5,
        url_growth=0.4,  # google: ~20 URLs; rank 100: ~5; rank 2000: ~2.5
        url_max=60,
        dominant_beta=(5.0, 1.5),  # mean dominant share 0.77: the AOL head is navigational
        url_zipf=1.2,
        # Real sample: 37% of queries have more than one URL (mostly the head and repeated
        # queries); a tail click goes to a second, third... URL of its query 25% of the time.
        tail_alt_url=0.25,
        # Shared URL pool (sites): top site 0.5% of tail queries, flat to rank 10^4, then
        # Zipf-steep so that 4.8 M tail queries share 1.6 M URLs.
        url_pool_law=RankLaw(0.005, 1.0, (10_000.0,), (0.55, 1.1)),
        structure_seed=20060301,
    ),
    "yandex": SynthPreset(
        name="yandex",
        description=(
            "Yandex 2013 search log (paper Figure 8): 4,970,073 users, 13,171,961 distinct "
            "queries, 12,702,350 distinct URLs. Records per user are not published: 7.5 on "
            "average keeps 13.2 M distinct queries reachable and generation fast. Head: a "
            "synthetic Zipf law (slope -0.9) whose ~600 most probable records have probability "
            ">= 1.3e-4, so a head list of M = 500 records forms from 1.5% opt-in users "
            "(paper §5)."),
        n_users=4_970_073,
        distinct_queries=13_171_961,
        distinct_urls=12_702_350,
        mean_records=7.5,
        records_sigma=1.2,
        max_records=20_000,
        repeat_query=0.35,
        repeat_url=0.26,
        named_queries=(),
        named_probabilities=(),
        named_urls=(),
        named_dominant_share=0.9,
        # No per-query statistics of Yandex are published; the head is a Zipf law (slope -0.9,
        # as search-log heads are) sized by the paper's own statements: M = 500 head lists form
        # from 1.5% opt-in at ε = 4 (expected CreateHeadList size ~650; ~1000 at 2.5%) but not
        # at ε = 1 (~140), "NDCG above 95% from 1.5% for all but the largest head list" (§5).
        # A steep knee after rank 700 then keeps 13.2 M distinct queries reachable from 37 M
        # records, and the tail continues as Zipf.
        head_law=RankLaw(0.045, 1.0, (700.0, 2000.0), (0.9, 2.5, 1.0)),
        head_size=2_000,
        url_lambda=1.3,
        url_growth=0.4,
        url_max=40,
        dominant_beta=(5.0, 1.5),
        url_zipf=1.2,
        tail_alt_url=0.25,
        # 12.7 M URLs for 13.2 M queries: few tail queries share a URL.
        url_pool_law=RankLaw(0.002, 1.0, (10_000.0,), (0.5, 1.2)),
        structure_seed=20130101,
    ),
}


def get_preset(preset: str) -> SynthPreset:
    """The preset named ``preset``; :class:`~hybriddp.errors.ParameterError` if unknown."""
    if preset not in PRESETS:
        raise parameter_error("preset", preset, "one of " + ", ".join(repr(p) for p in PRESETS),
                              "Pick a preset, e.g. --preset aol.")
    return PRESETS[preset]


# --------------------------------------------------------------------------------------
# The population: head URL distributions (fixed per preset)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _HeadUrls:
    """Head query ``h`` has URL slots ``ptr[h]:ptr[h+1]`` with ids ``ids`` and shares
    ``share``; ``key = h + cumulative share`` (increasing) lets one searchsorted draw them."""

    ptr: np.ndarray
    ids: np.ndarray
    share: np.ndarray
    key: np.ndarray
    n_urls: int
    named: tuple[str, ...]


@functools.lru_cache(maxsize=8)
def _head_urls(preset: SynthPreset) -> _HeadUrls:
    """The URL distributions of the head queries, drawn once from ``structure_seed``."""
    rng = np.random.default_rng(preset.structure_seed)
    p = preset.head_probabilities
    n_head = len(p)
    lam = preset.url_lambda * (p / p[-1]) ** preset.url_growth
    n = np.minimum(1 + rng.poisson(lam), preset.url_max).astype(np.int64)
    ptr = np.concatenate([[0], np.cumsum(n)])
    # dominant share, then the rest split Zipf-like with jitter, sorted decreasing
    dominant = rng.beta(*preset.dominant_beta, size=n_head)
    n_named = len(preset.named_queries)
    dominant[:n_named] = preset.named_dominant_share
    slot = np.arange(ptr[-1]) - np.repeat(ptr[:-1], n)  # 0 = dominant
    owner = np.repeat(np.arange(n_head), n)
    weight = (np.maximum(slot, 1).astype(np.float64) ** -preset.url_zipf
              * np.exp(0.5 * rng.standard_normal(ptr[-1])))
    weight[slot == 0] = 0.0
    rest = np.bincount(owner, weights=weight, minlength=n_head)
    # sort the non-dominant slots of each query by decreasing weight (dominant stays first)
    order = np.lexsort((np.where(slot == 0, -np.inf, -weight), owner))
    weight = weight[order]
    rest_share = np.where(rest[owner] > 0, weight / np.where(rest[owner] > 0, rest[owner], 1.0), 0.0)
    share = np.where(slot == 0, dominant[owner], (1.0 - dominant[owner]) * rest_share)
    share[slot == 0] = np.where(n == 1, 1.0, dominant)  # a single URL takes everything
    # ids: named dominant URLs first (equal names = one URL), then one id per other slot
    named_names = tuple(dict.fromkeys(preset.named_urls))
    ids = np.empty(ptr[-1], dtype=np.int64)
    is_named_slot = (owner < n_named) & (slot == 0)
    ids[is_named_slot] = [named_names.index(u) for u in preset.named_urls]
    ids[~is_named_slot] = len(named_names) + np.arange(int((~is_named_slot).sum()))
    cum = np.cumsum(share)
    cum_before = np.repeat(cum[ptr[:-1]] - share[ptr[:-1]], n)
    key = owner + np.minimum(cum - cum_before, 1.0)
    key[ptr[1:] - 1] = owner[ptr[1:] - 1] + 1.0  # last slot closes at h + 1 exactly
    for array in (ptr, ids, share, key):
        array.flags.writeable = False  # cached and shared
    return _HeadUrls(ptr, ids, share, key, len(named_names) + int((~is_named_slot).sum()), named_names)


def head_record_probabilities(preset: str | SynthPreset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The population probabilities of the head records.

    Returns
    -------
    (query, url, p) : ids and ``P(q)·P(u | q)`` of every head-query record (the expected
        per-user-sampled record probability, ALGORITHM.md §9's ground truth in expectation).
    """
    pre = get_preset(preset) if isinstance(preset, str) else preset
    hu = _head_urls(pre)
    owner = np.repeat(np.arange(pre.head_size), np.diff(hu.ptr))
    return owner, hu.ids, pre.head_probabilities[owner] * hu.share


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
             progress: ProgressFn | None = None) -> RecordLog:
    """Generate a synthetic search log calibrated to a real one (ALGORITHM.md §10).

    Parameters
    ----------
    preset : ``'aol'`` or ``'yandex'`` (see :data:`PRESETS`).
    seed : seed of the draws (reproducible experiments); None draws 128 bits from the OS.
    scale : multiplies the number of users, and so the records and distinct counts; the head
        probabilities do not change. ``scale=0.005`` makes a small AOL-like log for tests.
    progress : optional ``progress(stages_done, total_stages)``.

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
    q_independent, n_pool_q, n_query_ids = _draw_queries(rng, pre, scale, int(n - repeat_q.sum()))
    query = np.empty(n, dtype=np.int32)
    query[~repeat_q] = q_independent
    del q_independent
    query = query[_forward_fill(repeat_q)]
    del repeat_q
    step(3)

    # 4. URLs given the query, forward-filled over the repeated records
    hu = _head_urls(pre)
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


def _draw_queries(rng: np.random.Generator, pre: SynthPreset, scale: float,
                  m: int) -> tuple[np.ndarray, int, int]:
    """``m`` independent draws from P: head | pool (size solved for the distinct target) | fresh.

    Returns
    -------
    (ids, J, n_ids) : int32 query ids, the pool size, and the number of query ids in use
        (head + pool + fresh).
    """
    head_p = pre.head_probabilities
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


def _draw_urls(rng: np.random.Generator, pre: SynthPreset, scale: float, hu: _HeadUrls,
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


def _expected_head_urls(hu: _HeadUrls, draws_per_query: np.ndarray) -> float:
    """Expected distinct head URLs given how many URL draws each head query got."""
    owner = np.repeat(np.arange(len(draws_per_query)), np.diff(hu.ptr))
    log_miss = draws_per_query[owner] * np.log1p(-np.minimum(hu.share, 1.0 - 1e-15))
    miss = np.exp(np.bincount(hu.ids, weights=log_miss, minlength=hu.n_urls))
    return float((1.0 - miss).sum())


# --------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------


class _Decoder:
    """Strings of vocabulary ids as Arrow arrays, vectorized for synthetic vocabularies."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.prefix = vocab.prefix if isinstance(vocab, SyntheticVocabulary) else QUERY_PREFIX
        # synthetic names are checked once here; other strings per written chunk
        self.plain = False
        if isinstance(vocab, SyntheticVocabulary):
            self.named = pa.array(vocab.named, type=pa.string())
            self.plain = not any(_STRUCTURAL.search(x) for x in (vocab.prefix, *vocab.named))
        elif isinstance(vocab, ArrayVocabulary):
            self.strings = pa.array(vocab.strings, type=pa.string())

    def __call__(self, ids: np.ndarray) -> pa.Array:
        ids = np.asarray(ids, dtype=np.int64)
        valid = ids >= 0
        if isinstance(self.vocab, SyntheticVocabulary):
            out = synthetic_names(self.prefix, ids)
            if len(self.named):
                is_named = valid & (ids < len(self.named))
                if is_named.any():
                    names = self.named.take(pa.array(np.where(is_named, ids, 0)))
                    out = pc.if_else(pa.array(is_named), names, out)
        elif isinstance(self.vocab, ArrayVocabulary):
            out = self.strings.take(pa.array(np.where(valid, ids, 0)))
        else:
            out = pa.array(self.vocab.decode(np.where(valid, ids, 0)), type=pa.string())
        if not valid.all():
            out = pc.if_else(pa.array(valid), out, pa.scalar(None, pa.string()))
        return out


def synthetic_names(prefix: str, ids: np.ndarray) -> pa.Array:
    """``prefix + str(id)`` for every id, as an Arrow string array (no Python loop)."""
    digits = pc.cast(pa.array(np.asarray(ids, dtype=np.int64)), pa.string())
    return pc.binary_join_element_wise(pa.scalar(prefix), digits, "")


def _chunks(offsets: np.ndarray, target: int) -> list[tuple[int, int]]:
    """User ranges ``[a, b)`` of about ``target`` records each (a user is never split)."""
    n_users = len(offsets) - 1
    bounds = [0]
    while bounds[-1] < n_users:
        a = bounds[-1]
        b = int(np.searchsorted(offsets, offsets[a] + target, side="right")) - 1
        bounds.append(min(max(b, a + 1), n_users))
    return list(itertools.pairwise(bounds))


def write_log(log: RecordLog, path: str | os.PathLike[str], *, format: str = "parquet",
              seed: int | None = None, progress: ProgressFn | None = None) -> None:
    """Write a log as Parquet or in the AOL TSV format, in bounded memory.

    Parameters
    ----------
    log : any RecordLog (synthetic or loaded).
    path : output file. For ``format='aol'`` a ``.gz`` / ``.bz2`` / ``.zst`` name compresses.
    format : ``'parquet'``: columns ``user`` (int64, the user index), ``query`` (string),
        ``url`` (string, null for a log without URLs), one row per record.
        ``'aol'``: the original AOL layout (``AnonID Query QueryTime ItemRank ClickURL``,
        tab-separated, no quoting): every record is a click row (ItemRank 1..10), and rows
        without a click (empty ItemRank and ClickURL) are interleaved as in the real log
        (16,946,938 of its 36,389,567 lines), with increasing QueryTime per user within
        2006-03-01..2006-05-31. ``AnonID`` is the user index, so loading the file back gives
        the same users in the same order and the same records.
    seed : seed of the AOL format's extra rows, times and ranks (None: OS entropy).
    progress : optional ``progress(records_written, n_records)``.

    The file is written to a temporary file next to ``path`` and renamed over it at the end
    (:mod:`hybriddp.io.atomic`): a failed or killed write leaves ``path`` as it was.

    Raises
    ------
    ParameterError
        Unknown format, or the AOL format for a log without URLs.
    DataError
        ``path`` cannot be written (missing or read-only directory, a directory itself).
    """
    fmt = str(format).lower()
    if fmt not in WRITE_FORMATS:
        raise parameter_error("format", format, "one of " + ", ".join(repr(f) for f in WRITE_FORMATS))
    p = os.fspath(path)
    if fmt == "aol" and not log.has_urls:
        raise parameter_error("format", format, "'parquet' for a log without URLs",
                              "The AOL format has a record only where ClickURL is set.")
    check_output_path(p, "path")
    chunks = _chunks(log.user_offsets, _CHUNK_RECORDS)
    with atomic_path(p) as tmp:  # a failed or killed write leaves no half-written file (io.atomic)
        if fmt == "parquet":
            _write_parquet(log, os.fspath(tmp), chunks, progress)
        else:
            _write_aol(log, os.fspath(tmp), p, chunks, make_rng(seed), progress)
    logger.info("wrote %d records of %d users to %s (%s)", log.n_records, log.n_users, p, fmt)


def _write_parquet(log: RecordLog, path: str, chunks: list[tuple[int, int]],
                   progress: ProgressFn | None) -> None:
    import pyarrow.parquet as pq

    schema = pa.schema([("user", pa.int64()), ("query", pa.string()), ("url", pa.string())])
    dq, du = _Decoder(log.queries), _Decoder(log.urls)
    with pq.ParquetWriter(path, schema) as writer:
        if not chunks:
            writer.write_table(schema.empty_table())
        for a, b in chunks:
            lo, hi = int(log.user_offsets[a]), int(log.user_offsets[b])
            users = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(log.user_offsets[a:b + 1]))
            url = (du(log.url[lo:hi]) if log.has_urls
                   else pa.nulls(hi - lo, pa.string()))
            table = pa.table([pa.array(users), dq(log.query[lo:hi]), url], schema=schema)
            writer.write_table(table)
            if progress is not None:
                progress(hi, log.n_records)


# Real-log shapes for the AOL writer (aggregates of the real AOL log, docs/ALGORITHM.md §10): 16,946,938 of
# the 36,389,567 lines have no click; the click ranks 1..10 occur with these shares in the
# 20k-line sample (ranks above 10, 6% of clicks, are folded in).
_AOL_NO_CLICK_PER_CLICK = 16_946_938 / 19_442_629
_AOL_RANK_SHARES = np.array([0.424, 0.115, 0.080, 0.063, 0.046, 0.040, 0.036, 0.032, 0.031, 0.033])
_AOL_START = 1141171200  # 2006-03-01 00:00:00 UTC
_AOL_SPAN = 92 * 86400  # through 2006-05-31 23:59:59
_NO_CLICK_SAME_QUERY = 0.5  # a row without a click mostly precedes a click on the same query


def _write_aol(log: RecordLog, tmp: str, path: str, chunks: list[tuple[int, int]], rng: np.random.Generator,
               progress: ProgressFn | None) -> None:
    """Write to ``tmp``, compressed as the final name ``path`` says (``path`` also names errors)."""
    codec = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}.get(os.path.splitext(path)[1].lower())
    dq, du = _Decoder(log.queries), _Decoder(log.urls)
    rank_cum = np.cumsum(_AOL_RANK_SHARES / _AOL_RANK_SHARES.sum())
    p_geometric = 1.0 / (1.0 + _AOL_NO_CLICK_PER_CLICK)
    next_unclicked = len(log.queries)
    raw = pa.OSFile(tmp, "wb")
    if codec == "gzip":  # Arrow's gzip runs at level 9: ~1 MB/s; level 1 is ~50x faster
        stream = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=_GZIP_LEVEL, mtime=0)
    else:
        stream = pa.CompressedOutputStream(raw, codec) if codec else raw
    try:
        stream.write("\t".join(AOL_COLUMNS).encode())  # every row starts with its line break
        for a, b in chunks:
            lo, hi = int(log.user_offsets[a]), int(log.user_offsets[b])
            n_click = hi - lo
            # rows without a click before each click row: geometric, mean 0.87 per click
            rows_per_click = rng.geometric(p_geometric, n_click)
            n_rows = int(rows_per_click.sum())
            click_row = np.cumsum(rows_per_click) - 1
            is_click = np.zeros(n_rows, dtype=bool)
            is_click[click_row] = True
            row_click = np.repeat(np.arange(n_click), rows_per_click)  # the click a row precedes
            owner = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(log.user_offsets[a:b + 1]))
            user = owner[row_click]
            del owner
            # a row without a click repeats the coming click's query, or is a query never clicked
            qid = log.query[lo:hi].astype(np.int64)[row_click]
            fresh = ~is_click & (rng.random(n_rows) >= _NO_CLICK_SAME_QUERY)
            n_fresh = int(fresh.sum())
            qid[fresh] = next_unclicked + np.arange(n_fresh)
            next_unclicked += n_fresh
            query = dq(np.where(fresh, 0, qid))
            if n_fresh:
                query = pc.if_else(pa.array(fresh), synthetic_names(dq.prefix, qid), query)
            rank = np.minimum(np.searchsorted(rank_cum, rng.random(n_rows), side="right") + 1, 10)
            url_ids = np.full(n_rows, NO_URL, dtype=np.int64)
            url_ids[click_row] = log.url[lo:hi]
            columns = [pa.array(user), query, _aol_times(rng, user, a, b),
                       pa.array(rank, mask=~is_click), du(url_ids)]
            check = [i for i, d in ((1, dq), (4, du)) if not d.plain]
            stream.write(_tsv_lines(columns, path, check))
            if progress is not None:
                progress(hi, log.n_records)
        stream.write(b"\n")
    finally:
        stream.close()
        if stream is not raw:
            raw.close()


def _tsv_lines(columns: list[pa.Array], path: str, check: list[int]) -> pa.Buffer:
    """The rows as ``\\n``-prefixed tab-separated lines, nulls empty, no quoting, one buffer.

    Built by Arrow string kernels (pyarrow's CSV writer refuses ``"`` without quoting, and
    AOL queries contain it). A value with a tab or line break cannot be written: the columns
    ``check`` are searched for one.
    """
    text = [c if pa.types.is_string(c.type) else pc.cast(c, pa.string()) for c in columns]
    for i in check:
        if pc.any(pc.match_substring_regex(text[i], _STRUCTURAL.pattern)).as_py():
            raise DataError(f"cannot write {path} in the AOL format: a {AOL_COLUMNS[i]} value "
                            "contains a tab or line break; write Parquet instead")
    text[0] = pc.binary_join_element_wise("", text[0], "\n")  # "\n" + first field
    line = pc.binary_join_element_wise(*text, "\t", null_handling="replace", null_replacement="")
    if isinstance(line, pa.ChunkedArray):
        line = line.combine_chunks()
    offsets = np.frombuffer(line.buffers()[1], dtype=np.int32)[line.offset:line.offset + len(line) + 1]
    return line.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _aol_times(rng: np.random.Generator, user: np.ndarray, a: int, b: int) -> pa.Array:
    """Increasing ``YYYY-MM-DD HH:MM:SS`` times per user inside March-May 2006.

    A user is active over a random window (Beta(1, 1.5) of the 92 days, at least one second
    per row) and the rows are spread over it by sorted-uniform (exponential) spacings.
    """
    n_users = b - a
    rows = np.bincount(user - a, minlength=n_users)
    start_row = np.concatenate([[0], np.cumsum(rows)[:-1]])
    span = np.maximum(rng.beta(1.0, 1.5, n_users) * _AOL_SPAN, rows).astype(np.float64)
    span = np.minimum(span, _AOL_SPAN - 1)
    begin = rng.random(n_users) * (_AOL_SPAN - span)
    gaps = rng.exponential(1.0, len(user))
    cum = np.cumsum(gaps)
    total = np.add.reduceat(gaps, start_row) if len(user) else gaps
    before = (cum - gaps)[start_row]  # cumulative gap mass before each user's first row
    u = user - a
    frac = (cum - before[u]) / (total[u] + rng.exponential(1.0, n_users)[u])
    within = np.arange(len(user)) - start_row[u]  # row index inside the user
    free = span[u] - rows[u]  # seconds left after one second per row
    seconds = _AOL_START + np.floor(begin[u] + frac * free) + within
    stamps = pa.array(seconds.astype(np.int64), type=pa.timestamp("s"))
    return pc.cast(stamps, pa.string())  # "YYYY-MM-DD HH:MM:SS" (30x faster than strftime)

"""The presets of the synthetic logs: rank-frequency laws, calibration constants, the fixed population.

A :class:`SynthPreset` holds every constant of one synthetic log (AOL or Yandex, ALGORITHM.md §10) with
where it comes from; :data:`PRESETS` names them. The head queries' URL distributions are drawn once per
preset from its ``structure_seed`` (:func:`head_urls`), so every generation seed samples the same
population, whose head-record probabilities :func:`head_record_probabilities` gives.

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
import itertools
from dataclasses import dataclass

import numpy as np

from hybriddp.core.errors import parameter_error

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
    """The preset named ``preset``; :class:`~hybriddp.core.errors.ParameterError` if unknown."""
    if preset not in PRESETS:
        raise parameter_error("preset", preset, "one of " + ", ".join(repr(p) for p in PRESETS),
                              "Pick a preset, e.g. --preset aol.")
    return PRESETS[preset]


# --------------------------------------------------------------------------------------
# The population: head URL distributions (fixed per preset)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadUrls:
    """Head query ``h`` has URL slots ``ptr[h]:ptr[h+1]`` with ids ``ids`` and shares
    ``share``; ``key = h + cumulative share`` (increasing) lets one searchsorted draw them."""

    ptr: np.ndarray
    ids: np.ndarray
    share: np.ndarray
    key: np.ndarray
    n_urls: int
    named: tuple[str, ...]
    """Names of the URL ids 0 … len(named) − 1: the named queries' dominant URLs (equal names = one URL), then
    their other URLs, named after the dominant one (``…/page2`` …); every later id is a placeholder."""


@functools.lru_cache(maxsize=8)
def head_urls(preset: SynthPreset) -> HeadUrls:
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
    named = named_names + _secondary_names(preset.named_urls, n[:n_named])
    cum = np.cumsum(share)
    cum_before = np.repeat(cum[ptr[:-1]] - share[ptr[:-1]], n)
    key = owner + np.minimum(cum - cum_before, 1.0)
    key[ptr[1:] - 1] = owner[ptr[1:] - 1] + 1.0  # last slot closes at h + 1 exactly
    for array in (ptr, ids, share, key):
        array.flags.writeable = False  # cached and shared
    return HeadUrls(ptr, ids, share, key, len(named_names) + int((~is_named_slot).sum()), named)


def _secondary_names(dominant: tuple[str, ...], n_urls: np.ndarray) -> tuple[str, ...]:
    """Names of the named head queries' other URLs (slots 1 …, in slot order, query by query), derived from the
    query's dominant URL: ``<dominant>/page2``, ``<dominant>/page3`` … numbered per dominant URL across the
    queries that share it, so every name is distinct. Their ids follow the dominant URLs' (:func:`head_urls`),
    so they extend :attr:`HeadUrls.named` and only the names change: ids and counts are those of the
    placeholders ``http://www.site<id>`` they replace."""
    pages: dict[str, int] = {}
    out: list[str] = []
    for url, n in zip(dominant, n_urls.tolist(), strict=True):
        for _ in range(n - 1):
            pages[url] = pages.get(url, 1) + 1
            out.append(f"{url.rstrip('/')}/page{pages[url]}")
    if len(set(out) | set(dominant)) != len(out) + len(set(dominant)):
        raise ValueError("a named head query's derived URL name collides with another URL name")
    return tuple(out)


def head_record_probabilities(preset: str | SynthPreset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The population probabilities of the head records.

    Returns
    -------
    (query, url, p) : ids and ``P(q)·P(u | q)`` of every head-query record (the expected
        per-user-sampled record probability, ALGORITHM.md §9's ground truth in expectation).
    """
    pre = get_preset(preset) if isinstance(preset, str) else preset
    hu = head_urls(pre)
    owner = np.repeat(np.arange(pre.head_size), np.diff(hu.ptr))
    return owner, hu.ids, pre.head_probabilities[owner] * hu.share

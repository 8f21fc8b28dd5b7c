"""OLH, optimized local hashing: an ε-LDP frequency oracle, vectorized over users.

Wang, Blocki, Li, Jha, "Locally differentially private protocols for frequency estimation",
USENIX Security 2017: the "Local Hashing" protocols (OLH), on top of the paper's framework of
"pure" LDP protocols (support sets, the unbiased estimator and its variance) and its "Direct
Encoding" (g-ary randomized response, GRR).

Each user holding a value ``v``

1. draws a hash function ``H`` uniformly from a (universal) family mapping values to
   ``[0, g)`` with ``g = round(e^ε + 1)`` (the variance-minimizing ``g`` of OLH);
2. hashes ``x = H(v)`` and perturbs it by g-ary randomized response (GRR): keep ``x``
   with probability ``p = e^ε/(e^ε + g − 1)``, else report one of the other ``g − 1`` values
   uniformly;
3. sends ``(H, y)``.

The aggregator's support count of a candidate ``x`` is ``C(x) = #{i : H_i(x) = y_i}``; with a
universal family a non-holder supports ``x`` with probability ``1/g`` and a holder with
probability ``p``, so ``ĉ(x) = (C(x) − n/g)/(p − 1/g)`` is unbiased for the number of
holders (the pure-protocol estimator with ``p* = p``, ``q* = 1/g``), with variance
``n_x·p(1−p)/(p−1/g)² + (n−n_x)·(1/g)(1−1/g)/(p−1/g)²`` (:func:`olh_variance`), about
``n·4e^ε/(e^ε−1)²`` at ``g = e^ε + 1`` (OLH's variance; :func:`olh_variance_approx`).

The hash family
---------------
Values are integers ``x < 2^32``. A user's hash function is a pair ``(a, b)`` of uniform
64-bit integers:

    h32(x) = ((a·x + b) mod 2^64) >> 32,          H(x) = (h32(x)·g) >> 32.

``h32`` is Dietzfelbinger's multiply-add-shift scheme ("Universal hashing and k-wise
independent random variables via integer arithmetic without primes", STACS 1996; Thorup,
"High speed hashing for integers and strings", 2015, "multiply-add-shift"): for w-bit keys, a, b uniform in
``[2^{2w})`` and output the top w bits, it is *strongly* universal (2-independent) onto
``[2^32)`` — here w = 32, so all arithmetic is exact uint64 arithmetic with wrap-around (NumPy
uint64 multiplication wraps mod 2^64). ``H`` maps the uniform 32-bit value onto ``[0, g)`` by
a fixed multiply-high, which puts ``⌊2^32/g⌋`` or ``⌈2^32/g⌉`` hash values in each bucket:
``P[H(x) = j]`` and ``P[H(x) = H(x')]`` (x ≠ x') are ``1/g`` up to ``g/2^32`` (< 10⁻⁷ for any g
used here), i.e. the family is universal up to that rounding. Privacy does not depend on the
hash at all (GRR on ``H(v)`` is ε-LDP for *every* fixed ``H``); only the ``1/g`` in the
unbiasing step does, with a bias below ``n·g/2^32``.

Support counting in bulk
------------------------
``H_i(x) = y_i`` iff ``h32_i(x) ∈ [lo(y_i), lo(y_i+1))`` with ``lo(y) = ⌈y·2^32/g⌉``, iff
``(a_i·x + b_i − lo(y_i)·2^32) mod 2^64 < (lo(y_i+1) − lo(y_i))·2^32``. So a (user, candidate)
pair costs one multiply, one add and one compare on uint64; :func:`support_counts` evaluates
them in blocks of at most ``block_bytes`` (default 8 MB) per thread, on all cores.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hybriddp.core.threads import default_threads

VALUE_BITS = 32
"""Values (and PEM prefixes) hashed by OLH must be integers in ``[0, 2^VALUE_BITS)``."""

_U32 = np.uint64(32)
_MAX_U64 = np.iinfo(np.uint64).max


def olh_g(epsilon: float) -> int:
    """The hash range of OLH: ``g = round(e^ε + 1)`` (Wang et al. 2017, OLH), at least 2."""
    return max(2, round(math.exp(epsilon) + 1.0))


def keep_probability(epsilon: float, g: int) -> float:
    """GRR's chance to report the true hashed value: ``p = e^ε/(e^ε + g − 1)``."""
    e = math.exp(epsilon)
    return e / (e + g - 1)


@dataclass
class OLHReports:
    """The reports of ``n`` users: each user's hash function ``(a, b)`` and perturbed value ``y``.

    Attributes
    ----------
    a, b : uint64 arrays, shape (n,)
        The seed of each user's hash function ``H(x) = (((a·x + b) mod 2^64 >> 32)·g) >> 32``.
    y : int64 array, shape (n,)
        The reported (hashed, then randomized) value in ``[0, g)``.
    g : int
        Hash range.
    epsilon : float
        Privacy parameter the reports were randomized with.
    """

    a: np.ndarray
    b: np.ndarray
    y: np.ndarray
    g: int
    epsilon: float

    def __len__(self) -> int:
        return len(self.y)


def _as_values(values: np.ndarray) -> np.ndarray:
    """Values as uint64, checked to lie in ``[0, 2^VALUE_BITS)``."""
    v = np.asarray(values)
    if v.size and (v.min() < 0 or int(v.max()) >= 1 << VALUE_BITS):
        raise ValueError(f"OLH values must be integers in [0, 2^{VALUE_BITS})")
    return v.astype(np.uint64)


def hash32(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Multiply-add-shift ``((a·x + b) mod 2^64) >> 32`` (broadcasting, uint64, exact)."""
    with np.errstate(over="ignore"):
        return (np.asarray(a, dtype=np.uint64) * np.asarray(x, dtype=np.uint64)
                + np.asarray(b, dtype=np.uint64)) >> _U32


def olh_hash(a: np.ndarray, b: np.ndarray, x: np.ndarray, g: int) -> np.ndarray:
    """``H_{a,b}(x) = (h32(x)·g) >> 32`` in ``[0, g)`` as int64 (broadcasting)."""
    return ((hash32(a, b, x) * np.uint64(g)) >> _U32).astype(np.int64)


def draw_hash_seeds(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` independent hash functions: ``(a, b)`` uniform 64-bit integers."""
    a = rng.integers(0, _MAX_U64, size=n, dtype=np.uint64, endpoint=True)
    b = rng.integers(0, _MAX_U64, size=n, dtype=np.uint64, endpoint=True)
    return a, b


def grr_perturb(hashed: np.ndarray, g: int, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """g-ary randomized response (Direct Encoding): keep w.p. ``p``, else uniform over the other g − 1."""
    hashed = np.asarray(hashed, dtype=np.int64)
    n = len(hashed)
    keep = rng.random(n) < keep_probability(epsilon, g)
    other = rng.integers(0, g - 1, size=n, dtype=np.int64)
    other += other >= hashed  # skip the true value: uniform over [0, g) \ {hashed}
    return np.where(keep, hashed, other)


def olh_perturb(values: np.ndarray, epsilon: float, rng: np.random.Generator, g: int | None = None) -> OLHReports:
    """Every user's OLH report at once (Wang et al. 2017, Local Hashing): hash, then GRR.

    Parameters
    ----------
    values : int array, shape (n,), each in ``[0, 2^32)``: one value per user.
    epsilon : the per-user privacy parameter; each report is ε-LDP.
    rng : source of the hash seeds and the randomized response.
    g : hash range; default :func:`olh_g` (ε).
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    g = olh_g(epsilon) if g is None else int(g)
    if g < 2 or g >= 1 << 31:
        raise ValueError(f"g must be in [2, 2^31), got {g}")
    v = _as_values(values)
    a, b = draw_hash_seeds(len(v), rng)
    y = grr_perturb(olh_hash(a, b, v, g), g, epsilon, rng)
    return OLHReports(a, b, y, g, float(epsilon))


def _bucket_starts(y: np.ndarray, g: int) -> np.ndarray:
    """``lo(y) = ⌈y·2^32/g⌉`` exactly (uint64), the first 32-bit hash value ``H`` maps to ``y``."""
    y = np.asarray(y, dtype=np.uint64)
    return ((y << _U32) + np.uint64(g - 1)) // np.uint64(g)


def support_counts(reports: OLHReports, candidates: np.ndarray, *, threads: int | None = None,
                   block_bytes: int = 8 << 20) -> np.ndarray:
    """``C(x) = #{users i : H_i(x) = y_i}`` for every candidate ``x`` (support counting).

    Evaluates all (user, candidate) pairs with the interval test of the module docstring, in
    blocks of about ``block_bytes`` of uint64 per thread (memory stays bounded whatever the
    number of users and candidates), on ``threads`` threads (default: the machine's cores,
    at most 8; NumPy releases the GIL).

    Returns
    -------
    int64 array, shape (len(candidates),).
    """
    x = _as_values(candidates)
    n, n_cand = len(reports), len(x)
    counts = np.zeros(n_cand, dtype=np.int64)
    if n == 0 or n_cand == 0:
        return counts
    lo = _bucket_starts(reports.y, reports.g)
    hi = _bucket_starts(np.asarray(reports.y, dtype=np.int64) + 1, reports.g)
    with np.errstate(over="ignore"):
        shift = reports.b - (lo << _U32)  # mod 2^64
    width = (hi - lo) << _U32  # < 2^64 since g ≥ 2
    a = reports.a
    elems = max(1 << 12, block_bytes // 9)  # a uint64 block plus its bool mask
    c_chunk = min(n_cand, max(1, elems // 64))
    u_chunk = max(64, elems // c_chunk)
    tasks = [(cs, us) for cs in range(0, n_cand, c_chunk) for us in range(0, n, u_chunk)]

    def work(task: tuple[int, int]) -> tuple[int, np.ndarray]:
        cs, us = task
        xs = x[cs:cs + c_chunk]
        sl = slice(us, us + u_chunk)
        z = np.multiply.outer(xs, a[sl])  # (candidates, users), wraps mod 2^64
        z += shift[sl]
        return cs, np.count_nonzero(z < width[sl], axis=1)

    workers = threads or default_threads()
    if workers == 1 or len(tasks) == 1:
        results = map(work, tasks)
        for cs, c in results:
            counts[cs:cs + len(c)] += c
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for cs, c in pool.map(work, tasks):
                counts[cs:cs + len(c)] += c
    return counts


def olh_estimate(reports: OLHReports, candidates: np.ndarray, epsilon: float | None = None, *,
                 threads: int | None = None, block_bytes: int = 8 << 20) -> np.ndarray:
    """Unbiased estimates of the number of users holding each candidate (Wang et al. 2017, OLH).

    ``ĉ(x) = (C(x) − n/g)/(p − 1/g)`` with ``C`` from :func:`support_counts`; divide by
    ``len(reports)`` for frequencies. ``epsilon`` defaults to the reports' own (given, it must
    match it).

    Returns
    -------
    float64 array, shape (len(candidates),).
    """
    if epsilon is not None and not math.isclose(epsilon, reports.epsilon):
        raise ValueError(f"reports were randomized with epsilon={reports.epsilon}, not {epsilon}")
    g = reports.g
    p = keep_probability(reports.epsilon, g)
    c = support_counts(reports, candidates, threads=threads, block_bytes=block_bytes)
    return (c - len(reports) / g) / (p - 1.0 / g)


def olh_output_distribution(g: int, epsilon: float) -> np.ndarray:
    """``P[y | H(v) = h]`` as a (g × g) matrix: row = hashed input ``h``, column = report ``y``.

    For a user's (fixed) hash function ``H`` the report ``(H, y)`` has probability
    ``P[H]·P[y | H(v)]``, and ``P[H]`` does not depend on ``v``; so the privacy ratio
    ``P[(H, y) | v]/P[(H, y) | v']`` is a ratio of two entries of one column of this matrix
    (all of them when ``H(v) ≠ H(v')``; 1 when they collide).
    """
    p = keep_probability(epsilon, g)
    q = (1.0 - p) / (g - 1)
    P = np.full((g, g), q)
    np.fill_diagonal(P, p)
    return P


def max_privacy_ratio(P: np.ndarray) -> float:
    """``max_{x, x', y} P[y | x]/P[y | x']`` of a channel matrix (∞ if some P[y | x'] = 0 < P[y | x])."""
    P = np.asarray(P, dtype=np.float64)
    top = P.max(axis=0)
    bottom = P.min(axis=0)
    with np.errstate(divide="ignore"):
        ratios = np.where(top > 0, top / bottom, 1.0)
    return float(ratios.max())


def olh_variance(n: int, n_x: float, epsilon: float, g: int | None = None) -> float:
    """Exact ``Var[ĉ(x)]`` for ``n`` users of which ``n_x`` hold ``x`` (universal hash).

    A holder supports ``x`` w.p. ``p``, a non-holder w.p. ``1/g``, independently:
    ``Var = [n_x·p(1−p) + (n − n_x)(1/g)(1 − 1/g)]/(p − 1/g)²``.
    """
    g = olh_g(epsilon) if g is None else g
    p = keep_probability(epsilon, g)
    q = 1.0 / g
    return (n_x * p * (1.0 - p) + (n - n_x) * q * (1.0 - q)) / (p - q) ** 2


def olh_variance_approx(n: int, epsilon: float) -> float:
    """The OLH paper's approximate count variance ``n·4e^ε/(e^ε − 1)²`` (at ``g = e^ε + 1``)."""
    e = math.exp(epsilon)
    return n * 4.0 * e / (e - 1.0) ** 2

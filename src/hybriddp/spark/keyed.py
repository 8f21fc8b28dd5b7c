"""Keyed per-user sampling: the same ≤ m records per user on every engine (ALGORITHM.md §1, docs/SCALE.md).

The NumPy path samples with a sequential random stream (:func:`hybriddp.core.records.sample_per_user`),
which a cluster cannot replay without holding every user's position in the stream. The keyed
scheme gives every record a 64-bit key that depends only on its own content,

    key = xxhash64(seed, stream, user, query, url, k)        (Spark's ``xxhash64``, seed 42)

where ``k`` numbers the copies of one identical (user, query, url) row (0, 1, …; identical rows
are interchangeable, so the numbering's order does not matter), and keeps the ``m`` records of
each user with the smallest keys (ties, which need a 64-bit collision, broken by query, URL, k).
Ordering a user's records by independent uniform keys is a uniformly random order, so the first
``m`` are a uniform m-subset without replacement, as ALGORITHM.md §1 asks. ``user`` is hashed as
the UTF-8 text of the user id; a null URL (logs without a URL level) is skipped, as Spark does.

:func:`xxh64` is a pure-Python XXH64 (the reference: Spark's ``xxhash64`` chains
``XXH64(value, seed=previous hash)`` over its arguments, longs as 8 little-endian bytes, strings
as UTF-8) and :func:`keyed_sample` the reference sampler that :func:`spark_keyed_sample` must match.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                      9650029242287828579, 2870177450012600261)
SPARK_SEED = 42
"""The seed Spark's ``xxhash64`` function starts its chain from."""

STREAM_CODES = {"sample_optin": 1, "sample_clients": 2, "sample_records": 3}
"""The ``stream`` argument of the key: one number per sampling purpose."""


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * P2) & _M, 31) * P1) & _M


def xxh64(data: bytes, seed: int) -> int:
    """XXH64 of ``data`` with ``seed`` (unsigned 64-bit result), the reference algorithm."""
    n, i, seed = len(data), 0, seed & _M
    if n >= 32:
        v = [(seed + P1 + P2) & _M, (seed + P2) & _M, seed, (seed - P1) & _M]
        while i + 32 <= n:
            v = [_round(v[j], int.from_bytes(data[i + 8 * j:i + 8 * j + 8], "little")) for j in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for lane in v:
            h = (((h ^ _round(0, lane)) * P1) + P4) & _M
    else:
        h = (seed + P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, int.from_bytes(data[i:i + 8], "little")), 27) * P1 + P4) & _M
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ (int.from_bytes(data[i:i + 4], "little") * P1 & _M), 23) * P2 + P3) & _M
        i += 4
    while i < n:
        h = (_rotl(h ^ (data[i] * P5 & _M), 11) * P1) & _M
        i += 1
    h = ((h ^ (h >> 33)) * P2) & _M
    h = ((h ^ (h >> 29)) * P3) & _M
    return h ^ (h >> 32)


def spark_xxhash64(*values: int | str | None) -> int:
    """What Spark's ``xxhash64(values…)`` returns (signed): ints as longs, strings as UTF-8, None skipped."""
    h = SPARK_SEED
    for v in values:
        if v is None:
            continue
        data = (v & _M).to_bytes(8, "little") if isinstance(v, int) else v.encode("utf-8")
        h = xxh64(data, h)
    return h - (1 << 64) if h >= 1 << 63 else h


def record_key(seed: int, stream: str, user: str, query: str, url: str | None, k: int) -> int:
    """The key of the ``k``-th copy of record (query, url) of ``user`` (see the module docstring)."""
    return spark_xxhash64(seed, STREAM_CODES[stream], user, query, url, k)


def keyed_sample(users: Sequence[object], queries: Sequence[str], urls: Sequence[str | None], m: int,
                 seed: int, stream: str = "sample_records") -> list[tuple[str, str, str | None]]:
    """Reference sampler: (user, query, url) of the ≤ m smallest-key records of every user.

    Pure Python (one hash per record): for tests and small logs; Spark runs the same scheme at scale.
    """
    copies: dict[tuple[str, str, str | None], int] = defaultdict(int)
    per_user: dict[str, list[tuple[int, str, str, int, str | None]]] = defaultdict(list)
    for u, q, r in zip(users, queries, urls, strict=True):
        su = str(u)
        k = copies[(su, q, r)]
        copies[(su, q, r)] += 1
        per_user[su].append((record_key(seed, stream, su, q, r, k), q, "" if r is None else r, k, r))
    out = []
    for su, recs in per_user.items():
        out.extend((su, q, r) for _, q, _, _, r in sorted(recs)[:m])
    return out


def spark_keyed_sample(df: DataFrame, m: int, seed: int, stream: str = "sample_records", *,
                       user_col: str = "user", query_col: str = "query", url_col: str | None = "url") -> DataFrame:
    """The keyed sample in Spark: rows (user string, query, url) of the ≤ m smallest-key records per user.

    Two window passes (copies of a row; the per-user order), each a shuffle by user: the log is
    never collected. ``url_col=None`` for logs without a URL level (url is then null).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    url = F.col(url_col).cast("string") if url_col else F.lit(None).cast("string")
    recs = df.select(F.col(user_col).cast("string").alias("user"), F.col(query_col).cast("string").alias("query"),
                     url.alias("url"))
    copy = Window.partitionBy("user", "query", "url").orderBy(F.lit(0))
    recs = recs.withColumn("k", (F.row_number().over(copy) - 1).cast("long"))
    recs = recs.withColumn("key", F.xxhash64(F.lit(seed).cast("long"), F.lit(STREAM_CODES[stream]).cast("long"),
                                             "user", "query", "url", "k"))
    order = Window.partitionBy("user").orderBy("key", "query", F.coalesce("url", F.lit("")), "k")
    ranked = recs.withColumn("rank", F.row_number().over(order))
    return ranked.filter(F.col("rank") <= m).select("user", "query", "url")

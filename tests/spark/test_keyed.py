"""The keyed per-user sample (hybriddp.spark.keyed): hash, uniformity, Spark = reference (ALGORITHM.md §1)."""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import numpy as np
import pyarrow as pa
import pytest

from hybriddp.spark.keyed import keyed_sample, spark_keyed_sample, xxh64


def test_xxh64_published_vectors() -> None:
    # test vectors of the XXH64 reference implementation (xxhash.com / the python-xxhash README)
    assert xxh64(b"", 0) == 0xEF46DB3751D8E999
    assert xxh64(b"a", 0) == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc", 0) == 0x44BC2CF5AD770999
    assert xxh64(b"Nobody inspects the spammish repetition", 0) == 0xFBCEA83C8A378BF1


def test_reference_sample_is_uniform_without_replacement() -> None:
    """One user with 4 distinct records, m = 2, 1,200 seeds: each of the C(4,2) = 6 subsets ~ 1/6."""
    recs = ["a", "b", "c", "d"]
    seen: Counter[frozenset[str]] = Counter()
    for seed in range(1_200):
        got = keyed_sample(["u"] * 4, recs, [None] * 4, 2, seed)
        assert len(got) == 2 and len({q for _, q, _ in got}) == 2  # without replacement
        seen[frozenset(q for _, q, _ in got)] += 1
    assert set(seen) == {frozenset(c) for c in combinations(recs, 2)}
    chi2 = sum((n - 200) ** 2 / 200 for n in seen.values())
    assert chi2 < 25.7  # chi-square, 5 degrees of freedom, p = 1e-4


def _log(n_users: int, seed: int, string_users: bool, urls: bool) -> dict[str, list]:
    import random
    rnd = random.Random(seed)
    users, queries, url = [], [], []
    for u in range(n_users):
        for _ in range(rnd.randint(1, 6)):
            q = rnd.randint(0, 5)
            users.append(f"user-{u}" if string_users else 1000 + u)
            queries.append(f"q{q}")  # few distinct: identical rows of one user occur
            url.append(f"http://s{q}/{rnd.randint(0, 1)}" if urls and rnd.random() < 0.8 else None)
    return {"user": users, "query": queries, "url": url}


@pytest.mark.parametrize(("m", "string_users", "urls"), [(1, True, True), (3, False, True), (2, True, False)])
def test_spark_keyed_sample_equals_reference(spark, m: int, string_users: bool, urls: bool) -> None:
    cols = _log(400, m, string_users, urls)
    want = Counter(keyed_sample(cols["user"], cols["query"], cols["url"], m, seed=99))
    df = spark.createDataFrame(pa.table(cols if urls else {k: v for k, v in cols.items() if k != "url"}))
    rows = spark_keyed_sample(df, m, 99, url_col="url" if urls else None).collect()
    got = Counter((r["user"], r["query"], r["url"]) for r in rows)
    assert got == want
    per_user = Counter(u for u, _, _ in want.elements())
    have = Counter(str(u) for u in cols["user"])
    assert all(per_user[u] == min(m, n) for u, n in have.items())


def test_spark_head_list_equals_reference(spark) -> None:
    """CreateHeadList from Spark's keyed counts = from the reference's counts (same seeded noise)."""
    import random

    from hybriddp.core.noise import DiscreteLaplaceNoise
    from hybriddp.core.rng import stage_rng
    from hybriddp.spark.curator import reference_optin_counts, spark_optin_counts
    rnd = random.Random(4)
    users, queries, urls = [], [], []
    for u in range(3_000):  # Zipf-like queries so that some records pass tau
        for _ in range(rnd.randint(1, 4)):
            q = min(int(rnd.paretovariate(1.2)), 60)
            users.append(u)
            queries.append(f"q{q}")
            urls.append(f"http://s{q}/{rnd.randint(0, 2)}")
    df = spark.createDataFrame(pa.table({"user": users, "query": queries, "url": urls}))
    got = spark_optin_counts(df, 2, seed=8)
    want = reference_optin_counts(users, queries, urls, 2, seed=8)
    assert got.n_records == want.n_records == sum(min(2, n) for n in Counter(users).values())
    order_g, order_w = np.lexsort((got.url, got.query)), np.lexsort((want.url, want.query))
    assert np.array_equal(got.counts[order_g], want.counts[order_w])
    hls = [c.head_list(epsilon=4, delta=1e-5, m_o=2, noise=DiscreteLaplaceNoise(stage_rng(8, "headlist_noise")))
           for c in (got, want)]
    assert hls[0].n_records == hls[1].n_records > 5
    assert got.queries.decode(hls[0].query_ids) == want.queries.decode(hls[1].query_ids)
    assert np.array_equal(hls[0].entry_url, hls[1].entry_url)


def test_every_periods_counts_in_one_job_equal_each_periods_reference(spark) -> None:
    """Round series at scale (docs/SCALE.md): one Spark job samples ≤ m_O records per user *and period* and counts
    them per period; each period's counts equal the pure-Python reference on that period's records alone."""
    import random

    from hybriddp.core.periods import period_index
    from hybriddp.spark.curator import (
        PERIOD_SEPARATOR,
        reference_optin_counts,
        spark_optin_counts_by_period,
        with_period,
    )
    rnd = random.Random(30)
    start, week = 1_141_171_200, 7 * 86_400  # 2006-03-01, AOL's first day
    rows = {"user": [], "query": [], "url": [], "time": []}
    for u in range(300):
        for _ in range(rnd.randint(1, 8)):  # a user's records spread over 4 weeks
            q = rnd.randint(0, 6)
            rows["user"].append(f"user-{u}")
            rows["query"].append(f"q{q}")
            rows["url"].append(f"http://s{q}/{rnd.randint(0, 1)}")
            rows["time"].append(start + rnd.randint(0, 4 * week - 1))
    df = with_period(spark.createDataFrame(pa.table(rows)), "time", start, week)
    got = spark_optin_counts_by_period(df, 2, seed=7)
    idx = period_index(np.array(rows["time"]), start, week)
    assert sorted(got) == sorted(set(idx.tolist())) == [0, 1, 2, 3]
    for p, counted in got.items():
        mask = idx == p
        users = [f"{u}{PERIOD_SEPARATOR}{p}" for u, m in zip(rows["user"], mask, strict=True) if m]
        want = reference_optin_counts(users, [q for q, m in zip(rows["query"], mask, strict=True) if m],
                                      [r for r, m in zip(rows["url"], mask, strict=True) if m], 2, seed=7)
        def as_dict(c):
            urls = [None if x < 0 else c.urls.decode([x])[0] for x in c.url.tolist()]
            return dict(zip(zip(c.queries.decode(c.query), urls, strict=True), c.counts.tolist(), strict=True))
        assert as_dict(counted) == as_dict(want)
        per_user = Counter(u for u, m in zip(rows["user"], mask, strict=True) if m)
        assert counted.n_records == sum(min(2, n) for n in per_user.values())  # ≤ m_O per user in each period

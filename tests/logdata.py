"""Small search logs built in code for the tests (a fresh clone has no real data sets)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hybriddp.core.records import ArrayVocabulary, RecordLog


def zipf_log(n_users: int = 20_000, n_queries: int = 300, urls_per_query: int = 6, seed: int = 0,
             max_records: int = 5, query_exponent: float = 1.1) -> RecordLog:
    """Users with 1..max_records records; Zipf queries, a few Zipf URLs per query."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, max_records + 1, n_users)
    n = int(counts.sum())
    pq = 1.0 / np.arange(1, n_queries + 1) ** query_exponent
    q = rng.choice(n_queries, size=n, p=pq / pq.sum())
    pu = 1.0 / np.arange(1, urls_per_query + 1) ** 1.5
    u_local = rng.choice(urls_per_query, size=n, p=pu / pu.sum())
    u = q * urls_per_query + u_local
    offsets = np.concatenate([[0], np.cumsum(counts)])
    queries = ArrayVocabulary([f"query {i}" for i in range(n_queries)])
    urls = ArrayVocabulary([f"http://site{i // urls_per_query}.example/{i % urls_per_query}"
                            for i in range(n_queries * urls_per_query)])
    return RecordLog(offsets, q.astype(np.int32), u.astype(np.int32), queries, urls)


def write_aol(log: RecordLog, path: Path, no_click_every: int = 3) -> None:
    """Write a log in the AOL TSV format, adding a row without a click every few records."""
    qn = log.queries.decode(log.query)
    un = log.urls.decode(log.url)
    lines = ["AnonID\tQuery\tQueryTime\tItemRank\tClickURL"]
    for user in range(log.n_users):
        for r in range(log.user_offsets[user], log.user_offsets[user + 1]):
            if r % no_click_every == 0:
                lines.append(f"{1000 + user}\t{qn[r]}\t2006-03-01 10:00:00\t\t")
            lines.append(f"{1000 + user}\t{qn[r]}\t2006-03-01 10:00:01\t1\t{un[r]}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_csv(log: RecordLog, path: Path) -> None:
    """Write user,query,url as CSV."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    users = np.repeat(np.arange(log.n_users), log.records_per_user())
    table = pa.table({"uid": users, "q": log.queries.decode(log.query), "clicked": log.urls.decode(log.url)})
    pacsv.write_csv(table, path)

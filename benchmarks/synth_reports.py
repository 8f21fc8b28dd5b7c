"""Synthetic device reports at any scale, written as a Parquet reports directory (docs/SCALE.md).

A helper module of ``bench_spark.py``, which imports it as a sibling (a script's own folder is on
``sys.path``).

For measuring the server's counting (ALGORITHM.md §6) at browser scale: ``n`` one-report messages
whose reported entries follow a Zipf law over the head list's entries, with random 22-character
ids, written chunk by chunk (memory is bounded by one chunk, whatever ``n``). A fraction of the
messages is written twice (a device retrying), which the counting must drop. The true counts per
entry (``np.bincount`` of the drawn entries, resent copies excluded) come back with the directory,
so a counting engine can be checked against them exactly.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from hybriddp.curator.release import CuratorRelease
from hybriddp.io.parquet_reports import ROWS_PER_FILE, ReportsWriter, atomic_directory

_ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", dtype=np.uint8)


def random_ids(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` random message ids: 22 URL-safe base64 characters each (the shape devices send)."""
    data = _ALPHABET[rng.integers(0, 64, size=n * 22, dtype=np.uint8)]
    offsets = np.arange(0, 22 * n + 1, 22, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())])


def _entry_strings(release: CuratorRelease) -> tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]:
    """Per head-list entry: query and URL strings (null = wildcard), and which are null."""
    from hybriddp.spark.reports import entry_table  # the server's own mapping

    tbl = entry_table(release).sort_by("entry")
    q, u = tbl.column("q").combine_chunks(), tbl.column("u").combine_chunks()
    return q, u, np.asarray(q.is_null()), np.asarray(u.is_null())


def write_synthetic_reports(path: str | os.PathLike[str], release: CuratorRelease, n: int, *, seed: int = 0,
                            exponent: float = 1.1, resend_fraction: float = 0.001, chunk: int = 2_000_000,
                            rows_per_file: int = ROWS_PER_FILE,
                            progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Write ``n`` distinct one-report messages (plus resent copies) to ``path``; return the true counts.

    ``progress(k)`` is called after every chunk with the messages written so far.
    """
    rng = np.random.default_rng(seed)
    n_entries = release.head_list.n_entries
    w = 1.0 / np.arange(1, n_entries + 1) ** exponent
    law = rng.permutation(w / w.sum())  # Zipf weights spread over the entries, wildcards included
    q_values, u_values, q_null, u_null = _entry_strings(release)
    counts = np.zeros(n_entries, dtype=np.int64)
    done = 0
    with atomic_directory(path) as tmp:
        out = ReportsWriter(tmp, rows_per_file)
        while done < n:
            k = min(chunk, n - done)
            entry = rng.choice(n_entries, size=k, p=law)
            counts += np.bincount(entry, minlength=n_entries)
            resend = rng.random(k) < resend_fraction
            rows = np.concatenate([np.arange(k), np.flatnonzero(resend)])
            ids = random_ids(rng, k).take(pa.array(rows))
            e = entry[rows]
            out.add(pa.table({
                "id": ids, "pos": pa.array(np.zeros(len(rows), np.int32)),
                "headlist": pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(rows), np.int32)),
                                                           pa.array([release.hash])).cast(pa.string()),
                "query": pa.DictionaryArray.from_arrays(pa.array(e.astype(np.int32), mask=q_null[e]), q_values),
                "url": pa.DictionaryArray.from_arrays(pa.array(e.astype(np.int32), mask=u_null[e]), u_values),
            }))
            done += k
            if progress:
                progress(done)
        out.flush()
    return counts

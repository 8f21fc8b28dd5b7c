"""A synthetic log of any size as a directory of Parquet files, written part by part (docs/SCALE.md).

:func:`hybriddp.io.synth.generate` builds a whole log in memory; at browser scale (10⁸ users) that
does not fit one machine. :func:`write_partitioned_log` instead generates the users in parts of
``users_per_file`` users, each an independent draw of the preset (ALGORITHM.md §10) with its own
child seed, and writes each part as ``part-NNNNN.parquet`` (columns ``user``, ``query``, ``url``,
users numbered globally), so memory is bounded by one part. The head of the distributions (named
queries and URLs, their probabilities) is the preset's in every part; the long tail of each part is
drawn from the same synthetic name space, so tail records repeat across parts more often than in one
log generated whole (distinct-query counts grow more slowly with scale). The directory appears only
when every part is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hybriddp.errors import parameter_error
from hybriddp.io.parquet_reports import atomic_directory
from hybriddp.io.synth import _CHUNK_RECORDS, _chunks, _Decoder, generate, get_preset
from hybriddp.records import RecordLog

LOG_SCHEMA = pa.schema([("user", pa.int64()), ("query", pa.string()), ("url", pa.string())])


def _part_seeds(seed: int | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    return [int(c.generate_state(1, np.uint64)[0] >> np.uint64(1)) for c in np.random.SeedSequence(seed).spawn(n)]


def _write_part(log: RecordLog, path: str, first_user: int) -> None:
    dq, du = _Decoder(log.queries), _Decoder(log.urls)
    with pq.ParquetWriter(path, LOG_SCHEMA) as writer:
        for a, b in _chunks(log.user_offsets, _CHUNK_RECORDS):
            lo, hi = int(log.user_offsets[a]), int(log.user_offsets[b])
            users = np.repeat(np.arange(first_user + a, first_user + b, dtype=np.int64),
                              np.diff(log.user_offsets[a:b + 1]))
            writer.write_table(pa.table([pa.array(users), dq(log.query[lo:hi]), du(log.url[lo:hi])], LOG_SCHEMA))


def write_partitioned_log(path: str | os.PathLike[str], preset: str = "aol", *, seed: int | None = None,
                          scale: float = 1.0, users_per_file: int = 200_000,
                          progress: Callable[[int, int], None] | None = None) -> tuple[int, int, int]:
    """Write round(scale · preset users) users as Parquet parts; returns (users, records, files).

    ``progress(users_written, users_total)`` is called after every part.
    """
    pre = get_preset(preset)
    if users_per_file < 1:
        raise parameter_error("users_per_file", users_per_file, ">= 1")
    total = round(scale * pre.n_users)
    if total < 1:
        raise parameter_error("scale", scale, f">= {0.5 / pre.n_users:.3g} (at least one user)")
    sizes = [min(users_per_file, total - a) for a in range(0, total, users_per_file)]
    users = records = 0
    with atomic_directory(path) as tmp:
        for i, (n, part_seed) in enumerate(zip(sizes, _part_seeds(seed, len(sizes)), strict=True)):
            log = generate(preset, seed=part_seed, scale=n / pre.n_users)
            _write_part(log, os.path.join(tmp, f"part-{i:05d}.parquet"), users)
            users += log.n_users
            records += log.n_records
            if progress is not None:
                progress(users, total)
    return users, records, len(sizes)

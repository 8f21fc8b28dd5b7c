"""A synthetic log of any size as a directory of Parquet files, written part by part (docs/SCALE.md).

:func:`hybriddp.datasets.generator.generate` builds a whole log in memory; at browser scale (10⁸ users) that
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

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.core.stages import ProgressFn
from hybriddp.datasets.generator import generate
from hybriddp.datasets.presets import get_preset
from hybriddp.datasets.writers import write_parquet
from hybriddp.io.parquet_reports import atomic_directory


def _part_seeds(seed: int | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    return [int(c.generate_state(1, np.uint64)[0] >> np.uint64(1)) for c in np.random.SeedSequence(seed).spawn(n)]


def write_partitioned_log(path: str | os.PathLike[str], preset: str = "aol", *, seed: int | None = None,
                          scale: float = 1.0, users_per_file: int = 200_000,
                          progress: ProgressFn | None = None) -> tuple[int, int, int]:
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
            write_parquet(log, os.path.join(tmp, f"part-{i:05d}.parquet"), first_user=users)
            users += log.n_users
            records += log.n_records
            if progress is not None:
                progress(users, total)
    return users, records, len(sizes)

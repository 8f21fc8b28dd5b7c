"""LocalAlg for millions of simulated clients, vectorized, and its exact distribution (ALGORITHM.md §5).

:func:`randomize_batch` is the NumPy twin of :func:`hybriddp.device.localalg.local_alg`: the same
thresholds (computed by the same pure-Python code), the same three uniforms per report, the
same arithmetic (⌊v·n⌋), so with the same uniforms both give identical reports.
:func:`output_distribution` is P[report | record] in closed form, used by the exact privacy
test (Theorem 3) and the chi-square tests of both samplers.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hybriddp.core.headlist import HeadList
from hybriddp.core.reportlaw import LocalAlgParams
from hybriddp.core.threads import default_threads

CHUNK = 1 << 20
"""Reports per chunk: chunk ``i`` draws its uniforms from ``rng.spawn(n_chunks)[i]``."""


def n_chunks(n: int) -> int:
    """Number of chunks for ``n`` reports."""
    return (n + CHUNK - 1) // CHUNK


def chunk_uniforms(rng: np.random.Generator, n: int) -> Iterator[tuple[slice, np.ndarray]]:
    """The uniforms of ``n`` reports, chunk by chunk: ``(slice, array of shape (3, len))``.

    This is exactly what :func:`randomize_batch` draws from ``rng``, so a replay (e.g. the
    device randomizer fed by :class:`~hybriddp.device.localalg.UniformReplay`) reproduces it.
    """
    for i, child in enumerate(rng.spawn(n_chunks(n))):
        sl = slice(i * CHUNK, min(n, (i + 1) * CHUNK))
        yield sl, child.random((3, sl.stop - sl.start))


def randomize_batch(
    entries: np.ndarray, hl: HeadList, lp: LocalAlgParams, rng: np.random.Generator | None = None,
    uniforms: np.ndarray | None = None, threads: int | None = None,
) -> np.ndarray:
    """Randomize many mapped records at once; returns report entry indices.

    Parameters
    ----------
    entries : int array, shape (n,), head-list entry index of each (mapped) record.
    hl, lp : the head list and its LocalAlg constants.
    rng : generator for the uniforms (ignored when ``uniforms`` is given). Reports are cut
        in chunks of :data:`CHUNK`; chunk i draws from ``rng.spawn(n_chunks)[i]`` and the
        chunks run on ``threads`` threads (default: the machine's cores, at most 8).
    uniforms : optional float array, shape (3, n): the uniforms v1, v2, v3 of each report.

    Notes
    -----
    Branch 1 (v1 < 1−t): q' = ⌊v2·(k−1)⌋ skipping q, u' = ⌊v3·k_{q'}⌋.
    Branch 2 (else, k_q > 1 and v2 < 1−t_q): u' = ⌊v3·(k_q−1)⌋ skipping u.
    Otherwise the record itself.
    """
    entries = np.asarray(entries, dtype=np.int64)
    n = len(entries)
    if lp.k == 1:
        return np.zeros(n, dtype=np.int64)
    if uniforms is not None:
        return _randomize_chunk(entries, hl, lp, uniforms)
    if rng is None:
        raise ValueError("randomize_batch needs rng or uniforms")
    out = np.empty(n, dtype=np.int64)
    children = rng.spawn(n_chunks(n))

    def work(i: int) -> None:
        sl = slice(i * CHUNK, min(n, (i + 1) * CHUNK))
        out[sl] = _randomize_chunk(entries[sl], hl, lp, children[i].random((3, sl.stop - sl.start)))

    workers = threads or default_threads()
    if workers == 1 or len(children) == 1:
        for i in range(len(children)):
            work(i)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:  # NumPy releases the GIL
            list(pool.map(work, range(len(children))))
    return out


def _randomize_chunk(entries: np.ndarray, hl: HeadList, lp: LocalAlgParams, uniforms: np.ndarray) -> np.ndarray:
    """Fig. 6 lines 7-14 on one chunk, with the uniforms given."""
    v1, v2, v3 = uniforms
    offsets = hl.url_offsets
    q = hl.entry_query[entries]
    u = entries - offsets[q]
    kq = lp.kq
    # branch 1: another query, uniform over HL \ {q}; then a uniform URL of it
    other_q = (v2 * (lp.k - 1)).astype(np.int64)
    other_q += other_q >= q
    other_u = (v3 * kq[other_q]).astype(np.int64)
    # branch 2: same query, another URL uniform over HL[q] \ {u}
    kq_q = kq[q]
    alt_u = (v3 * (kq_q - 1)).astype(np.int64)
    alt_u += alt_u >= u
    change_url = v2 < lp.one_minus_tq[q]  # 1 − t_q = 0 where k_q = 1: never
    new_u = np.where(change_url, alt_u, u)
    branch1 = v1 < lp.one_minus_t
    return np.where(branch1, offsets[other_q] + other_u, offsets[q] + new_u)


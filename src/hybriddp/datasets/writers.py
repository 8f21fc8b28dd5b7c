"""Writing a log as Parquet or in the AOL search log's own TSV layout: :func:`write_log` (ALGORITHM.md §10).

Any :class:`~hybriddp.core.records.RecordLog` (synthetic or loaded) is written chunk by chunk, in
bounded memory, to a temporary file renamed over the target at the end (:mod:`hybriddp.core.atomic`).
The AOL layout is :data:`hybriddp.io.aol.AOL_COLUMNS`, with rows without a click and times drawn
to match the real log's shape.
"""

from __future__ import annotations

import gzip
import itertools
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hybriddp.core.atomic import atomic_path, check_output_path
from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.records import NO_URL, ArrayVocabulary, RecordLog, SyntheticVocabulary, Vocabulary
from hybriddp.core.rng import make_rng
from hybriddp.core.stages import ProgressFn
from hybriddp.datasets.generator import QUERY_PREFIX, logger
from hybriddp.io.aol import AOL_COLUMNS, AOL_HEADER
from hybriddp.io.textfiles import compression

WRITE_FORMATS = ("parquet", "aol")
LOG_SCHEMA = pa.schema([("user", pa.int64()), ("query", pa.string()), ("url", pa.string())])
"""The Parquet layout of a log: one row per record."""

_CHUNK_RECORDS = 1 << 21  # records per written chunk (bounded memory)
_GZIP_LEVEL = 1
_STRUCTURAL = re.compile("[\t\n\r]")  # characters an unquoted TSV value cannot hold


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


def _chunks(offsets: np.ndarray, target: int = _CHUNK_RECORDS) -> list[tuple[int, int]]:
    """User ranges ``[a, b)`` of about ``target`` records each (a user is never split)."""
    n_users = len(offsets) - 1
    bounds = [0]
    while bounds[-1] < n_users:
        a = bounds[-1]
        b = int(np.searchsorted(offsets, offsets[a] + target, side="right")) - 1
        bounds.append(min(max(b, a + 1), n_users))
    return list(itertools.pairwise(bounds))


def _record_users(log: RecordLog, a: int, b: int, first_user: int = 0) -> np.ndarray:
    """The user of each record of users ``a .. b-1`` (numbered from ``first_user``)."""
    return np.repeat(np.arange(first_user + a, first_user + b, dtype=np.int64), np.diff(log.user_offsets[a:b + 1]))


def write_log(log: RecordLog, path: str | os.PathLike[str], *, format: str = "parquet",
              seed: int | None = None, progress: ProgressFn | None = None,
              window: tuple[int, int] | None = None) -> None:
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
    window : AOL format: ``(start, seconds)``, the QueryTime range (UNIX seconds) instead of March–May 2006, e.g.
        one period of a log whose popularity drifts (:mod:`hybriddp.datasets.drift`).

    The file is written to a temporary file next to ``path`` and renamed over it at the end
    (:mod:`hybriddp.core.atomic`): a failed or killed write leaves ``path`` as it was.

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
    with atomic_path(p) as tmp:  # a failed or killed write leaves no half-written file (core.atomic)
        if fmt == "parquet":
            write_parquet(log, os.fspath(tmp), progress=progress)
        else:
            _write_aol(log, os.fspath(tmp), p, make_rng(seed), progress, window or (AOL_START, _AOL_SPAN))
    logger.info("wrote %d records of %d users to %s (%s)", log.n_records, log.n_users, p, fmt)


def write_parquet(log: RecordLog, path: str, *, first_user: int = 0, progress: ProgressFn | None = None) -> None:
    """Write ``log`` to the Parquet file ``path`` in :data:`LOG_SCHEMA` (in place: :func:`write_log` and the
    partitioned writer rename it), users numbered from ``first_user``, in chunks of bounded memory.

    ``progress(records_written, n_records)`` is called after each chunk.
    """
    import pyarrow.parquet as pq

    dq, du = _Decoder(log.queries), _Decoder(log.urls)
    chunks = _chunks(log.user_offsets)
    with pq.ParquetWriter(path, LOG_SCHEMA) as writer:
        if not chunks:
            writer.write_table(LOG_SCHEMA.empty_table())
        for a, b in chunks:
            lo, hi = int(log.user_offsets[a]), int(log.user_offsets[b])
            url = (du(log.url[lo:hi]) if log.has_urls
                   else pa.nulls(hi - lo, pa.string()))
            table = pa.table([pa.array(_record_users(log, a, b, first_user)), dq(log.query[lo:hi]), url],
                             schema=LOG_SCHEMA)
            writer.write_table(table)
            if progress is not None:
                progress(hi, log.n_records)


# Real-log shapes for the AOL writer (aggregates of the real AOL log, docs/ALGORITHM.md §10): 16,946,938 of
# the 36,389,567 lines have no click; the click ranks 1..10 occur with these shares in the
# 20k-line sample (ranks above 10, 6% of clicks, are folded in).
_AOL_NO_CLICK_PER_CLICK = 16_946_938 / 19_442_629
_AOL_RANK_SHARES = np.array([0.424, 0.115, 0.080, 0.063, 0.046, 0.040, 0.036, 0.032, 0.031, 0.033])
AOL_START = 1141171200
"""2006-03-01 00:00:00 UTC, the AOL log's first day (UNIX seconds): where written QueryTimes start."""
_AOL_SPAN = 92 * 86400  # through 2006-05-31 23:59:59
_NO_CLICK_SAME_QUERY = 0.5  # a row without a click mostly precedes a click on the same query


def _write_aol(log: RecordLog, tmp: str, path: str, rng: np.random.Generator, progress: ProgressFn | None,
               window: tuple[int, int]) -> None:
    """Write to ``tmp``, compressed as the final name ``path`` says (``path`` also names errors)."""
    codec = compression(path)
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
        stream.write(AOL_HEADER.encode())  # every row starts with its line break
        for a, b in _chunks(log.user_offsets):
            lo, hi = int(log.user_offsets[a]), int(log.user_offsets[b])
            n_click = hi - lo
            # rows without a click before each click row: geometric, mean 0.87 per click
            rows_per_click = rng.geometric(p_geometric, n_click)
            n_rows = int(rows_per_click.sum())
            click_row = np.cumsum(rows_per_click) - 1
            is_click = np.zeros(n_rows, dtype=bool)
            is_click[click_row] = True
            row_click = np.repeat(np.arange(n_click), rows_per_click)  # the click a row precedes
            user = _record_users(log, a, b)[row_click]
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
            columns = [pa.array(user), query, _aol_times(rng, user, a, b, *window),
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


def _aol_times(rng: np.random.Generator, user: np.ndarray, a: int, b: int, start: int = AOL_START,
               total_span: int = _AOL_SPAN) -> pa.Array:
    """Increasing ``YYYY-MM-DD HH:MM:SS`` times per user inside ``[start, start + total_span)`` (March-May 2006).

    A user is active over a random window (Beta(1, 1.5) of the span, at least one second
    per row) and the rows are spread over it by sorted-uniform (exponential) spacings.
    """
    n_users = b - a
    rows = np.bincount(user - a, minlength=n_users)
    start_row = np.concatenate([[0], np.cumsum(rows)[:-1]])
    span = np.maximum(rng.beta(1.0, 1.5, n_users) * total_span, rows).astype(np.float64)
    span = np.minimum(span, total_span - 1)
    begin = rng.random(n_users) * (total_span - span)
    gaps = rng.exponential(1.0, len(user))
    cum = np.cumsum(gaps)
    total = np.add.reduceat(gaps, start_row) if len(user) else gaps
    before = (cum - gaps)[start_row]  # cumulative gap mass before each user's first row
    u = user - a
    frac = (cum - before[u]) / (total[u] + rng.exponential(1.0, n_users)[u])
    within = np.arange(len(user)) - start_row[u]  # row index inside the user
    free = span[u] - rows[u]  # seconds left after one second per row
    seconds = start + np.floor(begin[u] + frac * free) + within
    stamps = pa.array(seconds.astype(np.int64), type=pa.timestamp("s"))
    return pc.cast(stamps, pa.string())  # "YYYY-MM-DD HH:MM:SS" (30x faster than strftime)

"""The AOL search log: tab-separated, header ``AnonID Query QueryTime ItemRank ClickURL``, no quoting.

:func:`load_aol` reads it (streaming, vectorized; the conventions of :mod:`hybriddp.io.loaders`) into a
:class:`~hybriddp.core.records.RecordLog` of ALGORITHM.md §1's records; the synthetic AOL writer
(:mod:`hybriddp.datasets.writers`) writes the same layout.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hybriddp.core.errors import DataError
from hybriddp.core.records import LoadStats, RecordLog
from hybriddp.core.stages import ProgressFn
from hybriddp.io.blocks import (
    BadRows,
    Encoder,
    all_empty,
    as_bool,
    count_rows,
    log_summary,
    read_delimited,
    vocabulary,
)
from hybriddp.io.textfiles import check_file, first_line, short

AOL_COLUMNS = ("AnonID", "Query", "QueryTime", "ItemRank", "ClickURL")
"""The columns of an AOL file, in order."""
AOL_HEADER = "\t".join(AOL_COLUMNS)
"""Line 1 of an AOL file."""

_INT_RE = r"^[0-9]+$"
_ANON_RE = r"^[0-9]{1,18}$"  # fits in int64


def load_aol(
    path: str | os.PathLike[str], *, skip_bad_rows: bool = False, keep_no_click: bool = False,
    progress: ProgressFn | None = None, times: bool = False,
) -> RecordLog:
    """Load an AOL search-log file (``.txt``/``.tsv``, optionally ``.gz``).

    The file is tab-separated with the header ``AnonID Query QueryTime ItemRank ClickURL``
    and no quoting (queries may contain ``"``). A record is ``(AnonID, Query, ClickURL)``
    of a row with a click; rows without a click (empty ClickURL) are counted in
    ``stats.rows_without_click`` and dropped, unless ``keep_no_click`` (then their URL is
    the string ``""``).

    Parameters
    ----------
    path : file to read; ``.gz``/``.bz2``/``.zst`` are decompressed on the fly.
    skip_bad_rows : skip malformed rows (wrong number of fields, non-integer AnonID, click
        row with non-integer ItemRank) and count them in ``stats.rows_skipped_bad``, instead
        of raising :class:`DataError` on the first one.
    keep_no_click : keep rows without a click as records with URL ``""``.
    progress : optional ``progress(bytes_read, total_bytes)``, called per block.
    times : keep each record's QueryTime (``YYYY-MM-DD HH:MM:SS``, UTC) as ``log.times`` (UNIX seconds), for
        splitting the log into periods (:func:`hybriddp.core.periods.split_periods`); a row whose time does not
        parse is then a bad row.

    Returns
    -------
    RecordLog with users = distinct AnonIDs (in increasing AnonID order).

    Raises
    ------
    DataError
        Missing file, wrong header, or a malformed row (message names file and line).
    """
    p = check_file(path)
    _check_header(p)
    bad = BadRows(p, skip_bad_rows, "tab")
    stats = LoadStats()
    kept = _Kept(times)
    k_end = 0
    for batch, k0 in read_delimited(p, delimiter="\t", quoted=False, columns=AOL_COLUMNS, bad=bad,
                                    progress=progress):
        k_end = k0 + batch.num_rows
        keep = _check_block(batch, k0, bad, stats, keep_no_click, times)
        if keep.any():
            kept.add(batch, keep)
    bad.finish(k_end, stats)
    log = kept.log(p, stats)
    log_summary(p, log)
    return log


def _check_header(path: str) -> None:
    first = first_line(path)
    if first != AOL_HEADER:
        raise DataError(
            f"{path}: line 1 is not the AOL header: expected the tab-separated columns "
            f"{' '.join(AOL_COLUMNS)!r}, found {short(first, 80)}; "
            "for another table layout use --format csv/tsv with --user-col/--query-col/--url-col")


def _check_block(batch: pa.RecordBatch, k0: int, bad: BadRows, stats: LoadStats, keep_no_click: bool,
                 times: bool = False) -> np.ndarray:
    """Flag the block's bad rows (``bad``), count its rows (``stats``); return the rows to keep."""
    anon, rank, url = batch.column(0), batch.column(3), batch.column(4)
    click = as_bool(pc.greater(pc.binary_length(url), 0))
    blank = all_empty(batch)
    bad_anon = ~as_bool(pc.match_substring_regex(anon, _ANON_RE)) & ~blank
    bad_rank = click & ~as_bool(pc.match_substring_regex(rank, _INT_RE))
    bad_time = (~as_bool(pc.is_valid(_parse_times(batch.column(2)))) & ~blank) if times else np.zeros_like(blank)
    is_bad = bad_anon | bad_rank | bad_time

    def describe(i: int) -> str:
        if bad_anon[i]:
            return f"AnonID {short(anon[i].as_py())} is not an integer"
        if bad_time[i]:
            return f"QueryTime {short(batch.column(2)[i].as_py())} is not a time YYYY-MM-DD HH:MM:SS"
        return f"ItemRank {short(rank[i].as_py())} of a row with a click is not an integer"

    bad.check_block(k0, batch.num_rows, np.flatnonzero(is_bad), describe)
    good = ~blank & ~is_bad
    count_rows(stats, blank, good, ~click)
    return good & (click | keep_no_click)


def _parse_times(col: pa.Array) -> pa.Array:
    """QueryTime as timestamps (seconds); null where it does not parse."""
    return pc.strptime(col.cast(pa.string()), format="%Y-%m-%d %H:%M:%S", unit="s", error_is_null=True)


class _Kept:
    """The kept rows' AnonIDs, queries and URLs (and times), block by block."""

    def __init__(self, times: bool = False) -> None:
        self.anon: list[np.ndarray] = []
        self.times: list[np.ndarray] | None = [] if times else None
        self.queries, self.urls = Encoder(), Encoder()

    def add(self, batch: pa.RecordBatch, keep: np.ndarray) -> None:
        mask = pa.array(keep)
        self.anon.append(batch.column(0).filter(mask).cast(pa.string()).cast(pa.int64()).to_numpy())
        if self.times is not None:
            self.times.append(_parse_times(batch.column(2).filter(mask)).cast(pa.int64()).to_numpy(
                zero_copy_only=False))
        self.queries.add(batch.column(1).filter(mask))
        self.urls.add(batch.column(4).filter(mask))

    def log(self, path: str, stats: LoadStats) -> RecordLog:
        """The records grouped by AnonID, users in increasing AnonID order."""
        anon_ids = np.concatenate(self.anon) if self.anon else np.zeros(0, np.int64)
        self.anon = []
        anon_unique, users = np.unique(anon_ids, return_inverse=True)
        del anon_ids
        q_codes, q_vocab = vocabulary(*self.queries.finish(), path)
        u_codes, u_vocab = vocabulary(*self.urls.finish(), path)
        times = None if self.times is None else (np.concatenate(self.times) if self.times else np.zeros(0, np.int64))
        return RecordLog.from_user_sorted(users, q_codes, u_codes, q_vocab, u_vocab, True, stats,
                                          user_ids=anon_unique, times=times)

"""Tables of records: CSV, TSV or Parquet (a file, or a directory of Parquet parts) with named columns.

:func:`load_table` reads the user, query and URL columns a caller names into a
:class:`~hybriddp.core.records.RecordLog` of ALGORITHM.md §1's records (streaming, vectorized; the
conventions of :mod:`hybriddp.io.loaders`). CSV has double-quote quoting, TSV none; the format comes
from ``format`` or the name (:func:`~hybriddp.io.textfiles.table_format`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.records import NO_URL, ArrayVocabulary, LoadStats, RecordLog
from hybriddp.core.stages import ProgressFn
from hybriddp.io.blocks import (
    BadRows,
    Encoder,
    all_empty,
    as_binary,
    as_bool,
    count_rows,
    empty_cells,
    header_names,
    log_summary,
    read_delimited,
    runs_on,
    vocabulary,
)
from hybriddp.io.textfiles import TABLE_FORMATS, check_file, short, table_format

_PARQUET_BATCH = 1 << 20  # rows


def load_table(
    path: str | os.PathLike[str], *, user_col: str | None = None, query_col: str = "query",
    url_col: str | None = None, row_per_user: bool = False, format: str | None = None,
    skip_bad_rows: bool = False, progress: ProgressFn | None = None,
) -> RecordLog:
    """Load a CSV / TSV / Parquet table of records.

    CSV uses standard double-quote quoting; TSV has no quoting at all (a ``"`` is an
    ordinary character, as in the AOL files). Both need a header line naming the columns.

    Parameters
    ----------
    path : the file; ``.gz``/``.bz2``/``.zst`` text files are decompressed on the fly.
    user_col : column of user ids (ints or strings). Required unless ``row_per_user``.
    query_col : column of queries (or items). An empty / null cell is a malformed row.
    url_col : column of clicked URLs; ``None`` for a log without a URL level
        (``has_urls=False``, URLs all ``NO_URL``). An empty / null URL means no click: the
        row is counted in ``stats.rows_without_click`` and is not a record.
    row_per_user : every row is its own user (``user_col`` must then be None).
    format : ``'csv'``, ``'tsv'`` or ``'parquet'``; None guesses from the extension
        (:func:`~hybriddp.io.textfiles.table_format`: ``.txt`` is TSV).
    skip_bad_rows : skip malformed rows (wrong number of fields, empty user or query) and count
        them, instead of raising on the first one.
    progress : optional ``progress(bytes_read, total_bytes)``, called per block.

    Raises
    ------
    DataError
        Missing file or column, unknown format, malformed row.
    ParameterError
        Neither or both of ``user_col`` and ``row_per_user``.
    """
    p = log_path(path)
    fmt = _table_kind(p, format)
    cols = _Columns.of(user_col, query_col, url_col, row_per_user)
    bad = BadRows(p, skip_bad_rows, "comma" if fmt == "csv" else "tab")
    stats = LoadStats()
    kept = _Kept(cols)
    k_end = 0
    for batch, k0 in _table_blocks(p, fmt, cols, bad, progress):
        k_end = k0 + batch.num_rows
        _read_block(batch, k0, fmt, cols, bad, stats, kept)
    bad.finish(k_end, stats)
    log = kept.log(p, stats)
    log_summary(p, log)
    return log


def _table_kind(path: str, format: str | None) -> str:
    """csv, tsv or parquet: ``format``, else what the name says (a directory is Parquet)."""
    fmt = (format or ("parquet" if os.path.isdir(path) else table_format(path))).lower()
    if os.path.isdir(path) and fmt != "parquet":
        raise DataError(f"{path} is a directory; only a Parquet log may be a directory of .parquet files")
    if fmt not in TABLE_FORMATS:
        raise DataError(f"unknown table format {format!r}: allowed are 'csv', 'tsv', 'parquet'")
    return fmt


@dataclass(frozen=True)
class _Columns:
    """The columns a table load reads: user (None: a row per user), query, URL (None: no URL level)."""

    user: str | None
    query: str
    url: str | None

    @classmethod
    def of(cls, user_col: str | None, query_col: str, url_col: str | None, row_per_user: bool) -> _Columns:
        if row_per_user and user_col is not None:
            raise parameter_error("user_col", user_col, "None when row_per_user is set",
                                  "Pass either --user-col or --row-per-user, not both.")
        if not row_per_user and user_col is None:
            raise parameter_error("user_col", None, "a column name",
                                  "Pass --user-col NAME, or --row-per-user if every row is one user.")
        return cls(user_col, query_col, url_col)

    @property
    def wanted(self) -> list[tuple[str, str]]:
        """``(column, role)`` of every column read."""
        return [(c, r) for c, r in ((self.user, "user"), (self.query, "query"), (self.url, "URL")) if c is not None]

    @property
    def names(self) -> list[str]:
        """The distinct columns read, in the order user, query, URL."""
        return list(dict.fromkeys(c for c, _ in self.wanted))


def _table_blocks(path: str, fmt: str, cols: _Columns, bad: BadRows,
                  progress: ProgressFn | None) -> Iterator[tuple[pa.RecordBatch, int]]:
    """Check the header (or the schema of every Parquet part) for the columns, then read in blocks."""
    if fmt == "parquet":
        parts = parquet_parts(path)
        schema = _read_schema(parts[0])
        _check_columns(path, cols, schema.names)
        _check_parquet_types(path, schema, cols.wanted)
        for part in parts[1:]:
            _check_same_schema(part, parts[0], cols.names)
        return _parquet_parts_batches(parts, cols.names, progress)
    present = header_names(path, "," if fmt == "csv" else "\t", fmt == "csv")
    _check_columns(path, cols, present)
    # every column is read (as bytes) to tell blank lines from rows with empty cells
    return read_delimited(path, delimiter="," if fmt == "csv" else "\t", quoted=fmt == "csv",
                          columns=list(dict.fromkeys(present)), bad=bad, progress=progress)


def _read_block(batch: pa.RecordBatch, k0: int, fmt: str, cols: _Columns, bad: BadRows, stats: LoadStats,
                kept: _Kept) -> None:
    """Flag the block's bad rows (``bad``), count its rows (``stats``), keep its records (``kept``)."""
    n = batch.num_rows
    col = {c: batch.column(batch.schema.get_field_index(c)) for c in cols.names}
    query = as_binary(col[cols.query])
    url = as_binary(col[cols.url]) if cols.url is not None else None
    user = col[cols.user] if cols.user is not None else None
    if user is not None and pa.types.is_dictionary(user.type):
        user = user.dictionary_decode()
    q_empty = as_bool(empty_cells(query))
    u_empty = as_bool(empty_cells(as_binary(user))) if user is not None else np.zeros(n, bool)
    no_click = as_bool(empty_cells(url)) if url is not None else np.zeros(n, bool)
    blank = np.zeros(n, bool) if fmt == "parquet" else all_empty(batch)
    run_on = runs_on(batch) if fmt == "csv" else np.zeros(n, bool)
    is_bad = (q_empty | u_empty | run_on) & ~blank

    def describe(i: int) -> str:
        if run_on[i]:
            return ("a double quote opened in this row is never closed, so a field runs on over the "
                    "following lines (each record must be on one line)")
        if u_empty[i]:
            return f"empty user value in column {cols.user!r}"
        return f"empty query in column {cols.query!r}"

    if fmt == "parquet":
        bad.check_rows(k0, np.flatnonzero(is_bad), describe)
    else:
        bad.check_block(k0, n, np.flatnonzero(is_bad), describe)
    good = ~blank & ~is_bad
    count_rows(stats, blank, good, no_click)
    keep = good & ~no_click
    if keep.any():
        kept.add(keep, query, url, user)


class _Kept:
    """The kept rows' users, queries and URLs, block by block."""

    def __init__(self, cols: _Columns) -> None:
        self.cols = cols
        self.queries, self.urls, self.users = Encoder(), Encoder(), Encoder()
        self.n = 0

    def add(self, keep: np.ndarray, query: pa.Array, url: pa.Array | None, user: pa.Array | None) -> None:
        mask = pa.array(keep)
        self.queries.add(query.filter(mask))
        if url is not None:
            self.urls.add(url.filter(mask))
        if user is not None:
            self.users.add(user.filter(mask))
        self.n += int(keep.sum())

    def log(self, path: str, stats: LoadStats) -> RecordLog:
        """The records grouped by user (users in order of first appearance, or one per row)."""
        user_ids = None
        if self.cols.user is not None:
            user_codes, user_values = self.users.finish()
            if pa.types.is_binary(user_values.type) or pa.types.is_large_binary(user_values.type):
                _, user_vocab = vocabulary(np.zeros(0, np.int64), user_values, path)
                user_ids = user_vocab.strings
            else:
                user_ids = user_values.to_numpy(zero_copy_only=False)
        else:
            user_codes = np.arange(self.n, dtype=np.int64)
        q_codes, q_vocab = vocabulary(*self.queries.finish(), path)
        if self.cols.url is not None:
            u_codes, u_vocab = vocabulary(*self.urls.finish(), path)
        else:
            u_codes, u_vocab = np.full(self.n, NO_URL, np.int64), ArrayVocabulary([])
        return RecordLog.from_user_sorted(user_codes, q_codes, u_codes, q_vocab, u_vocab,
                                          self.cols.url is not None, stats, user_ids=user_ids)


def _check_columns(path: str, cols: _Columns, present: Sequence[str]) -> None:
    for c, role in cols.wanted:
        if c not in present:
            raise _missing_column(path, c, role, present)


def _missing_column(path: str, name: str, role: str, present: Sequence[str]) -> DataError:
    if not any(present):
        return DataError(f"{path} is empty or its line 1 is blank: the first line must be a header naming "
                         "its columns")
    shown = ", ".join(short(c) for c in present[:10]) + (f" and {len(present) - 10:,} more" if len(present) > 10
                                                         else "")
    hint = ("; the header is not valid UTF-8 text (is the file binary, or in another encoding? convert it to "
            "UTF-8)" if any("\ufffd" in c for c in present) else "")
    return DataError(
        f"{path} has no column {name!r} (the {role} column); its columns are {shown}; use "
        f"--user-col/--query-col/--url-col to name them{hint}")


# --------------------------------------------------------------------------------------
# Parquet
# --------------------------------------------------------------------------------------


def log_path(path: str | os.PathLike[str]) -> str:
    """A log file, or a directory of Parquet files (a partitioned log), else :class:`DataError`."""
    p = os.fspath(path)
    if os.path.isdir(p):
        parquet_parts(p)  # refuses a directory without .parquet files
        return p
    return check_file(p)


def parquet_parts(path: str) -> list[str]:
    """The Parquet files of a log: the file itself, or a directory's ``*.parquet`` files in name order
    (recursively; names starting with ``.`` or ``_``, such as Spark's ``_SUCCESS``, are left out)."""
    if not os.path.isdir(path):
        return [path]
    parts = sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                   if f.endswith(".parquet") and not f.startswith((".", "_")))
    if not parts:
        raise DataError(f"{path} is a directory without .parquet files; pass a log file, or a directory of "
                        "Parquet files (a partitioned log, e.g. written by `hybriddp synth --partitioned`)")
    return parts


def _read_schema(path: str) -> pa.Schema:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as e:
        raise _parquet_error(path, e) from e


def _check_same_schema(part: str, first: str, columns: Sequence[str]) -> None:
    """Every part of a partitioned log has the first part's columns."""
    names = _read_schema(part).names
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(f"{part} has no column {missing[0]!r}, which {first} has; every file of a partitioned "
                        "log needs the same columns")


def _check_parquet_types(path: str, schema: pa.Schema, wanted: Sequence[tuple[str, str]]) -> None:
    """Refuse a user/query/URL column that is not text or a number (a list, struct, map, ...)."""
    for name, role in wanted:
        idx = schema.get_all_field_indices(name)
        if len(idx) > 1:
            raise DataError(f"{path} has {len(idx)} columns named {name!r} (the {role} column); "
                            "give the columns distinct names")
        t = schema.field(idx[0]).type
        value_type = t.value_type if pa.types.is_dictionary(t) else t
        if pa.types.is_nested(value_type):
            raise DataError(f"{path}: column {name!r} (the {role} column) has type {t}; a {role} must be a "
                            "string or a number; name another column with --user-col/--query-col/--url-col, "
                            "or flatten this one")


def _parquet_batches(path: str, columns: Sequence[str], progress: ProgressFn | None
                     ) -> Iterator[tuple[pa.RecordBatch, int]]:
    import pyarrow.parquet as pq

    total = os.path.getsize(path)
    try:
        pf = pq.ParquetFile(path)
        n_rows = max(pf.metadata.num_rows, 1)
        k0 = 0
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, columns=list(columns)):
            yield batch, k0
            k0 += batch.num_rows
            if progress is not None:
                progress(int(total * min(k0, n_rows) / n_rows), total)
    except (OSError, pa.ArrowException) as e:
        raise _parquet_error(path, e) from e
    if progress is not None:
        progress(total, total)


def _parquet_parts_batches(parts: Sequence[str], columns: Sequence[str], progress: ProgressFn | None
                           ) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The batches of every part in order; rows are numbered across parts (for error messages)."""
    if len(parts) == 1:
        yield from _parquet_batches(parts[0], columns, progress)
        return
    total = sum(os.path.getsize(f) for f in parts)
    done = k_base = 0
    for part in parts:
        size = os.path.getsize(part)
        inner = None if progress is None else (lambda b, _t, d=done: progress(d + b, total))
        k_end = k_base
        for batch, k0 in _parquet_batches(part, columns, inner):
            k_end = k_base + k0 + batch.num_rows
            yield batch, k_base + k0
        k_base = k_end
        done += size


def _parquet_error(path: str, exc: BaseException) -> DataError:
    with open(path, "rb") as fh:
        magic = fh.read(4)
    hint = ("; it does not start with the Parquet magic bytes PAR1; if it is a CSV or TSV text file, pass "
            "--format csv or --format tsv" if magic != b"PAR1" else "; check that the file is complete")
    return DataError(f"cannot read {path} as Parquet: {' '.join(str(exc).split())}{hint}")

"""Read search logs and item logs into a :class:`~hybriddp.records.RecordLog`.

Four entry points, all streaming and vectorized (no Python loop per row):

* :func:`load_aol` -- the AOL search log (tab-separated, header
  ``AnonID\\tQuery\\tQueryTime\\tItemRank\\tClickURL``, no quoting, optionally ``.gz``).
* :func:`load_table` -- a generic CSV / TSV / Parquet table with named user, query and URL columns.
* :func:`load_items` -- single-item logs such as Kosarak ``.dat``: one user per line, items
  separated by whitespace.
* :func:`load_log` -- picks one of the above from ``format`` or from the file name.

Conventions shared by the text loaders
--------------------------------------
* Line numbers in messages are 1-based physical lines of the (decompressed) file; the header
  is line 1.
* Text is UTF-8. Bytes that are not valid UTF-8 do not stop the load: they are replaced by
  U+FFFD (before parsing, so a malformed row holding them is skipped like any other) and a
  warning is logged.
* A file that is not text where text is expected -- compressed without the matching
  ``.gz``/``.bz2``/``.zst`` name (or named so without being it), Parquet, ZIP, UTF-16, or with a NUL
  byte in its first 64 KiB -- is refused with the fix, as is a truncated or damaged compressed
  file or a line longer than a parse block.
* Blank lines (and lines whose used fields are all empty, e.g. only tabs) are ignored: they
  are neither data rows nor bad rows, but they still count for line numbers.
* ``stats.rows_read`` counts the data rows read (blank lines excluded; bad rows and rows
  without a click included). ``stats.rows_without_click`` counts rows that have no URL
  (whether or not they were kept), ``stats.rows_skipped_bad`` the malformed rows skipped.
* Codes: query / URL ids are positions in :class:`~hybriddp.records.ArrayVocabulary` objects
  of the distinct strings, in order of first appearance.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from hybriddp.errors import DataError, parameter_error
from hybriddp.io.textfiles import (
    Utf8Repair,
    base_ext,
    check_file,
    check_text,
    first_line,
    head,
    open_stream,
    read_error,
    short,
)
from hybriddp.records import NO_URL, ArrayVocabulary, LoadStats, RecordLog

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], Any]
"""``progress(bytes_read, total_bytes)``, called once per block read."""

AOL_COLUMNS = ("AnonID", "Query", "QueryTime", "ItemRank", "ClickURL")
AOL_HEADER = "\t".join(AOL_COLUMNS)
FORMATS = ("aol", "csv", "tsv", "parquet", "items")

_BLOCK_SIZE = 32 << 20  # bytes of text parsed per block
_ITEMS_CHUNK = 64 << 20
_PARQUET_BATCH = 1 << 20  # rows
_MAX_EXAMPLES = 5
_SKIP_FIX = "or pass --skip-bad-rows to skip such rows"
_INT_RE = r"^[0-9]+$"
_ANON_RE = r"^[0-9]{1,18}$"  # fits in int64


# --------------------------------------------------------------------------------------
# Bad rows
# --------------------------------------------------------------------------------------


@dataclass
class _BadRows:
    """Tracks malformed rows of a text file: raises on the first one, or counts and skips.

    pyarrow drops a row with the wrong number of fields through :meth:`on_invalid_row`
    (single-threaded parsing gives its physical line number); the rows it does return are
    numbered ``k = 0, 1, ...`` and sit on line ``k + 2 + (invalid lines before it)``.
    """

    path: str
    skip: bool
    sep_name: str
    count: int = 0
    examples: list[str] = field(default_factory=list)
    _invalid: list[tuple[int, str]] = field(default_factory=list)  # (line, message), in order
    _invalid_lines: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _n_known: int = 0  # how many of _invalid are in _invalid_lines
    _n_done: int = 0  # how many of _invalid have been reported / counted
    n_invalid: int = 0

    def on_invalid_row(self, row: Any) -> str:
        number = row.number if row.number is not None else -1
        msg = f"expected {row.expected_columns} {self.sep_name}-separated fields, found {row.actual_columns}"
        self._invalid.append((int(number), msg))
        return "skip"

    def _sync(self) -> None:
        if self._n_known < len(self._invalid):
            new = np.array([ln for ln, _ in self._invalid[self._n_known:]], dtype=np.int64)
            self._invalid_lines = np.concatenate([self._invalid_lines, new])
            self._n_known = len(self._invalid)

    def line_numbers(self, k: np.ndarray) -> np.ndarray:
        """Physical line numbers of returned rows ``k`` (0-based row index over the file)."""
        self._sync()
        base = np.asarray(k, dtype=np.int64) + 2
        lines = base
        while True:  # fixed point: line = base + #invalid lines at or before it
            nxt = base + np.searchsorted(self._invalid_lines, lines, side="right")
            if np.array_equal(nxt, lines):
                return lines
            lines = nxt

    def check_block(self, k0: int, n: int, bad_idx: np.ndarray,
                    describe: Callable[[int], str], final: bool = False) -> None:
        """Handle the bad rows of one block (rows ``k0 .. k0+n-1``).

        ``bad_idx`` are block-relative indices of rows with bad values; ``describe(i)`` says
        what is wrong with row ``i``. Invalid-field-count rows up to the end of the block (all
        of them if ``final``) are handled with them, in line order.
        """
        self._sync()
        if final:
            upto = len(self._invalid)
        else:
            last = int(self.line_numbers(np.array([k0 + n - 1]))[0]) if n else 0
            upto = self._n_done + int(np.searchsorted(self._invalid_lines[self._n_done:], last, "right"))
        pending = self._invalid[self._n_done:upto]
        self._n_done = upto
        self.n_invalid += len(pending)
        n_bad = len(pending) + len(bad_idx)
        if n_bad == 0:
            return
        need = 1 if not self.skip else max(0, _MAX_EXAMPLES - len(self.examples))
        problems = list(pending[:need])
        if need and len(bad_idx):
            first_bad = np.asarray(bad_idx[:need], dtype=np.int64)
            lines = self.line_numbers(first_bad + k0)
            problems += [(int(ln), describe(int(i))) for ln, i in zip(lines, first_bad, strict=True)]
        problems.sort()
        if not self.skip:
            line, msg = problems[0]
            raise DataError(f"{self.path}: line {line}: {msg}; fix the file, {_SKIP_FIX}")
        self.count += n_bad
        self.examples += [f"line {ln}: {msg}" for ln, msg in problems[:need]]


def _bool(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=bool)


def _empty(arr: pa.Array) -> pa.Array:
    """True where a cell is null or empty."""
    return pc.fill_null(pc.equal(pc.binary_length(arr), 0), True)


def _all_empty(batch: pa.RecordBatch) -> np.ndarray:
    """True for rows whose cells are all empty: blank lines (or lines of separators only)."""
    out = np.ones(batch.num_rows, dtype=bool)
    for col in batch.columns:
        out &= _bool(_empty(col))
    return out


def _runs_on(batch: pa.RecordBatch) -> np.ndarray:
    """True for CSV rows with a line end inside a cell: an unclosed quote swallowed the lines after it."""
    out = np.zeros(batch.num_rows, dtype=bool)
    for col in batch.columns:
        out |= _bool(pc.fill_null(pc.match_substring_regex(col, "[\r\n]"), False))
    return out


# --------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------


def _as_binary(arr: pa.Array) -> pa.Array:
    """Text-like column as ``binary`` (other types are formatted as strings first)."""
    t = arr.type
    if pa.types.is_binary(t):
        return arr
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    try:
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)
                or pa.types.is_binary_view(t) or pa.types.is_string_view(t)):
            arr = arr.cast(pa.string())
        return arr.cast(pa.binary())
    except pa.ArrowException as e:  # load_table checks the types first; this is a safety net
        raise DataError(f"a column of type {t} cannot be read as text ({' '.join(str(e).split())})") from e


class _Encoder:
    """Incremental dictionary encoding: encode each block, unify the dictionaries at the end."""

    def __init__(self) -> None:
        self.blocks: list[pa.DictionaryArray] = []

    def add(self, values: pa.Array) -> None:
        if len(values):
            self.blocks.append(pc.dictionary_encode(values))

    def finish(self, value_type: pa.DataType | None = None) -> tuple[np.ndarray, pa.Array]:
        """Return ``(codes int64, distinct values)`` (``value_type`` of an empty result)."""
        if not self.blocks:
            return np.zeros(0, np.int64), pa.array([], value_type or pa.binary())
        unified = pa.chunked_array(self.blocks).unify_dictionaries()
        self.blocks = []
        codes = np.concatenate([c.indices.to_numpy() for c in unified.chunks]).astype(np.int64)
        return codes, unified.chunk(0).dictionary


def _vocabulary(codes: np.ndarray, values: pa.Array, path: str) -> tuple[np.ndarray, ArrayVocabulary]:
    """Decode distinct byte strings to a vocabulary; invalid UTF-8 is replaced by U+FFFD.

    Replacement can make two byte strings equal: their codes are then merged.
    """
    try:
        strings = values.cast(pa.string())
    except pa.ArrowInvalid:
        logger.warning("%s contains bytes that are not valid UTF-8; they were replaced by U+FFFD", path)
        strings = pa.array([b.decode("utf-8", "replace") for b in values.to_pylist()], pa.string())
        distinct = pc.unique(strings)
        if len(distinct) < len(strings):
            remap = pc.index_in(strings, value_set=distinct).to_numpy().astype(np.int64)
            codes, strings = remap[codes], distinct
    return codes, ArrayVocabulary(strings.to_numpy(zero_copy_only=False))


# --------------------------------------------------------------------------------------
# Delimited text
# --------------------------------------------------------------------------------------


def _read_delimited(
    path: str, *, delimiter: str, quoted: bool, columns: Sequence[str], bad: _BadRows,
    progress: ProgressFn | None,
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """Yield ``(batch, k0)``: blocks of ``columns`` (all as binary) and their first row index.

    Parsing is single-threaded so that rows with the wrong number of fields come with their
    line numbers; blank lines come through as rows of empty cells. The text goes through
    :class:`Utf8Repair`. A file with a header line and nothing else yields nothing.
    """
    total = os.path.getsize(path)
    stream, raw = open_stream(path)
    text = pa.TransformInputStream(stream, Utf8Repair(path))
    read_opts = pacsv.ReadOptions(block_size=_BLOCK_SIZE, use_threads=False)
    parse_opts = pacsv.ParseOptions(
        delimiter=delimiter, quote_char='"' if quoted else False, double_quote=quoted,
        escape_char=False, newlines_in_values=False, ignore_empty_lines=False,
        invalid_row_handler=bad.on_invalid_row)
    conv_opts = pacsv.ConvertOptions(
        column_types={c: pa.binary() for c in columns}, include_columns=list(columns),
        strings_can_be_null=False, quoted_strings_can_be_null=False)
    k0 = 0
    try:
        reader = pacsv.open_csv(text, read_options=read_opts, parse_options=parse_opts,
                                convert_options=conv_opts)
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            yield batch, k0
            k0 += batch.num_rows
            if progress is not None:
                progress(min(raw.tell(), total), total)
    except pa.ArrowInvalid as e:
        if not (k0 == 0 and "Empty CSV file" in str(e)):  # the header line has no line end: no rows
            raise read_error(path, e, "parse", _BLOCK_SIZE) from e
    except (OSError, pa.ArrowException) as e:
        raise read_error(path, e) from e
    finally:
        text.close()
        stream.close()
        raw.close()
    if progress is not None:
        progress(total, total)


def header_names(path: str, delimiter: str, quoted: bool) -> list[str]:
    """Column names of a delimited file's header line (``.gz`` ok; quoted CSV when ``quoted``)."""
    line = first_line(path)
    if not quoted:
        return line.split(delimiter)
    import csv  # only the header line goes through the csv module

    try:
        return next(csv.reader([line], delimiter=delimiter, strict=False), [])
    except csv.Error as e:
        raise DataError(f"{path}: line 1 (the header) cannot be read as CSV ({e}); it must name the columns, "
                        "separated by commas") from e


# --------------------------------------------------------------------------------------
# AOL
# --------------------------------------------------------------------------------------


def load_aol(
    path: str | os.PathLike[str], *, skip_bad_rows: bool = False, keep_no_click: bool = False,
    progress: ProgressFn | None = None,
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

    Returns
    -------
    RecordLog with users = distinct AnonIDs (in increasing AnonID order).

    Raises
    ------
    DataError
        Missing file, wrong header, or a malformed row (message names file and line).
    """
    p = check_file(path)
    first = first_line(p)
    if first != AOL_HEADER:
        raise DataError(
            f"{p}: line 1 is not the AOL header: expected the tab-separated columns "
            f"{' '.join(AOL_COLUMNS)!r}, found {short(first, 80)}; "
            "for another table layout use --format csv/tsv with --user-col/--query-col/--url-col")
    bad = _BadRows(p, skip_bad_rows, "tab")
    stats = LoadStats()
    queries, urls = _Encoder(), _Encoder()
    anon_blocks: list[np.ndarray] = []
    k_end = 0
    for batch, k0 in _read_delimited(p, delimiter="\t", quoted=False, columns=AOL_COLUMNS, bad=bad,
                                     progress=progress):
        anon, query, _, rank, url = (batch.column(i) for i in range(5))
        n = batch.num_rows
        k_end = k0 + n
        click = _bool(pc.greater(pc.binary_length(url), 0))
        blank = _all_empty(batch)
        bad_anon = ~_bool(pc.match_substring_regex(anon, _ANON_RE)) & ~blank
        bad_rank = click & ~_bool(pc.match_substring_regex(rank, _INT_RE))
        is_bad = bad_anon | bad_rank

        def describe(i: int, anon: pa.Array = anon, rank: pa.Array = rank,
                     bad_anon: np.ndarray = bad_anon) -> str:
            if bad_anon[i]:
                return f"AnonID {short(anon[i].as_py())} is not an integer"
            return f"ItemRank {short(rank[i].as_py())} of a row with a click is not an integer"

        bad.check_block(k0, n, np.flatnonzero(is_bad), describe)
        good = ~blank & ~is_bad
        stats.rows_read += int(n - blank.sum())
        stats.rows_without_click += int((good & ~click).sum())
        keep = good & (click | keep_no_click)
        if not keep.any():
            continue
        mask = pa.array(keep)
        anon_blocks.append(anon.filter(mask).cast(pa.string()).cast(pa.int64()).to_numpy())
        queries.add(query.filter(mask))
        urls.add(url.filter(mask))
    bad.check_block(k_end, 0, np.zeros(0, np.int64), str, final=True)
    stats.rows_read += bad.n_invalid
    stats.rows_skipped_bad = bad.count
    stats.bad_row_examples = bad.examples
    anon_ids = np.concatenate(anon_blocks) if anon_blocks else np.zeros(0, np.int64)
    del anon_blocks
    anon_unique, users = np.unique(anon_ids, return_inverse=True)
    del anon_ids
    q_codes, q_vocab = _vocabulary(*queries.finish(), p)
    u_codes, u_vocab = _vocabulary(*urls.finish(), p)
    log = RecordLog.from_user_sorted(users, q_codes, u_codes, q_vocab, u_vocab, True, stats, user_ids=anon_unique)
    _log_summary(p, log)
    return log


def _log_summary(path: str, log: RecordLog) -> None:
    s = log.stats
    logger.info("%s: %d rows read, %d records of %d users, %d distinct queries, %d distinct urls; "
                "%d rows without click, %d bad rows skipped", path, s.rows_read, log.n_records,
                log.n_users, len(log.queries), len(log.urls), s.rows_without_click, s.rows_skipped_bad)
    if s.rows_skipped_bad:
        logger.warning("%s: skipped %d malformed rows, e.g. %s", path, s.rows_skipped_bad,
                       "; ".join(s.bad_row_examples))
    if log.n_records == 0:
        logger.warning("%s: no records were read", path)


# --------------------------------------------------------------------------------------
# Generic tables
# --------------------------------------------------------------------------------------


def _table_format(path: str) -> str:
    ext = base_ext(path)
    if ext == ".csv":
        return "csv"
    if ext in (".tsv", ".tab", ".txt"):
        return "tsv"
    if ext in (".parquet", ".pq"):
        return "parquet"
    raise DataError(f"cannot tell the table format of {path} from its extension; "
                    "pass --format csv, tsv or parquet")


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


def _log_path(path: str | os.PathLike[str]) -> str:
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


def _check_same_schema(part: str, first: str, schema: pa.Schema, columns: Sequence[str]) -> None:
    """Every part of a partitioned log has the first part's columns."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(part).names
    except (OSError, pa.ArrowException) as e:
        raise _parquet_error(part, e) from e
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(f"{part} has no column {missing[0]!r}, which {first} has; every file of a partitioned "
                        "log needs the same columns")


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
    format : ``'csv'``, ``'tsv'`` or ``'parquet'``; None guesses from the extension.
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
    p = _log_path(path)
    fmt = (format or ("parquet" if os.path.isdir(p) else _table_format(p))).lower()
    if os.path.isdir(p) and fmt != "parquet":
        raise DataError(f"{p} is a directory; only a Parquet log may be a directory of .parquet files")
    if fmt not in ("csv", "tsv", "parquet"):
        raise DataError(f"unknown table format {format!r}: allowed are 'csv', 'tsv', 'parquet'")
    if row_per_user and user_col is not None:
        raise parameter_error("user_col", user_col, "None when row_per_user is set",
                              "Pass either --user-col or --row-per-user, not both.")
    if not row_per_user and user_col is None:
        raise parameter_error("user_col", None, "a column name",
                              "Pass --user-col NAME, or --row-per-user if every row is one user.")
    wanted = [(user_col, "user"), (query_col, "query"), (url_col, "URL")]
    wanted = [(c, r) for c, r in wanted if c is not None]
    columns = list(dict.fromkeys(c for c, _ in wanted))  # what is read from a Parquet file
    if fmt == "parquet":
        import pyarrow.parquet as pq

        parts = parquet_parts(p)
        try:
            schema = pq.read_schema(parts[0])
        except (OSError, pa.ArrowException) as e:
            raise _parquet_error(parts[0], e) from e
        present = schema.names
    else:
        present = header_names(p, "," if fmt == "csv" else "\t", fmt == "csv")
    for c, role in wanted:
        if c not in present:
            raise _missing_column(p, c, role, present)
    if fmt == "parquet":
        _check_parquet_types(p, schema, wanted)
        for part in parts[1:]:
            _check_same_schema(part, parts[0], schema, columns)

    bad = _BadRows(p, skip_bad_rows, "comma" if fmt == "csv" else "tab")
    if fmt == "parquet":
        blocks = _parquet_parts_batches(parts, columns, progress)
    else:
        # every column is read (as bytes) to tell blank lines from rows with empty cells
        blocks = _read_delimited(p, delimiter="," if fmt == "csv" else "\t", quoted=fmt == "csv",
                                 columns=list(dict.fromkeys(present)), bad=bad, progress=progress)
    stats = LoadStats()
    queries, urls, users = _Encoder(), _Encoder(), _Encoder()
    n_kept = 0
    bad_parquet: list[str] = []
    k_end = 0
    for batch, k0 in blocks:
        n = batch.num_rows
        k_end = k0 + n
        col = {c: batch.column(batch.schema.get_field_index(c)) for c in columns}
        query = _as_binary(col[query_col])
        url = _as_binary(col[url_col]) if url_col is not None else None
        user = col[user_col] if user_col is not None else None
        if user is not None and pa.types.is_dictionary(user.type):
            user = user.dictionary_decode()
        q_empty = _bool(_empty(query))
        u_empty = _bool(_empty(_as_binary(user))) if user is not None else np.zeros(n, bool)
        no_click = _bool(_empty(url)) if url is not None else np.zeros(n, bool)
        blank = np.zeros(n, bool) if fmt == "parquet" else _all_empty(batch)
        run_on = _runs_on(batch) if fmt == "csv" else np.zeros(n, bool)
        is_bad = (q_empty | u_empty | run_on) & ~blank

        def describe(i: int, u_empty: np.ndarray = u_empty, run_on: np.ndarray = run_on) -> str:
            if run_on[i]:
                return ("a double quote opened in this row is never closed, so a field runs on over the "
                        "following lines (each record must be on one line)")
            if u_empty[i]:
                return f"empty user value in column {user_col!r}"
            return f"empty query in column {query_col!r}"

        bad_idx = np.flatnonzero(is_bad)
        if fmt == "parquet":
            if len(bad_idx) and not skip_bad_rows:
                raise DataError(f"{p}: row {k0 + bad_idx[0] + 1}: {describe(int(bad_idx[0]))}; "
                                f"fix the file, {_SKIP_FIX}")
            bad.count += len(bad_idx)
            for i in bad_idx[: max(0, _MAX_EXAMPLES - len(bad_parquet))]:
                bad_parquet.append(f"row {k0 + i + 1}: {describe(int(i))}")
        else:
            bad.check_block(k0, n, bad_idx, describe)
        good = ~blank & ~is_bad
        stats.rows_read += int(n - blank.sum())
        stats.rows_without_click += int((good & no_click).sum())
        keep = good & ~no_click
        n_keep = int(keep.sum())
        if n_keep == 0:
            continue
        mask = pa.array(keep)
        queries.add(query.filter(mask))
        if url is not None:
            urls.add(url.filter(mask))
        if user is not None:
            users.add(user.filter(mask))
        n_kept += n_keep
    if fmt != "parquet":
        bad.check_block(k_end, 0, np.zeros(0, np.int64), str, final=True)
        stats.rows_read += bad.n_invalid
    stats.rows_skipped_bad = bad.count
    stats.bad_row_examples = bad.examples + bad_parquet
    user_ids = None
    if user_col is not None:
        user_codes, user_values = users.finish()
        if pa.types.is_binary(user_values.type) or pa.types.is_large_binary(user_values.type):
            _, user_vocab = _vocabulary(np.zeros(0, np.int64), user_values, p)
            user_ids = user_vocab.strings
        else:
            user_ids = user_values.to_numpy(zero_copy_only=False)
    else:
        user_codes = np.arange(n_kept, dtype=np.int64)
    q_codes, q_vocab = _vocabulary(*queries.finish(), p)
    if url_col is not None:
        u_codes, u_vocab = _vocabulary(*urls.finish(), p)
    else:
        u_codes, u_vocab = np.full(n_kept, NO_URL, np.int64), ArrayVocabulary([])
    log = RecordLog.from_user_sorted(user_codes, q_codes, u_codes, q_vocab, u_vocab,
                                     url_col is not None, stats, user_ids=user_ids)
    _log_summary(p, log)
    return log


# --------------------------------------------------------------------------------------
# Item logs
# --------------------------------------------------------------------------------------


def _decode(chunk: bytes, path: str, offset: int) -> str:
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError as e:
        logger.warning("%s: bytes that are not valid UTF-8 near byte %d (of the decompressed text) "
                       "were replaced by U+FFFD", path, offset + e.start)
        return chunk.decode("utf-8", "replace")


def load_items(
    path: str | os.PathLike[str], *, skip_bad_rows: bool = False, progress: ProgressFn | None = None,
) -> RecordLog:
    """Load a single-item log such as Kosarak ``.dat`` (optionally ``.gz``).

    One user per line; items separated by any whitespace. Every item occurrence is a record
    whose query is the item string (``has_urls=False``, URLs all ``NO_URL``). An empty line is
    a user with no records: it is dropped and counted in ``stats.rows_without_click``.
    ``stats.rows_read`` is the number of lines.

    Parameters
    ----------
    path : the file.
    skip_bad_rows : accepted for a uniform interface; every line is a valid list of items
        (bytes that are not UTF-8 are replaced by U+FFFD with a warning), so nothing is skipped.
    progress : optional ``progress(bytes_read, total_bytes)``, called per chunk.
    """
    p = check_file(path)
    del skip_bad_rows  # nothing can be malformed
    check_text(p, head(p))
    total = os.path.getsize(p)
    stream, raw = open_stream(p)
    stats = LoadStats()
    items = _Encoder()
    user_blocks: list[np.ndarray] = []
    n_lines = 0
    offset = 0
    rest = b""
    try:
        while True:
            data = stream.read(_ITEMS_CHUNK)
            eof = not data
            buf = rest + data
            if not eof:
                cut = buf.rfind(b"\n") + 1
                if cut == 0:  # no line end yet: read more
                    rest = buf
                    continue
                buf, rest = buf[:cut], buf[cut:]
            else:
                rest = b""
            if buf:
                text = _decode(buf, p, offset)
                offset += len(buf)
                lines = pc.list_flatten(pc.split_pattern(pa.array([text], pa.large_string()), "\n"))
                if text.endswith("\n"):
                    lines = lines.slice(0, len(lines) - 1)
                tokens = pc.utf8_split_whitespace(lines)
                owner = pc.list_parent_indices(tokens).to_numpy()
                flat = pc.list_flatten(tokens)
                nonempty = pc.greater(pc.utf8_length(flat), 0)
                flat = flat.filter(nonempty)
                owner = owner[_bool(nonempty)]
                n_users = int(np.count_nonzero(np.diff(owner))) + (len(owner) > 0)  # owner is sorted
                stats.rows_without_click += len(lines) - n_users
                items.add(flat.cast(pa.string()))
                user_blocks.append(owner.astype(np.int64) + n_lines)
                n_lines += len(lines)
            if progress is not None:
                progress(min(raw.tell(), total), total)
            if eof:
                break
    except (OSError, pa.ArrowException) as e:
        raise read_error(p, e) from e
    finally:
        stream.close()
        raw.close()
    stats.rows_read = n_lines
    users = np.concatenate(user_blocks) if user_blocks else np.zeros(0, np.int64)
    codes, values = items.finish(pa.string())
    vocab = ArrayVocabulary(values.to_numpy(zero_copy_only=False))
    log = RecordLog.from_user_sorted(users, codes, np.full(len(codes), NO_URL, np.int64), vocab,
                                     ArrayVocabulary([]), False, stats, user_ids=np.arange(1, n_lines + 1))
    _log_summary(p, log)
    return log


# --------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------

_OPTIONS: dict[str, set[str]] = {
    "aol": {"skip_bad_rows", "keep_no_click", "progress"},
    "table": {"user_col", "query_col", "url_col", "row_per_user", "skip_bad_rows", "progress"},
    "items": {"skip_bad_rows", "progress"},
}
_DEFAULTS: dict[str, object] = {"query_col": "query"}


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess the format of ``path``: one of :data:`FORMATS`.

    ``.dat`` -> items; ``.parquet``/``.pq`` -> parquet; ``.csv`` -> csv; ``.tsv``/``.txt``/no
    known extension -> aol if the first line is the AOL header, else tsv (for ``.tsv``/``.txt``).
    A compression suffix (``.gz`` ...) is looked through.
    """
    p = _log_path(path)
    if os.path.isdir(p):
        return "parquet"
    ext = base_ext(p)
    if ext == ".dat":
        return "items"
    if ext in (".parquet", ".pq"):
        return "parquet"
    if ext == ".csv":
        return "csv"
    first = first_line(p)
    if first == AOL_HEADER:
        return "aol"
    if not first and not head(p).strip():
        raise DataError(f"{p} is empty: a log needs a header line naming its columns (or, for an item log "
                        "named .dat, one line of items per user)")
    if ext in (".tsv", ".txt", ".tab"):
        return "tsv"
    raise DataError(f"cannot tell the format of {p} from its name or first line; "
                    f"pass --format, one of {', '.join(FORMATS)}")


def load_log(path: str | os.PathLike[str], *, format: str | None = None, **options: Any) -> RecordLog:
    """Load ``path`` with the loader of ``format`` (None: :func:`detect_format`).

    ``options`` go to :func:`load_aol`, :func:`load_table` or :func:`load_items`. Options a
    format does not take are ignored when they are None / False / their default, and refused
    otherwise (e.g. ``user_col='x'`` with ``format='aol'``).
    """
    p = _log_path(path)
    fmt = detect_format(p) if format is None else str(format).lower()
    if fmt not in FORMATS:
        raise DataError(f"unknown format {format!r}: allowed formats are {', '.join(FORMATS)}")
    kind = "table" if fmt in ("csv", "tsv", "parquet") else fmt
    accepted = _OPTIONS[kind]
    kwargs: dict[str, Any] = {}
    for name, value in options.items():
        if name in accepted:
            kwargs[name] = value
        elif name in set().union(*_OPTIONS.values()):
            if value is None or value is False or _DEFAULTS.get(name, object()) == value:
                continue
            raise parameter_error(name, value, f"unset for the {fmt!r} format",
                                  "That option only applies to other formats.")
        else:
            raise TypeError(f"load_log() got an unexpected keyword argument {name!r}")
    logger.info("loading %s as %s", p, fmt)
    if kind == "aol":
        return load_aol(p, **kwargs)
    if kind == "items":
        return load_items(p, **kwargs)
    return load_table(p, format=fmt, **kwargs)

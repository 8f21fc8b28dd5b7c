"""The steps every log reader shares: delimited text read in blocks, bad rows, dictionary encoding.

The AOL reader (:mod:`hybriddp.io.aol`) and the table reader (:mod:`hybriddp.io.tables`) read a file
block by block (:func:`read_delimited`), flag the malformed rows of each block (:class:`BadRows`: the
first one raises, or all are counted and skipped), dictionary-encode the kept cells (:class:`Encoder`)
and decode the distinct values once at the end (:func:`vocabulary`). The conventions they guarantee
(line numbers, blank lines, UTF-8 repair, the load statistics) are listed in :mod:`hybriddp.io.loaders`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from hybriddp.core.errors import DataError
from hybriddp.core.records import ArrayVocabulary, LoadStats, RecordLog
from hybriddp.core.stages import ProgressFn
from hybriddp.io.textfiles import Utf8Repair, first_line, logger, open_stream, read_error

BLOCK_SIZE = 32 << 20
"""Bytes of text parsed per block (a longer line is refused)."""
MAX_EXAMPLES = 5
"""Bad rows quoted in ``stats.bad_row_examples``."""
SKIP_FIX = "or pass --skip-bad-rows to skip such rows"


# --------------------------------------------------------------------------------------
# Bad rows
# --------------------------------------------------------------------------------------


@dataclass
class BadRows:
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
        return physical_lines(k, self._invalid_lines)

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
        need = 1 if not self.skip else max(0, MAX_EXAMPLES - len(self.examples))
        problems = list(pending[:need])
        if need and len(bad_idx):
            first_bad = np.asarray(bad_idx[:need], dtype=np.int64)
            lines = self.line_numbers(first_bad + k0)
            problems += [(int(ln), describe(int(i))) for ln, i in zip(lines, first_bad, strict=True)]
        problems.sort()
        if not self.skip:
            line, msg = problems[0]
            raise DataError(f"{self.path}: line {line}: {msg}; fix the file, {SKIP_FIX}")
        self.count += n_bad
        self.examples += [f"line {ln}: {msg}" for ln, msg in problems[:need]]

    def check_rows(self, k0: int, bad_idx: np.ndarray, describe: Callable[[int], str]) -> None:
        """Handle the bad rows of a block of a file without lines (Parquet): messages name the row
        (``k0 + i + 1``, 1-based over the file)."""
        if len(bad_idx) and not self.skip:
            raise DataError(f"{self.path}: row {k0 + bad_idx[0] + 1}: {describe(int(bad_idx[0]))}; "
                            f"fix the file, {SKIP_FIX}")
        self.count += len(bad_idx)
        for i in bad_idx[: max(0, MAX_EXAMPLES - len(self.examples))]:
            self.examples.append(f"row {k0 + i + 1}: {describe(int(i))}")

    def finish(self, k_end: int, stats: LoadStats) -> None:
        """After the last block (``k_end`` rows returned): handle the invalid rows after it and put the
        counts in ``stats`` (invalid rows are rows read)."""
        self.check_block(k_end, 0, np.zeros(0, np.int64), str, final=True)
        stats.rows_read += self.n_invalid
        stats.rows_skipped_bad = self.count
        stats.bad_row_examples = list(self.examples)


def physical_lines(rows: np.ndarray, skipped: np.ndarray) -> np.ndarray:
    """Physical line numbers of data rows ``rows`` (0-based; the header is line 1) of a file whose
    lines ``skipped`` (sorted) gave no row."""
    base = np.asarray(rows, dtype=np.int64) + 2
    lines = base
    while True:  # fixed point: line = base + number of skipped lines at or before it
        nxt = base + np.searchsorted(skipped, lines, side="right")
        if np.array_equal(nxt, lines):
            return lines
        lines = nxt


def count_rows(stats: LoadStats, blank: np.ndarray, good: np.ndarray, no_click: np.ndarray) -> None:
    """Add one block to ``stats``: its rows but blank lines are read; its good rows without a click
    are counted as such."""
    stats.rows_read += int(len(blank) - blank.sum())
    stats.rows_without_click += int((good & no_click).sum())


def as_bool(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as a NumPy one."""
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=bool)


def empty_cells(arr: pa.Array) -> pa.Array:
    """True where a cell is null or empty."""
    return pc.fill_null(pc.equal(pc.binary_length(arr), 0), True)


def all_empty(batch: pa.RecordBatch) -> np.ndarray:
    """True for rows whose cells are all empty: blank lines (or lines of separators only)."""
    out = np.ones(batch.num_rows, dtype=bool)
    for col in batch.columns:
        out &= as_bool(empty_cells(col))
    return out


def runs_on(batch: pa.RecordBatch) -> np.ndarray:
    """True for CSV rows with a line end inside a cell: an unclosed quote swallowed the lines after it."""
    out = np.zeros(batch.num_rows, dtype=bool)
    for col in batch.columns:
        out |= as_bool(pc.fill_null(pc.match_substring_regex(col, "[\r\n]"), False))
    return out


# --------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------


def as_binary(arr: pa.Array) -> pa.Array:
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


class Encoder:
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


def vocabulary(codes: np.ndarray, values: pa.Array, path: str) -> tuple[np.ndarray, ArrayVocabulary]:
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


def read_delimited(
    path: str, *, delimiter: str, quoted: bool, columns: Sequence[str], bad: BadRows,
    progress: ProgressFn | None,
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """Yield ``(batch, k0)``: blocks of ``columns`` (all as binary) and their first row index.

    Parsing is single-threaded so that rows with the wrong number of fields come with their
    line numbers; blank lines come through as rows of empty cells. The text goes through
    :class:`~hybriddp.io.textfiles.Utf8Repair`. A file with a header line and nothing else yields nothing.
    """
    total = os.path.getsize(path)
    stream, raw = open_stream(path)
    text = pa.TransformInputStream(stream, Utf8Repair(path))
    read_opts = pacsv.ReadOptions(block_size=BLOCK_SIZE, use_threads=False)
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
            raise read_error(path, e, "parse", BLOCK_SIZE) from e
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


def log_summary(path: str, log: RecordLog) -> None:
    """Log what a load read (info), its skipped rows (warning) and an empty result (warning)."""
    s = log.stats
    logger.info("%s: %d rows read, %d records of %d users, %d distinct queries, %d distinct urls; "
                "%d rows without click, %d bad rows skipped", path, s.rows_read, log.n_records,
                log.n_users, len(log.queries), len(log.urls), s.rows_without_click, s.rows_skipped_bad)
    if s.rows_skipped_bad:
        logger.warning("%s: skipped %d malformed rows, e.g. %s", path, s.rows_skipped_bad,
                       "; ".join(s.bad_row_examples))
    if log.n_records == 0:
        logger.warning("%s: no records were read", path)

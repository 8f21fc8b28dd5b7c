"""Reading one numeric column (one value per user) for hybrid mean estimation (ALGORITHM.md §11).

CSV/TSV (``.gz``/``.bz2``/``.zst`` allowed) and Parquet, the format from ``--format`` or the name
(:func:`~hybriddp.io.textfiles.table_format`: ``.txt`` is TSV); every unusable value is a
:class:`~hybriddp.core.errors.DataError` naming the file, the line (or row) and the value.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hybriddp.core.errors import DataError
from hybriddp.io.textfiles import TABLE_FORMATS, check_file, table_format

__all__ = ["TABLE_FORMATS", "read_value_column", "table_format"]

logger = logging.getLogger(__name__)

_NUMBER = r"^\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$"


def _missing_column(path: str, column: str, present: list[str]) -> DataError:
    shown = ", ".join(repr(c) for c in present[:20]) + (", ..." if len(present) > 20 else "")
    return DataError(f"{path}: no column {column!r} (columns: {shown}); pass the name of the value column "
                     "with --column")


def _parse_numbers(strings: Any, path: str, column: str, where: Any) -> np.ndarray:
    """Text cells → float64; the first non-number or empty cell is an error naming its line."""
    import pyarrow as pa
    import pyarrow.compute as pc

    strings = strings.cast(pa.string()) if not pa.types.is_string(strings.type) else strings
    ok = pc.fill_null(pc.match_substring_regex(strings, _NUMBER), False)
    bad = np.flatnonzero(~np.asarray(ok.to_numpy(zero_copy_only=False), dtype=bool))
    if len(bad):
        value = strings[int(bad[0])].as_py()
        what = "is empty" if value is None or not value.strip() else f"has {value!r}, which is not a number"
        raise DataError(f"{path}: {where(int(bad[0]))}: column {column!r} {what}; every row must hold one "
                        "numeric value (one row per user)")
    return np.asarray(pc.utf8_trim_whitespace(strings).cast(pa.float64()).to_numpy(zero_copy_only=False),
                      dtype=np.float64)


def _read_text_column(path: str, column: str, delimiter: str) -> np.ndarray:
    """The column as float64. Blank lines are skipped (pyarrow returns them as rows of empty cells;
    a row is blank when the value cell and one other cell are empty); line numbers count them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    from hybriddp.io.blocks import header_names, physical_lines

    names = header_names(path, delimiter, quoted=delimiter == ",")
    if column not in names:
        raise _missing_column(path, column, names)
    other = next((c for c in names if c != column), None)
    used = [column] + ([other] if other is not None else [])
    skipped: list[int] = []  # physical lines pyarrow dropped: whitespace-only lines
    invalid: list[tuple[int, str]] = []

    def on_invalid(row: Any) -> str:
        if not (row.text or "").strip():
            skipped.append(int(row.number))
        else:
            invalid.append((int(row.number), f"expected {row.expected_columns} fields separated by "
                                             f"{delimiter!r}, found {row.actual_columns}"))
        return "skip"

    try:
        table = pacsv.read_csv(
            path, read_options=pacsv.ReadOptions(use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=False, ignore_empty_lines=False,
                                             invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in used}, include_columns=used,
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
    except pa.ArrowInvalid as e:
        raise DataError(f"cannot parse {path}: {e}") from e
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"cannot read {path}: {e}") from e
    if invalid:
        line, msg = min(invalid)
        raise DataError(f"{path}: line {line}: {msg}; fix the file")
    skipped_lines = np.array(sorted(skipped), dtype=np.int64)
    strings = table.column(column).combine_chunks()
    blank = np.ones(len(strings), dtype=bool)
    for name in used:
        cells = pc.utf8_trim_whitespace(table.column(name).combine_chunks())
        blank &= np.asarray(pc.fill_null(pc.equal(cells, ""), True).to_numpy(zero_copy_only=False), dtype=bool)
    if blank.any():
        lines = physical_lines(np.flatnonzero(blank), skipped_lines)
        skipped_lines = np.sort(np.concatenate([skipped_lines, lines]))
        strings = strings.filter(pa.array(~blank))

    def where(k: int) -> str:
        return f"line {int(physical_lines(np.array([k]), skipped_lines)[0])}"

    return _parse_numbers(strings, path, column, where)


def _read_parquet_column(path: str, column: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        if column not in names:
            raise _missing_column(path, column, names)
        arr = pq.read_table(path, columns=[column]).column(column).combine_chunks()
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"cannot read {path}: {e}") from e
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _parse_numbers(arr, path, column, lambda k: f"row {k + 1}")
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
        raise DataError(f"{path}: column {column!r} has type {t}, not a number; pass a numeric column")
    if arr.null_count:
        k = int(np.flatnonzero(np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool))[0])
        raise DataError(f"{path}: row {k + 1}: column {column!r} is empty (null); every row must hold one "
                        "numeric value (one row per user)")
    values = np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise DataError(f"{path}: row {bad[0] + 1}: column {column!r} is {values[bad[0]]}, not a finite number")
    return values


def read_value_column(path: str, column: str, fmt: str | None = None) -> np.ndarray:
    """The numeric column ``column`` of a CSV / TSV / Parquet file, one row per user.

    Errors name the file, the column and the line (text; the header is line 1) or row
    (Parquet). Values must be finite numbers; blank lines are skipped.
    """
    check_file(path)
    kind = table_format(path, fmt)
    if kind == "parquet":
        values = _read_parquet_column(path, column)
    else:
        values = _read_text_column(path, column, "," if kind == "csv" else "\t")
    if len(values) == 0:
        raise DataError(f"{path}: no rows; one row per user is needed")
    logger.info("read %d values from column %r of %s", len(values), column, path)
    return values

"""Read search logs and item logs into a :class:`~hybriddp.core.records.RecordLog` (ALGORITHM.md §1).

Four entry points, all streaming and vectorized (no Python loop per row), one module per format:

* :func:`load_aol` (:mod:`hybriddp.io.aol`) -- the AOL search log (tab-separated, header
  ``AnonID\\tQuery\\tQueryTime\\tItemRank\\tClickURL``, no quoting, optionally ``.gz``).
* :func:`load_table` (:mod:`hybriddp.io.tables`) -- a generic CSV / TSV / Parquet table with named
  user, query and URL columns.
* :func:`load_items` (:mod:`hybriddp.io.items`) -- single-item logs such as Kosarak ``.dat``: one user
  per line, items separated by whitespace.
* :func:`load_log` (here) -- picks one of the above from ``format`` or from the file name
  (:func:`detect_format`).

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
* Codes: query / URL ids are positions in :class:`~hybriddp.core.records.ArrayVocabulary` objects
  of the distinct strings, in order of first appearance.
"""

from __future__ import annotations

import os
from typing import Any

from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.records import RecordLog
from hybriddp.io.aol import AOL_COLUMNS, AOL_HEADER, load_aol
from hybriddp.io.blocks import header_names
from hybriddp.io.items import load_items
from hybriddp.io.tables import load_table, log_path, parquet_parts
from hybriddp.io.textfiles import TABLE_EXTENSIONS, TABLE_FORMATS, base_ext, first_line, head, logger

__all__ = ["AOL_COLUMNS", "AOL_HEADER", "FORMATS", "detect_format", "header_names", "load_aol", "load_items",
           "load_log", "load_table", "parquet_parts"]

FORMATS = ("aol", "csv", "tsv", "parquet", "items")

_OPTIONS: dict[str, set[str]] = {
    "aol": {"skip_bad_rows", "keep_no_click", "progress"},
    "table": {"user_col", "query_col", "url_col", "row_per_user", "skip_bad_rows", "progress"},
    "items": {"skip_bad_rows", "progress"},
}
_DEFAULTS: dict[str, object] = {"query_col": "query"}


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess the format of ``path``: one of :data:`FORMATS`.

    ``.dat`` -> items; ``.parquet``/``.pq`` -> parquet; ``.csv`` -> csv; ``.tsv``/``.tab``/``.txt``/no
    known extension -> aol if the first line is the AOL header, else tsv (for ``.tsv``/``.tab``/``.txt``,
    the tab-separated extensions of :func:`~hybriddp.io.textfiles.table_format`). A compression suffix
    (``.gz`` ...) is looked through; a directory is a partitioned Parquet log.
    """
    p = log_path(path)
    if os.path.isdir(p):
        return "parquet"
    ext = base_ext(p)
    if ext == ".dat":
        return "items"
    kind = TABLE_EXTENSIONS.get(ext)
    if kind in ("parquet", "csv"):
        return kind
    first = first_line(p)
    if first == AOL_HEADER:
        return "aol"
    if not first and not head(p).strip():
        raise DataError(f"{p} is empty: a log needs a header line naming its columns (or, for an item log "
                        "named .dat, one line of items per user)")
    if kind == "tsv":
        return "tsv"
    raise DataError(f"cannot tell the format of {p} from its name or first line; "
                    f"pass --format, one of {', '.join(FORMATS)}")


def load_log(path: str | os.PathLike[str], *, format: str | None = None, **options: Any) -> RecordLog:
    """Load ``path`` with the loader of ``format`` (None: :func:`detect_format`).

    ``options`` go to :func:`load_aol`, :func:`load_table` or :func:`load_items`. Options a
    format does not take are ignored when they are None / False / their default, and refused
    otherwise (e.g. ``user_col='x'`` with ``format='aol'``).
    """
    p = log_path(path)
    fmt = detect_format(p) if format is None else str(format).lower()
    if fmt not in FORMATS:
        raise DataError(f"unknown format {format!r}: allowed formats are {', '.join(FORMATS)}")
    kind = "table" if fmt in TABLE_FORMATS else fmt
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

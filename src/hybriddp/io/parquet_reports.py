"""Device reports as a Parquet directory, the layout a data lake keeps them in (docs/FORMATS.md).

One row per report: ``id`` (the message id), ``pos`` (0, 1, … within its message), ``headlist``
(the head list's content hash), ``query`` and ``url`` (null = wildcard). A message is its rows
with one ``id``; a resent message repeats its (id, pos) rows and is counted once. The directory
holds ``part-NNNNN.parquet`` files; it is written under a temporary name and renamed when
complete, so a reader never sees half a directory.

Counted by :func:`hybriddp.spark.reports.count_reports_spark` (Spark) or, in one
process, by :func:`read_parquet_messages` feeding :class:`~hybriddp.server.party.MessageCounter`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hybriddp.core.errors import DataError

REPORT_SCHEMA = pa.schema([("id", pa.string()), ("pos", pa.int32()), ("headlist", pa.string()),
                           ("query", pa.string()), ("url", pa.string())])
ROWS_PER_FILE = 4_000_000


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``path``; on success it replaces ``path``.

    An earlier directory at ``path`` is moved aside and removed only after the rename, so an
    error or a kill leaves either the old or the new directory, never a mix.
    """
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    try:
        yield tmp
        old = None
        if target.exists():
            if not target.is_dir():
                raise DataError(f"{target} exists and is not a directory; choose another output path")
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=parent))
            os.replace(target, old / "d")
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class ReportsWriter:
    """Appends report rows to numbered Parquet files in a directory (``rows_per_file`` per file)."""

    def __init__(self, directory: Path, rows_per_file: int = ROWS_PER_FILE) -> None:
        self.directory = directory
        self.rows_per_file = rows_per_file
        self.files = 0
        self.rows = 0
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Queue rows (columns as :data:`REPORT_SCHEMA`); every file that fills up is written at once."""
        tbl = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        tbl = tbl.select(REPORT_SCHEMA.names).cast(REPORT_SCHEMA)
        self._buffer.extend(tbl.to_batches())
        self._buffered += tbl.num_rows
        if self._buffered >= self.rows_per_file:
            self._write(final=False)

    def flush(self) -> None:
        """Write every queued row (the last file may be short)."""
        self._write(final=True)

    def _write(self, final: bool) -> None:
        if not self._buffered:
            return
        tbl = pa.Table.from_batches(self._buffer, REPORT_SCHEMA)
        a = 0
        while tbl.num_rows - a >= self.rows_per_file or (final and a < tbl.num_rows):
            part = tbl.slice(a, self.rows_per_file)
            pq.write_table(part, self.directory / f"part-{self.files:05d}.parquet", compression="snappy")
            self.files += 1
            self.rows += part.num_rows
            a += part.num_rows
        rest = tbl.slice(a)
        self._buffer, self._buffered = rest.to_batches(), rest.num_rows


def write_reports_parquet(path: str | os.PathLike[str], messages: Iterable[dict[str, Any]],
                          rows_per_file: int = ROWS_PER_FILE, commit: Callable[[], Any] | None = None
                          ) -> tuple[int, int]:
    """Write device messages as a Parquet reports directory; returns (messages, reports).

    The directory appears only when every message was written and ``commit`` (if given, e.g. a
    device ledger's charge) returned.
    """
    n_msg = 0
    cols: dict[str, list[Any]] = {name: [] for name in REPORT_SCHEMA.names}
    with atomic_directory(path) as tmp:
        out = ReportsWriter(tmp, rows_per_file)
        for msg in messages:
            n_msg += 1
            for pos, rep in enumerate(msg["reports"]):
                for name, value in (("id", msg["id"]), ("pos", pos), ("headlist", msg["headlist"]),
                                    ("query", rep["query"]), ("url", rep["url"])):
                    cols[name].append(value)
            if len(cols["id"]) >= 65536:
                out.add(pa.table(cols, schema=REPORT_SCHEMA))
                cols = {name: [] for name in REPORT_SCHEMA.names}
        out.add(pa.table(cols, schema=REPORT_SCHEMA))
        out.flush()
        if commit is not None:
            commit()
    return n_msg, out.rows


def is_parquet_reports(path: str | os.PathLike[str]) -> bool:
    """True for a directory, a ``.parquet`` file or a URI (Parquet reports), False for a JSON Lines file."""
    p = Path(path)
    return "://" in str(path) or p.is_dir() or p.name.endswith(".parquet")


def report_files(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The Parquet files of reports directories (or files), with a clear error when there are none."""
    if not isinstance(path, (str, os.PathLike)):
        return [f for one in path for f in report_files(one)]
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise DataError(f"reports directory not found: {p}; pass the directory of Parquet report files")
    files = sorted(f for f in p.rglob("*.parquet") if not any(part.startswith((".", "_")) for part in f.parts[-1:]))
    if not files:
        raise DataError(f"{p}: no .parquet files; a reports directory holds part-*.parquet files "
                        "(written by `hybriddp randomize --output DIR.parquet`)")
    return files


def check_report_schema(path: Path, schema: pa.Schema) -> None:
    """Every column of :data:`REPORT_SCHEMA` present with a compatible type, or a DataError naming it."""
    for field in REPORT_SCHEMA:
        if field.name not in schema.names:
            raise DataError(f"{path}: column {field.name!r} is missing; a reports file has columns "
                            f"{', '.join(REPORT_SCHEMA.names)} (docs/FORMATS.md)")
        t = schema.field(field.name).type
        ok = pa.types.is_integer(t) if field.name == "pos" else (pa.types.is_string(t) or pa.types.is_large_string(t))
        if not ok:
            raise DataError(f"{path}: column {field.name!r} has type {t}; expected {field.type} (docs/FORMATS.md)")


def read_parquet_messages(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, message)`` from a Parquet reports directory, rebuilding each message from its rows.

    A message's rows are consecutive, across files taken in name order (as :func:`write_reports_parquet`
    writes them); a message starts where ``id`` changes or ``pos`` is 0 (a resent copy).
    """
    current: dict[str, Any] | None = None  # a message may continue in the next file (files in name order)
    where = ""
    for f in report_files(path):
        pf = pq.ParquetFile(f)
        check_report_schema(f, pf.schema_arrow)
        row = 0
        for batch in pf.iter_batches(columns=REPORT_SCHEMA.names, batch_size=65536):
            d = batch.to_pydict()
            for mid, pos, hl, q, u in zip(d["id"], d["pos"], d["headlist"], d["query"], d["url"], strict=True):
                row += 1
                if current is None or mid != current["id"] or pos == 0:
                    if current is not None:
                        yield where, current
                    current, where = {"id": mid, "headlist": hl, "reports": []}, f"{f}, row {row}"
                current["reports"].append({"query": q, "url": u})
    if current is not None:
        yield where, current

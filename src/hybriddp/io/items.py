"""Item logs such as Kosarak ``.dat``: one user per line, items separated by whitespace.

:func:`load_items` reads one into a :class:`~hybriddp.core.records.RecordLog` without a URL level
(every item occurrence is a record, ALGORITHM.md §1), streaming and vectorized.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hybriddp.core.records import NO_URL, ArrayVocabulary, LoadStats, RecordLog
from hybriddp.core.stages import ProgressFn
from hybriddp.io.blocks import Encoder, as_bool, log_summary
from hybriddp.io.textfiles import check_file, check_text, head, logger, open_stream, read_error

_ITEMS_CHUNK = 64 << 20  # bytes read at a time


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
    items = _Items(p, stats)
    try:
        for buf in _line_blocks(stream):
            if buf:
                items.add(buf)
            if progress is not None:
                progress(min(raw.tell(), total), total)
    except (OSError, pa.ArrowException) as e:
        raise read_error(p, e) from e
    finally:
        stream.close()
        raw.close()
    log = items.log()
    log_summary(p, log)
    return log


def _line_blocks(stream: pa.NativeFile) -> Iterator[bytes]:
    """The decompressed text in blocks of whole lines; the last block is the rest (``b""`` if none)."""
    rest = b""
    while True:
        data = stream.read(_ITEMS_CHUNK)
        if not data:
            yield rest
            return
        buf = rest + data
        cut = buf.rfind(b"\n") + 1
        if cut == 0:  # no line end yet: read more
            rest = buf
            continue
        buf, rest = buf[:cut], buf[cut:]
        yield buf


def _decode(chunk: bytes, path: str, offset: int) -> str:
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError as e:
        logger.warning("%s: bytes that are not valid UTF-8 near byte %d (of the decompressed text) "
                       "were replaced by U+FFFD", path, offset + e.start)
        return chunk.decode("utf-8", "replace")


class _Items:
    """The items of every line and the line (user) each belongs to, block by block."""

    def __init__(self, path: str, stats: LoadStats) -> None:
        self.path = path
        self.stats = stats
        self.items = Encoder()
        self.owners: list[np.ndarray] = []
        self.n_lines = 0
        self.offset = 0  # bytes of decompressed text before the next block

    def add(self, buf: bytes) -> None:
        """Split a block of whole lines into items; an empty line counts as a row without a click."""
        text = _decode(buf, self.path, self.offset)
        self.offset += len(buf)
        lines = pc.list_flatten(pc.split_pattern(pa.array([text], pa.large_string()), "\n"))
        if text.endswith("\n"):
            lines = lines.slice(0, len(lines) - 1)
        tokens = pc.utf8_split_whitespace(lines)
        owner = pc.list_parent_indices(tokens).to_numpy()
        flat = pc.list_flatten(tokens)
        nonempty = pc.greater(pc.utf8_length(flat), 0)
        flat = flat.filter(nonempty)
        owner = owner[as_bool(nonempty)]
        n_users = int(np.count_nonzero(np.diff(owner))) + (len(owner) > 0)  # owner is sorted
        self.stats.rows_without_click += len(lines) - n_users
        self.items.add(flat.cast(pa.string()))
        self.owners.append(owner.astype(np.int64) + self.n_lines)
        self.n_lines += len(lines)

    def log(self) -> RecordLog:
        """The records grouped by line; user ids are line numbers (1-based)."""
        self.stats.rows_read = self.n_lines
        users = np.concatenate(self.owners) if self.owners else np.zeros(0, np.int64)
        codes, values = self.items.finish(pa.string())
        vocab = ArrayVocabulary(values.to_numpy(zero_copy_only=False))
        return RecordLog.from_user_sorted(users, codes, np.full(len(codes), NO_URL, np.int64), vocab,
                                          ArrayVocabulary([]), False, self.stats,
                                          user_ids=np.arange(1, self.n_lines + 1))

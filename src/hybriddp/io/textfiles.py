"""Opening log files: the format and compression a name says, refusing non-text files, repairing UTF-8.

Used by the log readers (:mod:`hybriddp.io.loaders`) and the value reader (:mod:`hybriddp.io.values`).
A file is decompressed when its name ends in ``.gz``, ``.bz2`` or ``.zst`` (and refused when its first
bytes say otherwise); :func:`table_format` is the one reading of a table's format from its name. Where
text is expected,
:func:`check_text` refuses what is clearly not text (compressed data under another name,
Parquet, ZIP, SQLite, UTF-16, NUL bytes near the start), and :class:`Utf8Repair` replaces bytes
that are not UTF-8 by U+FFFD before parsing. Every failure is a one-line
:class:`~hybriddp.core.errors.DataError` naming the file and the fix.
"""

from __future__ import annotations

import logging
import os

import pyarrow as pa

from hybriddp.core.errors import DataError

logger = logging.getLogger("hybriddp.io.loaders")
"""The one logger of every log reader's messages (AOL, tables, item logs)."""

COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
TABLE_FORMATS = ("csv", "tsv", "parquet")
TABLE_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".txt": "tsv", ".parquet": "parquet",
                    ".pq": "parquet"}
"""The table format each file extension names (a compression suffix is looked through)."""
_CODEC_MAGIC = {"gzip": (b"\x1f\x8b", "gzip-compressed"), "bz2": (b"BZh", "bzip2-compressed"),
                "zstd": (b"\x28\xb5\x2f\xfd", "zstd-compressed")}
_OTHER_MAGIC = ((b"PK\x03\x04", "a ZIP archive", "unpack it first"),
                (b"PAR1", "a Parquet file", "name it .parquet or pass --format parquet"),
                (b"SQLite format 3\x00", "an SQLite database", "it is not a log"),
                (b"\xff\xfe", "UTF-16 text", "convert it to UTF-8, e.g. with iconv -f UTF-16 -t UTF-8"),
                (b"\xfe\xff", "UTF-16 text", "convert it to UTF-8, e.g. with iconv -f UTF-16 -t UTF-8"))
_SNIFF = 1 << 16  # bytes at the start of a text file checked for binary content


def check_file(path: str | os.PathLike[str]) -> str:
    """``path`` as a string if it is an existing regular file, else :class:`DataError`."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DataError(f"file not found: {p}")
    if not os.path.isfile(p):
        raise DataError(f"not a regular file: {p}")
    return p


def compression(path: str) -> str | None:
    """The pyarrow codec the name asks for (``a.csv.gz`` -> ``gzip``), or None."""
    return COMPRESSION.get(os.path.splitext(path)[1].lower())


def base_ext(path: str) -> str:
    """Extension without a compression suffix: ``a.tsv.gz`` -> ``.tsv``."""
    root, ext = os.path.splitext(path.lower())
    if ext in COMPRESSION:
        root, ext = os.path.splitext(root)
    return ext


def table_format(path: str, fmt: str | None = None) -> str:
    """``fmt`` when given, else the table format (one of :data:`TABLE_FORMATS`) the file name says.

    ``.csv`` is comma-separated with double-quote quoting; ``.tsv``, ``.tab`` and ``.txt`` are
    tab-separated without quoting; ``.parquet`` and ``.pq`` are Parquet. ``.txt`` is tab-separated
    because the AOL logs are distributed as ``.txt`` files of tab-separated rows (a ``.txt`` log whose
    first line is the AOL header is read as AOL by :func:`hybriddp.io.loaders.detect_format`). A
    compression suffix is looked through: ``a.txt.gz`` is TSV. Another name is a :class:`DataError`
    asking for ``--format``.
    """
    if fmt is not None:
        return fmt
    kind = TABLE_EXTENSIONS.get(base_ext(path))
    if kind is None:
        raise DataError(f"cannot tell the table format of {path} from its extension; "
                        "pass --format csv, tsv or parquet")
    return kind


def open_stream(path: str) -> tuple[pa.NativeFile, pa.NativeFile]:
    """Return ``(stream, raw)``: the decompressed stream and the raw file (for progress)."""
    codec = compression(path)
    try:
        if codec is not None:
            _check_compressed(path, codec)
        raw = pa.OSFile(path, "rb")
        return (pa.CompressedInputStream(raw, codec) if codec else raw), raw
    except (OSError, pa.ArrowException) as e:
        raise read_error(path, e, "open") from e


def _compressed_as(data: bytes) -> tuple[str, str] | None:
    """``(extension, description)`` of the compression format ``data`` starts with, if any."""
    for ext, codec in COMPRESSION.items():
        magic, what = _CODEC_MAGIC[codec]
        if data.startswith(magic) and (codec != "bz2" or (len(data) > 3 and 0x31 <= data[3] <= 0x39)):
            return ext, what
    return None


def _check_compressed(path: str, codec: str) -> None:
    """Refuse a file whose name says ``codec`` but whose first bytes are not that format."""
    with open(path, "rb") as fh:
        start = fh.read(16)
    magic, what = _CODEC_MAGIC[codec]
    if not start or start.startswith(magic):
        return
    ext = os.path.splitext(path)[1]
    actual = _compressed_as(start)
    fix = (f"it is {actual[1]}: rename it to end in {actual[0]}" if actual
           else f"if it is plain text, rename it without {ext}")
    raise DataError(f"{path}: the name ends in {ext} but the file is not {what} "
                    f"(it starts with {short(start, 16)}); {fix}")


def read_error(path: str, exc: BaseException, doing: str = "read", block_size: int = 0) -> DataError:
    """A one-line :class:`DataError` for a read/parse failure, with the fix for known causes
    (``block_size``: the parser's block, for the message about over-long lines)."""
    msg = " ".join(str(exc).split())
    low = msg.lower()
    if "truncated" in low or "unexpected end" in low or "premature end" in low:
        return DataError(f"{path}: the compressed data ends early, so the file is truncated (was a download or "
                         f"copy cut short?); get a complete copy of it ({msg})")
    if "straddl" in low:
        return DataError(f"{path}: a line is longer than {block_size:,} bytes, so this does not look like a "
                         "line-by-line text log; check that it is the right file and that it is not compressed "
                         "without a .gz/.bz2/.zst name")
    if "inflate" in low or "decompress" in low or "corrupt" in low:
        return DataError(f"{path}: the compressed data is damaged ({msg}); get a good copy of the file")
    if isinstance(exc, OSError) and exc.strerror:
        return DataError(f"cannot {doing} {path}: {exc.strerror}")
    return DataError(f"cannot {doing} {path}: {msg}")


def head(path: str) -> bytes:
    """The start of the decompressed file: at least 64 KiB, or up to the first line end (≤ 1 MiB)."""
    stream, raw = open_stream(path)
    try:
        data = b""
        while len(data) < _SNIFF or (b"\n" not in data and b"\r" not in data and len(data) < (1 << 20)):
            chunk = stream.read(1 << 16)
            if not chunk:
                break
            data += chunk
    except (OSError, pa.ArrowException) as e:
        raise read_error(path, e) from e
    finally:
        stream.close()
        raw.close()
    return data


def check_text(path: str, data: bytes) -> None:
    """Refuse binary content (compressed, Parquet, ZIP, UTF-16, NUL bytes) where text is expected.

    ``data`` is the start of the file after any decompression its name asks for.
    """
    actual = _compressed_as(data)
    if actual is not None and compression(path):
        raise DataError(f"{path} is still {actual[1]} after decompression (compressed twice?); "
                        "decompress it once by hand and load the result")
    if actual is not None:
        raise DataError(f"{path} is {actual[1]} but its name does not end in {actual[0]}; rename it to "
                        f"{os.path.basename(path)}{actual[0]} (compressed files are recognized by their name)")
    for magic, what, fix in _OTHER_MAGIC:
        if data.startswith(magic):
            raise DataError(f"{path} is {what}, not a text log; {fix}")
    nul = data.find(b"\x00", 0, _SNIFF)
    if nul >= 0:
        raise DataError(f"{path} is not a text file: byte {nul:,} (of the decompressed data) is NUL (0x00); a "
                        "search or item log is UTF-8 text, so check that this is the right file")


def first_line(path: str) -> str:
    """First line of the decompressed text file, without line end and BOM (undecodable -> U+FFFD).

    Raises :class:`DataError` when the file is binary rather than text (see :func:`check_text`).
    A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r``, as for the parser.
    """
    data = head(path)
    check_text(path, data)
    ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    line = data[:min(ends)] if ends else data
    return line.removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace")


def short(value: object, limit: int = 40) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _utf8_cut(data: bytes) -> int:
    """Where to cut ``data`` so that no multi-byte UTF-8 character is split (its end, or
    before a lead byte among the last four bytes)."""
    n = len(data)
    j = n - 1
    while j >= 0 and n - j <= 4 and 0x80 <= data[j] <= 0xBF:
        j -= 1
    return j if j >= 0 and n - j <= 4 and data[j] >= 0xC0 else n


class Utf8Repair:
    """Stream transform: bytes that are not valid UTF-8 become U+FFFD (with one warning).

    pyarrow passes a malformed row's text to the invalid-row handler as ``str``; invalid UTF-8
    there fails inside pyarrow and stops the load even with --skip-bad-rows, so the text is
    repaired before it is parsed. Valid blocks pass through unchanged; line ends never change.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.rest = b""  # an incomplete character carried to the next block
        self.offset = 0
        self.warned = False

    def __call__(self, buf: pa.Buffer) -> bytes:
        data = self.rest + buf.to_pybytes()
        if len(buf):
            cut = _utf8_cut(data)
            data, self.rest = data[:cut], data[cut:]
        else:  # end of the stream
            self.rest = b""
        start = self.offset
        self.offset += len(data)
        if data.isascii():
            return data
        try:
            data.decode("utf-8")
            return data
        except UnicodeDecodeError as e:
            if not self.warned:
                logger.warning("%s: bytes that are not valid UTF-8 near byte %d (of the decompressed text) "
                               "were replaced by U+FFFD", self.path, start + e.start)
                self.warned = True
            return data.decode("utf-8", "replace").encode("utf-8")

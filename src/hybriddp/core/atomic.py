"""Writing output files so that nothing is ever half-written or lost.

Every file hybriddp writes goes through :func:`atomic_path` (or the helpers built on it): the
content is written to a temporary file *in the same directory*, flushed and fsynced, and then
renamed over the target in one step (``os.replace``, atomic on POSIX). A command that fails or
is killed leaves the earlier file byte-for-byte as it was, and at worst a stray
``.<name>.<random>.tmp`` file, never a truncated output.

:func:`check_output_path` validates an output path *before* any computation, so a command
with a bad ``--output`` fails in a second instead of after the work (and before a privacy
ledger is charged).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from hybriddp.core.errors import DataError


def check_output_path(path: str | Path, option: str, suffixes: Sequence[str] | None = None) -> Path:
    """Refuse an output path that cannot be written, before any work is done.

    Checks that the parent directory exists and is writable, that the path is not a directory,
    and (with ``suffixes``) that the name ends in one of them (case-insensitive; ``.gz`` is
    matched as a whole suffix such as ``.jsonl.gz``). Raises :class:`DataError` naming
    ``option``, the value and the fix.
    """
    p = Path(path)
    if str(path) == "":
        raise DataError(f"{option} is empty; give a file name")
    if p.is_dir():
        raise DataError(f"{option} {p} is a directory; give a file name inside it")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise DataError(f"{option} {p}: the directory {parent} does not exist; create it first or choose another "
                        "path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DataError(f"{option} {p}: the directory {parent} is not writable; choose another path")
    if p.exists() and not os.access(p, os.W_OK):
        raise DataError(f"{option} {p} exists and is not writable; choose another path")
    if suffixes is not None:
        name = p.name.lower()
        if not any(name.endswith(s.lower()) for s in suffixes):
            raise DataError(f"{option} {p}: unknown extension; use one of {', '.join(suffixes)}")
    return p


def check_output_dir(path: str | Path, option: str, files: Sequence[str] = ()) -> Path:
    """Make sure an output directory exists (creating it) and is writable, before any work.

    ``files`` are names the command will write inside it: each is checked with
    :func:`check_output_path` (an existing read-only one is refused now, not after the work).
    Raises :class:`DataError` naming ``option``, the value and the fix.
    """
    p = Path(path)
    if str(path) == "":
        raise DataError(f"{option} is empty; give a directory")
    if p.exists() and not p.is_dir():
        raise DataError(f"{option} {p} is a file, not a directory; give a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{option} {p}: cannot create the directory ({exc.strerror or exc}); "
                        "choose another path") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise DataError(f"{option} {p}: the directory is not writable; choose another path")
    for name in files:
        check_output_path(p / name, option)
    return p


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/file system can fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success fsync it and rename it to ``path``.

    Use it for writers that take a file name (pyarrow, matplotlib, SQLite). On an exception the
    temporary file is removed and ``path`` is untouched.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        if target.exists():  # keep the earlier file's permissions
            with contextlib.suppress(OSError):
                os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
        _fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, encoding: str = "utf-8",
                compress: bool | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file for writing; it replaces ``path`` only when the block succeeds.

    ``mode`` is ``"w"`` (text, ``encoding``) or ``"wb"``. ``compress`` None: gzip when the name
    ends in ``.gz``. The gzip stream is closed (its trailer written) before the rename, so a
    ``.gz`` output is either complete or absent.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode {mode!r}; use 'w' or 'wb'")
    target = Path(path)
    gz = target.name.lower().endswith(".gz") if compress is None else compress
    with atomic_path(target) as tmp:
        if gz:
            fh: IO[Any] = gzip.open(tmp, mode + "t" if mode == "w" else mode,
                                    **({"encoding": encoding} if mode == "w" else {}))
        else:
            fh = open(tmp, mode, **({"encoding": encoding} if mode == "w" else {}))
        with fh:
            yield fh


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Atomically replace ``path`` with ``text``."""
    with atomic_open(path, "w", encoding=encoding, compress=False) as fh:
        fh.write(text)


def write_private_text(path: str | Path, text: str) -> None:
    """Atomically replace ``path`` with ``text`` (UTF-8) readable by its owner only: a new file gets mode 0600
    (secrets: device credentials, opt-in tokens). The umask is process-wide, so this is not for threads."""
    old = os.umask(0o077)
    try:
        write_text(path, text)
    finally:
        os.umask(old)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``."""
    with atomic_open(path, "wb", compress=False) as fh:
        fh.write(data)

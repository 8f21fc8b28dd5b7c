"""Files that cross machines in the file workflow: curator → devices → server (docs/FORMATS.md).

This module only reads and writes; what the documents mean is :mod:`hybriddp.curator.release`.

* the curator's release: the device head list and the opt-in estimates, two JSON files
  (:func:`write_release_files`, :func:`read_release_files`);
* device messages, a **reports file** (``hybriddp-reports`` v2, JSON Lines, ``.gz`` accepted)::

      {"format": "hybriddp-reports", "version": 2, "headlist": "sha256:…"}      ← header
      {"id": "…", "headlist": "sha256:…", "reports": [{"query": …, "url": …}]}  ← one line per device
      {"end": true, "messages": N, "reports": R}                                  ← trailer

  The trailer lets a reader tell a complete file from a truncated one; a file without it,
  or whose counts disagree, is refused.

Every file is written to a temporary file and renamed (:mod:`hybriddp.core.atomic`), so a failed
or killed writer leaves earlier files as they were. Raw opt-in records are never written here.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from hybriddp.core.atomic import atomic_open, atomic_path
from hybriddp.core.errors import DataError, HeadListError
from hybriddp.core.jsonfile import read_json

REPORTS_FORMAT = "hybriddp-reports"
REPORTS_VERSION = 2


def _dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False)


def write_release_files(headlist_path: str | Path, estimates_path: str | Path, headlist_doc: dict[str, Any],
                        estimates_doc: dict[str, Any], commit: Callable[[], Any] | None = None) -> None:
    """Write the curator's two documents so that both appear, or neither changes.

    Both are written to temporary files first; then ``commit`` runs (e.g. the privacy ledger's
    charge — if it raises, nothing is renamed and the earlier files stay as they were); then
    both are renamed into place.
    """
    with atomic_path(headlist_path) as tmp_h, atomic_path(estimates_path) as tmp_e:
        tmp_h.write_text(_dump(headlist_doc), encoding="utf-8")
        tmp_e.write_text(_dump(estimates_doc), encoding="utf-8")
        if commit is not None:
            commit()


def read_release_files(headlist_path: str | Path, estimates_path: str | Path) -> tuple[Any, Any]:
    """The two parsed JSON documents (validated by :func:`hybriddp.curator.release.release_from_documents`)."""
    return (read_json(headlist_path, "head list", HeadListError),
            read_json(estimates_path, "opt-in estimates", DataError))


# ----- reports files -----------------------------------------------------------------------------
def write_reports(path: str | Path, headlist_hash: str, messages: Iterable[dict[str, Any]],
                  commit: Callable[[], Any] | None = None) -> tuple[int, int]:
    """Write device messages as a reports file; returns (messages, reports).

    The file appears only when every message was written (and ``commit``, if given, returned):
    a device ledger that refuses, an error or a kill leaves an earlier file untouched.
    """
    n_msg = n_rep = 0
    with atomic_open(path, "w") as fh:
        fh.write(json.dumps({"format": REPORTS_FORMAT, "version": REPORTS_VERSION, "headlist": headlist_hash}) + "\n")
        for msg in messages:
            fh.write(json.dumps(msg, ensure_ascii=False, separators=(",", ":"), allow_nan=False))
            fh.write("\n")
            n_msg += 1
            n_rep += len(msg["reports"])
        fh.write(json.dumps({"end": True, "messages": n_msg, "reports": n_rep}) + "\n")
        if commit is not None:
            commit()
    return n_msg, n_rep


def _open_text(path: Path) -> IO[str]:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_messages(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, message)`` for each device message of a reports file.

    ``where`` is ``"FILE, line N"`` for error messages. The header must name the format and
    the trailer must close the file with the right counts; otherwise :class:`DataError` says
    the file is truncated or not a reports file. Messages are yielded as parsed JSON, to be
    checked by the server (:class:`hybriddp.server.party.MessageCounter`).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"reports file not found: {p}")
    n_msg = n_rep = 0
    end: dict[str, Any] | None = None
    lineno = 0
    try:
        with _open_text(p) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                if end is not None:
                    raise DataError(f"{p}, line {lineno}: data after the end line; the file was damaged or two "
                                    "files were joined. Write one reports file per `hybriddp randomize` run")
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{p}, line {lineno}: not JSON ({exc.msg}); a reports file has one JSON "
                                    "object per line (written by `hybriddp randomize`)") from None
                if lineno == 1:
                    _check_header(obj, p)
                    continue
                if isinstance(obj, dict) and obj.get("end") is True:
                    end = obj
                    continue
                n_msg += 1
                if isinstance(obj, dict) and isinstance(obj.get("reports"), list):
                    n_rep += len(obj["reports"])
                yield f"{p}, line {lineno}", obj
    except UnicodeDecodeError:
        raise DataError(f"{p}, line {lineno + 1}: not UTF-8 text; is this a reports file written by "
                        "`hybriddp randomize`?") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{p}: the gzip data is truncated or damaged ({exc}); the reports file is incomplete. "
                        "Write it again with `hybriddp randomize`") from None
    if lineno == 0:
        raise DataError(f"{p}: empty file; a reports file starts with a header line (written by `hybriddp randomize`)")
    if end is None:
        raise DataError(f"{p}: no end line; the file is truncated (was the writer killed?). Write it again with "
                        "`hybriddp randomize`")
    if end.get("messages") != n_msg or end.get("reports") != n_rep:
        raise DataError(f"{p}: the end line says {end.get('messages')} messages and {end.get('reports')} reports, "
                        f"but the file holds {n_msg} and {n_rep}; the file was altered or damaged")


def _check_header(obj: Any, p: Path) -> None:
    if not isinstance(obj, dict) or obj.get("format") != REPORTS_FORMAT:
        raise DataError(f"{p}, line 1: not a reports file (expected a header "
                        f'{{"format": "{REPORTS_FORMAT}", ...}}); pass the file `hybriddp randomize` wrote')
    if obj.get("version") != REPORTS_VERSION:
        raise DataError(f"{p}, line 1: reports file version {obj.get('version')!r}; this hybriddp reads version "
                        f"{REPORTS_VERSION}. Randomize again with this version")

"""Reading a JSON document from a file with errors that name the file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hybriddp.core.errors import HybridDPError


def read_json(path: str | Path, what: str, error: type[HybridDPError]) -> Any:
    """Parse ``path`` as JSON (UTF-8); any failure raises ``error`` naming ``what``, the file and the cause.

    A missing file, a directory, an unreadable or empty file, bytes that are not UTF-8, text that
    is not JSON, numbers too long to convert, and nesting too deep for the parser are all reported
    the same way, on one line.
    """
    p = Path(path)
    if p.is_dir():
        raise error(f"{what} file {p} is a directory; give the JSON file inside it")
    if not p.is_file():
        raise error(f"{what} file not found: {p}")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} file {p}: {exc.strerror or exc}") from None
    if not data.strip():
        raise error(f"{what} file {p} is empty; it must hold the JSON document hybriddp wrote")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{p}: not a {what} file: byte {exc.start} is 0x{data[exc.start]:02x}, which is not UTF-8 "
                    "text (JSON files are UTF-8)") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{p}: not valid JSON for a {what} file: it is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer with too many digits
        raise error(f"{p}: not valid JSON ({' '.join(str(exc).split())})") from None


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN or ±Infinity replaced by None (JSON has no such numbers)."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "dtype") and getattr(obj, "shape", None) == () and obj.dtype.kind == "f":
        return float(obj) if math.isfinite(float(obj)) else None
    return obj

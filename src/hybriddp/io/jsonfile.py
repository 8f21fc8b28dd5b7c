"""Reading a JSON document from a file with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybriddp.errors import HybridDPError


def read_json(path: str | Path, what: str, error: type[HybridDPError]) -> Any:
    """Parse ``path`` as JSON; a missing file or bad JSON raises ``error`` naming ``what``."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} file not found: {p}")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{p}: not valid JSON ({exc})") from None

"""How many threads hybriddp's own pools use (batch randomizer, OLH support counts).

Default: ``min(8, os.cpu_count())``. ``HYBRIDDP_THREADS`` in the environment overrides it (e.g.
on a shared machine), and :func:`set_default_threads` overrides both for this process — the
experiment runner's worker processes set 1, so ``--jobs N`` processes use N cores. A ``threads``
argument given to a function always wins.
"""

from __future__ import annotations

import os

MAX_DEFAULT_THREADS = 8
_override: int | None = None


def set_default_threads(n: int | None) -> None:
    """Use ``n`` threads by default in this process (None: back to the environment/CPU default)."""
    global _override
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"threads must be an integer >= 1, got {n!r}")
    _override = n


def default_threads() -> int:
    """The thread count a pool uses when its caller gives none (module docstring)."""
    if _override is not None:
        return _override
    env = os.environ.get("HYBRIDDP_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return min(MAX_DEFAULT_THREADS, os.cpu_count() or 1)

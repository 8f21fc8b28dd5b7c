"""Watching the OS CSPRNG: which integers a production sampler asks :mod:`secrets` for."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import pytest


def counting_randbelow(monkeypatch: pytest.MonkeyPatch, fake: Callable[[int], int] | None = None) -> list[int]:
    """Replace :func:`secrets.randbelow` (by ``fake``, or a pass-through); returns the list of bounds it is
    called with."""
    calls: list[int] = []
    real = secrets.randbelow

    def randbelow(n: int) -> int:
        calls.append(n)
        return real(n) if fake is None else fake(n)

    monkeypatch.setattr(secrets, "randbelow", randbelow)
    return calls

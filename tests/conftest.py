"""Shared pytest options for the test suite."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--update-snapshots``: rewrite tests/snapshots/seeded.json (see tests/test_snapshots.py)."""
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite the seeded-output snapshots from this run instead of comparing with them")

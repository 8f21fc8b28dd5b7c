"""Shared pytest options and fixtures for the test suite."""

from __future__ import annotations

import itertools

import pytest

_DATA_HOMES = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--update-snapshots``: rewrite tests/snapshots/seeded.json (see tests/test_snapshots.py)."""
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite the seeded-output snapshots from this run instead of comparing with them")


@pytest.fixture(autouse=True)
def _private_data_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own HYBRIDDP_DATA_HOME (created only if used), so no test reads or writes the
    device ledger in the real home directory, and no test sees another's."""
    home = tmp_path_factory.getbasetemp() / f"data-home-{next(_DATA_HOMES)}"
    monkeypatch.setenv("HYBRIDDP_DATA_HOME", str(home))

"""Shared pytest options and fixtures for the test suite."""

from __future__ import annotations

import itertools

import pytest

_DATA_HOMES = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--update-snapshots``: rewrite tests/snapshots/seeded.json (see tests/test_snapshots.py)."""
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite the seeded-output snapshots from this run instead of comparing with them")


_GROUPS = {"browser": "browser", "spark": "spark"}
"""Test directories whose tests share one expensive session fixture (a demo server and Chromium, a SparkSession):
under ``pytest -n`` (pytest-xdist, ``--dist loadgroup``) each runs on one worker, so
the fixture starts once, not once per worker."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put every test of a :data:`_GROUPS` directory into its xdist group (a no-op without pytest-xdist). First:
    xdist's own hook of the same name reads the groups into the test ids, so a marker added after it is ignored
    (each worker then started its own demo server and Chromium, and its own SparkSession)."""
    for item in items:
        parts = item.path.parts
        for directory, group in _GROUPS.items():
            if "tests" in parts and directory in parts[parts.index("tests") + 1:-1]:
                item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _private_data_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own HYBRIDDP_DATA_HOME (created only if used), so no test reads or writes the
    device ledger in the real home directory, and no test sees another's."""
    home = tmp_path_factory.getbasetemp() / f"data-home-{next(_DATA_HOMES)}"
    monkeypatch.setenv("HYBRIDDP_DATA_HOME", str(home))

"""Fixtures of the service tests: every test reaches the database through ``store_url``."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A fresh, empty database for one test: an SQLite file in the test's temporary directory."""
    return f"sqlite:///{tmp_path / 'hybriddp.db'}"

"""The node runtime and an npm package of tests/interop (installed by `.ci/run`: `npm ci --prefix tests/interop`),
for the interoperability tests against libraries no one here wrote. In CI a missing node or package FAILS the test;
elsewhere it is skipped with the command that installs it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

INTEROP = Path(__file__).with_name("interop")


def node_with(package: str) -> str:
    """The ``node`` executable, once the npm ``package`` (e.g. ``@hpke/core``) is installed in tests/interop."""
    exe = shutil.which("node")
    where = INTEROP / "node_modules" / package
    missing = None if exe else "`node` is not on PATH (install Node.js 20)"
    if missing is None and not where.is_dir():
        missing = f"{where} is missing: run `npm ci --prefix {INTEROP}`"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)
    return exe  # type: ignore[return-value]

"""A guard for the expensive session fixtures that one xdist group shares (tests/conftest.py, ``_GROUPS``)."""

from __future__ import annotations

import os

import pytest


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    """Fail if an expensive session fixture (``name``) starts on a second xdist worker of the same run: its tests'
    group (:data:`_GROUPS`) is then not in effect. Every worker's base temporary directory lies in the run's own
    directory, where the first start leaves a marker; without xdist there is one session and nothing to check."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    marker = tmp_path_factory.getbasetemp().parent / f"started-{name}"
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        pytest.fail(f"{name} started on a second xdist worker: the tests sharing it are not in one xdist group "
                    "(tests/conftest.py, _GROUPS)", pytrace=False)
    os.close(fd)

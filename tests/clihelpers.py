"""Running the CLI in-process in tests, and checking one-line errors."""

from __future__ import annotations

import re

from click.testing import CliRunner, Result

from hybriddp.cli import cli


def invoke(*args: object, ok: bool = True) -> Result:
    """Run ``hybriddp ARGS``; with ``ok`` assert exit status 0."""
    result = CliRunner().invoke(cli, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output + result.stderr
    return result


def assert_clean_error(result: Result, *needles: str) -> None:
    """Exit status 2, no traceback, and every needle in the error text."""
    assert result.exit_code == 2, result.output
    text = result.stderr or result.output
    assert "Traceback" not in text and "Traceback" not in result.output
    for needle in needles:
        assert needle in text, text


def exact_message(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern that matches ``message`` whole and nothing else."""
    return "^" + re.escape(message) + "$"

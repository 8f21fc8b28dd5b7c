"""The ``HybridDPError`` family: every error a user can cause says what, the value, and the fix."""

from __future__ import annotations


class HybridDPError(Exception):
    """Base class of every error hybriddp raises on purpose.

    The CLI prints ``str(error)`` on one line and exits with status 2; nothing else
    is caught there, so a bug still shows its traceback.
    """


class ParameterError(HybridDPError, ValueError):
    """A parameter is outside its allowed range.

    Built with :func:`parameter_error` so the message always names the parameter,
    the value it had, and what it must be.
    """


class DataError(HybridDPError, ValueError):
    """Input data cannot be used (malformed row, missing column, empty group, ...)."""


class HeadListError(HybridDPError):
    """A head list could not be built, read, or does not match the data sent with it."""


def parameter_error(name: str, value: object, allowed: str, fix: str = "") -> ParameterError:
    """Return a :class:`ParameterError` with the standard message shape.

    >>> str(parameter_error("epsilon", 0.5, "> ln 2 = 0.693"))
    'epsilon = 0.5 is not allowed: it must be > ln 2 = 0.693.'
    """
    msg = f"{name} = {value!r} is not allowed: it must be {allowed}."
    if fix:
        msg += f" {fix}"
    return ParameterError(msg)

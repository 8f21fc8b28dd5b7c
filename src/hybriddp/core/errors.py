"""The ``HybridDPError`` family: every error a user can cause says what, the value, and the fix."""

from __future__ import annotations

from typing import Any


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


class EmptyHeadListError(HeadListError):
    """CreateHeadList kept no record (ALGORITHM.md §3, §3.4).

    The empty outcome is itself an output of the mechanism, so the run costs what a release
    costs: ``charges`` are the ledger charges of the run (the same a successful release of it
    would carry; empty when the caller asked for none), and every caller with a ledger must
    charge them. Otherwise a curator could rerun until fresh noise lets a rare record through.
    The message names public parameters only (τ, ε, δ, m_O, the number of opt-in users), never
    a count of the data, and the fix.
    """

    def __init__(self, message: str, *, tau: float, epsilon: float, delta: float, m_o: int, n_optin_users: int,
                 charges: list[Any] | None = None) -> None:
        super().__init__(message)
        self.tau = tau
        self.epsilon = epsilon
        self.delta = delta
        self.m_o = m_o
        self.n_optin_users = n_optin_users
        self.charges: list[Any] = list(charges or [])  # hybriddp.privacy.ledger.Charge (core imports no party)


def parameter_error(name: str, value: object, allowed: str, fix: str = "") -> ParameterError:
    """Return a :class:`ParameterError` with the standard message shape.

    >>> str(parameter_error("epsilon", 0.5, "> ln 2 = 0.693"))
    'epsilon = 0.5 is not allowed: it must be > ln 2 = 0.693.'
    """
    msg = f"{name} = {value!r} is not allowed: it must be {allowed}."
    if fix:
        msg += f" {fix}"
    return ParameterError(msg)

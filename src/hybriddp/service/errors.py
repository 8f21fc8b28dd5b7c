"""Errors of the collection service, each mapped to one HTTP status by :mod:`hybriddp.service.app`.

All are :class:`~hybriddp.core.errors.HybridDPError` subclasses whose message names what was wrong and
the fix, like the rest of hybriddp. Anything else escaping a request is a bug (HTTP 500).
"""

from __future__ import annotations

import json
from typing import Any

from hybriddp.core.errors import DataError, HeadListError, HybridDPError, ParameterError
from hybriddp.core.tokens import TokenError
from hybriddp.privacy.ledger import BudgetExceededError, LedgerError


class ServiceError(HybridDPError):
    """Base class: ``status`` is the HTTP status, ``code`` the snake_case error code."""

    status = 400
    code = "bad_request"


class NotFoundError(ServiceError):
    """No round with that id."""

    status = 404
    code = "not_found"


class ConflictError(ServiceError):
    """The round is not in a state that allows the request (e.g. reports after close)."""

    status = 409
    code = "conflict"


class TooFewTokensError(ConflictError):
    """The round takes reports only once ``min_tokens`` report tokens were issued (its smallest anonymity set)."""

    code = "too_few_tokens"
    retry_after = 60


class UnauthorizedError(ServiceError):
    """A missing or wrong bearer token."""

    status = 401
    code = "unauthorized"


class BadBodyError(ServiceError):
    """A request body that is not the JSON (or NDJSON) the endpoint takes."""

    status = 400
    code = "malformed_body"


class BodyTooLargeError(ServiceError):
    """A request body over the size limit."""

    status = 413
    code = "body_too_large"


class QuotaError(ServiceError):
    """An opt-in token's upload quota (records or bytes per round) would be exceeded."""

    status = 413
    code = "quota_exceeded"


class SeedRefusedError(ServiceError):
    """A seeded (experiment) round asked of a server not started for testing."""

    status = 403
    code = "seeded_round_refused"


class StoreError(ServiceError):
    """The database cannot be used (wrong schema, unreachable, damaged): a server-side problem."""

    status = 503
    code = "database_unavailable"


class UnsupportedMediaTypeError(ServiceError):
    """A request body of a content type the endpoint does not take."""

    status = 415
    code = "unsupported_media_type"


class BodyTimeoutError(ServiceError):
    """A request body that stalled (a part did not arrive in time)."""

    status = 408
    code = "body_timeout"


class ServerBusyError(ServiceError):
    """The server holds as many unfinished request bodies as it may; the client retries later."""

    status = 503
    code = "busy"


MAX_MESSAGE = 600
"""Characters of an error message sent at most: a message that quotes a client's input is cut, so a 15 MB
field cannot come back as a 15 MB error."""


def cut_message(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE` characters, saying so."""
    if len(message) <= MAX_MESSAGE:
        return message
    return message[: MAX_MESSAGE - 40] + f"… (cut: {len(message):,} characters)"


def classify(exc: HybridDPError) -> tuple[int, str]:
    """The HTTP status and error code of an error of the library or the service."""
    if isinstance(exc, ServiceError):
        return exc.status, exc.code
    if isinstance(exc, TokenError):
        return 403, exc.code
    if isinstance(exc, BudgetExceededError):
        return 409, "budget_exceeded"
    if isinstance(exc, LedgerError):
        return 409, "ledger_refused"
    if isinstance(exc, HeadListError):
        return 422, "headlist_error"
    if isinstance(exc, ParameterError):
        return 422, "invalid_parameter"
    if isinstance(exc, DataError):
        return 422, "invalid_data"
    return 422, "invalid_input"


def error_payload(exc: HybridDPError) -> tuple[int, dict[str, dict[str, str]], dict[str, str]]:
    """(status, JSON body, headers) of the API's one error shape for ``exc``."""
    status, code = classify(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {"Retry-After": "5"} if status == 503 else {}
    if isinstance(exc, TooFewTokensError):
        headers = {"Retry-After": str(exc.retry_after)}
    return status, {"error": {"code": code, "message": cut_message(str(exc))}}, headers


def describe_errors(errs: Any) -> str:
    """Pydantic's validation errors in one line: field, problem and the value given, for the first five."""
    parts = []
    for e in list(errs)[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        got = "" if e.get("type") == "missing" else f" (got {json.dumps(e.get('input'), default=str)[:60]})"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}{got}")
    more = f"; and {len(errs) - 5} more" if len(errs) > 5 else ""
    return "; ".join(parts) + more

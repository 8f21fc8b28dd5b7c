"""What the API's routers share: the running service as a dependency, the bearer-token checks, the round id in
a path, and the documented error responses.

Administrator endpoints need ``Authorization: Bearer <admin token>``, compared in constant time
(:func:`is_admin`); opt-in uploads need the opt-in user's own token (:data:`OptinCredentials`).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hybriddp.core.protocol import ID_PATTERN
from hybriddp.service import models as m
from hybriddp.service.admission import Admission
from hybriddp.service.checkpool import CheckPool
from hybriddp.service.errors import UnauthorizedError
from hybriddp.service.metrics import Metrics
from hybriddp.service.store import Store
from hybriddp.service.writer import OptinWriter, ReportWriter


@dataclass(frozen=True)
class ServiceContext:
    """The parts of one running service that its routes use (``app.state.service``).

    ``admin_token``: the administrators' token as UTF-8 bytes; ``max_body_bytes``: the request body limit;
    ``allow_seeds``: whether seeded (non-private) rounds are taken; ``public_metrics``: whether ``/metrics``
    is served without the administrator token; ``private_round_details``: whether ``GET /api/v1/rounds/{id}``
    needs it; ``admission``: who may get report tokens (None: ``--open-admission``, reports need none);
    ``self_enrolment``: whether anyone may get a device credential (demos).
    """

    store: Store
    writer: ReportWriter
    pool: CheckPool | None
    metrics: Metrics
    admin_token: bytes
    max_body_bytes: int
    allow_seeds: bool
    public_metrics: bool = False
    private_round_details: bool = False
    admission: Admission | None = None
    self_enrolment: bool = False
    optin_writer: OptinWriter | None = None


async def service_context(request: Request) -> ServiceContext:
    """The running service of the app that got ``request``."""
    return request.app.state.service  # type: ignore[no-any-return]


async def service_store(request: Request) -> Store:
    """The database of the app that got ``request``."""
    return request.app.state.service.store  # type: ignore[no-any-return]


Service = Annotated[ServiceContext, Depends(service_context)]
"""A route parameter: the running service."""
StoreDep = Annotated[Store, Depends(service_store)]
"""A route parameter: the service's :class:`~hybriddp.service.store.Store`."""

admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                          description="The administrator token (`hybriddp serve` prints where it is).")
optin_bearer = HTTPBearer(auto_error=False, scheme_name="OptinToken",
                          description="The opt-in user's token from POST /api/v1/rounds/{id}/optin/enrol.")
AdminCredentials = Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)]
OptinCredentials = Annotated[HTTPAuthorizationCredentials | None, Security(optin_bearer)]


async def is_admin(service: Service, creds: AdminCredentials) -> bool:
    """True if the request carries the administrator token (constant-time comparison)."""
    given = creds.credentials.encode("utf-8", "surrogateescape") if creds is not None else b""
    return hmac.compare_digest(given, service.admin_token)


IsAdmin = Annotated[bool, Depends(is_admin)]
"""A route parameter: whether the request carries the administrator token."""


async def require_admin(admin: IsAdmin) -> None:
    """:class:`UnauthorizedError` (401) unless the request carries the administrator token."""
    if not admin:
        raise UnauthorizedError("this endpoint needs the administrator token: Authorization: Bearer <token> "
                                "(hybriddp serve printed where the token file is)")


ADMIN = [Depends(require_admin)]
"""The dependencies of an administrator endpoint."""


def require_visible(service: ServiceContext, admin: bool, what: str) -> None:
    """:class:`UnauthorizedError` (401) when the server shows ``what`` to administrators only
    (``--private-round-details``) and the request is not an administrator's."""
    if service.private_round_details and not admin:
        raise UnauthorizedError(f"this server shows {what} to administrators only (--private-round-details): "
                                "Authorization: Bearer <admin token>")

RoundId = Annotated[str, Path(description="The round's id: 16 random bytes in URL-safe base64 (22 characters). "
                                          "Any other string is answered 404.",
                              json_schema_extra={"pattern": f"^{ID_PATTERN}$"})]
"""A round id in a path (the pattern is documented, not enforced: a malformed id is simply not found)."""

_ERROR_TEXT = {400: "Malformed request body.", 401: "Missing or wrong bearer token.", 404: "No such round.",
               403: "Refused: a report without a valid token for it (token_required, token_invalid), a credential's "
                    "tokens for the round used up (issuance_limit), or a seeded round on a server not started with "
                    "--insecure-testing-seeds.",
               409: "The round's state does not allow this, or the privacy budget refuses it.",
               413: "Request body over the size limit, or an opt-in token's upload quota exceeded.",
               415: "Unsupported content type.",
               422: "Invalid parameters or data (the message names the field, the value and the fix).",
               503: "The database is unavailable."}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The documented error responses ``codes`` of a route: the API's one error shape, with what each means."""
    return {c: {"model": m.ErrorOut, "description": _ERROR_TEXT[c]} for c in codes}

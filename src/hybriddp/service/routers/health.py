"""The service's own endpoints: liveness (``/health``) and Prometheus metrics (``/metrics``)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from hybriddp.service import models as m
from hybriddp.service.errors import UnauthorizedError
from hybriddp.service.routers.common import IsAdmin, Service, errors
from hybriddp.service.schema import ROUND_STATES

router = APIRouter(tags=["service"])

_JSON_ERRORS = {c: {"description": d["description"], "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/ErrorOut"}}}} for c, d in errors(401, 503).items()}
"""/metrics answers text, but its errors are the API's JSON shape."""


@router.get("/health", response_model=m.HealthOut)
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **_JSON_ERRORS})
def get_metrics(service: Service, admin: IsAdmin) -> PlainTextResponse:
    """Prometheus metrics; needs the administrator token unless the server runs with ``--public-metrics``."""
    if not (admin or service.public_metrics):
        raise UnauthorizedError("/metrics needs the administrator token (Authorization: Bearer <token>), or a "
                                "server started with --public-metrics")
    text = service.metrics.render(service.store.state_counts(), ROUND_STATES)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

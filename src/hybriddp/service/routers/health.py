"""The service's own endpoints: liveness (``/health``) and Prometheus metrics (``/metrics``)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from hybriddp.service import models as m
from hybriddp.service.routers.common import Service, errors
from hybriddp.service.schema import ROUND_STATES

router = APIRouter(tags=["service"])


@router.get("/health", response_model=m.HealthOut)
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **errors(503)})
def get_metrics(service: Service) -> PlainTextResponse:
    text = service.metrics.render(service.store.state_counts(), ROUND_STATES)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

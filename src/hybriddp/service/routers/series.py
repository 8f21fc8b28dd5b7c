"""Round series (docs/SERIES.md): create, list, show, advance, cancel, and the trends over their published periods.

A series' rounds are ordinary rounds (``/api/v1/rounds/{id}``); the series only opens, publishes and closes them on
schedule (:mod:`hybriddp.service.series`). Showing a series and its trends is public, like a round's page, unless the
server runs with ``--private-round-details``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from hybriddp.server.trends import DEFAULT_WINDOW
from hybriddp.service import models as m
from hybriddp.service import series as ser
from hybriddp.service.errors import SeedRefusedError
from hybriddp.service.routers.common import ADMIN, IsAdmin, RoundId, Service, StoreDep, errors, require_visible
from hybriddp.service.routers.rounds import SEEDS_FLAG

router = APIRouter()


@router.post("/api/v1/series", status_code=201, response_model=m.SeriesOut, dependencies=ADMIN, tags=["series"],
             responses=errors(400, 401, 403, 404, 409, 413, 422, 503))
def create_series(body: m.CreateSeriesIn, service: Service) -> dict[str, Any]:
    """A series of rounds, one per period (docs/SERIES.md); its first round opens with the first advance (the
    server's scheduler, or ``POST /api/v1/series/{id}/advance``)."""
    params = body.params.model_dump(exclude_unset=True)
    if params.get("seed") is not None and not service.allow_seeds:
        raise SeedRefusedError(f"params.seed = {params['seed']}: a seeded series gives no privacy; leave the seed "
                               f"out, or start a test server with hybriddp serve {SEEDS_FLAG}")
    plan = ser.plan_series(service.store, body.kind, params, name=body.name, start=body.start,
                           period_seconds=body.period_seconds, optin_seconds=body.optin_seconds,
                           periods=body.periods, flagged=body.flagged, retention_hours=body.retention_hours,
                           carry=body.carry)
    info = ser.create_series(service.store, plan, body.first_round)
    return ser.status(service.store, info.id, admin=True)


@router.get("/api/v1/series", response_model=m.SeriesListOut, dependencies=ADMIN, tags=["series"],
            responses=errors(401, 503))
def list_series(store: StoreDep) -> dict[str, Any]:
    return {"series": [s.to_json(admin=True) for s in store.series_list()]}


@router.get("/api/v1/series/{series_id}", response_model=m.SeriesOut, tags=["series"],
            responses=errors(401, 404, 503))
def get_series(series_id: RoundId, service: Service, admin: IsAdmin) -> dict[str, Any]:
    """The series' schedule, each period's round and state, and what the lifetime budget admits per user."""
    require_visible(service, admin, "series")
    return ser.status(service.store, series_id, admin=admin)


@router.post("/api/v1/series/{series_id}/advance", response_model=m.SeriesOut, dependencies=ADMIN,
             tags=["series"], responses=errors(400, 401, 404, 409, 413, 422, 503))
def advance(series_id: RoundId, store: StoreDep, body: m.AdvanceIn | None = None) -> dict[str, Any]:
    """Do what the schedule says is due now (or, with ``step``, the next action at once): for cron-driven
    deployments and administrators; ``hybriddp serve`` also does it every ``--series-tick`` seconds."""
    step = body is not None and body.step
    done = ser.advance(store, series_id, step=step)
    return {**ser.status(store, series_id, admin=True), "actions": done}


@router.post("/api/v1/series/{series_id}/cancel", response_model=m.SeriesOut, dependencies=ADMIN, tags=["series"],
             responses=errors(401, 404, 409, 503))
def cancel(series_id: RoundId, store: StoreDep) -> dict[str, Any]:
    """Open no more periods; the current period's round is left as it is (close or abort it as any round)."""
    store.end_series(series_id, "cancelled")
    return ser.status(store, series_id, admin=True)


@router.get("/api/v1/series/{series_id}/trends", tags=["series"], responses=errors(401, 404, 422, 503))
def series_trends(series_id: RoundId, service: Service, admin: IsAdmin,
                  fdr: float = Query(0.05, gt=0, lt=1, description="Expected share of false trends."),
                  min_change: float = Query(0.0, ge=0, description="Smallest relative change that counts."),
                  window: int = Query(DEFAULT_WINDOW, ge=1, le=52,
                                      description="Periods pooled on each side of a boundary.")
                  ) -> dict[str, Any]:
    """Rising and falling queries across the series' published periods (ALGORITHM.md §13): post-processing of
    published results, no privacy spent."""
    from hybriddp.server.trends import PeriodEstimates, trend_document, trends

    require_visible(service, admin, "series")
    periods = [PeriodEstimates.from_result(doc, label) for label, doc in ser.trend_inputs(service.store, series_id)]
    if len(periods) < 2:
        return {"periods": [p.label for p in periods], "fdr": fdr, "min_change": min_change, "window": window,
                "tested": 0, "rising": 0, "falling": 0, "changes": [], "series": {},
                "note": "trends need two periods with published results"}
    return trend_document(periods, trends(periods, fdr=fdr, min_change=min_change, window=window), window)

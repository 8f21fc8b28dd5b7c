"""A round's administration: create, list, show, publish the head list, close, abort, delete.

Each route validates, calls :mod:`hybriddp.service.rounds` or the store, and renders the round
(:meth:`~hybriddp.service.store.RoundInfo.to_json`: the administrator's view, or the public one for
``GET /api/v1/rounds/{id}`` without the administrator token).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from hybriddp.service import closing, roundparams, rounds
from hybriddp.service import models as m
from hybriddp.service.errors import ConflictError, SeedRefusedError
from hybriddp.service.routers.common import ADMIN, IsAdmin, RoundId, Service, StoreDep, errors, require_visible
from hybriddp.service.sizing import ForecastOut, round_forecast

SEEDS_FLAG = "--insecure-testing-seeds"
"""The ``hybriddp serve`` flag without which seeded rounds are refused."""

router = APIRouter()


@router.post("/api/v1/rounds", status_code=201, response_model=m.RoundOut, dependencies=ADMIN, tags=["rounds"],
             responses=errors(400, 401, 403, 413, 422, 503))
def create_round(body: m.CreateRoundIn, service: Service) -> dict[str, Any]:
    params = roundparams.validate_params(body.kind, body.params.model_dump(exclude_unset=True))
    if params.get("seed") is not None and not service.allow_seeds:
        raise SeedRefusedError(f"params.seed = {params['seed']}: a seeded round gives no privacy (anyone who knows "
                               "the seed can regenerate its noise), so this server refuses it; leave the seed out "
                               f"(production), or start a test server with hybriddp serve {SEEDS_FLAG}")
    info = service.store.create_round(body.kind, body.name, params, retention_hours=body.retention_hours)
    return info.to_json(admin=True)


@router.get("/api/v1/rounds", response_model=m.RoundListOut, dependencies=ADMIN, tags=["rounds"],
            responses=errors(401, 503))
def list_rounds(store: StoreDep) -> dict[str, Any]:
    return {"rounds": [r.to_json(admin=True) for r in store.rounds()]}


@router.get("/api/v1/rounds/{round_id}", response_model=m.RoundOut, tags=["rounds"], responses=errors(401, 404, 503))
def get_round(round_id: RoundId, service: Service, admin: IsAdmin) -> dict[str, Any]:
    """A round's state, parameters and counts: public (without the opt-in counts) unless the server runs with
    ``--private-round-details``, which puts it behind the administrator token (docs/DEPLOYMENT.md)."""
    require_visible(service, admin, "round details")
    return service.store.round(round_id).to_json(admin=admin)


@router.get("/api/v1/rounds/{round_id}/forecast", response_model=ForecastOut, dependencies=ADMIN, tags=["rounds"],
            responses=errors(401, 404, 409, 422, 503))
def forecast(round_id: RoundId, store: StoreDep,
             optin_users: int | None = Query(None, ge=1, le=10**9, description="Opt-in users to forecast for. "
                                             "Default: the round's uploads so far.")) -> dict[str, Any]:
    """What a BLENDER round can expect before its head list is built (docs/TUNE.md "Sizing a round"): τ, the
    list's likely size and the chance it is empty for the opt-in users it has (or ``optin_users``) and the opt-in
    users it needs. Public parameters and the built-in prior only; the expected NDCG, which simulates rounds, is
    `hybriddp round create --expect-optin N --expect-devices M --dry-run`'s."""
    info = store.round(round_id)
    if info.kind != "blender":
        raise ConflictError(f"round {round_id} is a {info.kind} round: only BLENDER rounds have a head list to size")
    return round_forecast(info.params, optin_users if optin_users is not None else info.optin_users)


@router.post("/api/v1/rounds/{round_id}/abort", response_model=m.RoundOut, dependencies=ADMIN, tags=["rounds"],
             responses=errors(401, 404, 409, 503))
def abort(round_id: RoundId, store: StoreDep) -> dict[str, Any]:
    """End a round that is collecting opt-in data: its raw opt-in data are deleted, nothing is charged."""
    return store.abort(round_id).to_json(admin=True)


@router.delete("/api/v1/rounds/{round_id}", response_model=m.RoundOut, dependencies=ADMIN, tags=["rounds"],
               responses=errors(401, 404, 409, 503))
def delete_round(round_id: RoundId, store: StoreDep) -> dict[str, Any]:
    """Delete a round's raw opt-in data, tokens, reports, documents and results; its ledger charges stay."""
    return store.delete_round(round_id).to_json(admin=True)


@router.post("/api/v1/rounds/{round_id}/headlist", response_model=m.RoundOut, dependencies=ADMIN,
             tags=["curator"], responses=errors(400, 401, 404, 409, 413, 422, 503))
def publish(round_id: RoundId, store: StoreDep, body: m.PublishIn | None = None) -> dict[str, Any]:
    vocabulary = None if body is None or body.vocabulary is None else body.vocabulary.model_dump()
    return rounds.publish_headlist(store, round_id, vocabulary).to_json(admin=True)


@router.post("/api/v1/rounds/{round_id}/close", response_model=m.RoundOut, dependencies=ADMIN, tags=["rounds"],
             responses=errors(400, 401, 404, 409, 413, 422, 503))
def close(round_id: RoundId, store: StoreDep, body: m.CloseIn | None = None) -> dict[str, Any]:
    """Close the round and compute its results; results the anchor check flags are held for an administrator
    unless the body says otherwise (docs/ALGORITHM.md §7.2)."""
    return closing.close_round(store, round_id, "hold" if body is None else body.flagged).to_json(admin=True)


@router.post("/api/v1/rounds/{round_id}/results/publish", response_model=m.RoundOut, dependencies=ADMIN,
             tags=["rounds"], responses=errors(400, 401, 404, 409, 413, 422, 503))
def publish_results(round_id: RoundId, store: StoreDep, body: m.PublishResultsIn | None = None) -> dict[str, Any]:
    """Publish held results (state results-held), as they are or without their flagged entries."""
    return closing.publish_held(store, round_id, "keep" if body is None else body.flagged).to_json(admin=True)

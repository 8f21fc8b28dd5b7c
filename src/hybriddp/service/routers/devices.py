"""What devices use: the published head list (with its ETag) and the reports endpoint (ALGORITHM.md §5, §6).

``POST /api/v1/rounds/{id}/reports`` is served by the fast path, :class:`hybriddp.service.reports.ReportsEndpoint`,
to which :class:`hybriddp.service.app.ServiceApp` hands such requests before FastAPI's routing. The route
declared here states the endpoint in the OpenAPI document, and answers only when that diversion is off
(``ServiceApp.divert_reports = False``): through the same :func:`~hybriddp.service.reports.accept_reports`,
so both give the same answers.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hybriddp.service import models as m
from hybriddp.service.bodies import read_body
from hybriddp.service.errors import ConflictError
from hybriddp.service.reports import accept_reports
from hybriddp.service.routers.common import RoundId, Service, StoreDep, errors

router = APIRouter(tags=["devices"])


@router.get("/api/v1/rounds/{round_id}/headlist", response_model=m.HeadListOut,
            responses={304: {"description": "Not modified (If-None-Match matched the ETag)."},
                       **errors(404, 409, 503)})
def get_headlist(round_id: RoundId, request: Request, store: StoreDep) -> Response:
    docs = store.documents(round_id)
    if docs.headlist is None:
        raise ConflictError(f"round {round_id} has no head list yet: it is {docs.info.state!r}; the "
                            "administrator publishes it with POST /api/v1/rounds/{id}/headlist")
    etag = f'"{docs.info.headlist_hash}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    match = request.headers.get("if-none-match")
    if match is not None and (match.strip() == "*" or etag in [t.strip().removeprefix("W/")
                                                              for t in match.split(",")]):
        return Response(status_code=304, headers=headers)
    return Response(docs.headlist, media_type="application/json", headers=headers)


@router.post("/api/v1/rounds/{round_id}/reports", response_model=m.ReportAckOut,
             openapi_extra={"requestBody": m.REPORTS_BODY}, responses=errors(400, 403, 404, 409, 413, 415, 422, 503))
async def post_reports(round_id: RoundId, request: Request, service: Service) -> dict[str, int]:
    # Documents the fast path's endpoint (module docstring); reached only when ServiceApp.divert_reports is off.
    body = await read_body(request.receive, service.max_body_bytes)
    return await accept_reports(service.store, service.writer, service.pool, service.metrics, round_id, body,
                                request.headers.get("content-type"), service.admission is not None)

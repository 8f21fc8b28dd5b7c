"""A round's published results: the results (JSON, CSV or Parquet), the release they were computed from, and
the local-search document (ALGORITHM.md §7, §8)."""

from __future__ import annotations

import io
from typing import Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from hybriddp.service import closing
from hybriddp.service import models as m
from hybriddp.service.errors import NotFoundError
from hybriddp.service.routers.common import IsAdmin, RoundId, StoreDep, errors

router = APIRouter(tags=["results"])

_RESULTS_200 = {"description": "The results: JSON (everything), or the records table as CSV or Parquet.",
                "content": {"application/json": {"schema": {"type": "object"}},
                            "text/csv": {"schema": {"type": "string"}},
                            "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}}}}


@router.get("/api/v1/rounds/{round_id}/results", responses={200: _RESULTS_200, **errors(404, 409, 422, 503)})
def get_results(round_id: RoundId, store: StoreDep, admin: IsAdmin,
                format: Literal["json", "csv", "parquet"] = Query("json")) -> Response:
    """The results; held results (``results-held``, ALGORITHM.md §7.2) only with the administrator token."""
    info, results, result = closing.result_of(store, round_id, admin)
    if format == "json":
        return JSONResponse(results)
    table = closing.results_table(results, result)
    buf = io.BytesIO()
    if format == "csv":
        import pyarrow.csv as pacsv
        pacsv.write_csv(table, buf)
        media = "text/csv"
    else:
        import pyarrow.parquet as pq
        pq.write_table(table, buf)
        media = "application/vnd.apache.parquet"
    name = f"hybriddp-round-{info.id}.{format}"
    return Response(buf.getvalue(), media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/api/v1/rounds/{round_id}/release", response_model=m.ReleaseOut, responses=errors(404, 409, 503))
def get_release(round_id: RoundId, store: StoreDep) -> dict[str, Any]:
    return closing.release_of(store, round_id)


@router.get("/api/v1/rounds/{round_id}/local-search", response_model=m.LocalSearchOut,
            responses=errors(404, 409, 503))
def get_local_search(round_id: RoundId, store: StoreDep) -> dict[str, Any]:
    info, results, result = closing.result_of(store, round_id)
    if result is None:
        raise NotFoundError(f"round {round_id} is a mean round; only BLENDER rounds have a local-search document")
    return closing.local_search(info, result, results)

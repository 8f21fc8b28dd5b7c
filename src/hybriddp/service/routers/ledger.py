"""The privacy ledger of the service's database (PRIVACY.md): per-round totals and per-pseudonym spend."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from hybriddp.service import models as m
from hybriddp.service.ledger_view import service_ledger
from hybriddp.service.routers.common import ADMIN, StoreDep, errors

router = APIRouter(tags=["rounds"])


@router.get("/api/v1/ledger", response_model=m.LedgerOut, dependencies=ADMIN, responses=errors(401, 503))
def get_ledger(store: StoreDep) -> dict[str, Any]:
    """The privacy ledger: per-round totals and per-pseudonym spend (HMAC pseudonyms, never identities)."""
    return store.read(service_ledger)

"""The HTTP API's routes, one :class:`fastapi.APIRouter` per resource (``create_app`` includes :data:`ROUTERS`).

* :mod:`.health`: ``/health``, ``/metrics``;
* :mod:`.rounds`: a round's administration (create, list, show, publish the head list, close, abort, delete);
* :mod:`.ledger`: the privacy ledger;
* :mod:`.optin`: opt-in enrolment and uploads;
* :mod:`.tokens`: report tokens: a round's token key, issuance, device credentials (docs/TOKENS.md);
* :mod:`.devices`: the head list devices fetch and the reports endpoint they post to;
* :mod:`.results`: results, release and local-search document;
* :mod:`.series`: round series, one round per period on schedule, and their trends (docs/SERIES.md);
* :mod:`.ohttp`: the Oblivious HTTP gateway (RFC 9458, spec-v2 §4): its key configurations and ``POST /ohttp``.

:mod:`.common` holds their dependencies: the running service (:class:`~.common.ServiceContext`), the
administrator check, the round id in a path and the documented errors.
"""

from __future__ import annotations

from fastapi import APIRouter

from hybriddp.service.routers import devices, health, ledger, ohttp, optin, results, rounds, series, tokens

ROUTERS: tuple[APIRouter, ...] = (health.router, rounds.router, series.router, ledger.router, optin.router,
                                  tokens.router, devices.router, results.router, ohttp.router)
"""Every router of the API, in the order of the OpenAPI document."""

__all__ = ["ROUTERS"]

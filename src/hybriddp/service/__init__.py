"""The collection service: BLENDER and hybrid-mean rounds over HTTP with a real database.

``hybriddp serve`` runs :func:`create_app` on Uvicorn. The pieces: :mod:`.schema` (tables),
:mod:`.store` (every SQL statement, one module per concern), :mod:`.rounds` (round logic on the library's
curator, device and server functions), :mod:`.models` (the OpenAPI shapes), :mod:`.routers` (the routes, one
router per resource), :mod:`.reports` (the reports hot path) and :mod:`.app` (the app factory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybriddp.service.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    """``create_app`` on first use (PEP 562): a module of the package (the CLI's ``simulate``, ``round`` views) does
    not pull in FastAPI and the whole app, about 1.5 s of imports, unless it serves."""
    if name == "create_app":
        from hybriddp.service.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

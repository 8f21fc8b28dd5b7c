"""The collection service: BLENDER and hybrid-mean rounds over HTTP with a real database.

``hybriddp serve`` runs :func:`create_app` on Uvicorn. The pieces: :mod:`.schema` (tables),
:mod:`.store` (every SQL statement, one module per concern), :mod:`.rounds` (round logic on the library's
curator, device and server functions), :mod:`.models` (the OpenAPI shapes), :mod:`.routers` (the routes, one
router per resource), :mod:`.reports` (the reports hot path) and :mod:`.app` (the app factory).
"""

from hybriddp.service.app import create_app

__all__ = ["create_app"]

"""The collection service: BLENDER and hybrid-mean rounds over HTTP with a real database.

``hybriddp serve`` runs :func:`create_app` on Uvicorn. The pieces: :mod:`.schema` (tables),
:mod:`.store` (every SQL statement), :mod:`.rounds` (round logic on the library's curator,
device and server functions), :mod:`.models` (the OpenAPI shapes) and :mod:`.app` (routes).
"""

from hybriddp.service.app import create_app

__all__ = ["create_app"]

"""The service's web pages: the local-search page (``/``) and the curator's round page.

Filled in by the browser-client work (issue 11); ``create_app`` calls :func:`mount` last.
"""

from __future__ import annotations

from typing import Any


def mount(app: Any, store: Any) -> None:
    """Add the page routes and static assets to ``app`` (none yet)."""

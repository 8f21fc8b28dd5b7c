"""Rounds put into a state through the store's own transitions (for tests of the storage layer)."""

from __future__ import annotations

from typing import Any

from hybriddp.service.store import OptinUpload, RoundInfo, Store


def published_round(store: Store, kind: str = "blender", headlist: dict[str, Any] | None = None,
                    estimates: dict[str, Any] | None = None, *, user: str = "someone") -> RoundInfo:
    """A round whose head list is published: one opt-in user enrolled, one record (or value) uploaded, the
    build started (and charged, ε = 1) and finished with ``headlist`` / ``estimates``."""
    rnd = store.create_round(kind, None, {})
    store.enrol(rnd.id, user)
    item: Any = 1.0 if kind == "mean" else ("q", "u")
    store.add_optin_batch(rnd, [OptinUpload(1, [item], store.upload_key(None, [item]), 10)])
    info = store.start_build(rnd.id, 1.0, 0.0, private=True)
    return store.finish_build(info, "headlist-published", headlist or {"content_hash": "sha256:test"},
                              estimates if estimates is not None else {})

"""The opt-in upload hot path (issue 39): :class:`OptinUploadEndpoint`, the plain ASGI handler of
``POST /api/v1/rounds/{id}/optin/records``, answers every request as the FastAPI route does (status, error
code and message, ``WWW-Authenticate``), stores the same, and checks the token before it waits for a body."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_api import ADMIN, API

from hybriddp.service import create_app
from hybriddp.service.routers.optin import OptinUploadEndpoint
from uvicornhelpers import served

LIMIT = 4096


class Diverted:
    """The app, with opt-in uploads served by :class:`OptinUploadEndpoint` (with the service's opt-in writer, as a
    running service serves them) unless the request asks for the FastAPI route (header ``x-via: fastapi``) or for
    the endpoint without the writer (``x-via: thread``: every upload checked and stored in a thread hop)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        rid = OptinUploadEndpoint.round_of(scope) if scope["type"] == "http" else None
        if rid is not None and (b"x-via", b"fastapi") not in scope["headers"]:
            svc = self.app.state.service
            writer = None if (b"x-via", b"thread") in scope["headers"] else svc.optin_writer
            await OptinUploadEndpoint(svc.store, svc.metrics, svc.max_body_bytes, writer)(rid, scope, receive, send)
        else:
            await self.app(scope, receive, send)


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    app = create_app(f"sqlite:///{tmp_path / 'e.db'}", ADMIN, open_admission=True, max_body_bytes=LIMIT)
    assert app.divert_optin  # type: ignore[attr-defined]  # a running service serves uploads with the endpoint
    app.divert_optin = False  # type: ignore[attr-defined]  # here the app's own answer is the FastAPI route's
    with served(Diverted(app)) as url:
        yield url


def both(http: httpx.Client, path: str, content: bytes, headers: dict[str, str]) -> list[tuple[int, Any, Any]]:
    """(status, JSON body, WWW-Authenticate) of the request through the endpoint, through the route, and through
    the endpoint without the opt-in writer."""
    out = []
    for via in ({}, {"x-via": "fastapi"}, {"x-via": "thread"}):
        r = http.post(path, content=content, headers={**headers, **via})
        out.append((r.status_code, r.json(), r.headers.get("www-authenticate")))
    return out


def test_the_endpoint_answers_as_the_fastapi_route(base: str) -> None:
    with httpx.Client(base_url=base, timeout=30.0) as http:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        rid = http.post(f"{API}/rounds", headers=admin, json={"kind": "blender", "params": {
            "epsilon": 4.0, "delta": 1e-5, "head_list_size": 10, "m_o": 1, "m_c": 1}}).json()["id"]
        tokens = http.post(f"{API}/rounds/{rid}/optin/enrol", headers=admin,
                           json={"users": [f"u{i}" for i in range(6)]}).json()["tokens"]
        path = f"{API}/rounds/{rid}/optin/records"
        doc = json.dumps({"records": [{"query": "q", "url": "u"}]}).encode()
        js = {"Content-Type": "application/json"}
        cases = [
            (path, doc, {**js, "Authorization": "Bearer not-a-token"}),  # 401
            (path, doc, js),  # 401: no token
            (path, doc, {**js, "Authorization": f"Basic {tokens[0]}"}),  # 401: not a bearer token
            (path, doc, {"Content-Type": "text/plain", "Authorization": f"Bearer {tokens[0]}"}),  # 415
            (f"{API}/rounds/{'A' * 22}/optin/records", doc, {**js, "Authorization": f"Bearer {tokens[0]}"}),  # 404
            (path, b"{not json", {**js, "Authorization": f"Bearer {tokens[0]}"}),  # 400
            (path, b'{"records": 3}', {**js, "Authorization": f"Bearer {tokens[0]}"}),  # 422
            (path, b'{"values": [1]}', {**js, "Authorization": f"Bearer {tokens[0]}"}),  # 422: not a mean round
            (path, b"x" * (LIMIT + 1), {**js, "Authorization": f"Bearer {tokens[0]}"}),  # 413
            (path, b'{"token": "nope", "records": []}\n', {"Content-Type": "application/x-ndjson"}),  # 401
            (path, doc, {**js, "Authorization": "Bearer not-a-token"}),  # 401 again: the round is now checked, so
        ]  # the endpoint tries the writer's group commit first (issue 39), whose lookup does not find the token
        for p, body, headers in cases:
            fast, route, thread = both(http, p, body, headers)
            assert fast == route == thread and fast[0] >= 400, (p, body, headers, fast, route, thread)
        assert http.post(path, content=doc, headers={**js, "Authorization": f"Bearer {tokens[1]}"}).json() == {
            "accepted": 1, "duplicates": 0}
        fast, route, thread = both(http, path, doc, {**js, "Authorization": f"Bearer {tokens[1]}"})
        assert fast == route == thread == (200, {"accepted": 0, "duplicates": 1}, None)
        lines = b"".join(json.dumps({"token": t, "records": [{"query": "q", "url": "v"}]}).encode() + b"\n"
                         for t in tokens[2:4])
        assert http.post(path, content=lines, headers={"Content-Type": "application/x-ndjson"}).json() == {
            "accepted": 2, "duplicates": 0}


def test_a_refused_upload_is_answered_before_its_body_is_waited_for(base: str) -> None:
    """Headers announcing a body that never comes: the endpoint refuses (unknown round) at once, no 408 after a wait."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {API}/rounds/{'A' * 22}/optin/records HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     "application/json\r\nAuthorization: Bearer bogus\r\nContent-Length: 1000\r\n\r\n".encode())
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 404"), head[:200]

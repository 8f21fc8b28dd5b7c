"""Serving an ASGI app on a real socket for a test: uvicorn in a thread, on a free port of 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


@contextlib.contextmanager
def served(app: Any, **config: Any) -> Iterator[str]:
    """``app`` under uvicorn (no access log) while the block runs; yields its base URL ``http://127.0.0.1:PORT``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    options = {"log_level": "warning", "access_log": False, **config}
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()

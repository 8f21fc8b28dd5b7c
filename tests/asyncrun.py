"""Run a coroutine to completion from a synchronous test, whatever the calling thread is doing.

``asyncio.run`` refuses to start when the calling thread already runs an event loop, and in the
whole suite it may: Playwright's synchronous API (tests/browser, session-scoped) keeps one running
in the main thread. The coroutine therefore gets its own thread and its own loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` in a new thread; its result, or its exception raised here."""
    with ThreadPoolExecutor(1, thread_name_prefix="test-loop") as pool:
        return pool.submit(asyncio.run, coro).result()

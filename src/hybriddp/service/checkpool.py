"""Large report bodies are parsed and checked in worker processes, off the server's event loop.

A batch of thousands of device messages costs milliseconds of pure Python to parse and check
against the head list (:class:`hybriddp.service.rounds.BlenderReports`). In the server process that
work would hold the GIL the event loop and the group-commit writer need; in a worker process it
runs on another core. The worker gets the body and a *recipe* of the round's checker (the
published documents, sent only the first time a worker meets the round) and sends back the checked
``(message id, entries)`` items, or the :class:`~hybriddp.core.errors.HybridDPError` that refused the body.
Nothing is stored by a worker: storing stays with the one writer of the server process.

Workers are started lazily (spawned, not forked: the server has threads) and exit on their own
when the server process dies, even by SIGKILL.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import operator
import os
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from hybriddp.core.errors import HybridDPError
from hybriddp.service.bodies import first_message, parse_messages
from hybriddp.service.metrics import Metrics

logger = logging.getLogger(__name__)

DEFAULT_CHECK_WORKERS = min(4, os.cpu_count() or 1)
"""Worker processes by default: one a CPU, at most 4."""
_CACHE_SIZE = 64
_checkers: OrderedDict[Any, Any] = OrderedDict()  # in a worker: checker key → checker


def tune_interpreter() -> None:
    """The interpreter of a server process (and of a check worker), tuned for the report path.

    * Garbage collection: the objects alive now (modules, the app) move out of the collector's way
      (``gc.freeze``) and young collections run every 100,000 allocations instead of 700. A
      5,000-message body creates ~50,000 containers; with the default thresholds the collector
      re-scans them over and over and parsing takes four times as long. Those objects hold no
      reference cycles, so reference counting frees them; the collector still runs.
    * The GIL switch interval drops from 5 ms to 0.5 ms: the group-commit writer thread gives up
      the GIL in every SQLite call (BEGIN, INSERT, COMMIT's fsync) and would otherwise wait up to
      5 ms each time to get it back from the busy event loop, which stretches every commit cycle
      and with it every request's latency (single POSTs/s rose from ~2,300 to ~3,500 here)."""
    gc.freeze()
    gc.set_threshold(100_000, 20, 100)
    sys.setswitchinterval(0.0005)


def watch_parent(parent: int) -> None:
    """Exit this process as soon as its parent ``parent`` is gone, even if it was SIGKILLed (pipes to
    it may stay open in sibling processes, so end-of-file cannot be relied on)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, name="hybriddp-parent-watch", daemon=True).start()


def _init_worker(parent: int) -> None:
    """In a check worker: tune the interpreter; exit with the server process."""
    tune_interpreter()
    watch_parent(parent)


def _check(key: Any, recipe: tuple[Any, ...] | None, body: bytes, content_type: str | None) -> tuple[Any, ...]:
    """In a worker: ``("ok", items)``, ``("refused", error, messages)`` or ``("recipe",)`` (send the recipe)."""
    from hybriddp.service.rounds import checker_from_recipe
    checker = _checkers.get(key)
    if checker is None:
        if recipe is None:
            return ("recipe",)
        checker = _checkers[key] = checker_from_recipe(recipe)
        while len(_checkers) > _CACHE_SIZE:
            _checkers.popitem(last=False)
    return _check_with(checker, body, content_type)


def _ready() -> bool:
    """In a worker: the modules a check needs, imported (what :meth:`CheckPool.warm` waits for)."""
    import hybriddp.service.rounds  # noqa: F401
    return True


def _check_with(checker: Any, body: bytes, content_type: str | None) -> tuple[Any, ...]:
    """Parse a reports body and check every message: ``("ok", items)`` or ``("refused", error, messages)``."""
    try:
        messages = parse_messages(body, content_type)
    except HybridDPError as exc:
        return ("refused", exc, 0)
    try:
        items = [checker.check(msg, i) for i, msg in enumerate(messages, 1)]
    except HybridDPError as exc:
        return ("refused", exc, len(messages))
    items.sort(key=_by_id)  # stable: of equal ids the first stays first; the writer then merges sorted runs
    return ("ok", items)


_by_id = operator.itemgetter(0)

PRECHECK_BYTES = 64 * 1024
"""Bodies over this size have their first message checked alone before the whole body is parsed
(:func:`_first_refused`)."""


def _first_refused(checker: Any, body: bytes, content_type: str | None) -> tuple[Any, ...] | None:
    """``("refused", error, 1)`` when a large body's first message fails its checks (a bogus report token above
    all), found from that message alone (:func:`hybriddp.service.bodies.first_message`); None otherwise. Such a
    batch is refused before the rest of it is parsed or verified and before it is shipped to a worker: a 16 MiB
    batch of bogus tokens costs the server one message's check, not the ~0.13 s of CPU of its parse (issue 39).
    Its other messages were never read, so the metrics count one refused message."""
    if len(body) <= PRECHECK_BYTES:
        return None
    first = first_message(body, content_type)
    if first is None:
        return None
    try:
        checker.check(first, 1)
    except HybridDPError as exc:
        return ("refused", exc, 1)
    return None


class CheckPool:
    """A pool of ``workers`` processes checking report bodies (none: the caller checks in a thread)."""

    def __init__(self, workers: int = DEFAULT_CHECK_WORKERS) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_init_worker, initargs=(os.getpid(),))
            return self._pool

    async def check(self, checker: Any, body: bytes, content_type: str | None, metrics: Metrics
                    ) -> list[tuple[str, Any]]:
        """The checked items of a body, or its error (refused messages counted in ``metrics``)."""
        early = _first_refused(checker, body, content_type)
        if early is not None:
            return checked_items(early, metrics)
        loop = asyncio.get_running_loop()
        try:
            pool = self._executor()
            res = await loop.run_in_executor(pool, _check, checker.key, None, body, content_type)
            if res[0] == "recipe":
                res = await loop.run_in_executor(pool, _check, checker.key, checker.recipe, body, content_type)
        except BrokenProcessPool:  # a worker died (killed, out of memory): a new pool next time; check here now
            logger.warning("a report-check worker process died; starting new ones")
            self._discard()
            res = await asyncio.to_thread(_check_with, checker, body, content_type)
        return checked_items(res, metrics)

    def warm(self) -> None:
        """Start the worker processes now (at server start-up, in the background) rather than on the first
        large body: a restarted server under load would otherwise make its first requests wait for them."""
        pool = self._executor()
        for f in [pool.submit(_ready) for _ in range(self.workers)]:
            f.result()

    def _discard(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers (at server shutdown)."""
        self._discard()


def check_here(checker: Any, body: bytes, content_type: str | None, metrics: Metrics) -> list[tuple[str, Any]]:
    """The checked items of a body, checked in this process (small bodies, or no pool)."""
    return checked_items(_first_refused(checker, body, content_type) or _check_with(checker, body, content_type),
                         metrics)


def checked_items(res: tuple[Any, ...], metrics: Metrics) -> list[tuple[str, Any]]:
    """The items of a check's result, or its error raised (its refused messages counted in ``metrics``)."""
    if res[0] == "refused":
        metrics.count_reports(refused=res[2])
        raise res[1]
    return res[1]

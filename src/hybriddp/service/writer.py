"""Group commit of device reports and of opt-in users' own uploads: one writer thread each, one transaction
for many requests.

With SQLite's ``synchronous=FULL`` every commit waits for an fsync (about 10 ms on a common
disk), so committing each single-message request on its own would cap the service near 100
requests/s. Requests instead hand their validated messages to :class:`ReportWriter`; its thread
takes everything queued (up to :data:`MAX_GROUP_MESSAGES` messages), stores it with
:meth:`hybriddp.service.store.Store.add_reports_many` in one transaction, and only after the
commit answers each request. A request is therefore acknowledged only once its messages are
durable, and a crash loses only requests that were never acknowledged. After answering, the
thread settles SQLite's recent messages when they are due (:meth:`hybriddp.service.store.Store.settle_if_due`):
new requests queue meanwhile and go into the next group.

A group commit costs about a millisecond of CPU whatever its size, so small groups are expensive per
request. When requests arrive concurrently (the previous group held more than one) but the queue runs
dry while the group is still small (fewer than :data:`LINGER_GROUP_REQUESTS` requests), the thread
waits up to :data:`LINGER_SECONDS` for more before committing. An isolated request (the previous
group held one) never waits; :meth:`ReportWriter.close` still stores what is queued and stops
promptly (the stop marker ends a wait at once).

Opt-in users' own uploads (one small JSON request each, issue 39) go the same way through
:class:`OptinWriter`: the request is parsed on the event loop, and the group's transaction looks up every
token of the group at once and stores the uploads (:meth:`~hybriddp.service.store.optin.OptinStore.add_token_uploads`).

Requests wait on plain asyncio futures of their event loop. The thread answers a whole group with
one ``call_soon_threadsafe`` per loop (one wake-up of the loop, not one per request, and no
``concurrent.futures`` bridge per request: together about a sixth of a single report's cost on
the event loop).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from hybriddp.service.errors import ServiceError
from hybriddp.service.metrics import Metrics
from hybriddp.service.store import RoundInfo, Store

logger = logging.getLogger(__name__)

MAX_GROUP_MESSAGES = 250_000
"""Most messages stored by one transaction (bounds the latency a big group adds)."""

OPTIN_GROUP_USERS = 2_000
"""Most opt-in users' own uploads stored by one transaction of :class:`OptinWriter` (as
:data:`~hybriddp.service.store.enrolment.OPTIN_CHUNK` bounds a large upload's)."""

LINGER_SECONDS = 0.002
"""Longest wait for more requests when the group is small but requests arrive concurrently.

Without it, requests that each hold the event loop long (an OHTTP-relayed single: ~250 µs of
decapsulation and dispatch) reach the writer a few at a time, groups shrink to 2-10 requests and the
commit's fixed cost dominates their CPU. Device reports are sent at random times in the report window
anyway, so a few milliseconds more before the acknowledgement costs nobody; an isolated request (the
previous group held one) never waits. 0 turns lingering off."""

LINGER_GROUP_REQUESTS = 32
"""A group with fewer requests than this is "small": the writer may linger for more (see :data:`LINGER_SECONDS`)."""

_STOP = object()


class GroupWriter:
    """Queues requests (a round and its items each) and stores them in groups, one transaction per group: the
    thread, the lingering and the answers of the module docstring; :meth:`_persist` is what a group's transaction
    stores (:class:`ReportWriter`: device reports; :class:`OptinWriter`: opt-in users' own uploads)."""

    thread_name = "hybriddp-writer"

    def __init__(self, store: Store, max_group: int, metrics: Metrics | None, linger_seconds: float) -> None:
        self.store = store
        self.metrics = metrics  # group commits observed (requests per group, seconds), if given
        self.max_group = max_group
        self.linger = linger_seconds
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, info: RoundInfo, items: Sequence[Any]) -> asyncio.Future[Any]:
        """Queue one request's items (called on the event loop); the future, of the running loop,
        resolves after the commit (or with its error). A future cancelled meanwhile is left alone."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._closed:
                raise ServiceError("the server is shutting down; retry the request")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
                self._thread.start()
            self._queue.put((info, items, fut))
        return fut

    def close(self) -> None:
        """Store what is queued, then stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            thread.join()

    def _run(self) -> None:
        stop = False
        last_group = 1  # requests in the previous group: more than one means they arrive concurrently
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                return
            group = [first]
            size = len(first[1])
            deadline: float | None = None
            while size < self.max_group:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    # The queue is dry: linger for a fuller group only if requests are arriving
                    # concurrently and the group is still small; an isolated request never waits.
                    if self.linger <= 0 or last_group <= 1 or len(group) >= LINGER_GROUP_REQUESTS:
                        break
                    if deadline is None:
                        deadline = time.monotonic() + self.linger
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        nxt = self._queue.get(timeout=remaining)
                    except queue.Empty:
                        break
                if nxt is _STOP:
                    stop = True
                    break
                group.append(nxt)
                size += len(nxt[1])
            last_group = len(group)
            self._store(group)

    def _persist(self, batch: list[tuple[RoundInfo, Sequence[Any]]]) -> list[Any]:
        """Store a group's requests in one transaction: each one's answer, or the exception refusing it alone."""
        raise NotImplementedError

    def _after(self) -> None:
        """Called after each group's answers went out (new requests queue meanwhile)."""

    def _store(self, group: list[tuple[RoundInfo, Sequence[Any], asyncio.Future[Any]]]) -> None:
        try:
            t0 = time.perf_counter()
            results: list[Any] = self._persist([(info, items) for info, items, _ in group])
            if self.metrics is not None:
                self.metrics.observe_group(len(group), time.perf_counter() - t0)
        except BaseException as exc:  # the whole group failed (database unavailable, or a bug): tell every request
            if not isinstance(exc, ServiceError):
                logger.exception("storing a group of %d requests failed", len(group))
            results = [exc] * len(group)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
        for (_, _, fut), result in zip(group, results, strict=True):
            by_loop.setdefault(fut.get_loop(), []).append((fut, result))
        for loop, answers in by_loop.items():
            try:
                loop.call_soon_threadsafe(_answer, answers)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                logger.warning("%d requests were stored after their event loop closed", len(answers))
        self._after()


class ReportWriter(GroupWriter):
    """Device report requests: each request's validated messages, stored by
    :meth:`~hybriddp.service.store.Store.add_reports_many`; SQLite's recent messages settled when due."""

    thread_name = "hybriddp-report-writer"

    def __init__(self, store: Store, max_group_messages: int = MAX_GROUP_MESSAGES,
                 metrics: Metrics | None = None, linger_seconds: float = LINGER_SECONDS) -> None:
        super().__init__(store, max_group_messages, metrics, linger_seconds)

    def _persist(self, batch: list[tuple[RoundInfo, Sequence[Any]]]) -> list[Any]:
        return self.store.add_reports_many(batch)  # type: ignore[no-any-return]

    def _after(self) -> None:
        self._settle()

    def _settle(self) -> None:
        """Settle the recent messages if due; a failure is logged (the messages stay where they are, safe)."""
        t0 = time.perf_counter()
        try:
            moved = self.store.settle_if_due()
        except Exception:
            logger.exception("settling the recent messages failed; they stay in messages_recent (still counted)")
            return
        if moved:
            logger.info("settled %d messages in %.2f s", moved, time.perf_counter() - t0)


def _answer(answers: list[tuple[asyncio.Future[Any], Any]]) -> None:
    """On the event loop: resolve each request's future with its acknowledgement or error."""
    for fut, result in answers:
        if fut.done():  # cancelled meanwhile (the server is stopping)
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)


class OptinWriter(GroupWriter):
    """Opt-in users' own uploads (a token and its records each, :class:`~hybriddp.service.store.TokenUpload`),
    tokens resolved and uploads stored in one transaction for the group
    (:meth:`~hybriddp.service.store.optin.OptinStore.add_token_uploads`): a request answers with its
    :class:`~hybriddp.service.store.UploadAck`, its refusal, or None when its token is not one of the round's (the
    caller then gives the exact refusal the slow path gives)."""

    thread_name = "hybriddp-optin-writer"

    def __init__(self, store: Store, max_group_users: int = OPTIN_GROUP_USERS,
                 linger_seconds: float = LINGER_SECONDS) -> None:
        super().__init__(store, max_group_users, None, linger_seconds)

    def _persist(self, batch: list[tuple[RoundInfo, Sequence[Any]]]) -> list[Any]:
        return self.store.add_token_uploads(batch)  # type: ignore[no-any-return]

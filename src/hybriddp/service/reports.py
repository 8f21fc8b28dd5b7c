"""The service's hot path: ``POST /api/v1/rounds/{id}/reports`` as a plain ASGI handler.

Device reports are the one endpoint that sees thousands of requests a second. Served through
FastAPI's routing, dependency injection and response machinery, a one-message request costs about
1 ms of Python; here, in front of the app, it costs a fraction of that: the path is matched with one
regular expression, the body read with the size limit, parsed with orjson, every message checked
against the round's head list (:class:`hybriddp.service.rounds.BlenderReports`), and the messages
handed to the group-commit writer (:mod:`hybriddp.service.writer`). The answer goes out only after
the commit. Errors have the API's one JSON shape, with the same statuses as everywhere else.

:class:`hybriddp.service.app.ServiceApp` hands such requests to :class:`ReportsEndpoint` before
FastAPI's middleware and routing. The FastAPI route of the same path (:mod:`hybriddp.service.routers.devices`)
states the endpoint in the OpenAPI document; it answers only when the app's ``divert_reports`` is off, through
the same :func:`accept_reports`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import orjson
from starlette.requests import ClientDisconnect

from hybriddp.core.errors import HybridDPError
from hybriddp.core.protocol import ID_PATTERN
from hybriddp.service import roundparams, rounds
from hybriddp.service.bodies import check_content_length, read_body
from hybriddp.service.checkpool import CheckPool, check_here
from hybriddp.service.errors import TooFewTokensError, error_payload
from hybriddp.service.metrics import Metrics
from hybriddp.service.store import Store
from hybriddp.service.writer import ReportWriter

logger = logging.getLogger(__name__)

ROUTE = "/api/v1/rounds/{round_id}/reports"
"""The route template (the latency metric's label, as FastAPI names it)."""
_PATH = re.compile(rf"/api/v1/rounds/({ID_PATTERN})/reports")
INLINE_CHECK_BYTES = 64 * 1024
"""Bodies up to this size are checked on the event loop (no thread hop); larger ones in a thread."""
INLINE_CHECK_TOKENS = 16
"""With report tokens, bodies of up to this many messages (~30 µs of verification each) are checked on the event
loop; larger ones in the check workers, which spread the verifications over the cores."""


async def accept_reports(store: Store, writer: ReportWriter, pool: CheckPool | None, metrics: Metrics,
                         round_id: str, body: bytes, content_type: str | None, with_tokens: bool) -> dict[str, int]:
    """Check a reports body, store its messages (group commit) and return the acknowledgement.

    ``with_tokens``: every message must carry a valid report token (docs/TOKENS.md). Small bodies of a known
    round are checked right here on the event loop; larger ones in the worker processes of ``pool`` (or,
    without one, in a thread)."""
    target = rounds.report_target(store, round_id, with_tokens=with_tokens, cached_only=True)
    inline = INLINE_CHECK_BYTES if not with_tokens else INLINE_CHECK_TOKENS * 600  # ~600 bytes a message
    if target is not None and len(body) <= inline:  # small and no database read: check right here
        info, items = target[0], check_here(target[1], body, content_type, metrics)
    else:
        if target is None:
            target = await asyncio.to_thread(lambda: rounds.report_target(store, round_id, with_tokens=with_tokens))
        info = target[0]
        items = await (asyncio.to_thread(check_here, target[1], body, content_type, metrics) if pool is None
                       else pool.check(target[1], body, content_type, metrics))
    if with_tokens:
        await _enough_tokens(store, info)
    try:
        ack = await writer.submit(info, items)
    except HybridDPError:
        metrics.count_reports(refused=len(items))
        raise
    metrics.count_reports(accepted=ack.counted, duplicate=ack.duplicates)
    return {"acknowledged": ack.acknowledged, "counted": ack.counted, "duplicates": ack.duplicates}


_ENOUGH: set[tuple[str, int]] = set()
"""(store, round) pairs whose ``min_tokens`` were reached: the count only grows, so it is read until then only."""


async def _enough_tokens(store: Store, info: Any) -> None:
    """:class:`TooFewTokensError` while fewer than the round's ``min_tokens`` report tokens were issued."""
    need = roundparams.schedule(info.params)["min_tokens"]
    if need <= 0 or (store.url, info.num) in _ENOUGH:
        return
    have = await asyncio.to_thread(store.tokens_issued, info.num)
    if have < need:
        raise TooFewTokensError(f"round {info.id} takes reports once {need} report tokens were issued (its smallest "
                                f"anonymity set), and {have} were; keep the message and send it again later")
    _ENOUGH.add((store.url, info.num))


class ReportsEndpoint:
    """Serves ``POST /api/v1/rounds/{22-character id}/reports`` (see the module's docstring)."""

    def __init__(self, store: Store, writer: ReportWriter, pool: CheckPool | None, metrics: Metrics,
                 limit: int, with_tokens: bool) -> None:
        self.store, self.writer, self.pool, self.metrics, self.limit = store, writer, pool, metrics, limit
        self.with_tokens = with_tokens

    @staticmethod
    def round_of(scope: Any) -> str | None:
        """The round id when ``scope`` is a reports request, else None."""
        return post_round_id(_PATH, scope)

    async def __call__(self, round_id: str, scope: Any, receive: Any, send: Any) -> None:
        start = time.perf_counter()
        try:
            await self._known(round_id)  # 404/409 before the body
            body, content_type = await self._body(scope, receive)
        except ClientDisconnect:  # gone before its body arrived: nothing stored, nothing to answer
            return
        except HybridDPError as exc:
            status, out, headers = error_payload(exc)
        except Exception as exc:  # a bug: logged, and the API's 500 shape
            status, out, headers = internal_error(exc)
        else:
            status, out, headers = await self.answer(round_id, body, content_type, checked=True)
        await send_json(send, status, out, headers)
        self.metrics.observe("POST", ROUTE, time.perf_counter() - start)

    async def answer(self, round_id: str, body: bytes, content_type: str | None,
                     checked: bool = False) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, JSON body, extra headers) of the reports request for ``round_id`` with the whole ``body``.

        The OHTTP gateway serves an inner ``POST .../reports`` through this (no ASGI round trip); ``checked``: the
        round was already found (:meth:`_known`)."""
        try:
            if not checked:
                await self._known(round_id)
            ack = await accept_reports(self.store, self.writer, self.pool, self.metrics, round_id, body, content_type,
                                       self.with_tokens)
            return 200, ack, {}
        except HybridDPError as exc:
            return error_payload(exc)
        except Exception as exc:  # a bug: logged, and the API's 500 shape
            return internal_error(exc)

    async def _known(self, round_id: str) -> None:
        """404/409 (:class:`HybridDPError`) unless ``round_id`` is a round that takes reports now."""
        tok = self.with_tokens
        rounds.report_target(self.store, round_id, with_tokens=tok, cached_only=True) or await asyncio.to_thread(
            lambda: rounds.report_target(self.store, round_id, with_tokens=tok))

    async def _body(self, scope: Any, receive: Any) -> tuple[bytes, str | None]:
        """The whole body (413 as soon as it passes the limit) and the Content-Type header, read from
        the ASGI channel itself (a Starlette ``Request`` and its stream cost more than the rest of a
        single report's handling)."""
        headers = scope["headers"]
        check_content_length(headers, self.limit)
        body = await read_body(receive, self.limit)
        content_type = next((v.decode("latin-1") for k, v in headers if k == b"content-type"), None)
        return body, content_type


def post_round_id(path: re.Pattern[str], scope: Any) -> str | None:
    """The round id (``path``'s group 1) when ``scope`` is a POST to ``path``, else None: how the plain ASGI
    endpoints ahead of FastAPI recognise their requests."""
    if scope["type"] != "http" or scope["method"] != "POST" or (m := path.fullmatch(scope["path"])) is None:
        return None
    return m.group(1)


async def send_json(send: Any, status: int, out: Any, headers: dict[str, str]) -> None:
    """Answer on the ASGI channel ``send``: ``out`` as JSON with ``status`` and the extra ``headers``."""
    payload = orjson.dumps(out)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


def internal_error(exc: Exception) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Log a bug; the API's 500 answer (status, JSON body, headers)."""
    logger.exception("unexpected error", exc_info=exc)
    return 500, {"error": {"code": "internal_error", "message": "an unexpected server error; it was logged"}}, {}

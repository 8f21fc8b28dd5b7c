"""The relay's forwarder (:mod:`hybriddp.relay`): POSTs to one target over a small pool of kept-alive HTTP/1.1
connections on asyncio streams.

A relay forwards every device request to the same place, ``{target}/ohttp``, so it needs none of a general HTTP
client: :class:`Forwarder` writes one fixed request head (method, path, ``Host``, ``Content-Type``,
``Content-Length``: nothing else) and the body, and reads the answer's status line, head and body. With it the whole
relay process spends ~130 µs of CPU per forwarded request, where forwarding with an ``httpx.AsyncClient`` cost
~1.8 ms on this load (many requests in flight: its pool opened a new connection for most of them, and scans every
connection for every queued request; docs/RESULTS.md, issue 38).

Guarantees:

* At most ``connections`` connections to the target exist at once (requests beyond wait for one); a connection
  is reused only after its answer was read to the end, and only if it is still open (the target did not close
  it, it did not say ``Connection: close``, it was idle for less than ``idle_s``).
* A request that fails on a *reused* connection before any byte of the answer arrived (the target closed the
  connection while it was idle) is sent once more on a new connection; nothing else is retried.
* The whole exchange (waiting for a connection, connecting, TLS, writing, reading) takes at most ``timeout``
  seconds, or :class:`TargetError` is raised and the connection closed.
* An answer's body is read from ``Content-Length``, ``Transfer-Encoding: chunked`` or, without either, up to
  the connection's close; one over ``max_answer_bytes`` is a :class:`TargetError`. 1xx interim answers are
  skipped.
* An ``https`` target is reached over TLS with :func:`ssl.create_default_context` (certificate and host name
  verified).

Every failure is a :class:`TargetError` whose ``reason`` names its cause (the relay answers 502 with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

DEFAULT_CONNECTIONS = 32
"""Connections to the target kept at most (and requests in flight to it at once)."""
DEFAULT_IDLE_S = 4.0
"""Seconds an idle connection is kept (below uvicorn's 5 s keep-alive, which ``hybriddp serve`` uses)."""
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024 * 1024
HEAD_LIMIT = 64 * 1024
"""Largest status line and header section of an answer read."""


class TargetError(Exception):
    """The target could not be reached or did not answer in HTTP/1.1 in time; ``reason`` says why (an exception
    class name or a short phrase, nothing of a request)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Answer:
    """The target's answer: status, ``Content-Type`` (None when it sent none) and body."""

    status: int
    content_type: str | None
    body: bytes


class _Connection:
    """One kept-alive connection: its streams, and when it was last released."""

    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()

    def usable(self, idle_s: float) -> bool:
        """Whether it may carry another request: open at both ends and not idle too long."""
        return (not self.reader.at_eof() and not self.writer.is_closing()
                and time.monotonic() - self.idle_since < idle_s)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Stale(Exception):
    """A reused connection was found closed before any byte of the answer: the request may be sent again."""


class Forwarder:
    """POSTs bodies to ``url`` (``http(s)://host[:port]/path``) over kept-alive connections (module docstring)."""

    def __init__(self, url: str, *, connections: int = DEFAULT_CONNECTIONS, timeout: float = 30.0,
                 idle_s: float = DEFAULT_IDLE_S, max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url[:80]!r} is not an http:// or https:// URL")
        self.host = parts.hostname if parts.hostname.isascii() else parts.hostname.encode("idna").decode("ascii")
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        authority = host if parts.port is None else f"{host}:{parts.port}"
        path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
        self._head = f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n".encode("ascii")
        self.connections, self.timeout, self.idle_s = connections, timeout, idle_s
        self.max_answer_bytes = max_answer_bytes
        self._idle: deque[_Connection] = deque()
        self._slots = asyncio.Semaphore(connections)
        self.opened = 0
        """Connections opened so far (tests: reuse keeps it low)."""

    async def post(self, body: bytes, content_type: str) -> Answer:
        """The target's answer to ``POST`` of ``body`` with ``content_type`` (and ``Host``, ``Content-Length``);
        :class:`TargetError` when there is none within the timeout."""
        request = self._head + f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode(
            "latin-1")
        if len(body) <= 64 * 1024:
            request, body = request + body, b""
        try:
            if hasattr(asyncio, "timeout"):  # Python >= 3.11: a timer on this task
                async with asyncio.timeout(self.timeout):
                    return await self._send(request, body)
            return await asyncio.wait_for(self._send(request, body), self.timeout)
        except TargetError:
            raise
        except (TimeoutError, asyncio.TimeoutError):
            raise TargetError("TimeoutError") from None
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise TargetError(type(exc).__name__) from None

    async def _send(self, request: bytes, body: bytes) -> Answer:
        """One request on a pooled connection (waiting for a free one), sent again on a new connection if the
        reused one turns out closed."""
        async with self._slots:
            try:
                return await self._exchange(self._take(), request, body)
            except _Stale:
                return await self._exchange(None, request, body)

    def _take(self) -> _Connection | None:
        """A usable idle connection (the most recently used), closing the stale ones met; None if there is none."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(self.idle_s):
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls, limit=HEAD_LIMIT,
                                                       server_hostname=self.host if self.tls else None)
        self.opened += 1
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection | None, request: bytes, body: bytes) -> Answer:
        """Send the request on ``conn`` (a new connection if None) and read its answer; the connection goes back
        to the pool if it may be reused, else is closed. :class:`_Stale` if ``conn`` was reused and turned out
        closed before any byte of the answer."""
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        keep = False
        try:
            try:
                conn.writer.write(request)
                if body:
                    conn.writer.write(body)
                await conn.writer.drain()
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                if reused and (not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial):
                    raise _Stale from None
                raise
            answer, keep = await self._read_answer(conn.reader, head)
            return answer
        finally:
            if keep:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.close()

    async def _read_answer(self, reader: asyncio.StreamReader, head: bytes) -> tuple[Answer, bool]:
        """The answer whose head (status line and header section) is ``head`` (1xx interim answers skipped), and
        whether the connection may carry another request."""
        version, status, fields = _head(head)
        while 100 <= status < 200:
            version, status, fields = _head(await reader.readuntil(b"\r\n\r\n"))
        connection = fields.get("connection", "").lower()
        close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if status in (204, 304):
            body = b""
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            body = await self._chunked(reader)
        elif "content-length" in fields:
            length = fields["content-length"].strip()
            if not length.isdigit() or int(length) > self.max_answer_bytes:
                raise TargetError("bad Content-Length in the answer")
            body = await reader.readexactly(int(length))
        else:  # the body runs to the connection's close
            body = b""
            while not reader.at_eof() and len(body) <= self.max_answer_bytes:
                body += await reader.read(self.max_answer_bytes + 1 - len(body))
            close = True
        if len(body) > self.max_answer_bytes:
            raise TargetError("answer over the relay's limit")
        return Answer(status, fields.get("content-type"), body), not close

    async def _chunked(self, reader: asyncio.StreamReader) -> bytes:
        """A chunked body (RFC 9112 §7.1), trailers read and dropped."""
        chunks: list[bytes] = []
        size = 0
        while True:
            n = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"x", 16)  # ValueError if not hex
            if n == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailer fields
                    pass
                return b"".join(chunks)
            size += n
            if size > self.max_answer_bytes:
                raise TargetError("answer over the relay's limit")
            chunks.append(await reader.readexactly(n))
            if await reader.readexactly(2) != b"\r\n":
                raise TargetError("malformed chunked answer")

    async def aclose(self) -> None:
        """Close every idle connection (those in use close when their exchange ends or fails)."""
        while self._idle:
            self._idle.pop().close()


def _head(head: bytes) -> tuple[str, int, dict[str, str]]:
    """(HTTP version, status, header fields with lower-case names, repeated ones joined with commas) of an answer's
    head; :class:`TargetError` if it is not HTTP/1.x."""
    line, _, rest = head.partition(b"\r\n")
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise TargetError("the target's answer is not HTTP/1.x")
    fields: dict[str, str] = {}
    for raw in rest.split(b"\r\n"):
        name, sep, value = raw.partition(b":")
        if sep:
            key, val = name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")
            fields[key] = f"{fields[key]}, {val}" if key in fields else val
    return parts[0].decode("ascii"), int(parts[1]), fields

"""The server's HTTP/1.1 protocol: uvicorn's httptools protocol, with each response sent in one write.

Uvicorn writes a response's head (on ``http.response.start``) and its body (on ``http.response.body``)
to the socket in two ``transport.write`` calls. With uvloop each is a ``send`` system call, and on a
small response, such as the acknowledgement of a single device report, the two calls cost about a
fifth of the event loop's time per request (measured with py-spy, docs/RESULTS.md). They also reach
the client as two TCP segments, which it has to read separately.

:class:`CoalescingTransport` holds what is written during one turn of the event loop and passes it
to the socket at the end of that turn (``loop.call_soon``), so a response's head and body go out
together. Nothing is delayed beyond the current turn of the loop, and ``close`` sends what is held
first. :class:`Protocol` is uvicorn's ``HttpToolsProtocol`` on such a transport; ``hybriddp serve``
passes it to uvicorn as ``http=``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport whose writes of one event-loop turn reach the socket as one write.

    Every other attribute and method is the wrapped transport's."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Hold ``data``; everything held goes to the socket, in order, at the end of this loop turn."""
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        """Pass everything held to the wrapped transport (one write)."""
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        """Send what is held, then close (as ``asyncio.Transport.close``: buffered data is still sent)."""
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        """Close at once; what is held is dropped (as ``asyncio.Transport.abort``)."""
        self._held.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class Protocol(HttpToolsProtocol):
    """Uvicorn's httptools HTTP/1.1 protocol writing through a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

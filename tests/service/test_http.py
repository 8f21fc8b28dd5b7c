"""The server's coalescing transport (hybriddp.service.http), on real sockets and a real event loop.

A response's head and body are written in two calls by uvicorn; the transport must pass them to the
socket in one write at the end of the loop turn, in order, and never lose or delay data beyond it.
The whole service runs on this protocol (``hybriddp serve``), so every service test also crosses it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from asyncrun import run_async
from hybriddp.service.http import CoalescingTransport


class _Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.lost = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _received(sock: socket.socket) -> bytes:
    """Everything readable now (b"" when nothing has arrived; the socket is non-blocking)."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


async def _transport(sock: socket.socket) -> tuple[asyncio.Transport, _Sink]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.connect_accepted_socket(_Sink, sock)
    return transport, proto


def test_writes_of_one_turn_go_out_together_in_order(pair: tuple[socket.socket, socket.socket]) -> None:
    async def main() -> None:
        real, _ = await _transport(pair[0])
        t = CoalescingTransport(real, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        t.write(bytearray(b"{"))
        t.write(b"")
        t.writelines([memoryview(b"}")])
        assert _received(pair[1]) == b""  # held during this turn
        assert t.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await asyncio.sleep(0)  # the turn ends: one write
        await asyncio.sleep(0.01)
        assert _received(pair[1]) == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
        assert t.get_write_buffer_size() == 0
        t.write(b"next")  # a later turn: held again, sent again
        await asyncio.sleep(0.01)
        assert _received(pair[1]) == b"next"
        real.close()
    run_async(main())


def test_close_sends_what_is_held_and_abort_drops_it(pair: tuple[socket.socket, socket.socket]) -> None:
    async def main() -> None:
        real, sink = await _transport(pair[0])
        t = CoalescingTransport(real, asyncio.get_running_loop())
        t.write(b"last words")
        t.close()
        await asyncio.wait_for(sink.lost, 5)
        assert _received(pair[1]) == b"last words"
        assert t.is_closing()  # other attributes are the wrapped transport's
    run_async(main())

    a, b = socket.socketpair()
    b.setblocking(False)

    async def aborted() -> None:
        real, sink = await _transport(a)
        t = CoalescingTransport(real, asyncio.get_running_loop())
        t.write(b"never sent")
        t.abort()
        await asyncio.wait_for(sink.lost, 5)
        await asyncio.sleep(0.01)  # the flush scheduled by the write finds nothing held
        assert _received(b) == b""
    try:
        run_async(aborted())
    finally:
        a.close()
        b.close()


def test_uvicorn_serves_through_the_coalescing_transport() -> None:
    """Uvicorn with ``http=hybriddp.service.http:Protocol`` writes through the transport; keep-alive
    responses arrive whole."""
    import threading

    import uvicorn

    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"16")]})
        await send({"type": "http.response.body", "body": b'{"counted": 1}\r\n'})  # type: ignore[operator]

    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           http="hybriddp.service.http:Protocol"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        with socket.create_connection(sock.getsockname(), timeout=10) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(3):  # keep-alive: each response of the connection in one piece
                c.sendall(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}")
                data = c.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), data
                assert body == b'{"counted": 1}\r\n', data
            (conn,) = server.server_state.connections  # the open keep-alive connection's protocol
            assert isinstance(conn.transport, CoalescingTransport)  # type: ignore[attr-defined]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()

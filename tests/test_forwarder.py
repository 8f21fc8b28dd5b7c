"""The relay's forwarder (:mod:`hybriddp.forwarder`) against scripted HTTP/1.1 servers on real sockets: what it
sends, connection reuse and its bound, a retry on a connection the target closed, the answer framings it reads,
and its failures (timeout, refused, not HTTP). The relay with a real service is tests/service/test_ohttp_gateway.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from asyncrun import run_async
from hybriddp.forwarder import Forwarder, TargetError, _Connection

Handler = Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[bool]]
"""A scripted target's answer to one request (head, body) written to the stream; True keeps the connection."""


def ok(body: bytes = b"sealed", extra: bytes = b"") -> Handler:
    async def handler(_head: bytes, _body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: message/ohttp-res\r\n" + extra
                     + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return b"connection: close" not in extra.lower()
    return handler


class Target:
    """An HTTP/1.1 server on 127.0.0.1 that reads Content-Length bodies and answers with ``handler``; it records the
    heads it got and counts its connections and the most open at once."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.heads: list[bytes] = []
        self.connections = self.open = self.most_open = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/prefix/ohttp"

    async def __aexit__(self, *_exc: Any) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length:")))
                self.heads.append(head)
                if not await self.handler(head, await reader.readexactly(length), writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def test_it_sends_one_fixed_head_and_reuses_one_connection() -> None:
    async def run() -> None:
        target = Target(ok())
        async with target as url:
            fwd = Forwarder(url)
            for i in range(5):
                answer = await fwd.post(b"body %d" % i, "message/ohttp-req")
                assert (answer.status, answer.content_type, answer.body) == (200, "message/ohttp-res", b"sealed")
            await fwd.aclose()
        assert fwd.opened == target.connections == 1
        port = url.split(":")[2].split("/")[0]
        assert target.heads[0] == (b"POST /prefix/ohttp HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nContent-Type: "
                                   b"message/ohttp-req\r\nContent-Length: 6\r\n\r\n" % port.encode())
    run_async(run())


def test_connections_are_bounded_and_kept() -> None:
    async def slow(_head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.01)
        return await ok(body)(_head, body, writer)

    async def run() -> None:
        target = Target(slow)
        async with target as url:
            fwd = Forwarder(url, connections=8)
            answers = await asyncio.gather(*[fwd.post(b"%d" % i, "message/ohttp-req") for i in range(200)])
            assert [a.body for a in answers] == [b"%d" % i for i in range(200)]  # each its own answer
            assert target.most_open <= 8 and fwd.opened == target.connections <= 8
            await asyncio.gather(*[fwd.post(b"again", "message/ohttp-req") for _ in range(40)])
            assert fwd.opened <= 8  # the kept connections carried them
            await fwd.aclose()
    run_async(run())


def test_a_connection_the_target_closed_is_replaced() -> None:
    async def run() -> None:
        target = Target(ok())
        async with target as url:
            fwd = Forwarder(url)
            assert (await fwd.post(b"one", "message/ohttp-req")).status == 200
            fwd._idle[0].writer.transport.abort()  # type: ignore[attr-defined]  # as if the target had dropped it
            assert (await fwd.post(b"two", "message/ohttp-req")).status == 200
            assert fwd.opened == 2
            await fwd.aclose()
    run_async(run())


def test_a_stale_reused_connection_is_retried_once_on_a_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The target closes each connection after its answer without saying so (its keep-alive timeout firing right
    then); the forwarder, told the connection still looks open, sends on it, reads nothing, and sends again."""
    monkeypatch.setattr(_Connection, "usable", lambda self, idle_s: True)

    async def run() -> None:
        async def answer_then_drop(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
            await ok(body)(head, body, writer)
            return False
        target = Target(answer_then_drop)
        async with target as url:
            fwd = Forwarder(url)
            for i in range(3):
                assert (await fwd.post(b"%d" % i, "message/ohttp-req")).body == b"%d" % i
            assert len(target.heads) == 3 and fwd.opened == 3  # each sent once; the stale tries reached no one
            await fwd.aclose()
    run_async(run())


def test_answer_framings() -> None:
    async def chunked(_head: bytes, _body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: message/ohttp-res\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n")
        return True

    async def to_close(_head: bytes, _body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.0 503 Busy\r\nContent-Type: application/json\r\n\r\n{\"error\": 1}")
        return False

    async def run() -> None:
        for handler, want, conns in [(chunked, (200, "message/ohttp-res", b"abcde"), 1),
                                     (to_close, (503, "application/json", b'{"error": 1}'), 2),
                                     (ok(b"x", b"Connection: close\r\n"), (200, "message/ohttp-res", b"x"), 2)]:
            target = Target(handler)
            async with target as url:
                fwd = Forwarder(url)
                for _ in range(2):
                    a = await fwd.post(b"q", "message/ohttp-req")
                    assert (a.status, a.content_type, a.body) == want
                assert fwd.opened == conns, handler
                await fwd.aclose()
    run_async(run())


def test_failures_are_target_errors() -> None:
    async def silent(_head: bytes, _body: bytes, _writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(5)
        return False

    async def garbage(_head: bytes, _body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        return True

    async def huge(_head: bytes, _body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n")
        return True

    async def run() -> None:
        for handler, reason, options in [(silent, "TimeoutError", {"timeout": 0.2}),
                                         (garbage, "not HTTP/1.x", {}),
                                         (huge, "Content-Length", {"max_answer_bytes": 1000})]:
            async with Target(handler) as url:
                fwd = Forwarder(url, **options)
                with pytest.raises(TargetError, match=reason):
                    await fwd.post(b"q", "message/ohttp-req")
                assert not fwd._idle  # a failed connection is not kept
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(TargetError, match="ConnectionRefusedError"):
            await Forwarder(f"http://127.0.0.1:{port}/ohttp").post(b"q", "message/ohttp-req")
    run_async(run())


def test_urls() -> None:
    fwd = Forwarder("https://[::1]/ohttp")
    assert (fwd.host, fwd.port, fwd.tls is not None) == ("::1", 443, True)
    assert fwd._head.startswith(b"POST /ohttp HTTP/1.1\r\nHost: [::1]\r\n")
    assert Forwarder("http://dp.example:8080").port == 8080
    with pytest.raises(ValueError):
        Forwarder("ftp://x/ohttp")

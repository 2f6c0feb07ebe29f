"""Scripted servers on loopback sockets for the upstream HTTP client's tests: each
connection is a `Peer` a test's handler drives byte by byte, so the framing is exact.
`run` runs a test's coroutine on the loop the `loop_kind` fixture picked (asyncio, and
uvloop, the gateway's loop in production): import the fixture into a test module to
run its tests on both."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self

import pytest

from dragoman.upstream.transport.connection import Connection, Response
from dragoman.upstream.transport.pool import IDLE_LIMIT, Pool

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
try:
    import uvloop

    LOOPS["uvloop"] = uvloop.new_event_loop  # the gateway's loop in production
except ImportError:  # pragma: no cover
    pass

run_with: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop


@pytest.fixture(params=sorted(LOOPS), autouse=True)
def loop_kind(request: pytest.FixtureRequest) -> str:
    global run_with
    run_with = LOOPS[request.param]
    return request.param


def run(main: Callable[[], Awaitable[Any]], timeout: float = 10.0) -> Any:
    """Run a test's coroutine on the loop under test, bounded in time."""

    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await main()

    with asyncio.Runner(loop_factory=run_with) as runner:
        return runner.run(bounded())


# -- a scripted server ------------------------------------------------------------------


class Peer:
    """One server-side connection, driven by a test's handler."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        self.index = index  # 0 for the server's first connection
        self.reader = reader
        self.writer = writer
        self.requests: list[bytes] = []  # each request's head and body, as received
        self.eof = asyncio.Event()  # the client closed (or reset) the connection

    async def request(self) -> bytes | None:
        """The next request, whole (head and Content-Length body); None at EOF."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            raw = head + await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof.set()
            return None
        self.requests.append(raw)
        return raw

    async def send(self, *parts: bytes) -> None:
        for part in parts:
            self.writer.write(part)
            await self.writer.drain()

    async def until_eof(self, timeout: float = 2.0) -> None:
        """Read and drop bytes until the client closes; TimeoutError if it does not."""
        async with asyncio.timeout(timeout):
            try:
                while await self.reader.read(65536):
                    pass
            except ConnectionError:
                pass
        self.eof.set()

    def close(self) -> None:
        self.writer.close()


Handler = Callable[[Peer], Awaitable[None]]


class Script:
    """A server on 127.0.0.1 running `handler(peer)` for each connection, then closing it."""

    def __init__(self, handler: Handler, *, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.peers: list[Peer] = []
        self.connected = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.port = 0

    @property
    def root(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for peer in self.peers:
            peer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        peer = Peer(reader, writer, len(self.peers))
        self.peers.append(peer)
        self.connected.set()
        try:
            await self.handler(peer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # cancelled only at teardown; not re-raised, for Python 3.11's start_server logs a cancelled handler
        finally:
            writer.close()


def new_pool(*roots: str, proxies: dict[str, str | None] | None = None, tls: ssl.SSLContext | None = None,
             connect_timeout: float = 2.0, idle_limit: float = IDLE_LIMIT) -> Pool:  # fmt: skip
    return Pool(list(roots), connect_timeout=connect_timeout, tls=tls, proxies=proxies or {}, idle_limit=idle_limit)


@contextlib.asynccontextmanager
async def scripted_pool(handler: Handler, idle_limit: float = IDLE_LIMIT) -> AsyncIterator[tuple[Script, Pool]]:
    """A `Script` server and a pool to it, the pool closed at the end however it ends."""
    async with Script(handler) as server:
        pool = new_pool(server.root, idle_limit=idle_limit)
        try:
            yield server, pool
        finally:
            await pool.close()


def ok(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), b"".join(extra), body)


async def answer_each(peer: Peer, reply: bytes = b"") -> None:
    """Answer every request on the connection with `reply` (a 200 "ok" by default)."""
    while await peer.request() is not None:
        await peer.send(reply or ok(b"ok"))


async def get(pool: Pool, root: str, path: str = "/x") -> bytes:
    response = await pool.request(root, b"GET", path, b"", None)
    try:
        return await response.read()
    finally:
        response.release()


async def fed(*pieces: bytes) -> Response:
    """A response fed `pieces` as if each came in one read from the socket (no socket:
    the order of the parser's callbacks within one read is then certain)."""
    conn = Connection()
    response = Response(conn, None, reused=False)
    for piece in pieces:
        conn.data_received(piece)
    await response.wait_head()
    return response

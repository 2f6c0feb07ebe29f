"""One HTTP/1.1 connection to an upstream, handing its bytes to the response read from it.

Upstream calls are the gateway's hot path: a general-purpose client (aiohttp, measured
in bench/clients.py) spent about 110 µs of CPU on each request, three times what this
one does, retries and timeouts included. Here a connection is an asyncio Protocol whose bytes go straight
into httptools' parser (the one uvicorn uses), and a `Response` (`backends.response`, `backends.body`) hands the body out as
it arrives: `readany()` for streams, `read()` for whole bodies, or `drain_to(sink)`,
which hands each piece to a callback as it is parsed (no task wake-up per token). Connections are made
and pooled by `dragoman.upstream.transport.pool`. The gateway's rare outbound fetches (URL
documents, the models.dev registry) stay on aiohttp, for its resolver hook, redirects
and environment proxies; they are not on any request's hot path.

Failures are exceptions of `backends.failures` (ConnectionErrors and TimeoutErrors),
mapped to GatewayErrors once, in `dragoman.upstream.errors`.
"""

from __future__ import annotations

import asyncio

from dragoman.upstream.transport.body import HIGH_WATER, MAX_BODY  # noqa: F401

# Re-exported: the client's failures, its response, and the bounds on it, as callers know them.
from dragoman.upstream.transport.failures import (  # noqa: F401
    BadResponse,
    BodyTimeout,
    ConnectFailed,
    Disconnected,
    HeadTimeout,
    StaleConnection,
)
from dragoman.upstream.transport.inflate import INFLATE_PIECE  # noqa: F401
from dragoman.upstream.transport.response import STALE_WINDOW, Response  # noqa: F401


class Connection(asyncio.Protocol):
    """A transport and the response currently being read from it (None while idle)."""

    __slots__ = ("idle_since", "loop", "lost", "origin", "response", "transport")

    def __init__(self, origin: object = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        # Kept, not looked up per response and per read: asyncio.get_running_loop() makes a
        # getpid() system call each time, which shows in a profile of streamed tokens.
        self.loop = loop or asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.lost = False
        self.idle_since = 0.0
        self.origin = origin  # the pool's key for it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes on an idle connection (a 408 before closing, say): not reusable
            self.close()
            return
        response.feed(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.response is not None:
            self.response.connection_lost(exc)

    def pause_writing(self) -> None:  # requests are written whole; the kernel buffer absorbs them
        pass

    def resume_writing(self) -> None:
        pass

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

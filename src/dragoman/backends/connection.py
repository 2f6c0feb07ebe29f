"""One HTTP/1.1 connection to an upstream, and the response read from it.

Upstream calls are the gateway's hot path: a general-purpose client (aiohttp, measured
in bench/clients.py) spent about 110 µs of CPU on each request, three times what this
one does, retries and timeouts included. Here a connection is an asyncio Protocol whose bytes go straight
into httptools' parser (the one uvicorn uses), and a `Response` hands the body out as
it arrives: `readany()` for streams, `read()` for whole bodies, or `drain_to(sink)`,
which hands each piece to a callback as it is parsed (no task wake-up per token). Connections are made
and pooled by `dragoman.backends.pool`. The gateway's rare outbound fetches (URL
documents, the models.dev registry) stay on aiohttp, for its resolver hook, redirects
and environment proxies; they are not on any request's hot path.

Failures are exceptions of `backends.failures` (ConnectionErrors and TimeoutErrors),
mapped to GatewayErrors once, in `dragoman.backends.base`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import httptools

# Re-exported: the client's failures, and the size of a piece inflated, as callers know them.
from dragoman.backends.failures import BadResponse, BodyTimeout, ConnectFailed, Disconnected, HeadTimeout, StaleConnection  # noqa: F401
from dragoman.backends.inflate import CODINGS, INFLATE_PIECE, Inflater  # noqa: F401

if TYPE_CHECKING:
    from dragoman.backends.pool import Pool

# Buffered body bytes at which reading from the upstream pauses; a compressed body is
# inflated at most this much per callback, and no further ahead of its reader (`backends.inflate`).
HIGH_WATER = 256 * 1024
# A body read whole (`read`: replies that are not streams) is held in memory twice while
# joined; none the gateway reads comes near this.
MAX_BODY = 64 * 1024 * 1024
CLOCK_SLACK = 0.001  # the loop's clock may tick in milliseconds: a timer can fire a little early
MAX_HEAD = 64 * 1024  # bytes of response headers accepted
# A pooled connection the upstream closes this soon after a request went out, before a
# byte of answer, was closed while idle (the keep-alive race): the request is sent once
# more. Later, the upstream may have worked on it: that is an ordinary failure.
STALE_WINDOW = 0.5


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


class Response:
    """A response's head (`status`, `headers` with lower-case names) and its body as it
    arrives. Release it when read to the end (the connection goes back to the pool) or
    close it (the connection is dropped, which is how an upstream learns to stop)."""

    __slots__ = (
        "_chunks",
        "_complete",
        "_conn",
        "_done",
        "_ended",
        "_error",
        "_framed",
        "_head",
        "_head_size",
        "_inflater",
        "_keep_alive",
        "_names",
        "_parser",
        "_paused",
        "_pending",
        "_pool",
        "_received",
        "_reused",
        "_sent_at",
        "_sink",
        "_size",
        "_waiter",
        "headers",
        "idle_timeout",
        "status",
    )  # fmt: skip

    def __init__(self, conn: Connection, pool: Pool | None, *, reused: bool) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._conn = conn
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[None] = conn.loop.create_future()
        self._chunks: list[bytes] = []
        self._size = 0
        self._complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], bool] | None = None
        self._paused = False
        self._inflater: Inflater | None = None  # for a compressed body
        self._reused = reused
        self._received = False
        self._names: list[tuple[bytes, bytes]] = []
        self._done = False  # released or closed
        self._framed = False  # Content-Length or chunked: the end of the body is known without a close
        self._keep_alive = False
        self._head_size = 0
        self._sent_at = 0.0  # when the request was written (mark_sent)
        self._ended = False  # the parser saw the body's end (complete once what is pending is inflated)
        self._pending: list[bytes] | None = None  # compressed input waiting for the reader (see _inflate)
        self.idle_timeout: float | None = None  # the longest silence `read` waits through
        conn.response = self
        if conn.lost:  # lost before this response was attached (a close right after connecting)
            self.connection_lost(None)

    # -- the public surface ---------------------------------------------------------

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/octet-stream").partition(";")[0].strip().lower()

    @property
    def ended(self) -> bool:
        """The whole body has arrived (read or not)."""
        return self._complete

    @property
    def _inflated(self) -> int:
        """Bytes of a compressed body inflated so far (what its bounds are measured by)."""
        return self._inflater.inflated if self._inflater is not None else 0

    async def wait_head(self) -> None:
        await self._head

    def mark_sent(self) -> None:
        self._sent_at = self._conn.loop.time()

    def head_timed_out(self, timeout: float) -> None:
        """The deadline for the head passed (a timer, cheaper than a timeout scope per request)."""
        if not self._head.done():
            self._fail(HeadTimeout(f"no response within {timeout:g} s"))

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last read, waiting for some; b"" at the end."""
        chunks = self._chunks
        while not chunks:
            if self._pending:  # a large compressed body: the loop serves others between its pieces
                await asyncio.sleep(0)
                if self._pending:
                    self._inflate_pending()
                continue
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            waiter = self._waiter = self._conn.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        if self._paused and not self._pending:
            self._paused = False
            if self._conn.transport is not None:
                self._conn.transport.resume_reading()
        return data

    async def drain_to(self, sink: Callable[[bytes], bool]) -> None:
        """Hand the body to `sink` piece by piece, as the parser yields it, from the
        connection's callback, until the sink declines a piece (it returns False: the
        piece waits for `readany`), calls `stop_sink`, or the body ends or fails (which
        `readany` then reports). Returns at once if data is already waiting. A sink must
        not raise: it runs inside the protocol's callback."""
        if self._chunks or self._pending or self._error is not None or self._complete:
            return
        self._sink = sink
        waiter = self._waiter = self._conn.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
            self._sink = None

    def stop_sink(self) -> None:
        """Called by a sink: take no more pieces; `drain_to` returns."""
        self._sink = None
        self._wake()

    async def read(self, limit: int | None = None) -> bytes:
        """The body to its end, or its first `limit` bytes. Fails (and drops the
        connection) past MAX_BODY bytes, or after `idle_timeout` seconds without one."""
        parts: list[bytes] = []
        size = 0
        idle = self.idle_timeout
        timer: asyncio.TimerHandle | None = None
        loop = self._conn.loop
        last = 0.0
        if idle is not None:
            last = loop.time()

            def check() -> None:  # one timer, moved on lazily when it finds bytes came since
                nonlocal timer, last
                now = loop.time()
                if self._chunks or self._pending:  # bytes arrived that the reader has yet to take
                    last = now
                if now < last + idle - CLOCK_SLACK:
                    timer = loop.call_at(last + idle, check)
                else:
                    timer = None
                    self._fail(BodyTimeout(f"the reply stalled: no bytes for {idle:g} s"))

            timer = loop.call_at(last + idle, check)
        try:
            while limit is None or size < limit:
                data = await self.readany()
                if not data:
                    break
                if timer is not None:
                    last = loop.time()
                parts.append(data)
                size += len(data)
                if size > MAX_BODY:
                    error = BadResponse(f"the upstream's reply exceeds {MAX_BODY // (1024 * 1024)} MiB")
                    self._fail(error)
                    raise error
        finally:
            if timer is not None:
                timer.cancel()
        body = b"".join(parts)
        return body if limit is None else body[:limit]

    def release(self) -> None:
        """Done with the response: its connection is reused if the body was read to the
        end and the upstream keeps it open, else closed."""
        if self._done:
            return
        self._done = True
        conn = self._conn
        conn.response = None
        if (self._complete and self._keep_alive and not self._chunks and conn.reusable and self._pool is not None
                and conn.transport is not None and not conn.transport.get_write_buffer_size()):  # fmt: skip
            self._pool.put_back(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Drop the connection, whatever was read."""
        if self._done:
            return
        self._done = True
        self._conn.response = None
        self._conn.close()

    # -- fed by the connection --------------------------------------------------------

    def feed(self, data: bytes) -> None:
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadResponse("the upstream switched protocols"))
        except httptools.HttpParserError as error:
            self._fail(BadResponse(f"unreadable HTTP from the upstream: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ended:
            return
        if self._head.done() and not self._framed and exc is None:  # the body ran to the close: that is its end
            self._finish()
            return
        if (not self._head.done() and self._reused and not self._received
                and asyncio.get_running_loop().time() - self._sent_at < STALE_WINDOW):  # fmt: skip
            self._fail(StaleConnection("the upstream closed a pooled connection"))
        elif not self._head.done():
            self._fail(Disconnected(f"the upstream closed the connection before answering{_reason(exc)}"))
        else:
            self._fail(Disconnected(f"the upstream closed the connection mid-reply{_reason(exc)}"))

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._complete:
            self._error = error
        self._pending = None  # what waited to be inflated is dropped with the connection
        if not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved: no "never retrieved" warning if nobody waits
        self._wake()
        self._conn.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _finish(self) -> None:
        self._ended = True
        if self._pending:
            return  # complete once the reader has had the rest inflated (_inflate_pending)
        if self._inflater is not None:
            tail = self._inflater.flush()
            if tail:
                self._chunks.append(tail)
            if self._inflater.truncated:
                self._fail(BadResponse("the upstream's compressed body ends before its compressed stream does"))
                return
        self._complete = True
        self._wake()

    # -- httptools callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._ended:  # bytes past the answer (an unasked-for 408, say): ignored, and the connection is not reused
            self._keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._ended or self._error is not None:
            return
        self._head_size += len(name) + len(value)
        if self._head_size > MAX_HEAD:
            self._fail(BadResponse(f"the upstream's response headers exceed {MAX_HEAD // 1024} KB"))
            return
        self._names.append((name, value))

    def on_headers_complete(self) -> None:
        if self._ended or self._error is not None:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103): the real one follows
            self._names.clear()
            return
        headers = self.headers
        for raw_name, raw_value in self._names:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self._names.clear()
        self.status = status
        self._framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
        coding = headers.get("content-encoding", "identity").strip().lower()
        if coding in CODINGS:
            self._inflater = Inflater(coding)
        elif coding not in ("identity", ""):
            self._fail(BadResponse(f"the upstream used a content-encoding the gateway cannot read: {coding}"))
            return
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._error is not None or self._ended:
            return
        if self._inflater is not None:
            if self._pending:  # earlier input still waits for the reader: this goes after it
                self._pending.append(body)
                return
            self._inflate(body)
            return
        sink = self._sink
        if sink is not None:
            if sink(body):
                return
            self._sink = None
        self._chunks.append(body)
        self._size += len(body)
        if self._size > HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True  # a slow reader: stop reading until it catches up
            self._conn.transport.pause_reading()
        self._wake()

    def _inflate(self, data: bytes) -> None:
        """Inflate compressed input into the sink or the buffer, at most HIGH_WATER bytes
        in this call and none once the buffer holds that much: the rest waits in
        `_pending`, reading paused, for `readany` to inflate it."""
        assert self._inflater is not None
        try:
            rest = self._inflater.inflate(data, self._deliver, HIGH_WATER)
        except BadResponse as error:
            self._fail(error)
            return
        if rest is not None:
            self._pending = [rest]
            self._pause()
            self._wake()  # a `drain_to` returns, and its caller's `readany` goes on inflating
        elif self._size > HIGH_WATER:
            self._pause()  # a slow reader, as in `on_body`

    def _pause(self) -> None:
        transport = self._conn.transport
        if not self._paused and transport is not None and not transport.is_closing():
            self._paused = True
            transport.pause_reading()

    def _inflate_pending(self) -> None:
        """Inflate the next part of what waits (for `readany`)."""
        pending = self._pending
        assert pending
        self._pending = None
        self._inflate(pending[0] if len(pending) == 1 else b"".join(pending))
        if self._pending or self._error is not None:
            return
        if self._paused and self._size <= HIGH_WATER:
            self._paused = False
            if self._conn.transport is not None:
                self._conn.transport.resume_reading()
        if self._ended:
            self._finish()

    def _deliver(self, body: bytes) -> bool:
        """Inflated body bytes to the sink or the buffer (as `on_body` does inline for plain
        bytes). Whether the buffer has room for more."""
        sink = self._sink
        if sink is not None:
            if sink(body):
                return self._size <= HIGH_WATER
            self._sink = None
        self._chunks.append(body)
        self._size += len(body)
        self._wake()
        return self._size <= HIGH_WATER

    def on_message_complete(self) -> None:
        if self._ended or self._error is not None:
            return
        if self.status == 0:  # the end of an interim response: the parser reads the real one next
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._finish()


def _reason(exc: Exception | None) -> str:
    return f" ({exc})" if exc is not None and str(exc) else ""

"""The body of an upstream's response as it arrives, handed to its reader: `readany()`
for streams, `read()` for whole bodies, or `drain_to(sink)`, which hands each read's body
bytes to a callback once it is parsed (no task wake-up per token; one write to the client
per read, however many chunks of the body it held). Reading from the upstream pauses
while HIGH_WATER bytes wait for the reader; a compressed body is inflated within bounds
(`backends.inflate`). A `Response` (`backends.response`) is a Body with a head, fed by
httptools' parser.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dragoman.upstream.transport.failures import BadResponse, BodyTimeout
from dragoman.upstream.transport.inflate import Inflater
from dragoman.upstream.transport.link import Link

# Buffered body bytes at which reading from the upstream pauses; a compressed body is
# inflated at most this much per callback, and no further ahead of its reader (`backends.inflate`).
HIGH_WATER = 256 * 1024
# A body read whole (`read`: replies that are not streams) is held in memory twice while
# joined; none the gateway reads comes near this.
MAX_BODY = 64 * 1024 * 1024
CLOCK_SLACK = 0.001  # the loop's clock may tick in milliseconds: a timer can fire a little early


class Body:
    """A response's body as it arrives, and its reader's side: what waits to be read,
    whether reading from the upstream is paused, how the body ended or failed."""

    __slots__ = (
        "_chunks",
        "_complete",
        "_conn",
        "_ended",
        "_error",
        "_gathered",
        "_inflater",
        "_paused",
        "_pending",
        "_sink",
        "_size",
        "_waiter",
        "idle_timeout",
    )  # fmt: skip

    def __init__(self, conn: Link) -> None:
        self._conn = conn
        self._chunks: list[bytes] = []
        self._size = 0
        self._complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], bool] | None = None
        self._gathered: list[bytes] = []  # the body pieces of the read being parsed, for the sink
        self._paused = False
        self._inflater: Inflater | None = None  # for a compressed body
        self._ended = False  # the parser saw the body's end (complete once what is pending is inflated)
        self._pending: list[bytes] | None = None  # compressed input waiting for the reader (see _inflate)
        self.idle_timeout: float | None = None  # the longest silence `read` waits through

    # -- the reader's side ------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """The whole body has arrived (read or not)."""
        return self._complete

    @property
    def _inflated(self) -> int:
        """Bytes of a compressed body inflated so far (what its bounds are measured by)."""
        return self._inflater.inflated if self._inflater is not None else 0

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

    async def readable(self) -> bool:
        """Wait until `readany` has something to return: bytes (True), or the body's end or
        failure (False). A stream's first bytes are left for `readany`. Safe to cancel and call again."""
        while not (self._chunks or self._pending or self._error is not None or self._complete):
            waiter = self._waiter = self._conn.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return bool(self._chunks or self._pending)

    async def drain_to(self, sink: Callable[[bytes], bool]) -> None:
        """Hand the body to `sink` piece by piece from the connection's callback, a piece
        being what one read from the upstream held (its chunks joined, once it is parsed),
        until the sink declines a piece (it returns False: the piece waits for `readany`),
        calls `stop_sink`, or the body ends or fails (which `readany` then reports). Returns
        at once if data is already waiting. A sink must not raise: it runs inside the
        protocol's callback."""
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
        loop = self._conn.loop
        watch = None if self.idle_timeout is None else _Silence(self, self.idle_timeout, loop)
        try:
            while limit is None or size < limit:
                data = await self.readany()
                if not data:
                    break
                if watch is not None:
                    watch.last = loop.time()
                parts.append(data)
                size += len(data)
                if size > MAX_BODY:
                    error = BadResponse(f"the upstream's reply exceeds {MAX_BODY // (1024 * 1024)} MiB")
                    self._fail(error)
                    raise error
        finally:
            if watch is not None:
                watch.cancel()
        body = b"".join(parts)
        return body if limit is None else body[:limit]

    # -- fed by the parser -------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        if self._error is not None or self._ended:
            return
        if self._inflater is not None:
            if self._pending:  # earlier input still waits for the reader: this goes after it
                self._pending.append(body)
                return
            self._inflate(body)
            return
        if self._sink is not None:
            self._gathered.append(body)  # handed on at the read's end (`hand_gathered`)
            return
        self._buffer(body)

    def hand_gathered(self) -> None:
        """At the end of a read's parsing: its body pieces to the sink, joined, or to the
        buffer if the sink has gone or declines them."""
        gathered = self._gathered
        if not gathered:
            return
        self._gathered = []
        body = gathered[0] if len(gathered) == 1 else b"".join(gathered)
        sink = self._sink
        if sink is not None:
            if sink(body):
                return
            self._sink = None
        self._buffer(body)

    def _buffer(self, body: bytes) -> None:
        """Body bytes kept for `readany`; reading pauses past HIGH_WATER."""
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

    def _fail(self, error: BaseException) -> None:
        """Readers get `error` (unless the body was whole), and the connection is dropped."""
        if self._error is None and not self._complete:
            self._error = error
        self._pending = None  # what waited to be inflated is dropped with the connection
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


class _Silence:
    """Fails a body read whole that is silent for `idle` seconds: one timer, moved on lazily
    when it finds bytes came since. Cancelled, it lets go of its timer, which holds it: no
    cycle is left for the garbage collector (one per request, freed in batches otherwise)."""

    __slots__ = ("_body", "_idle", "_loop", "_timer", "last")

    def __init__(self, body: Body, idle: float, loop: asyncio.AbstractEventLoop) -> None:
        self._body, self._idle, self._loop = body, idle, loop
        self.last = loop.time()  # when bytes last came
        self._timer: asyncio.TimerHandle | None = loop.call_at(self.last + idle, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        body = self._body
        if body._chunks or body._pending:  # bytes arrived that the reader has yet to take
            self.last = now
        if now < self.last + self._idle - CLOCK_SLACK:
            self._timer = self._loop.call_at(self.last + self._idle, self._check)
        else:
            self._timer = None
            body._fail(BodyTimeout(f"the reply stalled: no bytes for {self._idle:g} s"))

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

"""A response read from an upstream connection (`backends.connection`): its head, the
httptools parser its bytes go into, and whether its connection goes back to the pool.
Its body is handed out as it arrives (`backends.body`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools

from dragoman.upstream.transport.body import Body
from dragoman.upstream.transport.failures import (
    BadResponse,
    Disconnected,
    HeadTimeout,
    StaleConnection,
)
from dragoman.upstream.transport.inflate import CODINGS, Inflater
from dragoman.upstream.transport.link import Link, Returns

MAX_HEAD = 64 * 1024  # bytes of a response's head (status line and headers, interim answers included)
# A pooled connection the upstream closes this soon after a request went out, before a
# byte of answer, was closed while idle (the keep-alive race): the request is sent once
# more. Later, the upstream may have worked on it: that is an ordinary failure.
STALE_WINDOW = 0.5


class Response(Body):
    """A response's head (`status`, `headers` with lower-case names) and its body as it
    arrives. Release it when read to the end (the connection goes back to the pool) or
    close it (the connection is dropped, which is how an upstream learns to stop)."""

    __slots__ = (
        "_done",
        "_framed",
        "_head",
        "_head_room",
        "_keep_alive",
        "_names",
        "_parser",
        "_pool",
        "_received",
        "_reused",
        "_sent_at",
        "headers",
        "opening",
        "status",
    )  # fmt: skip

    def __init__(self, conn: Link, pool: Returns | None, *, reused: bool) -> None:
        super().__init__(conn)
        self.status = 0
        self.headers: dict[str, str] = {}
        self._pool = pool
        # It holds this response's methods: let go of once released or closed, or the two
        # would be a cycle, freed by a garbage collection with everything the response holds.
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[None] = conn.loop.create_future()
        self._reused = reused
        self._received = False
        self._names: list[tuple[bytes, bytes]] = []
        self._done = False  # released or closed
        self._framed = False  # Content-Length or chunked: the end of the body is known without a close
        self._keep_alive = False
        self._head_room: int | None = MAX_HEAD  # bytes the head may still take; None once it is complete
        self._sent_at = 0.0  # when the request was written (mark_sent)
        # A stream's head alone is no answer: until its first body bytes, what decides (HttpClient.post).
        # The retrying client's watch over the stream's first bytes (`upstream.opening.Opening`),
        # kept here for the layer above; the transport never looks at it.
        self.opening: Any = None
        conn.response = self
        if conn.lost:  # lost before this response was attached (a close right after connecting)
            self.connection_lost(None)

    # -- the public surface ---------------------------------------------------------

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/octet-stream").partition(";")[0].strip().lower()

    async def wait_head(self) -> None:
        await self._head

    def mark_sent(self) -> None:
        self._sent_at = self._conn.loop.time()

    @property
    def sent_at(self) -> float:
        """When the request was written (the loop's clock): what first_byte_timeout is measured from."""
        return self._sent_at

    def head_timed_out(self, timeout: float) -> None:
        """The deadline for the head passed (a timer, cheaper than a timeout scope per request)."""
        if not self._head.done():
            self._fail(HeadTimeout(f"no response within {timeout:g} s"))

    def release(self) -> None:
        """Done with the response: its connection is reused if the body was read to the
        end and the upstream keeps it open, else closed."""
        if self._done:
            return
        self._done = True
        self._parser = None  # no more bytes come to it: conn.response is no longer this
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
        self._parser = None
        self._conn.response = None
        self._conn.close()

    # -- fed by the connection --------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Bytes read. Until the head is complete they are counted: httptools holds a header it
        has not seen the end of whole, so an endless header value would grow without bound."""
        self._received = True
        room = self._head_room
        if room is not None:
            if len(data) > room:
                self._head_room = 0
                self._parse(data[:room])  # the head may end in what fits; the rest is body
                if self._head_room is not None:
                    self._fail(BadResponse(f"the upstream's response head exceeds {MAX_HEAD // 1024} KB"))
                    self._conn.close()  # read no more of it
                    return
                data = data[room:]
            else:
                self._head_room = room - len(data)
        self._parse(data)
        if self._gathered:
            self.hand_gathered()

    def _parse(self, data: bytes) -> None:
        if self._parser is None:  # released or closed: what still comes is not this response's
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadResponse("the upstream switched protocols"))
        except httptools.HttpParserError as error:
            self._fail(BadResponse(f"unreadable HTTP from the upstream: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ended or self._error is not None:
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
        """As a body fails; a head not yet read fails with it."""
        if not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved: no "never retrieved" warning if nobody waits
        super()._fail(error)

    # -- httptools callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._ended:  # bytes past the answer (an unasked-for 408, say): ignored, and the connection is not reused
            self._keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._ended or self._error is not None:
            return
        self._names.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        if self._ended or self._error is not None or parser is None:
            return
        status = parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103): the real one follows
            self._names.clear()
            return
        headers = self.headers
        for raw_name, raw_value in self._names:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self._names.clear()
        self._head_room = None
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

    def on_message_complete(self) -> None:
        parser = self._parser
        if self._ended or self._error is not None or parser is None:  # (None: released while parsing)
            return
        if self.status == 0:  # the end of an interim response: the parser reads the real one next
            return
        self._keep_alive = parser.should_keep_alive()
        self._finish()


def _reason(exc: Exception | None) -> str:
    return f" ({exc})" if exc is not None and str(exc) else ""

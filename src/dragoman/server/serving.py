"""The HTTP server protocol: uvicorn's httptools protocol, plus a direct body writer.

A streamed token costs an event-loop wake-up of the request's task and an ASGI `send`
when it goes through the ASGI interface: about 3 µs of the 20 a translated token costs
on the benchmark machine (docs/performance.md). With the writer this module puts in
each request's scope, a stream's tokens are written to the client from the upstream
connection's own callback instead (see `backends.body.Body.drain_to`).

The protocol reads ten attributes of uvicorn's request cycle, one of its flow
control and four of the protocol's own: uvicorn is pinned in pyproject.toml to the
versions the suite tests it with. `http_protocol()` checks them once; if uvicorn changed
them, or httptools is missing, it logs a warning and the server is uvicorn's h11
protocol: streams take the ASGI path, which works the same, slower. Of the protections
below, the two that need no internals hold there too, by h11 and uvicorn's public
options (`server_options`): a response to HTTP/1.0 is never chunked, and a head past
MAX_HEAD_BYTES is refused (400 rather than 431). The others (408 for a stalled request,
idle connections closed, the connection limit, every pipelined request told of a hang-up) live in the
protocol, since no ASGI app sees a request before its head is whole. Direct writes
bypass any wrapper around ASGI `send`: only the hot endpoints use them, which `app.App`
serves without middleware.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from dragoman.core.errors import InvalidRequest, RequestHeadersTooLarge, RequestTimeout

HTTPTOOLS = importlib.util.find_spec("httptools") is not None  # uvicorn[standard] brings it where wheels exist
if TYPE_CHECKING or HTTPTOOLS:
    from uvicorn.protocols.http import flow_control, httptools_impl

    _Base = httptools_impl.HttpToolsProtocol
else:
    _Base = object

logger = logging.getLogger("dragoman")

DIRECT_BODY = "dragoman.direct_body"  # the scope extension's name
_CYCLE_ATTRIBUTES = ("scope", "transport", "flow", "disconnected", "response_started", "response_complete", "chunked_encoding",
                     "expected_content_length", "keep_alive", "message_event")  # fmt: skip
_PROTOCOL_ATTRIBUTES = ("scope", "cycle", "headers", "timeout_keep_alive", "connections")


class DirectBody:
    """Writes chunks of a response body that uvicorn has started, bypassing `send`.

    Only for a chunked body whose head has gone out: `ready()` is false otherwise, and
    while the client's socket is full (flow control) or gone, so that the caller goes
    back to `send`, which waits for the client as usual."""

    __slots__ = ("_cycle", "_broken")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._broken = False

    def ready(self) -> bool:
        cycle = self._cycle
        return (cycle.chunked_encoding is True and not cycle.flow.write_paused and not cycle.disconnected
                and not cycle.response_complete and not self._broken and not cycle.transport.is_closing())  # fmt: skip

    def write(self, chunk: bytes) -> None:
        """One chunk of the body; call `ready()` first. Never raises: a write the transport
        refuses (the client's connection is closing) is dropped, and `ready()` is false
        from then on, so the stream goes back to `send`, which ends it as uvicorn does."""
        if not chunk:
            return  # an empty chunk would end the body
        try:
            self._cycle.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        except Exception:  # noqa: BLE001 - uvloop raises RuntimeError for a closed handle
            self._broken = True


if TYPE_CHECKING or HTTPTOOLS:

    class CloseDelimitedCycle(httptools_impl.RequestResponseCycle):
        """uvicorn's request cycle for an HTTP/1.0 request, whose response is never chunked.

        uvicorn chunks any body without a content-length, whatever the request's version,
        and a 1.0 client cannot read chunked framing (RFC 9112 §7.1): nginx's `proxy_pass`
        speaks 1.0 to its upstream unless told otherwise. Such a body (a stream) is written
        as it is, and its end is the connection's close (`connection: close` in its head),
        whatever keep-alive the client asked for. A body with a content-length is uvicorn's
        as before. Its work per body message: telling uvicorn's length check that the
        message is the rest of the body, so that uvicorn writes it unframed and, after the
        last, completes the response and closes the connection, as for any response it
        does not keep alive."""

        close_delimited = False

        async def send(self, message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"content-length" for name, _ in headers):
                    self.close_delimited = True
                    self.chunked_encoding = False  # uvicorn adds transfer-encoding only while this is None
                    self.keep_alive = False  # uvicorn then adds `connection: close` and closes after the body
                    message = {**message, "headers": [(n, v) for n, v in headers if n.lower() != b"transfer-encoding"]}
            elif self.close_delimited and message["type"] == "http.response.body":
                self.expected_content_length = len(message.get("body", b""))
            await super().send(message)


READ_IDLE_TIMEOUT = 60.0  # seconds without a byte of a request that has begun: the client is answered 408
READ_DEADLINE = 300.0  # seconds from a request's first byte to its last, however steadily they come: then 408
MAX_CONNECTIONS = 1000  # open client connections per process (`server.max_connections`); more are closed at once
_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
_NOT_HTTP = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)
LINGER = 2.0  # seconds a refused client's remaining bytes are read and dropped before the close
MAX_HEAD_BYTES = 64 * 1024  # a request's line and headers: past it the client is answered 431


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head refused there."""


_HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\nconnection: close\r\n"
                   b"content-length: %d\r\n\r\n%s")  # fmt: skip


class DirectBodyProtocol(_Base):
    """uvicorn's httptools protocol; each request's scope carries a `DirectBody`.

    Also:
    - when the connection is lost, every request still answering on it is marked
      disconnected. uvicorn marks only the newest, so a client that pipelined a second
      request behind a stream and then went away left the stream writing to a closed
      transport (an exception per write, and the upstream generating for nobody);
    - a request whose bytes stop coming for `read_idle_timeout` (part of its headers or
      of its body), or that has not arrived whole `read_deadline` after its first byte,
      is answered 408 and its connection closed. uvicorn waits forever, so a few stalled
      clients (or clients sending a byte now and then) could hold as many connections as
      they liked. A request that arrives in one read costs no timer;
    - past `max_connections` open connections, a new one is closed at once, before it
      costs more than its descriptor (the SDKs retry a connection closed so);
    - a connection that has not begun a request within uvicorn's keep-alive timeout
      (`timeout_keep_alive`, 5 s by default: what an idle connection gets between
      requests) is closed, without a response. uvicorn arms that timeout only after a
      response, so connections that sent nothing stayed open until the client left, and
      enough of them used up the process's file descriptors. The one timer a connection
      costs is not cancelled: when it fires, it does nothing if a request has begun;
    - a request whose line and headers pass `MAX_HEAD_BYTES` is answered 431 and its
      connection closed, before any of it is parsed past the limit. uvicorn and httptools
      keep a head whole, however long, so one 200 MB header took 200 MB of memory. A head
      is counted in bytes across reads, up to the blank line that ends it, before each
      read is parsed: a read that begins a request costs one search for that line. A head
      that begins inside a read, behind a pipelined request's body, is counted by what
      httptools parsed of it (its line and headers, not the blank space between them);
    - an HTTP/1.0 request's response is never chunked (`CloseDelimitedCycle`): a stream
      to it is written unframed and ended by the close. Its stream has no direct writer.
    """

    max_connections = MAX_CONNECTIONS
    read_idle_timeout = READ_IDLE_TIMEOUT
    read_deadline = READ_DEADLINE

    def __init__(self, *args: Any, max_connections: int | None = None, read_idle_timeout: float | None = None,
                 read_deadline: float | None = None, **kwargs: Any) -> None:  # fmt: skip
        """Each limit: the module's default unless given (a test's, through a partial)."""
        super().__init__(*args, **kwargs)
        if max_connections is not None:
            self.max_connections = max_connections
        if read_idle_timeout is not None:
            self.read_idle_timeout = read_idle_timeout
        if read_deadline is not None:
            self.read_deadline = read_deadline
        self._begun = 0.0  # when the request being received began
        self._answering: list[Any] = []  # request cycles whose response is not complete
        self._receiving = False  # between the first byte of a request and its end
        self._last_byte = 0.0
        self._read_timer: Any = None
        self._idle_timer: Any = None
        self._refused = False  # answered 400 or 431: what else comes is dropped until the close
        self._head_open = False  # between a request's first byte and the end of its head
        self._head_exact = False  # its bytes counted from its first (it began a read), not by what was parsed
        self._exact_next = False  # a request beginning now begins a read
        self._head_bytes = 0  # of the open head, in the reads before this one
        self._head_tail = b""  # the last bytes of the previous read: the blank line may span two

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # counted in `self.connections` (the server's) from here
        if len(self.connections) > self.max_connections:
            transport.close()  # connection_lost takes it out of the count
            return
        self._idle_timer = self.loop.call_later(self.timeout_keep_alive, self._close_if_idle)

    def _close_if_idle(self) -> None:
        self._idle_timer = None
        if self.scope is None and not self.transport.is_closing():  # uvicorn makes a scope when a request begins
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._receiving = True
        self._begun = self.loop.time()
        self._head_open, self._head_exact, self._exact_next = True, self._exact_next, False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._receiving = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the rest of a refused request: read, so that the refusal is not lost to a reset
        counted = -1  # the open head's bytes once this read is parsed, when the read does not end it
        if self._head_open or not self._receiving:  # a head goes on, or begins, in this read
            counted, ended = self._count_head(data)
            if counted > MAX_HEAD_BYTES:
                self._refuse_head()
                return
            counted = -1 if ended else counted
        super().data_received(data)
        self._exact_next = False
        if self._head_open:  # the read ended inside a head: counted on in the next
            self._head_bytes = counted if counted >= 0 else self._parsed_head()
            self._head_tail = data[-3:] if len(data) >= 3 else (self._head_tail + data)[-3:]
        if self._receiving:  # a request arriving in pieces
            self._last_byte = self.loop.time()
            if self._read_timer is None:
                wait = min(self.read_idle_timeout, self.read_deadline - (self._last_byte - self._begun))
                self._read_timer = self.loop.call_later(max(wait, 0.0), self._check_read)

    def _count_head(self, data: bytes) -> tuple[int, bool]:
        """The bytes of the head that is open, or that this read begins, up to the blank line
        that ends it; and whether this read ends it."""
        if self._head_open:
            seen, tail = self._head_bytes, self._head_tail
            end = (tail + data[:3]).find(b"\r\n\r\n")  # the blank line, begun in the last read
            if end >= 0:
                return seen + end + 4 - len(tail), True
        else:  # a request begins here; blank lines before it (RFC 9112 §2.2) leave it to `_parsed_head`
            seen = 0
            self._exact_next = data[:1] not in (b"\r", b"\n")
        end = data.find(b"\r\n\r\n")
        return (seen + end + 4, True) if end >= 0 else (seen + len(data), False)

    def _parsed_head(self) -> int:
        """What httptools has parsed of the head: its target and headers (at least a colon and a
        line end each), fewer bytes than it has."""
        return len(getattr(self, "url", b"")) + sum(len(name) + len(value) + 3 for name, value in self.headers)

    def _refuse_head(self) -> None:
        if self.transport.is_closing():  # uvicorn answered 400 (a malformed request)
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:  # not while answering an earlier request on the connection
            body = RequestHeadersTooLarge(f"request headers larger than {MAX_HEAD_BYTES // 1024} KiB").body(None)
            self._refuse(_HEAD_TOO_LARGE % (len(body), body))
        else:
            self._refused = True
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP, in Anthropic's envelope (uvicorn's own is plain text)."""
        if self._refused:
            return
        body = InvalidRequest("the request is not valid HTTP/1.1 (malformed request line or headers)").body(None)
        self._refuse(_NOT_HTTP % (len(body), body))

    def _refuse(self, response: bytes) -> None:
        """Answer a client that may still be sending, then close: closing at once with its bytes
        unread would reset the connection, and the client would never read the answer. Its
        bytes are read and dropped for LINGER seconds, after the end of the answer is sent."""
        self._refused = True
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER, self.transport.close)

    def _check_read(self) -> None:
        self._read_timer = None
        if not self._receiving or self.transport.is_closing():
            return
        now = self.loop.time()
        idle_left = self.read_idle_timeout - (now - self._last_byte)
        total_left = self.read_deadline - (now - self._begun)
        if idle_left > 0 and total_left > 0:
            self._read_timer = self.loop.call_later(min(idle_left, total_left), self._check_read)
            return
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            why = (f"no byte of the request for {self.read_idle_timeout:g} s" if idle_left <= 0
                   else f"the request did not arrive whole within {self.read_deadline:g} s")  # fmt: skip
            body = RequestTimeout(f"{why}; send it whole").body(None)
            self.transport.write(_TIMED_OUT % (len(body), body))
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._head_open = False
        if not self._head_exact and self._parsed_head() > MAX_HEAD_BYTES:  # counted by what was parsed of it
            self._refuse_head()
            raise _HeadTooLarge  # stops the parser before uvicorn starts the request (it logs a warning)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not an upgrade
            scope: dict[str, Any] = self.scope  # type: ignore[assignment]  # uvicorn types extensions narrowly
            if scope["http_version"] == "1.0":
                # Before the request's task first runs (uvicorn creates it with `loop.create_task`),
                # so the app gets this class's `send`. No direct writer: they write chunks, and a
                # 1.0 stream goes through `send` (its DirectBody would never be ready anyway).
                cycle.__class__ = CloseDelimitedCycle
            else:
                scope["extensions"] = {**scope.get("extensions", {}), DIRECT_BODY: DirectBody(cycle)}
            self._answering = [*(c for c in self._answering if not c.response_complete), cycle]

    def on_response_complete(self) -> None:
        """A response is out: its scope lets go of its DirectBody, which holds its cycle, which
        holds the scope. Left, that cycle would wait for a garbage collection, with every
        object the request's scope holds (its state, its outcome), a batch of requests at once."""
        for cycle in self._answering:
            if cycle.response_complete:
                _let_go(cycle)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        super().connection_lost(exc)
        for cycle in self._answering:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()  # wakes a `receive()`: the app hears http.disconnect
            else:
                _let_go(cycle)
        self._answering = []


def _let_go(cycle: Any) -> None:
    extensions = cycle.scope.get("extensions")
    if extensions:
        extensions.pop(DIRECT_BODY, None)


def http_protocol(max_connections: int | None = None) -> Any:
    """What to pass to uvicorn as `http`: the protocol with the direct writer and the
    protections above (and, if given, its own connection limit: a partial, which
    `--workers` processes can unpickle), or, with a warning, uvicorn's h11 protocol when
    that cannot work here (`server_options`)."""
    missing = _missing_internals()
    if missing is None:
        if max_connections is not None:
            return functools.partial(DirectBodyProtocol, max_connections=max_connections)
        return DirectBodyProtocol
    logger.warning(
        "dragoman's HTTP protocol cannot be installed (%s): serving with uvicorn's h11 protocol, slower, without "
        "the 408 for stalled requests, the close of idle connections, the connection limit or the direct stream "
        "writer (uvicorn %s; dragoman is tested with the range pinned in its pyproject.toml)",
        missing,
        _uvicorn_version(),
    )
    return "h11"


def server_options(max_connections: int | None = None) -> dict[str, Any]:
    """uvicorn's options for `dragoman serve` (and the tests' server): the protocol, and the
    head limit h11 enforces itself, through uvicorn's own setting, should it be the fallback
    (h11 also never chunks a response to an HTTP/1.0 client). httptools ignores the limit."""
    return {"http": http_protocol(max_connections), "h11_max_incomplete_event_size": MAX_HEAD_BYTES}


def _missing_internals() -> str | None:
    """What keeps DirectBodyProtocol from working with the uvicorn installed, if anything."""
    if not HTTPTOOLS:
        return "httptools is not installed"
    for cls, names in ((httptools_impl.RequestResponseCycle, _CYCLE_ATTRIBUTES), (flow_control.FlowControl, ("write_paused",)),
                       (httptools_impl.HttpToolsProtocol, _PROTOCOL_ATTRIBUTES)):  # fmt: skip
        absent = _unset(cls, names)
        if absent:
            return f"uvicorn's {cls.__name__} no longer sets {', '.join(absent)}"
    return None


def _uvicorn_version() -> str:
    import uvicorn

    return uvicorn.__version__


def _unset(cls: type, names: tuple[str, ...]) -> list[str]:
    """Which of `names` `cls.__init__` does not assign to its instance."""
    init = getattr(cls.__dict__.get("__init__"), "__code__", None)
    if init is None:
        return list(names)
    import dis

    stored = {i.argval for i in dis.get_instructions(init) if i.opname == "STORE_ATTR"}
    return [name for name in names if name not in stored]

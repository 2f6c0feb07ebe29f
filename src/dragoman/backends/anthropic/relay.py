"""The passthrough path's `upstream.pump.Transformer`: a /v1/messages stream relayed as
whole events (`events.Events`), its head (up to the first event) held until it can be
given the client's model name and a `message_start`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping

import msgspec

from dragoman.backends.anthropic.events import (
    Events,
    completed_start,
    error_event_data,
    leading_comments,
    note_usage,
    with_start,
)
from dragoman.calls.types import Call, ClientWriter
from dragoman.core.error_mapping import from_error_event
from dragoman.core.errors import UpstreamError
from dragoman.core.redaction import Redactor
from dragoman.protocol.sse import KEEPALIVE_COMMENT, PING
from dragoman.upstream.transport.response import Response

HEAD_LIMIT = 64 * 1024  # how far into a stream the model name is looked for


def renamed(data: bytes, call: Call) -> bytes:
    """`data` with the first `"model"` the upstream's name put back to the client's."""
    if call.upstream_model == call.model:
        return data
    old = msgspec.json.encode(call.upstream_model)
    new = msgspec.json.encode(call.model)
    return data.replace(b'"model":' + old, b'"model":' + new, 1).replace(b'"model": ' + old, b'"model": ' + new, 1)


class Relay:
    """Silences get comment lines until `message_start` (a server may answer 200 before its
    prefill), pings after it at event boundaries. An event cut by a read waits for its end, so
    that an upstream failing mid-event ends the client's stream with a clean `error` event.

    A stream whose first event is an `error`, while nothing has been sent (`committed`: the
    client's 200 went out with a comment line), raises it as the HTTP error the server would
    have answered (error_mapping.from_error_event): the SDKs retry that, and not an error event.
    `headers`, the reply's (not sent before the first chunk), become those of the instance
    the stream came from in the end (`reply_headers` picks them). `tag`: the tag of the replica
    answering, for its tool ids (None: they are not tagged; `events.Events`)."""

    __slots__ = ("_call", "_committed", "_events", "_head", "_headers", "_reply_headers", "ended", "name", "started")

    def __init__(self, name: str, call: Call, headers: dict[str, str] | None,
                 reply_headers: Callable[[Mapping[str, str]], dict[str, str]], *, committed: bool,
                 redactor: Redactor, tag: Callable[[], str] | None = None) -> None:  # fmt: skip
        self.name = name
        self._call = call
        self._headers = headers
        self._reply_headers = reply_headers
        self._committed = committed
        self._events = Events(call, name, redactor, tag)
        self._head: bytes | None = b""  # None once the head has gone out
        # Plain attributes, not properties: the pump reads them once per read.
        self.started = False  # the head has gone out
        self.ended = False  # `message_stop` or an `error` event went past (`Events.ended`)

    cut = False  # the reply ends with the server's

    def silence(self) -> bytes | None:
        if (
            self._head is not None
        ):  # nothing has gone out yet (llama-server's prefill): a ping would precede message_start
            self._committed = True
            return KEEPALIVE_COMMENT
        return PING if self._events.at_boundary else None

    def abandoned(self) -> None:
        self._events.count_output()

    def resent(self, response: Response) -> None:
        if self._headers is not None:
            self._headers.clear()
            self._headers.update(self._reply_headers(response.headers))

    def feed(self, data: bytes) -> Iterable[bytes]:
        if self._head is not None:
            return self._feed_head(data)
        events = self._events
        whole = events.take(data)
        self.ended = events.ended
        return (whole,) if whole else ()

    def feed_to(self, data: bytes, writer: ClientWriter) -> None:
        events = self._events
        whole = events.take(data)
        self.ended = events.ended
        if whole:
            writer.write(whole)

    def _feed_head(self, data: bytes) -> list[bytes]:
        assert self._head is not None
        head = self._head + data
        out = []
        skip = leading_comments(head)
        if skip:  # the server's own keep-alives: comments before message_start, as ours are
            self._committed = True
            out.append(head[:skip])
            head = head[skip:]
        if b"\n\n" not in head and b"\n\r\n" not in head and len(head) < HEAD_LIMIT:
            self._head = head
            return out
        self._head = None
        self.started = True
        chunk = self._opened(head)
        note_usage(self._call, chunk[: chunk.find(b"\n\n")])  # message_start: the input tokens
        whole = self._events.take(chunk)
        self.ended = self._events.ended
        if whole:
            out.append(whole)
        return out

    def _opened(self, head: bytes) -> bytes:
        """The stream's first events, once: an opening error raised if nothing has gone out,
        else the client's model name, a `message_start` (supplied if missing) with the null
        fields the SDKs type."""
        if not self._committed:
            data = error_event_data(head)
            if data is not None:
                retry_after = self._headers.get("retry-after") if self._headers is not None else None
                raise from_error_event(
                    data, upstream=self.name, redactor=self._events.redactor, retry_after=retry_after
                )
        return completed_start(with_start(renamed(head, self._call), self._call))

    async def finish(self) -> AsyncIterator[bytes]:
        events = self._events
        if self._head:  # the stream ended within its first event
            whole = events.take(self._opened(self._head))
            if whole:
                yield whole
        whole = events.finish()  # an error event the server closed on without its blank line
        if whole:
            yield whole
        events.count_output()  # (a stream ended by an `error` event told no output count)
        if not events.complete():
            raise UpstreamError(f"upstream {self.name} closed the stream before the reply was complete")

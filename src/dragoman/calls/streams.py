"""What may watch or change a stream on its way to the client: observers and transforms.

A part that wants a stream's bytes (a trace reading its usage, a thread holding its
message, a safeguard holding its last `message_delta`, a server tool adding blocks of its
own) registers on the reply, `Streaming.observe(fn)` or `Streaming.transform(t)`, and never
wraps `Streaming.chunks`: once the stream has started, the pump (`upstream.pump`) writes
straight to the client from the connection's callback, and a wrapper around `chunks` would
see only the first event. The pump runs what is registered here on both of its paths; a
stream with no pump behind it (a reply made whole, then streamed) runs them around its chunks.

Order: each piece goes through the transforms in the order they were registered, then
every observer sees what the client gets. Keep-alives (pings, comment lines) go to the
observers only: a transform holding an event never holds a keep-alive.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Protocol

from dragoman.protocol.sse import KEEPALIVE_COMMENT, PING

# Sees each piece the client gets (one or more whole SSE events, or a keep-alive), on either
# path. Called in the connection's callback: quick, no I/O, must not raise.
Observer = Callable[[bytes], None]


class StreamTransform(Protocol):
    """Changes a stream on its way to the client. `feed` is called for each piece (one or
    more whole SSE events), in the connection's callback once the stream writes directly:
    quick, no I/O. What takes time goes in `finish`, which the pump runs with keep-alives
    going out meanwhile. A failure (GatewayError) becomes the stream's `error` event."""

    def feed(self, chunk: bytes) -> Iterable[bytes]:
        """What goes out in place of `chunk`: itself, nothing (held), or more (injected)."""
        ...

    def finish(self) -> AsyncIterator[bytes]:
        """The upstream's stream ended well: what was held, and anything to add (it may wait
        for a verdict or another upstream call). Not called for a stream that failed or a
        client that left: what must happen then belongs to the request's end (`Finish.hold`)."""
        ...


class Stages:
    """The transforms and observers registered on one stream, applied by whoever moves its
    bytes (the pump, or `around`)."""

    __slots__ = ("transforms", "observers")

    def __init__(self) -> None:
        self.transforms: list[StreamTransform] = []
        self.observers: list[Observer] = []

    def out(self, chunk: bytes, first: int = 0) -> list[bytes]:
        """What the client gets for `chunk`: through the transforms from `first` on, then seen."""
        outs = [chunk]
        for transform in self.transforms[first:]:
            outs = [out for piece in outs for out in transform.feed(piece)]
        for out in outs:
            for observer in self.observers:
                observer(out)
        return outs

    def seen(self, keepalive: bytes) -> None:
        """A keep-alive going out: the observers see it; the transforms do not."""
        for observer in self.observers:
            observer(keepalive)

    async def ends(self) -> AsyncGenerator[bytes, None]:
        """Each transform's `finish` in turn, its outputs through the transforms after it."""
        for index, transform in enumerate(self.transforms):
            async for chunk in transform.finish():
                for out in self.out(chunk, index + 1):
                    yield out

    def writer(self, writer: _Writer) -> StagedWriter:
        """`writer` (the client's direct writer) with these stages in front of it."""
        return StagedWriter(self, writer)

    async def around(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`chunks` through the stages, for a stream no pump reads."""
        async for chunk in chunks:
            if chunk is PING or chunk is KEEPALIVE_COMMENT:
                self.seen(chunk)
                yield chunk
                continue
            for out in self.out(chunk):
                yield out
        async for out in self.ends():
            yield out


class _Writer(Protocol):
    def ready(self) -> bool: ...

    def write(self, chunk: bytes) -> None: ...


class StagedWriter:
    """A client writer (`calls.types.ClientWriter`) that runs the stages on what it writes."""

    __slots__ = ("_stages", "inner")

    def __init__(self, stages: Stages, inner: _Writer) -> None:
        self._stages = stages
        self.inner = inner

    def ready(self) -> bool:
        return self.inner.ready()

    def write(self, chunk: bytes) -> None:
        for out in self._stages.out(chunk):
            self.inner.write(out)

"""The one stream pump: reads an upstream stream into the client's, whatever the path.

Both streaming paths (translating: `backends.openai.stream`; passthrough:
`backends.anthropic.relay`) read the same way; only what they make of the bytes differs,
and that is a `Transformer`. The pump owns the rest, once: waiting for the body to begin
(a retried stream's may come from another instance), keep-alives on silence, the idle
timeout (`keepalive.ReadWatch`), writing straight to the client from the connection's
callback once the stream has started (`DirectWrites`), and what becomes of the upstream
response at the end (reused, read to its end in the background, or closed). It also runs
the reply's observers and transforms (`calls.streams`) on what it yields and what it writes
directly alike, so that nothing else needs to wrap a stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Generic, Protocol, TypeVar

from dragoman.calls.streams import StagedWriter, Stages
from dragoman.calls.types import ClientWriter, DirectWrites
from dragoman.core.config import UpstreamConfig
from dragoman.upstream.errors import upstream_errors
from dragoman.upstream.keepalive import BodyEnds, ReadWatch, Silence
from dragoman.upstream.opening import Opening
from dragoman.upstream.transport.response import Response

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Transformer(Protocol[T_co]):
    """What one path makes of an upstream stream's bytes. The pump calls `feed` for each
    read and `feed_to` for each piece written straight to the client (only once `started`,
    and only for a stream whose outputs are SSE bytes); `finish` once the upstream's stream
    or the reply has ended. Outputs go to the client (or the caller) as they are yielded, so
    a transformer that fails yields what came before the failure first, then raises."""

    @property
    def started(self) -> bool:
        """The reply's first event has gone out: pieces may go straight to the client."""
        ...

    @property
    def ended(self) -> bool:
        """The reply has ended (or the upstream's stream has): nothing more is read."""
        ...

    @property
    def cut(self) -> bool:
        """The reply ended before the upstream's stream (a stop sequence): the upstream is
        closed at once, so that its generation stops."""
        ...

    def silence(self) -> T_co | None:
        """What fills one keep-alive interval without data (a ping, a comment line), if anything."""
        ...

    def resent(self, response: Response) -> None:
        """The body comes from `response`, another instance's: the request was sent again."""
        ...

    def feed(self, data: bytes) -> Iterable[T_co]:
        """One read's outputs (GatewayError after those that came before the failure)."""
        ...

    def feed_to(self, data: bytes, writer: ClientWriter) -> None:
        """One piece, its output written to `writer` (what came before a failure too)."""
        ...

    def finish(self) -> AsyncIterator[T_co]:
        """The reply's last outputs; GatewayError if the upstream's stream ended too soon."""
        ...

    def abandoned(self) -> None:
        """The stream ended before the reply did (a failure, the client leaving): note what
        is known so far (the usage the upstream reported)."""
        ...


class Pump:
    """How one upstream's streams are read: its name (in errors), its timeouts, and the
    keep-alive interval (`silence` after that long without a read)."""

    __slots__ = ("_keepalive", "_upstream", "ends", "name")

    def __init__(self, name: str, upstream: UpstreamConfig, keepalive: float, ends: BodyEnds) -> None:
        self.name = name
        self._upstream = upstream
        self._keepalive = keepalive
        self.ends = ends  # the gateway's: bodies read past their stream's end

    def run(
        self, response: Response, transformer: Transformer[T], direct: DirectWrites | None = None
    ) -> AsyncGenerator[T, None]:
        """The stream's outputs. After the first, reads go straight to `direct`'s writer when
        there is one, from the connection's callback. Raises GatewayError after yielding what
        came before the failure; always releases or closes the upstream response."""
        return _Run(self, response, transformer, direct).outputs()


class _Run(Generic[T]):
    """One stream being pumped."""

    __slots__ = ("_name", "_pump", "_response", "_t", "_watch", "_writes", "_failed", "_stages", "_staged")

    def __init__(
        self, pump: Pump, response: Response, transformer: Transformer[T], direct: DirectWrites | None
    ) -> None:
        self._name = pump.name
        self._pump = pump
        self._response = response
        self._t = transformer
        self._watch: ReadWatch  # made once the stream is read: it times the reading task
        self._writes = direct if direct is not None else DirectWrites()
        self._failed: BaseException | None = None  # what a direct write raised, raised again by `outputs`
        self._stages: Stages | None = None  # the reply's observers and transforms (`calls.streams`), if any
        self._staged: StagedWriter | None = None  # the client's writer behind them

    async def outputs(self) -> AsyncGenerator[T, None]:
        pump, t, writes = self._pump, self._t, self._writes
        self._watch = watch = ReadWatch.for_upstream(pump._upstream, interval=pump._keepalive, name=pump.name)
        self._stages = stages = writes.stages  # registered before the first output was asked for
        opening = self._response.opening  # a stream's head alone is no answer: until its body begins
        finished = False
        try:
            if opening is not None:
                async for keepalive in self._begin(opening):
                    yield self._keepalive(keepalive)
            response = self._response  # the one whose body began
            while not t.ended:
                if t.started and writes.writer is not None:
                    if await self._drain():  # a silence
                        ping = t.silence()
                        if ping is not None:
                            yield self._keepalive(ping)
                        continue
                    if t.ended:
                        break
                try:
                    with upstream_errors(self._name):
                        data = await watch.read(response.readany())
                except Silence:
                    ping = t.silence()
                    if ping is not None:
                        yield self._keepalive(ping)
                    continue
                if not data:
                    break
                if stages is None:
                    for out in t.feed(data):
                        yield out
                else:
                    for out in t.feed(data):
                        for staged in stages.out(out):  # type: ignore[arg-type]  # staged streams are bytes
                            yield staged  # type: ignore[misc]
            if t.cut:
                self._response.close()  # the generation stops now, not after the reply's last outputs
            async for out in t.finish():
                if stages is None:
                    yield out
                else:
                    for staged in stages.out(out):  # type: ignore[arg-type]
                        yield staged  # type: ignore[misc]
            if stages is not None and stages.transforms:
                async for out in self._ends(stages):
                    yield out
            finished = True
            if not t.cut:
                self._pump.ends.end_body(
                    self._response
                )  # the client's reply ends now, not when the server ends its body
        finally:
            watch.close()
            if opening is not None:
                opening.close()
            if not finished:
                self._response.close()  # stops the backend's generation
                t.abandoned()

    def _keepalive(self, keepalive: T) -> T:
        if self._stages is not None:
            self._stages.seen(keepalive)  # type: ignore[arg-type]
        return keepalive

    async def _ends(self, stages: Stages) -> AsyncIterator[T]:
        """The transforms' last outputs (`Stages.ends`), with keep-alives while they take time
        (a verdict awaited, another upstream call): the client sees the stream alive."""
        ends = stages.ends()
        try:
            while True:
                step = asyncio.ensure_future(anext(ends))
                try:
                    while not (await asyncio.wait({step}, timeout=self._pump._keepalive))[0]:
                        ping = self._t.silence()
                        if ping is not None:
                            yield self._keepalive(ping)
                finally:
                    if not step.done():  # the client left: the transform's wait ends with it
                        step.cancel()
                        await asyncio.wait({step})
                try:
                    out = step.result()
                except StopAsyncIteration:
                    return
                yield out  # type: ignore[misc]  # staged streams are bytes
        finally:
            await ends.aclose()

    async def _begin(self, opening: Opening) -> AsyncIterator[T]:
        """Keep-alives until the body begins: it may come from another instance (no content
        block has gone out)."""
        while True:
            try:
                with upstream_errors(self._name):
                    begun = await opening.begun(self._response, self._watch)
                break
            except Silence:
                keepalive = self._t.silence()
                if keepalive is not None:
                    yield keepalive
        if begun is not self._response:
            self._t.resent(begun)
            self._response = begun

    async def _drain(self) -> bool:
        """Pieces straight to the client until one waits for `readany` (the client is slow, or
        the body ended or failed); True after a silence, for the caller's keep-alive."""
        try:
            await self._watch.read(self._response.drain_to(self._to_client))
        except Silence:
            if self._failed is None:  # (a failure in the same loop turn as the timer: no keep-alive)
                return True
        if self._failed is not None:
            raise self._failed
        return False

    def _to_client(self, data: bytes) -> bool:
        """`Response.drain_to`'s sink, in the connection's callback: must not raise."""
        writer = self._writes.writer
        if writer is None or self._failed is not None or not writer.ready():
            return False  # e.g. the client is slow: this read goes through `readany`, and `send` waits
        self._watch.touch()
        if self._stages is not None:  # the observers and transforms see what is written directly too
            staged = self._staged
            if staged is None or staged.inner is not writer:
                staged = self._staged = self._stages.writer(writer)
            writer = staged
        try:
            self._t.feed_to(data, writer)
        except BaseException as error:  # noqa: BLE001 - raised again by `outputs`
            self._failed = error
        if self._failed is not None or self._t.ended:
            self._response.stop_sink()
        return True

"""The one stream pump (`upstream.pump`) with a transformer of the test's own: each path
plugs into it the same way, and what becomes of the upstream response is the pump's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from dragoman.calls.types import ClientWriter, DirectWrites, Streaming
from dragoman.core.config_load import from_dict
from dragoman.core.errors import GatewayError, UpstreamError
from dragoman.upstream.keepalive import BodyEnds
from dragoman.upstream.pump import Pump
from tests.support.responses import ReadyWriter as Writer
from tests.support.responses import ScriptedResponse


class Upper:
    """Upper-cases each read; the reply ends at a read saying b"end" (cut: at b"stop");
    a read saying b"bad" fails after its output."""

    def __init__(self) -> None:
        self.started = self.ended = self.cut = False
        self.finished = self.left = False

    def silence(self) -> bytes | None:
        return b":\n\n"

    def resent(self, response: Any) -> None:
        pass

    def abandoned(self) -> None:
        self.left = True

    def feed(self, data: bytes) -> Iterable[bytes]:
        self.started = True
        self.ended = data in (b"end", b"stop")
        self.cut = data == b"stop"
        if data == b"bad":
            return self._fail(data)
        return (data.upper(),)

    def _fail(self, data: bytes) -> Iterable[bytes]:
        yield data.upper()
        raise UpstreamError("bad read")

    def feed_to(self, data: bytes, writer: ClientWriter) -> None:
        self.ended = data in (b"end", b"stop")
        writer.write(data.upper())

    async def finish(self) -> AsyncIterator[bytes]:
        self.finished = True
        if not self.ended:
            raise UpstreamError("closed too soon")
        yield b"FIN"


def pump(keepalive: float = 15) -> Pump:
    config = from_dict({"upstreams": {"up": {"url": "http://127.0.0.1:9/v1"}}})
    return Pump("up", config.upstreams["up"], keepalive=keepalive, ends=BodyEnds())


async def run(reads: list[bytes]) -> tuple[list[bytes], ScriptedResponse, BaseException | None]:
    response = ScriptedResponse(reads)
    out: list[bytes] = []
    try:
        async for chunk in pump().run(response, Upper()):  # type: ignore[arg-type]
            out.append(chunk)
    except GatewayError as error:
        return out, response, error
    return out, response, None


def test_each_read_goes_through_the_transformer_then_its_finish_and_the_connection_is_reused() -> None:
    out, response, error = asyncio.run(run([b"a", b"b", b"end"]))
    assert error is None
    assert out == [b"A", b"B", b"END", b"FIN"]
    assert response.released and not response.closed


def test_a_failing_read_sends_what_came_before_it_and_drops_the_connection() -> None:
    out, response, error = asyncio.run(run([b"a", b"bad", b"end"]))
    assert isinstance(error, UpstreamError) and "bad read" in str(error)
    assert out == [b"A", b"BAD"]
    assert response.closed and not response.released


def test_a_stream_ending_too_soon_is_the_transformers_error_and_drops_the_connection() -> None:
    out, response, error = asyncio.run(run([b"a"]))
    assert isinstance(error, UpstreamError) and "too soon" in str(error)
    assert out == [b"A"]
    assert response.closed


def test_a_cut_reply_closes_the_upstream_before_its_last_outputs() -> None:
    out, response, error = asyncio.run(run([b"a", b"stop", b"more"]))
    assert error is None and out == [b"A", b"STOP", b"FIN"]
    assert response.closed and not response.released


def test_the_pump_reads_nothing_more_once_the_reply_ended() -> None:
    response = ScriptedResponse([b"a", b"end", b"never"])

    async def go() -> list[bytes]:
        return [chunk async for chunk in pump().run(response, Upper())]  # type: ignore[arg-type]

    assert asyncio.run(go()) == [b"A", b"END", b"FIN"]  # what follows the end is no part of the reply


def test_a_silent_upstream_gets_the_transformers_keepalive_between_reads() -> None:
    response = ScriptedResponse([b"a", 0.3, b"end"])  # quiet for longer than the keep-alive interval

    async def go() -> list[bytes]:
        return [chunk async for chunk in pump(keepalive=0.05).run(response, Upper())]  # type: ignore[arg-type]

    out = asyncio.run(go())
    assert out[0] == b"A" and out[-2:] == [b"END", b"FIN"]
    assert set(out[1:-2]) == {b":\n\n"} and out[1:-2]  # keep-alives only, at least one


def test_after_the_first_output_pieces_go_straight_to_the_clients_writer() -> None:
    response = ScriptedResponse([b"a", b"b", b"c", b"end"])
    writer = Writer()

    async def go() -> list[bytes]:
        direct = DirectWrites(writer)
        return [chunk async for chunk in pump().run(response, Upper(), direct)]  # type: ignore[arg-type]

    assert asyncio.run(go()) == [b"A", b"FIN"]  # the first through the generator, the end too
    assert writer.written == [b"B", b"C", b"END"]
    assert response.released


def test_a_stream_that_fails_tells_its_transformer_so_and_one_that_ends_does_not() -> None:
    async def go(reads: list[bytes]) -> Upper:
        upper = Upper()
        with contextlib.suppress(GatewayError):
            async for _ in pump().run(ScriptedResponse(reads), upper):  # type: ignore[arg-type]
                pass
        return upper

    assert asyncio.run(go([b"a", b"bad"])).left  # it notes the usage reported so far
    assert not asyncio.run(go([b"a", b"end"])).left


class HoldEnd:
    """Holds the piece saying END until `verdict` is set, then sends it after its own."""

    def __init__(self) -> None:
        self.verdict = asyncio.Event()
        self.held: list[bytes] = []

    def feed(self, chunk: bytes) -> Iterable[bytes]:
        if chunk == b"END":
            self.held.append(chunk)
            return ()
        return (chunk.lower(),)

    async def finish(self) -> AsyncIterator[bytes]:
        await self.verdict.wait()
        yield b"VERDICT"
        for chunk in self.held:
            yield chunk


def staged_run(reads: list[bytes | float], *stages: Any, keepalive: float = 15) -> tuple[list[bytes], Writer, Any]:
    """The pump in direct mode with `stages` registered on the reply as the assembly does
    (observers are lists to append to); what was yielded, and the client's writer."""
    writer = Writer()
    direct = DirectWrites(writer)
    reply = Streaming(pump(keepalive).run(ScriptedResponse(reads), Upper(), direct), direct=direct)  # type: ignore[arg-type]
    for stage in stages:
        if isinstance(stage, list):
            reply.observe(stage.append)
        else:
            reply.transform(stage)

    async def go() -> list[bytes]:
        return [chunk async for chunk in reply.chunks]

    return asyncio.run(go()), writer, reply


def test_an_observer_sees_every_byte_the_client_gets_when_the_pump_writes_directly() -> None:
    seen: list[bytes] = []
    yielded, writer, _ = staged_run([b"a", b"b", b"c", b"end"], seen)
    assert writer.written == [b"B", b"C", b"END"]  # written directly, past any wrapper of `chunks`
    assert seen == [b"A", b"B", b"C", b"END", b"FIN"] == [yielded[0], *writer.written, yielded[1]]


def test_an_observer_sees_the_keepalives_too() -> None:
    seen: list[bytes] = []
    yielded, writer, _ = staged_run([b"a", 0.3, b"end"], seen, keepalive=0.05)
    assert b":\n\n" in seen and seen == [*yielded[:-1], *writer.written, yielded[-1]]


def test_a_transform_holding_the_last_event_sends_it_after_its_verdict_in_direct_mode() -> None:
    hold, seen = HoldEnd(), []
    hold.verdict.set()
    yielded, writer, _ = staged_run([b"a", b"b", b"end"], hold, seen)
    assert writer.written == [b"b"]  # END held back, the rest rewritten on the way
    assert yielded == [b"a", b"fin", b"VERDICT", b"END"]
    assert seen == [b"a", b"b", b"fin", b"VERDICT", b"END"]  # observers see what the client gets


def test_keepalives_go_on_while_a_transform_waits_for_its_verdict() -> None:
    hold, seen = HoldEnd(), []
    out: list[bytes] = []

    async def go() -> None:
        writer = Writer()
        direct = DirectWrites(writer)
        reply = Streaming(pump(0.02).run(ScriptedResponse([b"a", b"end"]), Upper(), direct), direct=direct)  # type: ignore[arg-type]
        reply.transform(hold)
        reply.observe(seen.append)
        async for chunk in reply.chunks:
            out.append(chunk)
            if out.count(b":\n\n") == 3:  # the stream stayed alive while the verdict was awaited
                hold.verdict.set()

    asyncio.run(go())
    assert out == [b"a", b"fin", b":\n\n", b":\n\n", b":\n\n", b"VERDICT", b"END"]
    assert seen == out


def test_a_client_leaving_during_the_verdict_ends_the_transforms_wait() -> None:
    hold = HoldEnd()

    async def go() -> bool:
        direct = DirectWrites(Writer())
        reply = Streaming(pump(0.02).run(ScriptedResponse([b"a", b"end"]), Upper(), direct), direct=direct)  # type: ignore[arg-type]
        reply.transform(hold)
        chunks = reply.chunks
        async for chunk in chunks:
            if chunk == b":\n\n":
                break
        await chunks.aclose()  # type: ignore[attr-defined]
        return hold.verdict.is_set()

    assert asyncio.run(go()) is False  # closed without waiting for a verdict that never comes


def test_a_stream_without_a_pump_runs_its_stages_around_its_chunks() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b"A", b"END"):
            yield chunk

    hold, seen = HoldEnd(), []
    hold.verdict.set()
    reply = Streaming(chunks())
    reply.transform(hold)
    reply.observe(seen.append)

    async def go() -> list[bytes]:
        return [chunk async for chunk in reply.chunks]

    assert asyncio.run(go()) == seen == [b"a", b"VERDICT", b"END"]

"""The one stream pump (`upstream.pump`) with a transformer of the test's own: each path
plugs into it the same way, and what becomes of the upstream response is the pump's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from dragoman.calls.types import ClientWriter, DirectWrites
from dragoman.core.config_load import from_dict
from dragoman.core.errors import GatewayError, UpstreamError
from dragoman.upstream.pump import Pump
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
    return Pump("up", config.upstreams["up"], keepalive=keepalive)


class Writer:
    """The client's side of direct writes: always ready, keeps what it was given."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def ready(self) -> bool:
        return True

    def write(self, chunk: bytes) -> None:
        self.written.append(chunk)


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

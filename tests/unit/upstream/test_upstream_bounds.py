"""What an upstream's reply may cost the gateway: a compressed body is inflated in
bounded pieces, never far ahead of its reader and never past MAX_INFLATED; a body read
whole stops at MAX_BODY; and one whose bytes stop coming fails after `idle_timeout`.
The bounds are asserted through the errors raised and the bytes inflated, not by time."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest

from dragoman.core.errors import UpstreamError, UpstreamTimeout
from dragoman.core.redaction import Redactor
from dragoman.upstream.errors import _mapped
from dragoman.upstream.transport import connection
from dragoman.upstream.transport.connection import HIGH_WATER, INFLATE_PIECE, BadResponse, BodyTimeout
from tests.support.peers import (  # noqa: F401 (loop_kind: the fixture)
    Peer,
    Script,
    fed,
    get,
    loop_kind,
    ok,
    run,
    scripted_pool,
)
from tests.support.samples import MiB, gzip_bomb

# The most one callback or one `readany` inflates before handing over: its budget, plus the last piece.
STEP = HIGH_WATER + INFLATE_PIECE


def test_the_bomb_is_what_it_claims() -> None:
    bomb = gzip_bomb(8)
    inflated = zlib.decompressobj(47).decompress(bomb)
    assert len(inflated) == 8 * MiB and not inflated.strip(b"\0")
    assert len(gzip_bomb(1024)) < 1.1 * MiB  # 1 MB on the wire for 1 GiB inflated
    assert zlib.decompressobj(47).decompress(gzip_bomb(1, prefix=b"data: x\n\n")).startswith(b"data: x\n\n\0")


def chunked(head: bytes, body: bytes, piece: int = 16 * 1024) -> list[bytes]:
    return [
        head,
        *(b"%x\r\n%s\r\n" % (len(body[i : i + piece]), body[i : i + piece]) for i in range(0, len(body), piece)),
        b"0\r\n\r\n",
    ]


GZIP_CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
)


# -- a compressed body is inflated in bounded steps --------------------------------------


def test_a_bomb_arriving_in_one_read_is_inflated_one_step_at_a_time() -> None:
    """Even one read holding a whole bomb (1 GiB inflated) costs one callback only a
    bounded amount of inflating: the rest waits for the reader, a step per `readany`."""

    async def main() -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n"
        bomb = gzip_bomb(1024)
        response = await fed(head % len(bomb) + bomb)
        assert response._inflated <= STEP  # what the callback did
        for _ in range(4):
            assert len(await response.readany()) <= STEP
            assert response._inflated <= 5 * STEP
        response.close()

    run(main)


def test_a_bomb_read_whole_fails_at_max_body_with_a_502() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        bomb = gzip_bomb(1024)
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(bomb), bomb)

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/v1/chat/completions", b"", b"{}")
            with pytest.raises(BadResponse, match="exceeds 64 MiB") as caught:
                await response.read()
            assert response._inflated <= connection.MAX_BODY + STEP  # stopped at the bound, not at 1 GiB
            response.release()
            mapped = _mapped(caught.value, "up")
            assert isinstance(mapped, UpstreamError) and mapped.status == 502 and "exceeds 64 MiB" in str(mapped)

    run(main)


def test_a_streamed_bomb_stays_within_high_water_and_fails_past_max_inflated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read as a stream, a slow reader never has more than a step waiting, and the body
    fails once MAX_INFLATED bytes came out of it (made small here: the real bound is the
    same code, 256 MiB)."""
    monkeypatch.setattr("dragoman.upstream.transport.inflate.MAX_INFLATED", 8 * MiB)

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(*chunked(GZIP_CHUNKED.replace(b"application/json", b"text/event-stream"), gzip_bomb(64, b"\n")))
        await peer.until_eof()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/", b"", b"{}")
            seen = 0
            with pytest.raises(BadResponse, match="inflates past 8 MiB") as caught:
                while True:
                    await asyncio.sleep(0.001)  # a slow reader: the upstream's bytes pile up meanwhile
                    data = await response.readany()
                    assert 0 < len(data) <= STEP
                    seen += len(data)
            assert 7 * MiB < seen <= 8 * MiB
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)  # and the connection is dropped
            assert _mapped(caught.value, "up").status == 502  # type: ignore[union-attr]
            response.release()

    run(main)


def test_a_sink_taking_a_bomb_gets_a_step_per_callback_then_readany_goes_on() -> None:
    async def main() -> None:
        bomb = gzip_bomb(64, b"\n")
        response = await fed(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(bomb))
        taken: list[int] = []
        draining = asyncio.ensure_future(response.drain_to(lambda piece: bool(taken.append(len(piece))) or True))
        await asyncio.sleep(0)
        response._conn.data_received(bomb)  # all of it in one read, handed to the sink
        await draining  # returns: the rest waits for readany
        assert 0 < sum(taken) <= STEP and max(taken) <= INFLATE_PIECE
        assert len(await response.readany()) <= STEP
        response.close()

    run(main)


@pytest.mark.parametrize("sink", [False, True], ids=["readany", "drain_to"])
def test_a_large_compressed_body_arrives_whole_and_the_connection_is_reused(sink: bool) -> None:
    """The pieces that waited for the reader come out whole and in order, the body then
    ends, and the connection, paused meanwhile, reads again for the next request."""
    text = b"".join(b"event %d: %s\n" % (i, b"token " * (i % 50)) for i in range(60_000))
    packed = gzip.compress(text)
    assert len(text) > 20 * HIGH_WATER and len(packed) < len(text) // 10

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(*chunked(GZIP_CHUNKED, packed, piece=256 * 1024))
        await peer.request()
        await peer.send(ok(b"next"))

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"GET", "/", b"", None)
            parts: list[bytes] = []
            while True:
                if sink:
                    await response.drain_to(lambda piece: bool(parts.append(piece)) or True)
                data = await response.readany()
                if not data:
                    break
                parts.append(data)
            assert b"".join(parts) == text
            response.release()
            assert await get(pool, server.root) == b"next"
            assert len(server.peers) == 1

    run(main)


def test_a_corrupt_stream_found_in_a_later_step_is_a_bad_response() -> None:
    async def main() -> None:
        good = gzip_bomb(4)
        body = good + b"\xff" * 64  # past 4 MiB of zeros, garbage
        response = await fed(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        )
        with pytest.raises(BadResponse, match="corrupt"):
            await response.read()

    run(main)


# -- a body read whole ---------------------------------------------------------------------


def test_a_body_read_whole_fails_past_max_body_naming_the_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dragoman.upstream.transport.body.MAX_BODY", 1 * MiB)

    async def handler(peer: Peer) -> None:
        await peer.request()
        try:
            await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (8 * MiB), *[b"x" * MiB] * 8)
            await peer.until_eof()
        except ConnectionError:  # the gateway hung up while this was still sending
            peer.eof.set()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/", b"", b"{}")
            with pytest.raises(BadResponse, match="exceeds 1 MiB"):
                await response.read()
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)  # the rest is not read: the connection is dropped
            with pytest.raises(BadResponse, match="exceeds 1 MiB"):  # and a read after the failure fails, not hangs
                await response.read()
            response.release()

    run(main)


def test_a_body_up_to_max_body_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dragoman.upstream.transport.body.MAX_BODY", 1 * MiB)

    async def main() -> None:
        response = await fed(ok(b"x" * MiB))
        assert await response.read() == b"x" * MiB

    run(main)


def test_a_body_that_stops_coming_fails_after_idle_timeout_and_drops_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n", b'{"id": ')
        await peer.until_eof(timeout=5)  # headers, a few bytes, then silence

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/", b"", b"{}", head_timeout=5, idle_timeout=0.2)
            with pytest.raises(BodyTimeout, match="no bytes for 0.2 s") as caught:
                await response.read()
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)
            response.release()
            mapped = _mapped(caught.value, "up")
            assert isinstance(mapped, UpstreamTimeout) and mapped.type == "timeout_error" and mapped.status == 504

    run(main)


def test_a_body_that_keeps_coming_outlasts_idle_timeout() -> None:
    """The deadline is for silence, not for the whole body: one that trickles in over
    several idle timeouts is read whole."""

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(12):
            await peer.send(b"1\r\nx\r\n")
            await asyncio.sleep(0.05)
        await peer.send(b"0\r\n\r\n")
        await peer.request()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/", b"", b"{}", idle_timeout=0.2)
            assert await response.read() == b"x" * 12
            response.release()

    run(main)


def test_without_an_idle_timeout_read_sets_no_timer() -> None:
    async def main() -> None:
        response = await fed(ok(b"ok"))
        assert response.idle_timeout is None
        assert await response.read() == b"ok"

    run(main)


def test_the_idle_timeout_reaches_the_response_from_the_upstreams_config() -> None:
    from dragoman.core.config import OpenAIUpstream
    from dragoman.upstream.client import HttpClient

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{")
        await peer.until_eof(timeout=5)

    async def main() -> None:
        async with Script(handler) as server:
            client = HttpClient(
                "up", OpenAIUpstream(url=server.root, idle_timeout=0.2, max_retries=0), None, redactor=Redactor()
            )
            response = await client.post("/chat/completions", b"{}")
            assert response.idle_timeout == 0.2
            with pytest.raises(BodyTimeout):
                await response.read()
            response.release()
            await client.close()

    run(main)


# -- the response head ---------------------------------------------------------------------


def test_an_endless_header_value_fails_at_max_head_and_drops_the_connection() -> None:
    """httptools holds an unfinished header value whole; the head's bytes are counted as they
    are read, so the value stops at MAX_HEAD and the connection is closed, not read on."""

    async def endless(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\nx-endless: ")
        with pytest.raises(ConnectionError):
            for _ in range(4096):  # 256 MiB if the gateway read it all: it must hang up long before
                await peer.send(b"a" * 65536)
                if peer.reader.at_eof():
                    raise ConnectionResetError
        peer.eof.set()

    async def main() -> None:
        async with scripted_pool(endless) as (server, pool):
            with pytest.raises(BadResponse, match="response head exceeds 64 KB"):
                await get(pool, server.root)
            await asyncio.wait_for(server.peers[0].eof.wait(), 5)

    run(main)


@pytest.mark.parametrize("split", [False, True])
def test_a_head_just_under_max_head_with_its_body_in_the_same_read_is_read(split: bool) -> None:
    headers = b"".join(b"x-h%d: %s\r\n" % (n, b"v" * 1000) for n in range(60))  # about 61 KB
    reply = ok(b"b" * (3 * MiB), headers)

    async def main() -> None:
        pieces = [reply[i : i + 1000] for i in range(0, 64_000, 1000)] + [reply[64_000:]] if split else [reply]
        response = await fed(*pieces)
        assert response.status == 200 and response.headers["x-h59"] == "v" * 1000
        assert await response.read() == b"b" * (3 * MiB)

    run(main)


def test_a_head_past_max_head_in_one_read_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(BadResponse, match="response head exceeds 64 KB"):
            await fed(ok(b"", b"x-big: " + b"v" * (64 * 1024) + b"\r\n"))

    run(main)

"""dragoman's own upstream HTTP/1.1 client (`upstream.transport`: pool, connection, response)
over real loopback sockets, against scripted servers that write raw bytes so the framing
(Content-Length, chunked, close-delimited) is exact: bodies, keep-alive, stale pooled
connections and disconnects. Encodings, cancellation, the request's bytes, connecting, TLS
and proxies: test_upstream_wire.py."""

from __future__ import annotations

import asyncio

import pytest

from dragoman.upstream.transport.connection import Disconnected, StaleConnection
from tests.support.peers import (
    Peer,
    answer_each,
    get,
    loop_kind,  # noqa: F401 (the fixture: each test on asyncio and uvloop)
    ok,
    run,
    scripted_pool,
)


def test_content_length_body_and_head() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 201 Created\r\nContent-Type: Text/Plain; charset=utf-8\r\nX-Thing: a\r\nx-thing: b\r\n"
                        b"Content-Length: 11\r\n\r\nhello world")  # fmt: skip
        await peer.request()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"GET", "/", b"", None)
            assert response.status == 201
            assert response.headers["x-thing"] == "a, b"  # names lower-cased, repeats joined
            assert response.content_type == "text/plain"
            assert await response.read() == b"hello world"
            assert await response.readany() == b""
            response.release()

    run(main)


def test_chunked_body_arrives_in_pieces_then_ends() -> None:
    go_on = [asyncio.Event(), asyncio.Event()]

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n",
            b"5\r\nhello\r\n",
        )
        await go_on[0].wait()
        await peer.send(b"6\r\n world\r\n")
        await go_on[1].wait()
        await peer.send(b"1\r\n!\r\n0\r\n\r\n")
        await peer.request()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/stream", b"", b"{}")
            assert response.content_type == "text/event-stream"
            assert await response.readany() == b"hello"
            go_on[0].set()
            assert await response.readany() == b" world"
            go_on[1].set()
            assert await response.readany() == b"!"
            assert await response.readany() == b""
            assert await response.readany() == b""  # and stays at the end
            response.release()

    run(main)


def test_drain_to_hands_pieces_to_the_sink_until_it_declines_one_then_readany_has_it() -> None:
    begin, go_on = asyncio.Event(), asyncio.Event()
    handed = {piece: asyncio.Event() for piece in (b"one", b"two", b"three")}

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await begin.wait()
        for piece, given in handed.items():
            await peer.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            await given.wait()  # each piece its own read: the next goes once the sink had this one
        await go_on.wait()
        await peer.send(b"4\r\nfour\r\n0\r\n\r\n")
        await peer.request()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/stream", b"", b"{}")
            taken: list[bytes] = []
            begin.set()

            def sink(piece: bytes) -> bool:
                handed[piece].set()
                if piece == b"three":
                    return False
                taken.append(piece)
                return True

            await response.drain_to(sink)  # returns when a piece is declined
            assert taken == [b"one", b"two"]
            assert await response.readany() == b"three"  # the declined piece, not lost
            go_on.set()
            await response.drain_to(lambda piece: False)  # declines every piece
            assert await response.readany() == b"four"
            await response.drain_to(sink)  # the body has ended: returns at once
            assert await response.readany() == b""
            response.release()

    run(main)


def test_drain_to_hands_the_chunks_of_one_read_as_one_piece() -> None:
    begin, later = asyncio.Event(), asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await begin.wait()
        await peer.send(b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n")  # three chunks, one read
        await later.wait()
        await peer.send(b"4\r\nfour\r\n0\r\n\r\n")  # the last, then the body's end
        await peer.request()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/stream", b"", b"{}")
            pieces: list[bytes] = []

            def sink(piece: bytes) -> bool:
                pieces.append(piece)
                later.set()
                return True

            begin.set()
            await response.drain_to(sink)  # returns at the body's end
            assert pieces == [b"onetwothree", b"four"]  # one call (one write to the client) per read
            assert await response.readany() == b""
            response.release()

    run(main)


def test_drain_to_returns_when_the_sink_stops_or_the_body_ends_or_fails() -> None:
    begin = asyncio.Event()
    handed = {piece: asyncio.Event() for piece in (b"first", b"second", b"third")}

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await begin.wait()
        for piece, given in handed.items():
            await peer.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            await given.wait()  # each piece its own read: the next goes once a sink had this one
        peer.close()  # mid-body

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/stream", b"", b"{}")
            taken: list[bytes] = []

            def stopping(piece: bytes) -> bool:
                handed[piece].set()
                taken.append(piece)
                response.stop_sink()  # took this one, wants no more
                return True

            begin.set()
            await response.drain_to(stopping)
            assert taken == [b"first"]

            def taking(piece: bytes) -> bool:
                handed[piece].set()
                taken.append(piece)
                return True

            await response.drain_to(taking)
            assert taken == [b"first", b"second", b"third"]
            with pytest.raises(Disconnected):  # drain_to returned at the failure; readany reports it
                await response.readany()
            response.close()

    run(main)


def test_close_delimited_body_ends_at_the_close_and_is_not_reused() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n", b"abc")
        await asyncio.sleep(0.02)  # pacing: the body comes in two reads
        await peer.send(b"def")  # then the handler returns: the server closes

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert await get(pool, server.root) == b"abcdef"
            assert await get(pool, server.root) == b"abcdef"
            assert len(server.peers) == 2

    run(main)


def test_keep_alive_two_requests_share_one_connection() -> None:
    async def main() -> None:
        async with scripted_pool(answer_each) as (server, pool):
            assert await get(pool, server.root, "/a") == b"ok"
            assert await get(pool, server.root, "/b") == b"ok"
            assert len(server.peers) == 1
            assert [r.split(b" ")[1] for r in server.peers[0].requests] == [b"/a", b"/b"]

    run(main)


def test_a_connection_close_response_is_not_reused() -> None:
    async def handler(peer: Peer) -> None:  # says close but keeps answering: only the client can tell
        await answer_each(peer, ok(b"ok", b"connection: close\r\n"))

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert await get(pool, server.root) == b"ok"
            assert await get(pool, server.root) == b"ok"
            assert len(server.peers) == 2
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)  # the client closed the first
            assert len(server.peers[0].requests) == 1

    run(main)


def test_release_before_the_body_is_read_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello")  # half of it, for now
            await peer.until_eof()
        else:
            await answer_each(peer)

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"GET", "/", b"", None)
            response.release()
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)
            assert await get(pool, server.root) == b"ok"
            assert len(server.peers) == 2

    run(main)


def test_release_of_a_partly_read_body_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await peer.until_eof()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"GET", "/", b"", None)
            assert await response.readany() == b"abc"
            response.release()
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)

    run(main)


def test_close_drops_a_connection_that_could_have_been_reused() -> None:
    async def main() -> None:
        async with scripted_pool(answer_each) as (server, pool):
            response = await pool.request(server.root, b"GET", "/", b"", None)
            assert await response.read() == b"ok"
            response.close()
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)
            assert await get(pool, server.root) == b"ok"
            assert len(server.peers) == 2

    run(main)


def test_the_most_recently_used_idle_connection_is_taken() -> None:
    async def main() -> None:
        async with scripted_pool(answer_each) as (server, pool):
            first = await pool.request(server.root, b"GET", "/1", b"", None)
            second = await pool.request(server.root, b"GET", "/2", b"", None)  # the first is busy: a second connection
            assert len(server.peers) == 2
            for response in (first, second):
                await response.read()
            first.release()
            second.release()  # released last: taken first
            assert await get(pool, server.root, "/3") == b"ok"
            assert [r.split(b" ")[1] for r in server.peers[1].requests] == [b"/2", b"/3"]

    run(main)


def test_a_connection_idle_too_long_is_not_reused() -> None:
    async def main() -> None:
        async with scripted_pool(answer_each, idle_limit=0.0) as (server, pool):
            assert await get(pool, server.root) == b"ok"
            assert await get(pool, server.root) == b"ok"
            assert len(server.peers) == 2
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)

    run(main)


def test_a_pool_left_idle_closes_its_connections_after_the_idle_limit() -> None:
    """No request comes to take them: the pool's own timer lets them go (the upstream's
    sockets and the gateway's file descriptors are not held for ever)."""

    async def main() -> None:
        async with scripted_pool(answer_each, idle_limit=0.2) as (server, pool):
            first = await pool.request(server.root, b"GET", "/1", b"", None)
            second = await pool.request(server.root, b"GET", "/2", b"", None)
            for response in (first, second):
                await response.read()
                response.release()
            await asyncio.wait_for(asyncio.gather(*(peer.eof.wait() for peer in server.peers)), 2)
            assert all(not origin.idle for origin in pool._origins.values())

    run(main)


def test_bytes_on_an_idle_connection_make_it_unusable() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            await peer.send(ok(b"ok"))
            await asyncio.sleep(0.05)  # pacing: the bytes come after the reply, as it sits idle
            await peer.send(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n"
            )  # and keeps the connection open
            await peer.until_eof()
        else:
            await answer_each(peer)

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert await get(pool, server.root) == b"ok"
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)  # the client dropped it on the unasked-for bytes
            assert await get(pool, server.root) == b"ok"
            assert len(server.peers) == 2
            assert len(server.peers[0].requests) == 1

    run(main)


@pytest.mark.parametrize("pause", [0.0, 0.05], ids=["at-once", "after-a-pause"])
def test_a_pooled_connection_closed_while_idle_is_replaced(pause: float) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"first"))  # keep-alive by default, but the server closes right after

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert await get(pool, server.root) == b"first"
            await asyncio.sleep(
                pause
            )  # at once: the close may come while the request is on its way (then it is resent)
            assert await get(pool, server.root) == b"first"
            assert len(server.peers) == 2

    run(main)


def test_a_pooled_connection_closed_as_the_request_is_sent_is_resent_once_on_a_new_one() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"ok"))
        if peer.index == 0:
            await peer.request()  # reads the second request, then closes without a byte of answer
            return
        await answer_each(peer)

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert await get(pool, server.root, "/a") == b"ok"
            assert await get(pool, server.root, "/b") == b"ok"
            assert len(server.peers) == 2
            assert [r.split(b" ")[1] for r in server.peers[0].requests] == [b"/a", b"/b"]
            assert [r.split(b" ")[1] for r in server.peers[1].requests] == [b"/b"]  # sent again, once

    run(main)


def test_a_pooled_connection_closed_after_a_partial_answer_is_not_resent() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"ok"))
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncont")  # the upstream started answering: not safe to resend

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert await get(pool, server.root) == b"ok"
            with pytest.raises(Disconnected) as caught:
                await pool.request(server.root, b"POST", "/", b"", b"{}")
            assert not isinstance(caught.value, StaleConnection)
            assert len(server.peers) == 1

    run(main)


def test_a_content_length_body_cut_short_is_disconnected() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello")

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"GET", "/", b"", None)
            received = b""
            with pytest.raises(Disconnected, match="mid-reply"):
                while True:
                    received += await response.readany()
            assert received in (b"", b"hello")
            with pytest.raises(Disconnected):  # and again on the next read
                await response.readany()
            response.release()

    run(main)


def test_a_chunked_body_cut_short_is_disconnected() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await asyncio.sleep(0.05)  # pacing: the close comes in a later read than the piece

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"GET", "/", b"", None)
            assert await response.readany() == b"hello"
            with pytest.raises(Disconnected, match="mid-reply"):
                await response.readany()
            response.release()

    run(main)


def test_a_new_connection_closed_before_an_answer_is_disconnected_and_not_resent() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()  # then close

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            with pytest.raises(Disconnected, match="before answering") as caught:
                await pool.request(server.root, b"POST", "/", b"", b"{}")
            assert not isinstance(caught.value, StaleConnection)
            assert len(server.peers) == 1

    run(main)

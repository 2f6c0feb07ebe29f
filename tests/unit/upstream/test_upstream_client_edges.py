"""dragoman's upstream client where a review found it wrong: when a request is sent
again, empty and raw-deflate compressed bodies, a reset that ends a close-delimited
body, a configured Host, and a response that arrives as its caller is cancelled."""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib

import pytest

from dragoman.upstream.errors import _mapped
from dragoman.upstream.keepalive import head_or_task
from dragoman.upstream.transport import pool as pool_module
from dragoman.upstream.transport.connection import STALE_WINDOW, Disconnected, HeadTimeout
from dragoman.upstream.transport.pool import Origin, Pool
from tests.support.peers import (  # noqa: F401 (loop_kind: the fixture)
    Peer,
    Script,
    fed,
    get,
    loop_kind,
    new_pool,
    ok,
    run,
    scripted_pool,
)


def test_a_request_the_upstream_held_before_dropping_it_is_not_sent_again() -> None:
    """Only a close right as the request went out means the pooled connection was
    stale; after that the upstream may have worked on it, and resending is the retry
    policy's call (max_retries), not the pool's."""

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"ok"))
        if await peer.request() is not None:  # the second request on the same connection
            await asyncio.sleep(STALE_WINDOW + 0.2)  # "works on it", then dies without answering
            return

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert await get(pool, server.root, "/a") == b"ok"
            with pytest.raises(Disconnected, match="before answering"):
                await get(pool, server.root, "/b")
            assert len(server.peers) == 1  # no second connection: not sent again
            assert len(server.peers[0].requests) == 2

    run(main)


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\ncontent-encoding: gzip\r\n\r\n",
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-encoding: deflate\r\nretry-after: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
], ids=["200-empty", "204", "429-chunked-empty"])  # fmt: skip
def test_an_empty_body_with_a_content_encoding_is_empty_not_corrupt(head: bytes) -> None:
    async def main() -> None:
        response = await fed(head)
        assert await response.read() == b""

    run(main)


def test_raw_deflate_without_the_zlib_wrapper_is_decoded() -> None:
    text = b"raw deflate, as some servers send it " * 50
    packer = zlib.compressobj(wbits=-15)
    raw = packer.compress(text) + packer.flush()

    async def main() -> None:
        response = await fed(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: deflate\r\ncontent-length: %d\r\n\r\n" % len(raw) + raw
        )
        assert await response.read() == text

    run(main)


def test_a_reset_ends_a_close_delimited_body_with_an_error_not_a_short_body() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n", b"data: partial\n\n")
        sock = peer.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        peer.writer.transport.abort()

    async def main() -> None:
        async with Script(handler) as server:
            pool = new_pool(server.root)
            response = await pool.request(server.root, b"GET", "/", b"", None)
            try:
                with pytest.raises(Disconnected, match="mid-reply"):
                    await response.read()
            finally:
                response.close()
                await pool.close()

    run(main)


def test_a_configured_host_header_is_the_host_line() -> None:
    assert Origin("http://10.0.0.5:8000/v1", None, None, "models.internal").host_line == b"host: models.internal\r\n"

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"ok"))

    async def main() -> None:
        async with Script(handler) as server:
            pool = Pool([server.root], connect_timeout=2, tls=None, proxies={}, host="vhost.example")
            assert await get(pool, server.root) == b"ok"
            head = server.peers[0].requests[0].lower()
            assert head.count(b"host:") == 1 and b"\r\nhost: vhost.example\r\n" in head
            await pool.close()

    run(main)


def test_an_https_root_without_tls_settings_is_refused() -> None:
    with pytest.raises(ValueError, match="needs TLS"):
        Origin("https://api.example.com", None, None)


def test_a_response_that_arrives_as_its_caller_is_cancelled_is_closed() -> None:
    """The caller (a client that hung up) is cancelled in the same loop turn in which
    the upstream's head arrives: that response must be closed, or the upstream goes on
    generating for nobody."""
    closed: list[bool] = []

    class Head:
        def close(self) -> None:
            closed.append(True)

    async def main() -> None:
        caller: asyncio.Task[object] | None = None

        async def start() -> Head:
            await asyncio.sleep(0.01)
            assert caller is not None
            caller.cancel()  # the client leaves ...
            return Head()  # ... as the answer comes

        caller = asyncio.ensure_future(head_or_task(start(), 10))
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert closed == [True]

    run(main)


def test_a_black_holed_address_does_not_cost_the_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's first address drops every SYN (a listening socket whose accept queue is
    full does that on loopback); the next address is tried alongside after 0.25 s, so
    the request succeeds instead of waiting out the connect timeout on the first."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    filler = socket.create_connection(hole.getsockname())  # fills the queue: further SYNs go unanswered

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"ok"))

    async def main() -> None:
        async with Script(handler) as server:

            async def addresses(host: str, port: int) -> list[tuple]:  # type: ignore[type-arg]
                assert host == "models.test"
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", hole.getsockname()),
                        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", server.port))]  # fmt: skip

            monkeypatch.setattr(pool_module, "_addresses", addresses)
            root = f"http://models.test:{server.port}"
            pool = Pool([root], connect_timeout=3, tls=None, proxies={})
            assert await get(pool, root) == b"ok"  # one address at a time: ConnectFailed after 3 s instead
            await pool.close()

    try:
        run(main)
    finally:
        filler.close()
        hole.close()


def test_a_head_later_than_head_timeout_is_a_timeout_and_drops_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.until_eof(timeout=5)  # never answers; sees the gateway hang up

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            with pytest.raises(HeadTimeout, match="no response within 0.2 s"):
                await pool.request(server.root, b"POST", "/v1/chat/completions", b"", b"{}", head_timeout=0.2)
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)
            assert _mapped(HeadTimeout("no response within 0.2 s"), "up").type == "timeout_error"

    run(main)

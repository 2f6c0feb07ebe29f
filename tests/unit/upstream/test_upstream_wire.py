"""dragoman's own upstream HTTP/1.1 client over real loopback sockets, against scripted
servers: encoded and unreadable answers, interim answers, cancellation, the exact request
bytes, connecting, TLS, flow control and proxies."""

from __future__ import annotations

import asyncio
import base64
import gzip
import os
import socket
import ssl
import time
import zlib
from pathlib import Path

import pytest

from dragoman.core.errors import UpstreamError, UpstreamTimeout
from dragoman.upstream.client import _encode_headers
from dragoman.upstream.errors import _mapped
from dragoman.upstream.transport.connection import HIGH_WATER, BadResponse, ConnectFailed, Disconnected
from dragoman.upstream.transport.pool import Origin
from tests.support.forward_proxy import ForwardProxy
from tests.support.peers import (
    Peer,
    Script,
    answer_each,
    fed,
    get,
    loop_kind,  # noqa: F401 (the fixture: each test on asyncio and uvloop)
    new_pool,
    ok,
    run,
    scripted_pool,
)
from tests.support.samples import self_signed


def test_a_gzip_body_is_decoded() -> None:
    text = b"".join(b"line %d of a compressible body\n" % i for i in range(2000))
    packed = gzip.compress(text)

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(packed, b"content-encoding: gzip\r\n"))
        await peer.request()
        head = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
        pieces = [packed[i : i + 700] for i in range(0, len(packed), 700)]
        await peer.send(head, *(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces), b"0\r\n\r\n")
        await peer.request()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert len(packed) < len(text) // 4
            assert await get(pool, server.root) == text
            assert await get(pool, server.root) == text  # chunked and in pieces, on the same connection
            assert len(server.peers) == 1

    run(main)


def test_a_deflate_body_is_decoded() -> None:
    text = b"deflated " * 500

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(zlib.compress(text), b"content-encoding: deflate\r\n"))

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            assert await get(pool, server.root) == text

    run(main)


CORRUPT_GZIP = gzip.compress(b"hello")[:10] + b"\xff" * 20  # a gzip header, then an invalid deflate block type


def test_a_corrupt_gzip_body_is_a_bad_response() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(CORRUPT_GZIP + b"more to come", b"content-encoding: gzip\r\n")[:-12])
        await peer.until_eof()  # the client drops the connection: the rest never goes

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"GET", "/", b"", None)
            with pytest.raises(BadResponse, match="corrupt"):
                await response.read()
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)
            response.release()

    run(main)


def test_a_corrupt_gzip_body_ending_in_the_same_read_is_a_bad_response() -> None:
    async def main() -> None:
        response = await fed(ok(CORRUPT_GZIP, b"content-encoding: gzip\r\n"))  # head and whole body: one read
        with pytest.raises(BadResponse, match="corrupt"):
            await response.read()

    run(main)


def test_bytes_after_a_complete_response_are_not_taken_into_it() -> None:
    async def main() -> None:
        response = await fed(ok(b"ok"), b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 5\r\n\r\nabcde")
        seen = (response.status, response.headers.get("content-length"), await response.read())
        assert seen == (200, "2", b"ok"), seen

    run(main)


def test_a_truncated_gzip_body_is_a_bad_response() -> None:
    text = b"".join(b"line %d\n" % i for i in range(5000))
    packed = gzip.compress(text)

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(
            ok(packed[: len(packed) // 2], b"content-encoding: gzip\r\n")
        )  # Content-Length matches what is sent

    async def main() -> None:
        async with Script(handler) as server:
            pool = new_pool(server.root)
            response = await pool.request(server.root, b"GET", "/", b"", None)
            try:
                with pytest.raises(BadResponse, match="ends before"):
                    await response.read()
            finally:
                response.release()
                await pool.close()

    run(main)


def test_an_unknown_content_encoding_is_a_bad_response() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"\x0b\x02\x80hello\x03", b"content-encoding: br\r\n"))
        await peer.until_eof()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            with pytest.raises(BadResponse, match="content-encoding.*br"):
                await pool.request(server.root, b"GET", "/", b"", None)
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)  # and the connection is dropped

    run(main)


def test_garbage_instead_of_http_is_a_bad_response() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await peer.until_eof()

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            with pytest.raises(BadResponse, match="unreadable HTTP"):
                await pool.request(server.root, b"GET", "/", b"", None)
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)

    run(main)


def test_interim_responses_are_skipped() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        await asyncio.sleep(0.02)  # pacing: the interim answer in a read of its own
        await peer.send(
            b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n" + ok(b"final", b"x-final: yes\r\n")
        )
        await answer_each(peer)

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/", b"", b"{}")
            assert response.status == 200
            assert response.headers.get("x-final") == "yes"
            assert "link" not in response.headers  # the interim answer's headers are not the response's
            assert await response.read() == b"final"
            response.release()
            assert await get(pool, server.root) == b"ok"  # and the connection is still good for the next
            assert len(server.peers) == 1

    run(main)


def test_cancelling_a_request_waiting_for_its_head_closes_the_connection() -> None:
    asked = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        asked.set()
        await peer.until_eof(timeout=5)

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            task = asyncio.ensure_future(pool.request(server.root, b"POST", "/slow", b"", b"{}"))
            await asyncio.wait_for(asked.wait(), 2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(
                server.peers[0].eof.wait(), 4
            )  # closed by the cancel: the peer itself gives up only at 5 s

    run(main)


def test_a_timeout_around_the_request_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.until_eof(timeout=5)

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await pool.request(server.root, b"POST", "/slow", b"", b"{}")
            await asyncio.wait_for(server.peers[0].eof.wait(), 2)

    run(main)


def test_the_request_bytes_are_exact() -> None:
    big = os.urandom(40_000)  # above the size joined to the head: written separately

    async def main() -> None:
        async with Script(answer_each) as server:
            root = f"http://127.0.0.1:{server.port}/base/"
            pool = new_pool(root)
            lines = b"authorization: Bearer k\r\nx-custom: 1\r\n"
            for body in (b'{"a":1}', None, big):
                response = await pool.request(
                    root, b"POST" if body is not None else b"GET", "/v1/chat?q=1", lines, body
                )
                assert await response.read() == b"ok"
                response.release()
            port = server.port
            assert server.peers[0].requests == [
                b"POST /base/v1/chat?q=1 HTTP/1.1\r\nhost: 127.0.0.1:%d\r\nauthorization: Bearer k\r\nx-custom: 1\r\n"
                b'content-length: 7\r\n\r\n{"a":1}' % port,
                b"GET /base/v1/chat?q=1 HTTP/1.1\r\nhost: 127.0.0.1:%d\r\nauthorization: Bearer k\r\nx-custom: 1\r\n\r\n"
                % port,
                b"POST /base/v1/chat?q=1 HTTP/1.1\r\nhost: 127.0.0.1:%d\r\nauthorization: Bearer k\r\nx-custom: 1\r\n"
                b"content-length: 40000\r\n\r\n%s" % (port, big),
            ]
            await pool.close()

    run(main)


def test_the_host_line_leaves_out_a_default_port() -> None:
    assert Origin("http://models.example:80/v1", None, None).host_line == b"host: models.example\r\n"
    tls = ssl.create_default_context()
    assert Origin("https://models.example", tls, None).host_line == b"host: models.example\r\n"
    assert Origin("https://models.example:8443", tls, None).host_line == b"host: models.example:8443\r\n"
    assert Origin("http://[::1]:8000", None, None).host_line == b"host: [::1]:8000\r\n"


def test_header_values_with_line_breaks_or_nul_are_refused() -> None:
    for bad in ({"x": "a\r\nb"}, {"x": "a\nb"}, {"x": "a\rb"}, {"x": "a\0b"}, {"x\r\ny": "1"}):
        with pytest.raises(ValueError, match="line break or NUL"):
            _encode_headers(bad)
    assert (
        _encode_headers({"X-A": "1", "host": "evil", "Content-Length": "9", "b": "two words"})
        == b"X-A: 1\r\nb: two words\r\n"
    )


def test_connection_errors_are_mapped_once() -> None:
    unreachable = _mapped(ConnectFailed("refused"), "gpu")
    assert isinstance(unreachable, UpstreamError) and "upstream gpu is unreachable: refused" in str(unreachable)
    failed = _mapped(Disconnected("the upstream closed the connection mid-reply"), "gpu")
    assert isinstance(
        failed, UpstreamError
    ) and "upstream gpu failed: the upstream closed the connection mid-reply" in str(failed)
    assert isinstance(_mapped(BadResponse("x"), "gpu"), UpstreamError)
    assert isinstance(_mapped(TimeoutError(), "gpu"), UpstreamTimeout)
    assert _mapped(ValueError("x"), "gpu") is None


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_refused_connection_is_connect_failed() -> None:
    async def main() -> None:
        root = f"http://127.0.0.1:{_closed_port()}"
        pool = new_pool(root)
        with pytest.raises(ConnectFailed, match="cannot connect to 127.0.0.1"):
            await pool.request(root, b"GET", "/", b"", None)

    run(main)


def test_a_proxy_that_never_answers_connect_times_out() -> None:
    async def main() -> None:
        proxy = await ForwardProxy(hang_connect=True).start()
        try:
            root = "https://127.0.0.1:9"  # never reached
            pool = new_pool(root, proxies={root: proxy.url}, tls=ssl.create_default_context(), connect_timeout=0.3)
            started = time.monotonic()
            with pytest.raises(ConnectFailed, match="timed out"):  # the connect timeout's error, not wait_for's
                await asyncio.wait_for(pool.request(root, b"GET", "/", b"", None), 10)
            assert time.monotonic() - started > 0.25
            assert [s.line for s in proxy.connects] == ["CONNECT 127.0.0.1:9 HTTP/1.1"]
        finally:
            await proxy.stop()

    run(main)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"), "upstream")


def _server_tls(cert: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    return context


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
def test_a_large_body_read_slowly_arrives_whole_and_in_order(over_tls: bool, cert: tuple[Path, Path]) -> None:
    size = 6 * 1024 * 1024
    body = b"".join(i.to_bytes(4, "big") for i in range(size // 4))

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for i in range(0, size, 64 * 1024):
            peer.writer.write(body[i : i + 64 * 1024])
            await peer.writer.drain()
        await peer.request()

    async def main() -> None:
        async with Script(handler, tls=_server_tls(cert) if over_tls else None) as server:
            pool = new_pool(server.root, tls=ssl.create_default_context(cafile=str(cert[0])))
            response = await pool.request(server.root, b"GET", "/big", b"", None)
            pieces = []
            while piece := await response.readany():
                pieces.append(piece)
                await asyncio.sleep(0.005)  # a slow reader
            assert b"".join(pieces) == body
            # Reading paused once HIGH_WATER bytes waited: no read saw much more than that at once.
            assert max(map(len, pieces)) <= HIGH_WATER + 512 * 1024
            response.release()
            assert len(server.peers) == 1
            await pool.close()

    run(main, timeout=30)


def test_a_plain_http_upstream_through_a_proxy_gets_absolute_form_and_credentials() -> None:
    async def main() -> None:
        proxy = await ForwardProxy().start()
        try:
            async with Script(answer_each) as server:
                root = f"http://127.0.0.1:{server.port}/v1"
                pool = new_pool(root, proxies={root: f"http://us%40er:p%3Ass@127.0.0.1:{proxy.port}"})
                response = await pool.request(root, b"POST", "/chat/completions", b"x-a: 1\r\n", b"{}")
                assert await response.read() == b"ok"
                response.release()
                assert await get(pool, root, "/models") == b"ok"
                assert [s.line for s in proxy.seen] == [
                    f"POST http://127.0.0.1:{server.port}/v1/chat/completions HTTP/1.1",
                    f"GET http://127.0.0.1:{server.port}/v1/models HTTP/1.1",
                ]
                credentials = base64.b64encode(b"us@er:p:ss").decode()
                assert all(s.headers["proxy-authorization"] == f"Basic {credentials}" for s in proxy.seen)
                assert proxy.seen[0].headers["host"] == f"127.0.0.1:{server.port}"
                assert proxy.connections == 1  # the connection to the proxy is kept alive and reused
                await pool.close()
        finally:
            await proxy.stop()

    run(main)


def test_a_proxy_without_credentials_gets_no_proxy_authorization() -> None:
    async def main() -> None:
        proxy = await ForwardProxy().start()
        try:
            async with Script(answer_each) as server:
                pool = new_pool(server.root, proxies={server.root: proxy.url})
                assert await get(pool, server.root) == b"ok"
                assert proxy.seen[0].line == f"GET http://127.0.0.1:{server.port}/x HTTP/1.1"
                assert "proxy-authorization" not in proxy.seen[0].headers
                await pool.close()
        finally:
            await proxy.stop()

    run(main)


def test_an_https_upstream_directly(cert: tuple[Path, Path]) -> None:
    async def main() -> None:
        async with Script(answer_each, tls=_server_tls(cert)) as server:
            pool = new_pool(server.root, tls=ssl.create_default_context(cafile=str(cert[0])))
            assert await get(pool, server.root) == b"ok"
            assert await get(pool, server.root) == b"ok"
            assert len(server.peers) == 1
            await pool.close()

    run(main)


def test_an_untrusted_certificate_is_connect_failed(cert: tuple[Path, Path]) -> None:
    async def main() -> None:
        async with Script(answer_each, tls=_server_tls(cert)) as server:
            pool = new_pool(server.root, tls=ssl.create_default_context())
            with pytest.raises(ConnectFailed, match="TLS with 127.0.0.1.*certificate"):
                await pool.request(server.root, b"GET", "/", b"", None)

    run(main)


def test_an_https_upstream_through_a_proxy_goes_through_connect_and_tls(cert: tuple[Path, Path]) -> None:
    async def main() -> None:
        proxy = await ForwardProxy().start()
        try:
            async with Script(answer_each, tls=_server_tls(cert)) as server:
                root = f"https://127.0.0.1:{server.port}/v1"
                tls = ssl.create_default_context(cafile=str(cert[0]))
                pool = new_pool(root, proxies={root: f"http://user:pw@127.0.0.1:{proxy.port}"}, tls=tls)
                response = await pool.request(root, b"POST", "/chat/completions", b"", b"{}")
                assert await response.read() == b"ok"
                response.release()
                assert await get(pool, root, "/models") == b"ok"
                assert [s.line for s in proxy.seen] == [
                    f"CONNECT 127.0.0.1:{server.port} HTTP/1.1"
                ]  # one tunnel, reused
                assert proxy.seen[0].headers["host"] == f"127.0.0.1:{server.port}"
                assert proxy.seen[0].headers["proxy-authorization"] == "Basic " + base64.b64encode(b"user:pw").decode()
                # Inside the tunnel: origin form, and the proxy's credentials are not sent to the upstream.
                assert len(server.peers) == 1
                first = server.peers[0].requests[0]
                assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % server.port)
                assert b"proxy-authorization" not in first.lower()
                await pool.close()
        finally:
            await proxy.stop()

    run(main)


def test_a_proxy_refusing_connect_is_connect_failed_naming_the_status(cert: tuple[Path, Path]) -> None:
    async def main() -> None:
        proxy = await ForwardProxy(connect_status=407).start()
        try:
            root = "https://127.0.0.1:9"
            pool = new_pool(root, proxies={root: proxy.url}, tls=ssl.create_default_context(cafile=str(cert[0])))
            with pytest.raises(ConnectFailed, match="407") as caught:
                await pool.request(root, b"GET", "/", b"", None)
            assert f"127.0.0.1:{proxy.port}" in str(caught.value)
        finally:
            await proxy.stop()

    run(main)


def test_a_proxy_closing_before_answering_connect_is_connect_failed() -> None:
    async def handler(peer: Peer) -> None:
        await peer.reader.readuntil(b"\r\n\r\n")  # then close

    async def main() -> None:
        async with Script(handler) as proxy:
            root = "https://127.0.0.1:9"
            pool = new_pool(root, proxies={root: proxy.root}, tls=ssl.create_default_context())
            with pytest.raises(ConnectFailed, match="closed the connection before answering CONNECT"):
                await pool.request(root, b"GET", "/", b"", None)

    run(main)

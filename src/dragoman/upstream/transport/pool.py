"""Pooled HTTP/1.1 connections to an upstream's replicas: plain or TLS, straight or
through an HTTP proxy (absolute-form requests for http://, a CONNECT tunnel for https://).

New connections race a host's addresses (IPv6 and IPv4) the happy-eyeballs way (RFC
8305, with aiohappyeyeballs: uvloop's create_connection tries them one by one, so a
black-holed address would cost the whole connect timeout). A connection goes back to
the pool when its response was read to the end and the upstream keeps it open; it is
reused most-recently-used first, and dropped once idle for `idle_limit` (IDLE_LIMIT). A request whose
pooled connection the upstream closes as it goes out (STALE_WINDOW, before a byte of
the answer) is sent once more on a new connection.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from collections.abc import Awaitable, Mapping
from typing import TypeVar
from urllib.parse import quote, unquote, urlsplit

import aiohappyeyeballs

from dragoman.upstream.transport.connection import Connection
from dragoman.upstream.transport.failures import (
    ConnectFailed,
    ConnectTimeout,
    StaleConnection,
)
from dragoman.upstream.transport.response import Response

T = TypeVar("T")
HAPPY_EYEBALLS_DELAY = 0.25  # seconds before the next address is tried alongside (RFC 8305's default)
IDLE_LIMIT = 15.0  # seconds a pooled connection may wait for its next request
MAX_IDLE = 256  # pooled connections kept per replica
SMALL_BODY = 16 * 1024  # bodies up to this size are joined to the head: one write


class _Proxy:
    __slots__ = ("authorization", "host", "port")

    def __init__(self, url: str) -> None:
        # Messages never quote the URL: it may hold a password.
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("only http:// proxies are supported (the proxy URL is not one)")
        try:
            port = parts.port
        except ValueError:
            raise ValueError("the proxy URL's port is not a number (a '/' in a password is written %2F)") from None
        self.host = parts.hostname
        self.port = port or 80
        self.authorization = b""
        if parts.username is not None:
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.authorization = b"proxy-authorization: Basic " + base64.b64encode(secret) + b"\r\n"


class Origin:
    """One replica: where to connect, what goes before each request's path, its idle connections."""

    __slots__ = (
        "ascii_host",
        "authority",
        "host",
        "host_line",
        "idle",
        "port",
        "proxy",
        "root",
        "target_prefix",
        "tls",
    )

    def __init__(self, root: str, tls: ssl.SSLContext | None, proxy: str | None, host: str | None = None) -> None:
        parts = urlsplit(root)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {root!r}")
        if parts.scheme == "https" and tls is None:
            raise ValueError(f"{root}: an https:// URL needs TLS settings")
        self.root = root
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = tls if parts.scheme == "https" else None
        self.proxy = _Proxy(proxy) if proxy else None
        base = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~").encode("ascii")
        default_port = parts.port is None or parts.port == (443 if parts.scheme == "https" else 80)
        self.ascii_host = self.host if self.host.isascii() else self.host.encode("idna").decode("ascii")
        bracketed = f"[{self.ascii_host}]" if ":" in self.ascii_host else self.ascii_host  # IPv6
        netloc = bracketed + ("" if default_port else f":{self.port}")
        self.authority = f"{bracketed}:{self.port}".encode("ascii")  # what CONNECT names
        # Through a proxy, a plain-HTTP request names the whole URL (absolute form).
        absolute = self.proxy is not None and self.tls is None
        self.target_prefix = (f"http://{netloc}".encode("ascii") if absolute else b"") + base
        self.host_line = b"host: " + (host or netloc).encode("latin-1") + b"\r\n"  # a configured Host wins
        if absolute and self.proxy is not None:
            self.host_line += self.proxy.authorization
        self.idle: list[Connection] = []

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}" + (
            f" through the proxy {self.proxy.host}:{self.proxy.port}" if self.proxy else ""
        )


async def _open(host: str, port: int) -> socket.socket:
    """A connected socket to `host`: its addresses raced, IPv6 and IPv4 interleaved."""
    infos = await _addresses(host, port)
    return await aiohappyeyeballs.start_connection(infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY, interleave=1)


async def _addresses(host: str, port: int) -> list[tuple]:  # type: ignore[type-arg]
    return await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)


async def _wrap(connecting: Awaitable[T], sock: socket.socket) -> T:
    """`connecting` (a transport made on `sock`); the socket is closed if that fails."""
    try:
        return await connecting
    except BaseException:
        sock.close()
        raise


class _Tunnel(asyncio.Protocol):
    """A connection to a proxy until it answers CONNECT."""

    def __init__(self) -> None:
        self.buffer = b""
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" in self.buffer and not self.answer.done():
            self.answer.set_result(self.buffer)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(ConnectFailed("the proxy closed the connection before answering CONNECT"))


class Pool:
    """Connections for one upstream's replicas (`roots`, each a scheme://host[:port][/path])."""

    def __init__(
        self,
        roots: list[str],
        *,
        connect_timeout: float,
        tls: ssl.SSLContext | None,
        proxies: Mapping[str, str | None],
        host: str | None = None,
        idle_limit: float = IDLE_LIMIT,
    ) -> None:
        self._origins = {root: Origin(root, tls, proxies.get(root), host) for root in roots}
        self._connect_timeout = connect_timeout
        self._idle_limit = idle_limit  # seconds a pooled connection may wait for its next request
        self._sweep: asyncio.TimerHandle | None = None  # closes connections idle past `idle_limit`
        self._closed = False

    async def request(
        self,
        root: str,
        method: bytes,
        target: str,
        headers: bytes,
        body: bytes | None,
        *,
        head_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> Response:
        """Send a request and wait for the response's head, at most `head_timeout`
        seconds after it went out (HeadTimeout). `headers` are complete header lines
        (each ending in CRLF) but for host and content-length. A body read whole may
        then be silent for `idle_timeout` seconds at most (BodyTimeout)."""
        origin = self._origins[root]
        path = origin.target_prefix + target.encode("ascii")
        if body is None:
            head = b"%s %s HTTP/1.1\r\n%s%s\r\n" % (method, path, origin.host_line, headers)
        else:
            head = b"%s %s HTTP/1.1\r\n%s%scontent-length: %d\r\n\r\n" % (
                method,
                path,
                origin.host_line,
                headers,
                len(body),
            )
        while True:
            conn = self._take(origin)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(origin)
            response = Response(conn, self, reused=reused)
            response.idle_timeout = idle_timeout
            transport = conn.transport
            assert transport is not None
            response.mark_sent()
            if body is None:
                transport.write(head)
            elif len(body) <= SMALL_BODY:
                transport.write(head + body)
            else:
                transport.write(head)
                transport.write(body)
            timer = None
            if head_timeout is not None:
                timer = conn.loop.call_later(head_timeout, response.head_timed_out, head_timeout)
            try:
                await response.wait_head()
            except StaleConnection:
                continue  # a new connection next: it cannot be stale
            except BaseException:
                response.close()  # a cancelled or failed request must not leave the upstream working
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            return response

    def put_back(self, conn: Connection) -> None:
        origin = conn.origin
        assert isinstance(origin, Origin)
        if len(origin.idle) >= MAX_IDLE or self._closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        origin.idle.append(conn)
        if self._sweep is None:  # one timer per pool, not per connection: a pool left idle still lets go of them
            self._sweep = conn.loop.call_later(self._idle_limit, self._close_stale, conn.loop)

    def _close_stale(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweep = None
        now = time.monotonic()
        waiting = False
        for origin in self._origins.values():
            kept = []
            for conn in origin.idle:  # oldest first, as put_back appends
                if conn.reusable and now - conn.idle_since < self._idle_limit:
                    kept.append(conn)
                else:
                    conn.close()
            origin.idle[:] = kept
            waiting = waiting or bool(kept)
        if waiting:
            self._sweep = loop.call_later(self._idle_limit / 2, self._close_stale, loop)

    def _take(self, origin: Origin) -> Connection | None:
        idle = origin.idle
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable and now - conn.idle_since < self._idle_limit:
                return conn
            conn.close()
        return None

    async def _connect(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                if origin.proxy is None:
                    sock = await _open(origin.host, origin.port)
                    _, conn = await _wrap(loop.create_connection(
                        lambda: Connection(origin, loop), sock=sock, ssl=origin.tls, server_hostname=origin.host if origin.tls else None,
                    ), sock)  # fmt: skip
                elif origin.tls is None:
                    sock = await _open(origin.proxy.host, origin.proxy.port)
                    _, conn = await _wrap(loop.create_connection(lambda: Connection(origin, loop), sock=sock), sock)
                else:
                    conn = await self._tunnel(origin)
        except ConnectFailed:
            raise
        except TimeoutError:
            raise ConnectTimeout(f"connecting to {origin.where} timed out after {self._connect_timeout:g} s") from None
        except ssl.SSLError as error:
            raise ConnectFailed(f"TLS with {origin.where} failed: {error}") from None
        except OSError as error:
            raise ConnectFailed(f"cannot connect to {origin.where}: {error.strerror or error}") from None
        return conn

    async def _tunnel(self, origin: Origin) -> Connection:
        assert origin.proxy is not None and origin.tls is not None
        loop = asyncio.get_running_loop()
        sock = await _open(origin.proxy.host, origin.proxy.port)
        transport, tunnel = await _wrap(loop.create_connection(_Tunnel, sock=sock), sock)
        try:
            authority = origin.authority
            transport.write(
                b"CONNECT %s HTTP/1.1\r\nhost: %s\r\n%s\r\n" % (authority, authority, origin.proxy.authorization)
            )
            answer = await tunnel.answer
            first_line = answer.split(b"\r\n", 1)[0]
            status = first_line.split(b" ", 2)[1:2]
            if status != [b"200"]:
                proxy = f"{origin.proxy.host}:{origin.proxy.port}"
                raise ConnectFailed(f"the proxy {proxy} refused CONNECT: {first_line.decode('latin-1')}")
            conn = Connection(origin, loop)
            tls_transport = await loop.start_tls(transport, conn, origin.tls, server_hostname=origin.host)
        except BaseException:
            transport.close()
            raise
        if tls_transport is None:
            raise ConnectFailed(f"TLS with {origin.where} failed: the connection closed during the handshake")
        conn.connection_made(tls_transport)
        return conn

    async def close(self) -> None:
        self._closed = True  # a response released later closes its connection
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.pop().close()

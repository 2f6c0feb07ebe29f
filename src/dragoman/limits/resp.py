"""A lean Redis client for the limits' hot path: one pipelined connection per process.

redis-py's asyncio client cost the gateway about 200 µs of CPU per script call (a pool,
a lock, a stream reader, a retry wrapper and a generic parser each time). Here every
request's command is appended to one buffer, which goes out in a single write at the end
of the event loop's turn: the scripts of concurrent requests share one round trip, and
their replies come back in order on the one connection. A reply that is late by
`timeout` seconds (checked by one timer per connection, not one per call) closes the
connection and fails every call waiting on it, as redis-py's socket timeout did.

Errors are redis-py's own classes (`ConnectionError`, `ResponseError`, `NoScriptError`)
or `OSError` / `TimeoutError`, so callers catch what they caught before. `Script` is
called like redis-py's: `await script(keys=[...], args=[...])`, EVALSHA first and the
script loaded once when Redis does not know it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import ssl
from collections.abc import Sequence
from typing import Any

from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.exceptions import ConnectionError, NoScriptError, RedisError, ResponseError

_MORE = object()  # the reply has not arrived whole yet
_PLAIN = {"host", "port", "db", "username", "password", "path", "connection_class"}

Arg = bytes | str | int | float


def supported(url: str) -> bool:
    """Whether `url` names only what this client handles (no query options such as `ssl_cert_reqs`)."""
    return set(parse_url(url)) <= _PLAIN


MEMO_MAX = 4096  # encoded arguments remembered per type: a request's keys and numbers mostly repeat
_MEMO: dict[type, dict[Any, bytes]] = {bytes: {}, str: {}, int: {}, float: {}}  # by type: 1 and 1.0 differ


def _bulk(part: Arg) -> bytes:
    if not isinstance(part, bytes):
        part = (part if isinstance(part, str) else repr(part)).encode()
    return b"$%d\r\n%b\r\n" % (len(part), part)


def bulk(part: Arg) -> bytes:
    """One argument as a RESP bulk string; numbers as redis-py writes them (`repr`). Each
    argument's encoding is remembered: formatting a float costs more than looking it up."""
    memo = _MEMO.get(part.__class__)
    if memo is None:
        return _bulk(part)
    encoded = memo.get(part)
    if encoded is None:
        if len(memo) >= MEMO_MAX:
            memo.clear()
        encoded = memo[part] = _bulk(part)
    return encoded


def encode(parts: Sequence[Arg]) -> bytes:
    """One command in RESP."""
    return b"".join([b"*%d\r\n" % len(parts), *map(bulk, parts)])


def parse(buf: bytes, pos: int) -> tuple[Any, int]:
    """The reply at `pos` and where the next begins, or (_MORE, pos) if it is cut short.
    An error reply is returned as its exception, not raised."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _MORE, pos
    kind = buf[pos]
    if kind == 36:  # $ bulk string
        size = int(buf[pos + 1 : end])
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buf) < stop + 2:
            return _MORE, pos
        return buf[end + 2 : stop], stop + 2
    if kind == 58:  # : integer
        return int(buf[pos + 1 : end]), end + 2
    if kind == 42:  # * array
        count = int(buf[pos + 1 : end])
        if count < 0:
            return None, end + 2
        items, at = [], end + 2
        for _ in range(count):
            item, at = parse(buf, at)
            if item is _MORE:
                return _MORE, pos
            items.append(item)
        return items, at
    if kind == 43:  # + simple string
        return buf[pos + 1 : end], end + 2
    if kind == 45:  # - error
        message = buf[pos + 1 : end].decode("utf-8", "replace")
        return (NoScriptError if message.startswith("NOSCRIPT") else ResponseError)(message), end + 2
    raise ConnectionError(f"Redis sent a reply this client cannot read ({buf[pos : pos + 1]!r})")


class _Link(asyncio.Protocol):
    """One connection: calls in flight, in the order sent, each with its deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.loop, self.timeout = loop, timeout
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self.out: list[bytes] = []  # commands not yet written: they go in one write
        self.rest = b""  # the start of a reply not yet whole
        self.lost: BaseException | None = None
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, command: bytes) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        if self.lost is not None:
            future.set_exception(ConnectionError(f"Redis connection lost ({self.lost})"))
            return future
        if not self.waiting and self.transport is not None:
            self.transport.write(command)  # nothing in flight (as at concurrency 1): no batch to wait for
        else:
            if not self.out:
                self.loop.call_soon(self._flush)
            self.out.append(command)
        self.waiting.append((future, self.loop.time() + self.timeout))
        if self._watch is None:
            self._watch = self.loop.call_at(self.waiting[0][1], self._check)
        return future

    def _flush(self) -> None:
        if self.out and self.transport is not None and self.lost is None:
            self.transport.write(b"".join(self.out) if len(self.out) > 1 else self.out[0])
        self.out = []

    def _check(self) -> None:
        self._watch = None
        if not self.waiting or self.lost is not None:
            return
        deadline = self.waiting[0][1]
        if self.loop.time() >= deadline:
            self._fail(TimeoutError(f"Redis did not answer within {self.timeout:g} s"))
        else:
            self._watch = self.loop.call_at(deadline, self._check)

    def data_received(self, data: bytes) -> None:
        buf = self.rest + data if self.rest else data
        pos, size, waiting = 0, len(buf), self.waiting
        try:
            while pos < size:
                reply, pos = parse(buf, pos)
                if reply is _MORE:
                    break
                future = waiting.popleft()[0]
                if not future.done():  # its caller may have gone (cancelled)
                    if isinstance(reply, ResponseError):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
        except (ConnectionError, ValueError, IndexError) as error:  # garbage, or a reply nobody asked for
            self._fail(ConnectionError(f"Redis sent an unreadable reply ({error})"))
            return
        self.rest = buf[pos:] if pos < size else b""

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("Redis closed the connection"))

    def _fail(self, error: BaseException) -> None:
        """The connection is done for: every call still waiting fails with `error`."""
        if self.lost is None:
            self.lost = error
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self.transport is not None:
            self.transport.abort()
        waiting, self.waiting = self.waiting, collections.deque()
        for future, _ in waiting:
            if not future.done():
                future.set_exception(
                    error if isinstance(error, TimeoutError | OSError | RedisError) else ConnectionError(str(error))
                )
        self.out = []


class Pipe:
    """Redis at `url`, over one connection opened on first use and again after a failure."""

    def __init__(self, url: str, timeout: float) -> None:
        self.where = parse_url(url)
        self.timeout = timeout
        self._link: _Link | None = None
        self._opening: asyncio.Future[_Link] | None = None

    async def call(self, *parts: Arg) -> Any:
        """One command's reply; an error reply raised as redis-py would."""
        return await self.send(encode(parts))

    async def send(self, command: bytes) -> Any:
        """The reply to `command`, one command already in RESP."""
        link = self._link
        if link is None or link.lost is not None or link.loop is not asyncio.get_running_loop():
            link = await self._open()
        return await link.send(command)

    async def _open(self) -> _Link:
        """A connected link, shared by callers that ask while it opens."""
        if self._opening is None or self._opening.get_loop() is not asyncio.get_running_loop():
            stale, self._link = self._link, None
            if stale is not None and stale.lost is None:
                _drop(stale)
            self._opening = asyncio.get_running_loop().create_future()
            try:
                self._link = await self._connect()
            except BaseException as error:
                self._opening.set_exception(error)
                self._opening.exception()  # retrieved: only the callers waiting on it need it
                raise
            else:
                self._opening.set_result(self._link)
            finally:
                self._opening = None
            return self._link
        return await asyncio.shield(self._opening)

    async def _connect(self) -> _Link:
        loop = asyncio.get_running_loop()
        where = self.where
        link = _Link(loop, self.timeout)
        async with asyncio.timeout(self.timeout):
            kind = where.get("connection_class")
            if kind is UnixDomainSocketConnection:
                await loop.create_unix_connection(lambda: link, where["path"])
            else:
                secure = ssl.create_default_context() if kind is SSLConnection else None
                await loop.create_connection(lambda: link, where.get("host", "localhost"), where.get("port", 6379),
                                             ssl=secure)  # fmt: skip
            try:
                if where.get("password") is not None:
                    user = [where["username"]] if where.get("username") else []
                    await link.send(encode([b"AUTH", *user, where["password"]]))
                if where.get("db"):
                    await link.send(encode([b"SELECT", where["db"]]))
            except BaseException:
                link.transport.abort() if link.transport is not None else None
                raise
        return link

    def script(self, source: str) -> Script:
        return Script(self, source)

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is None or link.transport is None or link.lost is not None:
            return
        if link.loop is asyncio.get_running_loop():
            link._flush()
            link.transport.close()
        else:
            _drop(link)


def _drop(link: _Link) -> None:
    """Another event loop's link (closed, maybe): let go of it as well as that loop allows."""
    link.lost = ConnectionError("the event loop changed")
    with contextlib.suppress(Exception):
        if link.transport is not None:
            link.transport.abort()


class Script:
    """A Lua script run by its SHA1, loaded into Redis the first time it is missing there."""

    def __init__(self, pipe: Pipe, source: str) -> None:
        self.pipe = pipe
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source).hexdigest().encode()  # noqa: S324 - Redis names scripts so

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        return await self.run(encode([b"EVALSHA", self.sha, len(keys), *keys, *args]))

    def command(self, keys: Sequence[bytes], args: Sequence[bytes], count: int) -> bytes:
        """The EVALSHA of this script, its `keys` and `args` encoded already (`bulk`; an item of
        `args` may hold several), `count` the arguments `args` holds in all."""
        head = b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%b\r\n%b" % (3 + len(keys) + count, len(self.sha), self.sha,
                                                                 bulk(len(keys)))  # fmt: skip
        return b"".join([head, *keys, *args])

    async def run(self, command: bytes) -> Any:
        """The reply to `command` (an EVALSHA of this script), the script loaded first if Redis lacks it."""
        try:
            return await self.pipe.send(command)
        except NoScriptError:
            await self.pipe.call(b"SCRIPT", b"LOAD", self.source)
            return await self.pipe.send(command)

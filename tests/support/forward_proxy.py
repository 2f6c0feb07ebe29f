"""A small HTTP forward proxy on a loopback socket, for tests of upstreams reached through one.

Absolute-form requests (`POST http://host:port/path HTTP/1.1`) are forwarded in origin
form, without `proxy-authorization`, on one upstream connection per client connection
(so keep-alive works through it); `CONNECT host:port` opens a tunnel piped both ways.
Every request head is recorded as the proxy saw it. Run it in the test's own loop
(`await proxy.start()` / `await proxy.stop()`) or in a thread of its own (`with
proxy.in_thread():`) for a gateway running in another thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Seen:
    line: str  # the request line, e.g. "CONNECT 127.0.0.1:443 HTTP/1.1"
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names


class ForwardProxy:
    def __init__(self, *, connect_status: int | None = None, hang_connect: bool = False) -> None:
        self.connect_status = connect_status  # answer CONNECT with this status instead of tunnelling
        self.hang_connect = hang_connect  # read CONNECT and never answer it
        self.seen: list[Seen] = []
        self.connections = 0  # client connections accepted
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def connects(self) -> list[Seen]:
        return [s for s in self.seen if s.line.startswith("CONNECT ")]

    @property
    def forwarded(self) -> list[Seen]:
        return [s for s in self.seen if not s.line.startswith("CONNECT ")]

    async def start(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @contextmanager
    def in_thread(self) -> Iterator[ForwardProxy]:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        if not ready.wait(10):
            raise RuntimeError("the proxy did not start")
        try:
            yield self
        finally:
            with suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.stop(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            if not thread.is_alive():
                loop.close()

    # -- serving ----------------------------------------------------------------------

    def _track(self, coro: object) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            while True:
                head = await _head(reader)
                if head is None:
                    return
                line, headers = head
                self.seen.append(Seen(line, headers))
                method, target, _ = line.split(" ", 2)
                if method == "CONNECT":
                    await self._connect(target, reader, writer)
                    return
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                url = urlsplit(target)
                if upstream is None:
                    up_reader, upstream = await asyncio.open_connection(url.hostname, url.port or 80)
                    self._writers.add(upstream)
                    self._track(_pipe(up_reader, writer))
                path = (url.path or "/") + (f"?{url.query}" if url.query else "")
                lines = [f"{method} {path} HTTP/1.1"]
                lines += [f"{name}: {value}" for name, value in headers.items() if name != "proxy-authorization"]
                upstream.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        except (ConnectionError, asyncio.IncompleteReadError, OSError, asyncio.CancelledError):
            return  # cancelled only by stop(); not re-raised, for Python 3.11's start_server logs a cancelled handler
        finally:
            writer.close()
            if upstream is not None:
                upstream.close()

    async def _connect(self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.hang_connect:
            await reader.read()  # until the client gives up
            return
        if self.connect_status is not None:
            writer.write(
                b'HTTP/1.1 %d Refused\r\nproxy-authenticate: Basic realm="test"\r\ncontent-length: 0\r\n\r\n'
                % self.connect_status
            )
            await writer.drain()
            return
        host, _, port = target.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        self._writers.add(up_writer)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        piping = self._track(_pipe(up_reader, writer))
        await _pipe(reader, up_writer)
        await piping


async def _head(reader: asyncio.StreamReader) -> tuple[str, dict[str, str]] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    line, *rest = raw[:-4].decode("latin-1").split("\r\n")
    headers = {}
    for item in rest:
        name, _, value = item.partition(":")
        headers[name.strip().lower()] = value.strip()
    return line, headers


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()

"""A TCP proxy on a loopback port, in threads of its own, between a gateway and a server
(PostgreSQL) that a test must not stop, because others share it. The test makes the server
look down (`cut`: every connection dropped, each new one closed at once), frozen (`freeze`:
connections held open, nothing relayed, as a server stopped with SIGSTOP), and back
(`restore`). `url(base)` is the base URL with its host and port replaced by the proxy's."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Iterator

import pytest

BUFFER = 65536


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        threading.Thread(target=self._accept, name="tcp proxy", daemon=True).start()

    def url(self, base: str) -> str:
        parts = urllib.parse.urlsplit(base)
        netloc = f"{parts.username}@" if parts.username else ""
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{self.port}"))

    def cut(self) -> None:
        """The server unreachable: every connection closed now, each new one at once."""
        with self._lock:
            self._cut = True
            sockets, self._open = self._open, set()
        for sock in sockets:
            _close(sock)
        self._flowing.set()  # pumps held by a freeze wake up to find their sockets closed

    def freeze(self) -> None:
        """Nothing relayed either way (connections stay open, new ones are held) until `restore`."""
        self._flowing.clear()

    def restore(self) -> None:
        with self._lock:
            self._cut = False
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._flowing.wait()
        with self._lock:
            if self._cut:
                _close(client)
                return
            self._open.add(client)
        try:
            server = socket.create_connection(self.target, timeout=10)
        except OSError:
            self._drop(client)
            return
        server.settimeout(None)
        with self._lock:
            if self._cut:
                _close(server)
                _close(client)
                return
            self._open.add(server)
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(BUFFER)
            except OSError:
                data = b""
            self._flowing.wait()
            if not data:
                break
            try:
                sink.sendall(data)
            except OSError:
                break
        self._drop(source)
        self._drop(sink)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@pytest.fixture
def pg_proxy(pg_url: str) -> Iterator[tuple[TcpProxy, str]]:
    """A proxy to the session's PostgreSQL, and the test's schema URL through it."""
    parts = urllib.parse.urlsplit(pg_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    try:
        yield proxy, proxy.url(pg_url)
    finally:
        proxy.close()

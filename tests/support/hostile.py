"""A hostile upstream on a loopback socket: it reads each POST's head, then answers with
whatever bytes a test scripts (a head that never ends, say), for as long as the gateway
reads them; a GET (a model list) gets a 404. `sent` counts what went out, so a test can
show the gateway hung up early."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable


class HostileUpstream:
    def __init__(self, answer: Callable[[], Iterable[bytes]]) -> None:
        """`answer()`: the reply's bytes, piece by piece, for each request (endless allowed)."""
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.sent = 0
        self.hung_up = threading.Event()  # the gateway closed a connection while it was being answered
        self._stopping = threading.Event()
        self._listener.settimeout(0.05)  # so that the accept loop notices `stop()`
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> HostileUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        return
                    head += data
                if head.startswith(b"GET "):  # a model list: none, so discovery ends at once
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    return
                for piece in self._answer():
                    conn.sendall(piece)
                    self.sent += len(piece)
            except OSError:
                self.hung_up.set()

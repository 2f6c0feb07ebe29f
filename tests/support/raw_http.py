"""A client on a raw socket, for tests that check the framing on the wire."""

from __future__ import annotations

import json
import socket


def raw_request(body: dict, *, version: str, connection: str | None = None, path: str = "/v1/messages") -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} {version}\r\nhost: x\r\nx-api-key: k\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n"
    if connection is not None:
        head += f"connection: {connection}\r\n"
    return head.encode() + b"content-length: %d\r\n\r\n%s" % (len(data), data)


class Reader:
    """A client's side of one connection: a response's head, then its body by the framing it asks for."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> bytes:
        data = self.sock.recv(65536)
        self.buffer += data
        return data

    def head(self) -> tuple[str, dict[str, list[str]]]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._more(), f"closed before a whole head: {self.buffer!r}"
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, list[str]] = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers.setdefault(name.strip().lower(), []).append(value.strip())
        return status, headers

    def until_close(self) -> bytes:
        """Everything up to the server's close: fails (socket timeout) if it keeps the connection open."""
        while self._more():
            pass
        body, self.buffer = self.buffer, b""
        return body

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            assert self._more(), "closed before the content-length's end"
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return body

    def chunked(self) -> bytes:
        """A chunked body, to its last chunk."""
        body = b""
        while True:
            while b"\r\n" not in self.buffer:
                assert self._more(), "closed mid-chunk"
            size_line, _, self.buffer = self.buffer.partition(b"\r\n")
            size = int(size_line, 16)
            data = self.exactly(size + 2)
            assert data.endswith(b"\r\n")
            if size == 0:
                return body
            body += data[:-2]

"""What `serving.DirectBodyProtocol` does to clients that hold connections without using
them, over real sockets: a connection that never begins a request is closed after
uvicorn's keep-alive timeout, and (see also the 408 tests in test_direct_writes.py)
requests keep being served, pipelined or late, as uvicorn serves them."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes import FakeUpstream
from tests.servers import GatewayServer, make_config

HEALTH = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"


@pytest.fixture
def start(upstream: FakeUpstream) -> Iterator[Any]:
    servers: list[GatewayServer] = []

    def start(**options: Any) -> GatewayServer:
        server = GatewayServer(make_config(upstream.url), **options).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _connect(gateway: GatewayServer) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", gateway.port))
    client.settimeout(5)
    return client


def _read_response(client: socket.socket, pending: bytearray) -> bytes:
    """One response with a Content-Length body (`pending`: bytes already read past the last one)."""
    while b"\r\n\r\n" not in pending:
        data = client.recv(65536)
        assert data, f"the connection closed before a response: {bytes(pending)!r}"
        pending += data
    head, _, _ = bytes(pending).partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    end = len(head) + 4 + length
    while len(pending) < end:
        data = client.recv(65536)
        assert data, "the connection closed mid-response"
        pending += data
    response = bytes(pending[:end])
    del pending[:end]
    return response


def _wait_closed(client: socket.socket) -> bytes:
    """What the client still receives until the server closes the connection."""
    received = b""
    while data := client.recv(65536):
        received += data
    return received


def test_a_connection_that_sends_nothing_is_closed_after_the_keep_alive_timeout(start: Any) -> None:
    gateway = start(timeout_keep_alive=0.3)
    with _connect(gateway) as client:
        connected = time.monotonic()
        received = _wait_closed(client)  # the 5 s socket timeout raises if it stays open
        waited = time.monotonic() - connected
    assert received == b""  # quietly: nothing was asked
    assert waited > 0.2


def test_blank_lines_are_not_a_request(start: Any) -> None:
    gateway = start(timeout_keep_alive=0.3)
    with _connect(gateway) as client:
        client.sendall(b"\r\n")  # the parser skips it: no request begins
        assert _wait_closed(client) == b""


def test_a_request_begun_late_but_within_the_timeout_is_served_and_the_connection_kept_alive(start: Any) -> None:
    # The idle timer, armed at connect, fires at 0.8 s, while the connection is in
    # uvicorn's keep-alive after the first reply (until about 1.2 s): it leaves it be.
    gateway = start(timeout_keep_alive=0.8)
    with _connect(gateway) as client:
        connected = time.monotonic()
        pending = bytearray()
        time.sleep(0.4)
        client.sendall(HEALTH[:10])
        client.sendall(HEALTH[10:])
        assert _read_response(client, pending).startswith(b"HTTP/1.1 200 ")
        time.sleep(max(0.0, connected + 1.0 - time.monotonic()))
        client.sendall(HEALTH)
        assert _read_response(client, pending).startswith(b"HTTP/1.1 200 ")
        assert pending == b""


def test_pipelined_requests_are_all_served_then_keep_alive_closes_the_connection(start: Any) -> None:
    gateway = start(timeout_keep_alive=0.3)
    with _connect(gateway) as client:
        client.sendall(HEALTH * 3)
        pending = bytearray()
        for _ in range(3):
            assert _read_response(client, pending).startswith(b"HTTP/1.1 200 ")
        replied = time.monotonic()
        assert _wait_closed(client) == b"" and pending == b""  # uvicorn's keep-alive timeout, armed after the last reply
        assert time.monotonic() - replied > 0.2


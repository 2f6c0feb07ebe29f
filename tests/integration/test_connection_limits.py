"""The limits `serving.DirectBodyProtocol` puts on clients, over real sockets: a
connection that never begins a request is closed after uvicorn's keep-alive timeout, a
request whose headers pass 64 KiB is answered 431 (the 408 for a stalled request is in
test_direct_writes.py), and requests within the limits are served, pipelined or late,
as uvicorn serves them."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dragoman.server.serving import MAX_HEAD_BYTES, DirectBodyProtocol
from tests.support.fakes import FakeUpstream
from tests.support.servers import GatewayServer, make_config
from tests.support.waiting import eventually

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
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
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
        assert (
            _wait_closed(client) == b"" and pending == b""
        )  # uvicorn's keep-alive timeout, armed after the last reply
        assert time.monotonic() - replied > 0.2


def _send_in_pieces(client: socket.socket, data: bytes, piece: int = 16384) -> None:
    """The first line alone, so that the head arrives in more than one read; then the
    rest, stopping where the server closes the connection."""
    first = data.index(b"\r\n") + 2
    client.sendall(data[:first])
    time.sleep(0.05)
    try:
        for start in range(first, len(data), piece):
            client.sendall(data[start : start + piece])
    except (BrokenPipeError, ConnectionResetError):
        pass


def _received_until_closed(client: socket.socket) -> bytes:
    received = b""
    try:
        while data := client.recv(65536):
            received += data
    except ConnectionResetError:  # the server closed with some of the request unread
        pass
    return received


@pytest.mark.parametrize(
    "headers",
    [
        b"x-big: " + b"a" * (1 << 20) + b"\r\n",
        b"".join(b"x-header-%05d: %s\r\n" % (i, b"v" * 20) for i in range(30000)),  # 1 MB in short headers
    ],
    ids=["one-long-header", "many-headers"],
)
def test_headers_past_64_kib_are_answered_431_and_the_connection_closed(start: Any, headers: bytes) -> None:
    # 1 MB, in reads of up to 256 KB: refused at the read that passes 64 KiB, the rest dropped.
    gateway = start()
    with _connect(gateway) as client:
        _send_in_pieces(client, b"GET /health HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n")
        received = _received_until_closed(client)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    assert b"connection: close" in head.lower()
    envelope = json.loads(body)
    assert envelope["type"] == "error"  # no request_id: like the 408, it is written before the request has one
    assert envelope["error"] == {"type": "invalid_request_error", "message": "request headers larger than 64 KiB"}


def test_big_headers_within_the_limit_are_served(start: Any) -> None:
    gateway = start()
    with _connect(gateway) as client:
        _send_in_pieces(client, b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 32768 + b"\r\n\r\n", piece=4096)
        response = _read_response(client, bytearray())
    assert response.startswith(b"HTTP/1.1 200 ")
    assert json.loads(response.partition(b"\r\n\r\n")[2]) == {"status": "ok"}


def test_after_big_headers_within_the_limit_the_next_request_is_counted_afresh(start: Any) -> None:
    gateway = start()
    head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 40000 + b"\r\n\r\n"  # two of them pass 64 KiB
    with _connect(gateway) as client:
        pending = bytearray()
        for _ in range(2):
            _send_in_pieces(client, head, piece=4096)
            assert _read_response(client, pending).startswith(b"HTTP/1.1 200 ")


def _head_of(size: int) -> bytes:
    """A `GET /health` head of exactly `size` bytes, its blank line included."""
    begin = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: "
    return begin + b"a" * (size - len(begin) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize("pieces", [False, True], ids=["sent-at-once", "in-4-kb-pieces"])
def test_the_head_limit_is_counted_in_bytes_whatever_the_reads(start: Any, pieces: bool) -> None:
    """64 KiB to the byte, whether the head comes in one read or many, the last one ending it."""
    gateway = start()
    for size, status in ((MAX_HEAD_BYTES, b"200"), (MAX_HEAD_BYTES + 1, b"431"), (75_000, b"431")):
        with _connect(gateway) as client:
            if pieces:
                _send_in_pieces(client, _head_of(size), piece=4096)
            else:
                client.sendall(_head_of(size))
            response = _read_response(client, bytearray()) if status == b"200" else _received_until_closed(client)
        assert response.startswith(b"HTTP/1.1 " + status + b" "), (size, response[:100])


def test_a_head_past_the_limit_behind_a_pipelined_request_is_not_served(start: Any) -> None:
    """Begun inside a read, after another request: counted by what was parsed of it."""
    gateway = start()
    with _connect(gateway) as client:
        client.sendall(HEALTH + _head_of(75_000))
        assert _received_until_closed(client).count(b"HTTP/1.1 200 ") < 2


@pytest.mark.parametrize(
    "garbage",
    [
        b"G@T /health HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        b"GET /health HTTP/1.1\r\nbad\x01header: x\r\n\r\n",
    ],
    ids=["bad-method", "two-content-lengths", "control-character"],
)
def test_bytes_that_are_not_http_get_a_400_in_anthropics_envelope(start: Any, garbage: bytes) -> None:
    gateway = start()
    client = _connect(gateway)
    client.sendall(garbage)
    response = _wait_closed(client)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"application/json" in head
    error = json.loads(body)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "not valid HTTP" in error["error"]["message"]


def test_a_client_leaving_while_sending_its_body_is_recorded_as_499_of_an_unknown_model(start: Any) -> None:
    gateway = start()
    client = _connect(gateway)
    client.sendall(
        b'POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"model":'
    )
    time.sleep(0.1)  # pacing: the server reads the head and begins the request before the client leaves
    client.close()
    import httpx

    def recorded() -> list[str]:
        rows = httpx.get(f"http://127.0.0.1:{gateway.port}/metrics").text.splitlines()
        return [row for row in rows if row.startswith("dragoman_requests_total{") and 'status="499"' in row]

    (row,) = eventually(recorded, "the 499 recorded")
    assert 'model="unknown"' in row and row.endswith(" 1.0")


def test_a_client_still_sending_its_oversized_headers_gets_the_431_not_a_reset(start: Any) -> None:
    gateway = start()
    client = _connect(gateway)
    client.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4_000_000)  # on and on, past the limit
    response = _wait_closed(client)
    assert response.startswith(b"HTTP/1.1 431 "), response[:200]


def test_a_request_trickling_in_gets_a_408_at_the_total_deadline(start: Any) -> None:
    """A byte every 0.1 s keeps the idle timeout from firing; the deadline for the whole request does not move."""
    gateway = start(http=functools.partial(DirectBodyProtocol, read_deadline=0.5))
    client = _connect(gateway)
    request = (
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    )
    client.sendall(request)
    received = b""
    with contextlib.suppress(OSError):  # the server closes while a byte is on its way
        for _ in range(100):  # 10 s of trickling at most
            client.sendall(b" ")
            time.sleep(0.1)
            client.setblocking(False)
            try:
                received += client.recv(65536)
            except BlockingIOError:
                pass
            finally:
                client.setblocking(True)
            if received:
                break
    client.settimeout(5)
    with contextlib.suppress(OSError):
        received += _wait_closed(client)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert "did not arrive whole within 0.5 s" in json.loads(body)["error"]["message"]


def test_connections_past_max_connections_are_closed_at_once(upstream: FakeUpstream) -> None:
    gateway = GatewayServer(make_config(upstream.url, server={"max_connections": 2}), timeout_keep_alive=30).start()
    try:
        held = [_connect(gateway) for _ in range(2)]
        for client in held:  # both served, and kept open
            client.sendall(HEALTH)
            assert _read_response(client, bytearray()).startswith(b"HTTP/1.1 200 ")
        extra = _connect(gateway)
        with contextlib.suppress(ConnectionResetError):
            extra.sendall(HEALTH)
        with contextlib.suppress(ConnectionResetError):
            assert _wait_closed(extra) == b""  # closed without an answer
        held.pop().close()

        def served_again() -> bool:  # once the server has seen the close, there is room again
            with _connect(gateway) as again, contextlib.suppress(OSError):
                again.sendall(HEALTH)
                return again.recv(65536).startswith(b"HTTP/1.1 200 ")
            return False

        eventually(served_again, "a connection served after one of the held ones closed")
        for client in held:
            client.close()
    finally:
        gateway.stop()

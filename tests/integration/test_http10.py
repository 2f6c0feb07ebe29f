"""HTTP/1.0 clients (nginx's `proxy_pass` by default): a response to them is never chunked.

A stream (no content-length) is its plain SSE events, ended by the server closing the
connection, whatever keep-alive the client asked for; a reply with a content-length is
framed by it as before. HTTP/1.1 streams stay chunked on a kept-alive connection. Raw
sockets, so that the framing on the wire is what is checked."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from dragoman.server.serving import DirectBody
from tests.support.fake_anthropic import FakeAnthropic, NativeReply, text_events
from tests.support.fakes import FakeUpstream, completion, text_stream
from tests.support.raw_http import Reader
from tests.support.raw_http import raw_request as _request
from tests.support.servers import GatewayServer, make_config, sse_frames

PAUSE = ("sleep", 0.02)  # each token its own read, as from a model: the reads a direct writer would take
STREAM = {"model": "test-model", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}


def _paced(items: list[Any]) -> list[Any]:
    return [part for item in items for part in (item, PAUSE)][
        :-1
    ]  # no pause after the end: the gateway is gone by then


@pytest.fixture
def connect() -> Iterator[Any]:
    sockets: list[socket.socket] = []

    def connect(gateway: GatewayServer) -> Reader:
        sock = socket.create_connection(("127.0.0.1", gateway.port))
        sock.settimeout(10)
        sockets.append(sock)
        return Reader(sock)

    yield connect
    for sock in sockets:
        sock.close()


@pytest.fixture
def direct_writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    written: list[bytes] = []
    write = DirectBody.write

    def noted(self: DirectBody, chunk: bytes) -> None:
        written.append(chunk)
        write(self, chunk)

    monkeypatch.setattr(DirectBody, "write", noted)
    return written


@pytest.fixture
def gateways() -> Iterator[Any]:
    started: list[GatewayServer] = []

    def start(url: str, **config: Any) -> GatewayServer:
        started.append(GatewayServer(make_config(url, **config)).start())
        return started[-1]

    yield start
    for gateway in started:
        gateway.stop()


@pytest.mark.parametrize("connection", [None, "keep-alive"])
def test_a_translated_stream_to_an_http10_client_is_plain_sse_ended_by_the_close(
    upstream: FakeUpstream, gateways: Any, connect: Any, direct_writes: list[bytes], connection: str | None
) -> None:
    upstream.stream_reply(_paced(text_stream("Hello", " there", " world")))
    reader = connect(gateways(upstream.url))
    reader.sock.sendall(_request(STREAM, version="HTTP/1.0", connection=connection))

    status, headers = reader.head()
    body = reader.until_close()  # the server closes: that is where the body ends

    assert status.split()[1] == "200"
    assert "transfer-encoding" not in headers and "content-length" not in headers
    assert headers["connection"] == ["close"]
    frames = [(name, data) for name, data in sse_frames(body.decode()) if name != "ping"]
    assert [name for name, _ in frames] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert (
        "".join(data["delta"]["text"] for name, data in frames if name == "content_block_delta") == "Hello there world"
    )
    assert direct_writes == []  # a 1.0 stream goes through ASGI `send`


def test_a_passthrough_stream_to_an_http10_client_is_its_events_byte_for_byte(
    native: FakeAnthropic, gateways: Any, connect: Any, direct_writes: list[bytes]
) -> None:
    events = text_events("Hello")
    native.replies.append(NativeReply(events=_paced(events)))
    gateway = gateways(
        native.url, upstream={"protocol": "anthropic"}, models=[{"name": "native-model", "upstream": "default"}]
    )
    reader = connect(gateway)
    reader.sock.sendall(_request({**STREAM, "model": "native-model"}, version="HTTP/1.0", connection="keep-alive"))

    status, headers = reader.head()
    body = reader.until_close()

    assert status.split()[1] == "200"
    assert "transfer-encoding" not in headers
    assert headers["connection"] == ["close"]
    assert body == b"".join(events)
    assert direct_writes == []


@pytest.mark.parametrize("connection", [None, "keep-alive"])
def test_a_json_reply_to_an_http10_client_keeps_its_content_length(
    upstream: FakeUpstream, gateways: Any, connect: Any, connection: str | None
) -> None:
    upstream.json_reply(completion("Hello!"))
    reader = connect(gateways(upstream.url))
    reader.sock.sendall(_request({**STREAM, "stream": False}, version="HTTP/1.0", connection=connection))

    status, headers = reader.head()
    body = reader.exactly(int(headers["content-length"][0]))

    assert status.split()[1] == "200"
    assert "transfer-encoding" not in headers
    reply = json.loads(body)
    assert reply["type"] == "message" and reply["content"] == [{"type": "text", "text": "Hello!"}]


def test_an_http11_stream_is_still_chunked_and_its_connection_kept_alive(
    upstream: FakeUpstream, gateways: Any, connect: Any, direct_writes: list[bytes]
) -> None:
    upstream.stream_reply(_paced(text_stream("Hello", " there", " world")))
    upstream.json_reply(completion("Again"))
    reader = connect(gateways(upstream.url))
    reader.sock.sendall(_request(STREAM, version="HTTP/1.1"))

    status, headers = reader.head()
    body = reader.chunked()

    assert status.split()[1] == "200"
    assert headers["transfer-encoding"] == ["chunked"]
    assert "connection" not in headers
    frames = [name for name, _ in sse_frames(body.decode()) if name != "ping"]
    assert frames[0] == "message_start" and frames[-1] == "message_stop"
    assert direct_writes, "the 1.1 stream was not written directly"

    reader.sock.sendall(_request({**STREAM, "stream": False}, version="HTTP/1.1"))  # the same connection, still open
    status, headers = reader.head()
    assert status.split()[1] == "200"
    assert json.loads(reader.exactly(int(headers["content-length"][0])))["content"][0]["text"] == "Again"

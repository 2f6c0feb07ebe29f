"""The server dragoman runs when its HTTP protocol cannot be installed (a uvicorn whose
internals changed, or no httptools; the warning: tests/unit/server/test_serving.py):
uvicorn's h11 protocol, with the protections that need no internals (HTTP/1.0 responses
unchunked, a head past MAX_HEAD_BYTES refused). The hooked server is every other test's."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import anthropic
import pytest

from dragoman.server import serving
from tests.support.fakes import FakeUpstream, completion, text_stream
from tests.support.raw_http import Reader, raw_request
from tests.support.servers import GatewayServer, make_config, sse_frames

STREAM = {"model": "test-model", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def uvicorn_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn's request cycle no longer sets an attribute the protocol reads."""
    monkeypatch.setattr(serving, "_CYCLE_ATTRIBUTES", (*serving._CYCLE_ATTRIBUTES, "renamed_in_a_later_uvicorn"))


@pytest.fixture
def plain(upstream: FakeUpstream, uvicorn_changed: None) -> Iterator[GatewayServer]:
    gateway = GatewayServer(make_config(upstream.url)).start()
    yield gateway
    gateway.stop()


def test_the_plain_server_streams_and_answers_through_the_sdk(upstream: FakeUpstream, plain: GatewayServer) -> None:
    upstream.stream_reply(text_stream("Hello", " there"))
    upstream.json_reply(completion("Again"))
    client = anthropic.Anthropic(base_url=plain.url, api_key="k", max_retries=0)
    with client.messages.stream(model="test-model", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]) as s:
        assert s.get_final_text() == "Hello there"
    message = client.messages.create(model="test-model", max_tokens=50, messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].type == "text" and message.content[0].text == "Again"


def _connect(gateway: GatewayServer) -> Reader:
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.settimeout(10)
    return Reader(sock)


def test_the_plain_server_never_chunks_a_stream_to_an_http10_client(
    upstream: FakeUpstream, plain: GatewayServer
) -> None:
    upstream.stream_reply(text_stream("Hello"))
    reader = _connect(plain)
    try:
        reader.sock.sendall(raw_request(STREAM, version="HTTP/1.0", connection="keep-alive"))
        status, headers = reader.head()
        body = reader.until_close()
    finally:
        reader.sock.close()
    assert status.split()[1] == "200"
    assert "transfer-encoding" not in headers
    names = [name for name, _ in sse_frames(body.decode())]
    assert names[0] == "message_start" and names[-1] == "message_stop"


def test_the_plain_server_refuses_a_head_past_the_limit(plain: GatewayServer) -> None:
    reader = _connect(plain)
    big = b"x-filler: " + b"a" * (serving.MAX_HEAD_BYTES + 1024) + b"\r\n"
    try:
        reader.sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n" + big)
        status, _ = reader.head()
    finally:
        reader.sock.close()
    assert status.split()[1] == "400"  # h11's refusal: uvicorn's plain text, not Anthropic's envelope

"""Streams written to the client from the upstream connection's callback
(`serving.DirectBody`, `Response.drain_to`) behave exactly as streams sent through
ASGI: every scenario runs both ways, over real sockets, and the direct way is checked
to have been taken."""

from __future__ import annotations

import functools
import json
import logging
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.server.serving import (
    DIRECT_BODY,
    DirectBody,
    DirectBodyProtocol,
    http_protocol,
)
from tests.support.fake_anthropic import FakeAnthropic, NativeReply, text_events
from tests.support.fakes import FakeUpstream, Reply, chunk, text_stream, usage_chunk
from tests.support.servers import GatewayServer, make_config, sse_frames
from tests.support.waiting import eventually

HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
REQUEST = {"model": "test-model", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
PAUSE = ("sleep", 0.02)  # each token its own read, as from a model


class Writes:
    """Counts the chunks written directly, and the times the writer was not ready."""

    def __init__(self) -> None:
        self.written = 0
        self.refused = 0


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Writes:
    counts = Writes()
    write, ready = DirectBody.write, DirectBody.ready

    def counted_write(self: DirectBody, data: bytes) -> None:
        counts.written += 1
        write(self, data)

    def counted_ready(self: DirectBody) -> bool:
        answer = ready(self)
        counts.refused += not answer
        return answer

    monkeypatch.setattr(DirectBody, "write", counted_write)
    monkeypatch.setattr(DirectBody, "ready", counted_ready)
    return counts


class WithoutDirectBody(DirectBodyProtocol):
    """dragoman's protocol with no direct writer in the scope: every chunk goes through `send`."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.scope.get("extensions", {}).pop(DIRECT_BODY, None)


@pytest.fixture(params=["direct", "asgi"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def start(mode: str) -> Iterator[Any]:
    servers: list[GatewayServer] = []

    def start(url: str, **config: Any) -> GatewayServer:
        http = http_protocol() if mode == "direct" else WithoutDirectBody
        server = GatewayServer(make_config(url, **config), http=http).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _paced(*items: Any) -> list[Any]:
    out: list[Any] = []
    for item in items:
        out += [item, PAUSE]
    return out


def _stream(gateway: GatewayServer, body: dict | None = None) -> list[tuple[str | None, Any]]:
    response = httpx.post(f"{gateway.url}/v1/messages", json=body or REQUEST, headers=HEADERS, timeout=20)
    assert response.status_code == 200
    return sse_frames(response.text)


def _check_mode(mode: str, writes: Writes) -> None:
    if mode == "direct":
        assert writes.written > 0, "no chunk was written directly"
    else:
        assert writes.written == 0


def test_paced_text_and_tool_call_arrive_whole(upstream: FakeUpstream, start: Any, mode: str, writes: Writes) -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    upstream.stream_reply(_paced(
        chunk({"role": "assistant", "content": ""}), chunk({"content": "Let me "}), chunk({"content": "check."}),
        chunk({"tool_calls": [call]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk(finish="tool_calls"), usage_chunk(prompt=12, completion_tokens=7),
    ))  # fmt: skip
    frames = [(e, d) for e, d in _stream(start(upstream.url)) if e != "ping"]

    assert [e for e, _ in frames] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert [d["delta"]["text"] for _, d in frames[2:4]] == ["Let me ", "check."]
    assert frames[5][1]["content_block"]["name"] == "get_weather"
    assert "".join(d["delta"]["partial_json"] for _, d in frames[6:8]) == '{"city": "Paris"}'
    assert frames[9][1]["delta"]["stop_reason"] == "tool_use"
    assert frames[9][1]["usage"] == {
        "input_tokens": 12,
        "output_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    _check_mode(mode, writes)


def test_unreadable_chunk_after_tokens_ends_with_an_error_event(
    upstream: FakeUpstream, start: Any, mode: str, writes: Writes
) -> None:
    upstream.stream_reply(
        [*_paced(*text_stream("one ", "two ")[:3]), b"data: {not json\n\n", chunk({"content": "never"})]
    )
    frames = _stream(start(upstream.url))

    texts = [d["delta"]["text"] for e, d in frames if e == "content_block_delta"]
    assert texts == ["one ", "two "]
    assert frames[-1][0] == "error"
    assert frames[-1][1]["error"]["type"] == "api_error"
    assert "unreadable stream chunk" in frames[-1][1]["error"]["message"]
    _check_mode(mode, writes)


def test_upstream_dropping_mid_stream_ends_with_an_error_event(
    upstream: FakeUpstream, start: Any, mode: str, writes: Writes
) -> None:
    upstream.queue(Reply(chunks=_paced(*text_stream("a", "b", "c")[:4]), drop=True, done=False))
    frames = _stream(start(upstream.url))

    assert [d["delta"]["text"] for e, d in frames if e == "content_block_delta"] == ["a", "b", "c"]
    assert frames[-1][0] == "error" and "message_stop" not in [e for e, _ in frames]
    _check_mode(mode, writes)


def test_a_server_keeping_its_body_open_after_done_still_gives_a_whole_reply(upstream: FakeUpstream, start: Any, mode: str,
                                                                            writes: Writes) -> None:  # fmt: skip
    # The client's reply ends at once, not after the grace the gateway gives the body's end (more than the client's timeout here).
    chunks = [*_paced(*text_stream("a", "b", "c")), b"data: [DONE]\n\n", ("sleep", 30)]
    upstream.queue(Reply(chunks=chunks, done=False))
    gateway = start(upstream.url, upstream={"idle_timeout": 60})
    gateway.app.gateway.shared.ends.grace = 60
    response = httpx.post(
        f"{gateway.url}/v1/messages", json=REQUEST, headers=HEADERS, timeout=10
    )  # not 30 s, nor an error
    frames = sse_frames(response.text)
    assert [d["delta"]["text"] for e, d in frames if e == "content_block_delta"] == ["a", "b", "c"]
    assert [e for e, _ in frames][-2:] == ["message_delta", "message_stop"] and "error" not in [e for e, _ in frames]
    _check_mode(mode, writes)


def test_passthrough_server_keeping_its_body_open_after_message_stop_still_gives_a_whole_reply(
    native: FakeAnthropic, start: Any, mode: str, writes: Writes
) -> None:
    events = text_events("Hello")
    native.replies.append(NativeReply(events=[*_paced(*events), ("sleep", 30)]))
    gateway = start(
        native.url, upstream={"protocol": "anthropic"}, models=[{"name": "native-model", "upstream": "default"}]
    )
    gateway.app.gateway.shared.ends.grace = 60  # the reply ends at once all the same
    response = httpx.post(
        f"{gateway.url}/v1/messages", json={**REQUEST, "model": "native-model"}, headers=HEADERS, timeout=10
    )
    assert response.content == b"".join(events)
    _check_mode(mode, writes)


def test_silence_mid_stream_is_filled_with_pings_then_the_stream_goes_on(upstream: FakeUpstream, start: Any, mode: str,
                                                                        writes: Writes) -> None:  # fmt: skip
    pieces = text_stream("first", "before", "after")
    upstream.stream_reply([*_paced(*pieces[:3]), ("sleep", 0.45), *_paced(*pieces[3:])])
    frames = _stream(start(upstream.url, server={"keepalive_interval": 0.1}))

    names = [e for e, _ in frames]
    first, second = names.index("content_block_delta"), len(names) - 1 - names[::-1].index("content_block_delta")
    assert names[first + 1 : second].count("ping") >= 2  # between the two tokens
    assert names[-1] == "message_stop"
    _check_mode(mode, writes)


def test_silence_past_the_idle_timeout_mid_stream_is_an_error(
    upstream: FakeUpstream, start: Any, mode: str, writes: Writes
) -> None:
    pieces = text_stream("one", "two", "three", "after")
    upstream.stream_reply([*_paced(*pieces[:4]), ("sleep", 1.5), *pieces[4:]])
    frames = _stream(start(upstream.url, server={"keepalive_interval": 0.1}, upstream={"idle_timeout": 0.4}))

    assert [d["delta"]["text"] for e, d in frames if e == "content_block_delta"] == ["one", "two", "three"]
    assert frames[-1][0] == "error"
    assert frames[-1][1]["error"]["type"] == "timeout_error"
    _check_mode(mode, writes)


def test_passthrough_forwards_paced_events_byte_for_byte(
    native: FakeAnthropic, start: Any, mode: str, writes: Writes
) -> None:
    events = text_events("Hello")
    deltas = [event_for(f" t{i}") for i in range(5)]
    events = [*events[:3], *deltas, *events[3:]]
    native.replies.append(NativeReply(events=_paced(*events)))
    gateway = start(
        native.url, upstream={"protocol": "anthropic"}, models=[{"name": "native-model", "upstream": "default"}]
    )

    response = httpx.post(
        f"{gateway.url}/v1/messages", json={**REQUEST, "model": "native-model"}, headers=HEADERS, timeout=20
    )

    assert response.content == b"".join(events)
    _check_mode(mode, writes)
    assert _metric(gateway, "output") == 3.0  # the usage of message_delta, read as it went past


@pytest.mark.parametrize("end", ["drop-mid-event", "clean-close-without-message-stop"])
def test_passthrough_stream_cut_short_ends_with_an_error_event_the_sdk_raises(native: FakeAnthropic, start: Any, mode: str,
                                                                              writes: Writes, end: str) -> None:  # fmt: skip
    events = text_events("Hello")
    half = event_for(" world")[:30]
    cut = [*events[:3], half, "drop"] if end == "drop-mid-event" else events[:3]
    native.replies.append(NativeReply(events=_paced(*cut)))
    gateway = start(
        native.url, upstream={"protocol": "anthropic"}, models=[{"name": "native-model", "upstream": "default"}]
    )
    client = anthropic.Anthropic(base_url=gateway.url, api_key=HEADERS["x-api-key"], max_retries=0)

    seen = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with client.messages.stream(
            model="native-model", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            seen.extend(stream.text_stream)
    assert seen == ["Hello"]
    assert caught.value.body["error"]["type"] == "api_error"


def event_for(text: str) -> bytes:
    from tests.support.fake_anthropic import event

    return event(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
    )


def test_a_client_that_stops_reading_gets_every_token_in_order(
    upstream: FakeUpstream, start: Any, mode: str, writes: Writes
) -> None:
    """The client's socket fills (flow control): direct writes stop, `send` waits for
    the client, and nothing is lost or reordered."""
    tokens = _numbered_tokens(lambda text: chunk({"content": text}))
    upstream.stream_reply(
        [
            chunk({"role": "assistant", "content": ""}),
            *tokens,
            chunk(finish="stop"),
            usage_chunk(completion_tokens=COUNT),
        ]
    )
    gateway = start(upstream.url)

    frames = _read_late(gateway, "test-model", writes if mode == "direct" else None)
    _check_every_token(frames, [d["delta"]["text"] for e, d in frames if e == "content_block_delta"], mode, writes)


def test_passthrough_to_a_client_that_stops_reading_loses_nothing(native: FakeAnthropic, start: Any, mode: str,
                                                                  writes: Writes) -> None:  # fmt: skip
    events = text_events("")
    native.replies.append(NativeReply(events=[*events[:3], *_numbered_tokens(event_for), *events[3:]]))
    gateway = start(
        native.url, upstream={"protocol": "anthropic"}, models=[{"name": "native-model", "upstream": "default"}]
    )

    frames = _read_late(gateway, "native-model", writes if mode == "direct" else None)
    texts = [d["delta"]["text"] for e, d in frames if e == "content_block_delta"][1:]  # after text_events' own ""
    _check_every_token(frames, texts, mode, writes)


TOKEN = "x" * 2000
COUNT = 2500  # 5 MB of text: more than the kernel buffers between the gateway and a client reading nothing


def _numbered_tokens(make: Any) -> list[Any]:
    """COUNT numbered tokens made by `make(text)`, a short pause every 50 (separate reads)."""
    items: list[Any] = []
    for i in range(COUNT):
        items.append(make(f"{i:05d}{TOKEN}"))
        if i % 50 == 0:
            items.append(("sleep", 0.001))
    return items


def _check_every_token(frames: list[tuple[str | None, Any]], texts: list[str], mode: str, writes: Writes) -> None:
    # (tokens that reached the gateway in one read may come out in one text delta)
    assert "".join(texts) == "".join(f"{i:05d}{TOKEN}" for i in range(COUNT))
    assert frames[-1][0] == "message_stop"
    _check_mode(mode, writes)
    if mode == "direct":
        assert writes.refused > 0, "the client's socket never filled: the test did not exercise flow control"


def _read_late(gateway: GatewayServer, model: str, writes: Writes | None = None) -> list[tuple[str | None, Any]]:
    """A stream's frames, read by a client with a small socket buffer that reads nothing
    (the gateway's writes to it pause), then everything. It reads nothing until the direct
    writer found the socket full (`writes`), or for half a second in buffered mode."""
    body = (
        b'{"model":"%s","max_tokens":5000,"stream":true,"messages":[{"role":"user","content":"Hi"}]}' % model.encode()
    )
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", gateway.port))
        client.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\n"
                       b"content-length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        if writes is None:
            time.sleep(0.5)  # read nothing while the upstream sends everything
        else:  # however loaded the machine, wait until flow control has had to act
            eventually(lambda: writes.refused > 0, "the direct writer finding the client's socket full", timeout=30)
        received = bytearray()
        client.settimeout(20)
        while data := client.recv(65536):
            received += data
    return sse_frames(_unchunk(bytes(received)).decode())


def _unchunk(raw: bytes) -> bytes:
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    body = bytearray()
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2 :]
    return bytes(body)


def _metric(gateway: GatewayServer, direction: str) -> float:
    """The gateway's token counter for native-model (recorded just after the stream's last byte)."""
    line = f'dragoman_tokens_total{{direction="{direction}",model="native-model"}}'

    def row() -> str | None:
        return next((r for r in httpx.get(f"{gateway.url}/metrics").text.splitlines() if r.startswith(line)), None)

    return float(eventually(row, f"the {direction} token counter").split()[-1])


def test_time_to_first_token_is_recorded_once_when_the_first_delta_is_written_directly(
    upstream: FakeUpstream, start: Any, mode: str, writes: Writes
) -> None:
    # The tool call's first chunk opens its block without a delta; the first delta is the next read.
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    upstream.stream_reply(_paced(
        chunk({"role": "assistant", "content": None, "tool_calls": [call]}),
        *[chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}) for part in ('{"a"', ": 1", "}")],
        chunk(finish="tool_calls"), usage_chunk(),
    ))  # fmt: skip
    gateway = start(upstream.url)
    frames = _stream(gateway)

    assert [e for e, _ in frames if e != "ping"][:3] == ["message_start", "content_block_start", "content_block_delta"]
    _check_mode(mode, writes)
    assert eventually(lambda: _histogram_count(gateway), "time to first token recorded") == 1


def _histogram_count(gateway: GatewayServer) -> float:
    for row in httpx.get(f"{gateway.url}/metrics").text.splitlines():
        if row.startswith('dragoman_time_to_first_token_seconds_count{path="translate"}'):
            return float(row.split()[-1])
    return 0.0


def test_a_client_leaving_while_tokens_flow_closes_the_upstream(
    upstream: FakeUpstream, start: Any, mode: str, writes: Writes
) -> None:
    items: list[Any] = [chunk({"role": "assistant", "content": ""})]
    for i in range(300):
        items += [chunk({"content": f" t{i}"}), ("sleep", 0.01)]
    upstream.stream_reply([*items, chunk(finish="stop"), usage_chunk()])
    gateway = start(upstream.url)

    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=REQUEST, headers=HEADERS, timeout=10) as response:
        received = b""
        for data in response.iter_bytes():
            received += data
            if received.count(b"content_block_delta") >= 10:
                break  # and hang up, mid-stream
    eventually(lambda: upstream.disconnects == 1, "the upstream saw it", timeout=3)
    assert upstream.completed == 0
    _check_mode(mode, writes)


def test_passthrough_counts_a_message_delta_cut_across_reads(
    native: FakeAnthropic, start: Any, mode: str, writes: Writes
) -> None:
    events = text_events("Hello")
    delta = events[4].replace(b'"output_tokens": 3', b'"output_tokens": 123')
    cut = delta.index(b'"output_tokens": 1') + len(b'"output_tokens": 1')  # "1" | "23}}"
    tokens = [event_for(f" t{i}") for i in range(3)]
    native.replies.append(
        NativeReply(events=_paced(*events[:3], *tokens, events[3], delta[:cut], delta[cut:], events[5]))
    )
    gateway = start(
        native.url, upstream={"protocol": "anthropic"}, models=[{"name": "native-model", "upstream": "default"}]
    )

    response = httpx.post(
        f"{gateway.url}/v1/messages", json={**REQUEST, "model": "native-model"}, headers=HEADERS, timeout=20
    )

    assert response.content.endswith(delta + events[5])
    assert _metric(gateway, "output") == 123.0
    _check_mode(mode, writes)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture
def warnings_logged() -> Iterator[Any]:
    """Call it once the gateway runs (uvicorn configures its loggers at start, dropping
    handlers): the warnings and errors of dragoman's and uvicorn's loggers from then on
    (uvicorn's do not reach the root logger, so caplog misses them)."""
    handler = Collect()
    loggers = [logging.getLogger(name) for name in ("dragoman", "uvicorn.error")]

    def watch() -> list[str]:
        for logger in loggers:
            logger.addHandler(handler)
        return handler.messages

    yield watch
    for logger in loggers:
        logger.removeHandler(handler)


def test_a_client_resetting_a_pipelined_connection_mid_stream_is_a_client_disconnect(
    upstream: FakeUpstream, start: Any, mode: str, writes: Writes, warnings_logged: Any
) -> None:
    """uvicorn alone marks only the newest request of a pipelined connection as
    disconnected: the stream ahead of it went on writing to a closed transport."""
    items: list[Any] = [chunk({"role": "assistant", "content": ""})]
    for i in range(100):
        items += [chunk({"content": f" t{i}"}), ("sleep", 0.01)]
    for _ in range(2):
        upstream.stream_reply([*items, chunk(finish="stop"), usage_chunk()])
    gateway = start(upstream.url)
    logged = warnings_logged()
    body = json.dumps(REQUEST).encode()
    post = (
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )

    with socket.create_connection(("127.0.0.1", gateway.port)) as client:
        client.sendall(post + post)
        received = b""
        while received.count(b"content_block_delta") < 5:
            received += client.recv(65536)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    eventually(lambda: upstream.disconnects >= 1, "the upstream saw it", timeout=5)  # the upstream request was closed
    # the stream's outcome is recorded once its task has ended
    eventually(lambda: _rows(gateway, "dragoman_requests_total{"), "the stream's outcome recorded")
    assert _rows(gateway, "dragoman_upstream_errors_total{") == []
    assert _rows(gateway, "dragoman_client_disconnects_total") == ["dragoman_client_disconnects_total 1.0"]
    assert logged == []
    _check_mode(mode, writes)


def _rows(gateway: GatewayServer, prefix: str) -> list[str]:
    return [row for row in httpx.get(f"{gateway.url}/metrics").text.splitlines() if row.startswith(prefix)]


@pytest.mark.parametrize(
    "sent",
    [
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-ty",  # part of the headers
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{\"model\": ",
    ],
    ids=["headers", "body"],
)  # fmt: skip
def test_a_client_that_stops_sending_its_request_gets_a_408_and_the_connection_closes(
    upstream: FakeUpstream, sent: bytes
) -> None:
    impatient = functools.partial(DirectBodyProtocol, read_idle_timeout=0.3)
    gateway = GatewayServer(make_config(upstream.url), http=impatient).start()
    try:
        with socket.create_connection(("127.0.0.1", gateway.port)) as client:
            client.settimeout(5)
            client.sendall(sent[:20])
            time.sleep(0.2)
            client.sendall(sent[20:])  # bytes keep the request alive; then nothing more
            started = time.monotonic()
            received = b""
            while data := client.recv(65536):
                received += data
        waited = time.monotonic() - started
    finally:
        gateway.stop()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    error = json.loads(body)["error"]
    assert error["type"] == "timeout_error" and "no byte of the request" in error["message"]
    assert 0.2 < waited < 3
    assert upstream.requests == []

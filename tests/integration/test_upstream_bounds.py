"""Upstream replies that would cost the gateway unbounded memory or time end as
Anthropic errors instead: a gzip bomb or an oversized reply is a 502 `api_error` (an
`error` event mid-stream), a reply whose body stops coming is a 504 `timeout_error`
after the upstream's idle_timeout. On both paths: translating and passthrough."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from dragoman.backends.shared import Shared
from dragoman.core.config_load import from_dict
from dragoman.upstream.transport import inflate
from tests.support.envelopes import error_of
from tests.support.fake_anthropic import FakeAnthropic, NativeReply
from tests.support.fakes import Reply, chunk, completion
from tests.support.samples import MiB, gzip_bomb
from tests.support.servers import GatewayServer, sse_frames

USER = [{"role": "user", "content": "Hello"}]
VALID = {"model": "test-model", "max_tokens": 10, "messages": USER}
GZIP_JSON = {"content-type": "application/json", "content-encoding": "gzip"}


def _post(url: str, body: dict, *, key: str = "k", timeout: float = 20) -> httpx.Response:
    headers = {"content-type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"}
    return httpx.post(f"{url}/v1/messages", content=json.dumps(body).encode(), headers=headers, timeout=timeout)


def _error(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type
    return body["error"]["message"]


# -- the translating path ------------------------------------------------------------------


def test_a_gzip_bomb_reply_is_a_502_and_the_gateway_goes_on_serving(gateway, upstream):
    upstream.queue(Reply(chunks=[gzip_bomb(1024)], headers=GZIP_JSON, done=False))  # 1 MB that inflates to 1 GiB
    message = _error(_post(gateway.url, VALID), 502, "api_error")
    assert "upstream default failed" in message and "exceeds 64 MiB" in message
    assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200
    assert _post(gateway.url, VALID).json()["content"][0]["text"] == "Hello!"


def test_an_oversized_reply_is_a_502_naming_the_size(gateway, upstream):
    upstream.queue(Reply(chunks=[b" " * (65 * MiB)], headers={"content-type": "application/json"}, done=False))
    message = _error(_post(gateway.url, VALID), 502, "api_error")
    assert "exceeds 64 MiB" in message


def test_a_reply_whose_body_stops_after_its_headers_is_a_504(make_gateway, upstream):
    gateway = make_gateway(upstream={"idle_timeout": 0.3})
    upstream.queue(
        Reply(chunks=[b'{"id": "chatcmpl-1", ', ("sleep", 5)], headers={"content-type": "application/json"}, done=False)
    )
    message = _error(_post(gateway.url, VALID, timeout=4), 504, "timeout_error")
    assert "upstream default timed out" in message and "no bytes for 0.3 s" in message


def test_a_slow_but_steady_reply_is_not_cut_by_idle_timeout(make_gateway, upstream):
    gateway = make_gateway(upstream={"idle_timeout": 0.3})
    body = json.dumps(completion("steady")).encode()
    pieces: list = []
    for i in range(0, len(body), len(body) // 6 + 1):
        pieces += [body[i : i + len(body) // 6 + 1], ("sleep", 0.1)]  # 0.7 s in all, never 0.3 s silent
    upstream.queue(Reply(chunks=pieces, headers={"content-type": "application/json"}, done=False))
    assert _post(gateway.url, VALID).json()["content"][0]["text"] == "steady"


def test_a_gzip_bomb_mid_stream_ends_with_an_error_event(gateway, upstream, monkeypatch: pytest.MonkeyPatch):
    """A stream may be long, so its bound is MAX_INFLATED (256 MiB, made small here) and
    backpressure, not MAX_BODY. What came before the bomb reaches the client."""
    monkeypatch.setattr(inflate, "MAX_INFLATED", 4 * MiB)
    first = b"data: " + json.dumps(chunk({"role": "assistant", "content": "partial"})).encode() + b"\n\n"
    upstream.queue(Reply(chunks=[gzip_bomb(64, b"\n", prefix=first)], headers={"content-encoding": "gzip"}, done=False))
    response = _post(gateway.url, {**VALID, "stream": True})
    assert response.status_code == 200
    frames = sse_frames(response.text)
    assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] == "api_error"
    assert "inflates past 4 MiB" in frames[-1][1]["error"]["message"]
    assert "".join(d["delta"]["text"] for e, d in frames if e == "content_block_delta") == "partial"


# -- replies read as a stream and folded into one message ----------------------------------------

STOPPING = {**VALID, "stop_sequences": ["###"]}  # read as a stream upstream, folded for the client


def _tool_stream(pieces: int, piece: str) -> list:
    """A tool call whose arguments come in `pieces` fragments of `piece`: {"text": "<piece * pieces>"}."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "write", "arguments": '{"text": "'}}
    fragments = [chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece * 64}}]})] * (pieces // 64)
    end = chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]}, "tool_calls")
    return [chunk({"role": "assistant", "content": None, "tool_calls": [call]}), *fragments, end]


def test_a_long_reply_read_as_a_stream_folds_whole(gateway, upstream):
    """4 MB of text and 4 MB of tool arguments, in thousands of pieces each: the SDK gets all of it."""
    text = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": "abcd" * 256})] * 4096
    upstream.stream_reply([*text, chunk({}, "stop")])
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0, timeout=60)
    message = client.messages.create(**STOPPING)
    assert message.content[0].type == "text" and message.content[0].text == "abcd" * 256 * 4096
    upstream.stream_reply(_tool_stream(4096, "abcd" * 256))
    message = client.messages.create(**STOPPING, tools=[{"name": "write", "input_schema": {"type": "object"}}])
    block = message.content[0]
    assert block.type == "tool_use" and block.input == {"text": "abcd" * 256 * 4096}


@pytest.mark.parametrize("kind", ["text", "tool arguments"])
def test_a_folded_reply_past_its_cap_is_a_502_and_the_gateway_goes_on(make_gateway, upstream, kind):
    """A hostile upstream's endless stream, read for a non-streaming request, ends at MAX_FOLDED
    (64 MiB; 1 MiB here: the gateway's `Shared.max_folded`) with Anthropic's envelope, and
    closes the upstream request."""
    gateway = make_gateway(shared=Shared(max_folded=MiB))
    if kind == "text":
        upstream.stream_reply([chunk({"role": "assistant", "content": ""})] + [chunk({"content": "x" * 1024})] * 4096)
    else:
        upstream.stream_reply(_tool_stream(4096, "x" * 1024)[:-1], done=False)
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0, timeout=60)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(**STOPPING, tools=[{"name": "write", "input_schema": {"type": "object"}}])
    assert "longer than 1 MiB" in error_of(caught, 502, "api_error")
    assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200
    assert client.messages.create(**VALID).content[0].text == "Hello!"


# -- the passthrough path --------------------------------------------------------------------


@pytest.fixture
def passthrough(native: FakeAnthropic):
    def start(**upstream: object) -> GatewayServer:
        config = from_dict({
            "upstreams": {"native": {"url": native.url + "/v1", "protocol": "anthropic", "max_retries": 0, **upstream}},
            "models": [{"name": "claude-test", "upstream": "native", "upstream_model": "native-model"}],
        })  # fmt: skip
        server = GatewayServer(config).start()
        started.append(server)
        return server

    started: list[GatewayServer] = []
    yield start
    for server in started:
        server.stop()


def test_passthrough_a_gzip_bomb_reply_is_a_502(passthrough, native):
    gateway = passthrough()
    native.replies.append(NativeReply(events=[gzip_bomb(1024)], headers=GZIP_JSON))
    message = _error(_post(gateway.url, {**VALID, "model": "claude-test"}), 502, "api_error")
    assert "upstream native failed" in message and "exceeds 64 MiB" in message


def test_passthrough_a_reply_whose_body_stops_after_its_headers_is_a_504(passthrough, native):
    gateway = passthrough(idle_timeout=0.3)
    native.replies.append(
        NativeReply(events=[b'{"id": "msg_1", ', ("sleep", 5)], headers={"content-type": "application/json"})
    )
    message = _error(_post(gateway.url, {**VALID, "model": "claude-test"}, timeout=4), 504, "timeout_error")
    assert "upstream native timed out" in message

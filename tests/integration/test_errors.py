"""Errors over a real socket, in Anthropic's envelope: client mistakes (400/404/405),
upstream failures before a stream starts (status codes the SDK maps and retries
correctly), and failures after it started (an `error` event; never a hang)."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import pytest

from tests.support.fakes import Reply, chunk, completion, text_stream
from tests.support.servers import sse_frames

USER = [{"role": "user", "content": "Hello"}]
VALID = {"model": "test-model", "max_tokens": 10, "messages": USER}


def _envelope(response: httpx.Response, status: int, error_type: str) -> str:
    """Assert the Anthropic error envelope and the request id; return the message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    request_id = response.headers["request-id"]
    assert request_id.startswith("req_")
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert body["request_id"] == request_id
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]["message"]


def _post(
    gateway, body: object, *, raw: bytes | None = None, path: str = "/v1/messages", timeout: float = 10
) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    headers = {"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"}
    return httpx.post(f"{gateway.url}{path}", content=content, headers=headers, timeout=timeout)


def _sdk(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)


# -- the client's mistakes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"model": "test-model", "messages": USER}, ["max_tokens", "required"]),
        ({"max_tokens": 10, "messages": USER}, ["model", "required"]),
        ({**VALID, "messages": "Hello"}, ["messages", "array"]),
        ({**VALID, "messages": []}, ["messages", "at least one"]),
        ({**VALID, "max_tokens": "ten"}, ["max_tokens", "int"]),
        ({**VALID, "messages": [{"role": "robot", "content": "hi"}]}, ["messages.0.role", "robot"]),
        (
            {**VALID, "messages": [{"role": "user", "content": [{"type": "banana", "x": 1}]}]},
            ["messages.0.content.0.type", "banana"],
        ),
        ({**VALID, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, ["messages.0.content.0.text"]),
        ({**VALID, "messages": [{"role": "user"}]}, ["messages.0.content"]),
        ({**VALID, "stream": "yes"}, ["stream", "bool"]),
        ({**VALID, "temperature": 3}, ["temperature"]),
        ({**VALID, "stop_sequences": ["ok", ""]}, ["stop_sequences.1"]),
        ({**VALID, "tools": [{"name": "f"}]}, ["tools.0.input_schema"]),
        ({**VALID, "tool_choice": {"type": "sometimes"}}, ["tool_choice"]),
    ],
    ids=[
        "missing-max_tokens",
        "missing-model",
        "messages-not-a-list",
        "messages-empty",
        "max_tokens-wrong-type",
        "bad-role",
        "unknown-block-type",
        "text-block-without-text",
        "message-without-content",
        "stream-wrong-type",
        "temperature-out-of-range",
        "empty-stop-sequence",
        "tool-without-schema",
        "bad-tool-choice",
    ],  # fmt: skip
)
def test_invalid_requests_name_the_field(gateway, upstream, body, names):
    message = _envelope(_post(gateway, body), 400, "invalid_request_error")
    for name in names:
        assert name in message, message
    assert upstream.requests == []  # nothing invalid reaches the upstream


def test_invalid_request_is_not_retried_by_the_sdk(gateway, upstream):
    response = _post(gateway, {**VALID, "messages": []})
    assert response.headers.get("x-should-retry") == "false"


def test_invalid_json(gateway):
    message = _envelope(_post(gateway, None, raw=b'{"model": "test-model", '), 400, "invalid_request_error")
    assert "JSON" in message
    message = _envelope(_post(gateway, None, raw=b""), 400, "invalid_request_error")
    assert "empty" in message
    message = _envelope(_post(gateway, None, raw=b"[1, 2]"), 400, "invalid_request_error")
    assert "object" in message


def test_invalid_request_through_the_sdk(gateway):
    with pytest.raises(anthropic.BadRequestError) as caught:
        _sdk(gateway).messages.create(model="test-model", max_tokens=10, messages=[{"role": "robot", "content": "x"}])  # type: ignore[typeddict-item]
    error = caught.value
    assert error.status_code == 400
    assert error.body["error"]["type"] == "invalid_request_error"
    assert error.request_id and error.request_id == error.body["request_id"]
    assert "messages.0.role" in error.message


def test_unknown_model_lists_the_served_models(gateway, upstream):
    gateway.wait_discovered()
    message = _envelope(_post(gateway, {**VALID, "model": "no-such-model"}), 404, "not_found_error")
    assert "no-such-model" in message and "test-model" in message
    with pytest.raises(anthropic.NotFoundError) as caught:
        _sdk(gateway).messages.create(model="no-such-model", max_tokens=10, messages=USER)
    # ... and how to serve any name (Claude Code's claude-* names) with one of them
    assert "--default-model" in caught.value.message and "aliases" in caught.value.message
    assert upstream.requests == []


def test_wrong_path_and_wrong_method(gateway):
    message = _envelope(_post(gateway, VALID, path="/v1/nothing"), 404, "not_found_error")
    assert "/v1/nothing" in message
    message = _envelope(httpx.get(f"{gateway.url}/v1/messages", timeout=5), 405, "invalid_request_error")
    assert "GET" in message and "/v1/messages" in message
    _envelope(httpx.put(f"{gateway.url}/v1/messages", json=VALID, timeout=5), 405, "invalid_request_error")
    _envelope(httpx.delete(f"{gateway.url}/v1/models", timeout=5), 405, "invalid_request_error")


def test_request_too_large(make_gateway, upstream):
    gateway = make_gateway(server={"max_request_bytes": 1000})
    body = {**VALID, "messages": [{"role": "user", "content": "x" * 2000}]}
    message = _envelope(_post(gateway, body), 413, "request_too_large")
    assert "1000" in message
    assert upstream.requests == []


# -- upstream failures before the response starts -------------------------------------------


@pytest.fixture
def no_retry(make_gateway):
    """A gateway that hands the upstream's first failure straight to the client."""
    return make_gateway(upstream={"max_retries": 0})


def test_upstream_429_passes_retry_after_and_is_a_rate_limit_error(no_retry, upstream):
    gateway = no_retry
    upstream.json_reply(
        {"error": {"message": "Rate limit reached", "type": "rate_limit"}}, status=429, headers={"retry-after": "7"}
    )
    response = _post(gateway, VALID)
    message = _envelope(response, 429, "rate_limit_error")
    assert response.headers["retry-after"] == "7"
    assert "Rate limit reached" in message
    assert "x-should-retry" not in response.headers  # the SDK may retry a 429

    upstream.json_reply({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "3"})
    with pytest.raises(anthropic.RateLimitError) as caught:
        _sdk(gateway).messages.create(**VALID)
    assert caught.value.response.headers["retry-after"] == "3"
    assert caught.value.body["error"]["type"] == "rate_limit_error"


def test_upstream_429_on_a_stream_is_an_http_error_not_an_event(no_retry, upstream):
    gateway = no_retry
    upstream.json_reply({"error": {"message": "Rate limit reached"}}, status=429, headers={"retry-after": "2"})
    with pytest.raises(anthropic.RateLimitError):
        with _sdk(gateway).messages.stream(**VALID) as stream:
            stream.get_final_message()


def test_upstream_503_is_overloaded(no_retry, upstream):
    gateway = no_retry
    upstream.json_reply({"error": {"message": "server busy"}}, status=503)
    message = _envelope(_post(gateway, VALID), 529, "overloaded_error")
    assert "server busy" in message
    upstream.json_reply({"error": {"message": "server busy"}}, status=503)
    with pytest.raises(anthropic.OverloadedError) as caught:
        with _sdk(gateway).messages.stream(**VALID) as stream:
            stream.get_final_message()
    assert caught.value.status_code == 529


def test_upstream_500_is_a_bad_gateway_api_error(no_retry, upstream):
    gateway = no_retry
    upstream.json_reply({"error": {"message": "CUDA error: an illegal memory access"}}, status=500)
    message = _envelope(_post(gateway, VALID), 502, "api_error")
    assert "500" in message and "illegal memory access" in message
    upstream.json_reply({"detail": "internal"}, status=500)
    with pytest.raises(anthropic.InternalServerError) as caught:
        _sdk(gateway).messages.create(**VALID)
    assert caught.value.status_code == 502


def test_transient_upstream_failures_are_retried_before_the_client_sees_them(make_gateway, upstream):
    gateway = make_gateway(upstream={"max_retries": 2})
    upstream.json_reply({"error": {"message": "busy"}}, status=503, headers={"retry-after": "0"})
    upstream.json_reply({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "0"})
    message = _sdk(gateway).messages.create(**VALID)
    assert message.content[0].text == "Hello!"
    assert len(upstream.requests) == 3


def test_deterministic_upstream_errors_are_not_retried(make_gateway, upstream):
    gateway = make_gateway(upstream={"max_retries": 2})
    upstream.json_reply({"error": {"message": "bad schema"}}, status=400)
    _envelope(_post(gateway, VALID), 400, "invalid_request_error")
    assert len(upstream.requests) == 1


def test_upstream_unreachable_is_a_clear_api_error(make_gateway, dead_port):
    closed = dead_port  # nothing listens there
    gateway = make_gateway(url=f"http://127.0.0.1:{closed}/v1", upstream={"max_retries": 0})
    started = time.monotonic()
    message = _envelope(_post(gateway, VALID), 502, "api_error")
    assert "unreachable" in message and str(closed) in message
    with pytest.raises(anthropic.InternalServerError) as caught:
        with _sdk(gateway).messages.stream(**VALID) as stream:
            stream.get_final_message()
    assert "unreachable" in caught.value.message
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "upstream_error",
    [
        # vLLM
        {"object": "error", "type": "BadRequestError", "code": 400, "message": "This model's maximum context length is 4096 tokens. "
         "However, you requested 10 output tokens and your prompt contains 5000 input tokens. Please reduce the length of the input prompt."},
        # OpenAI
        {"error": {"message": "This model's maximum context length is 4096 tokens. However, your messages resulted in 5000 tokens. "
                   "Please reduce the length of the messages.", "type": "invalid_request_error", "code": "context_length_exceeded"}},
        # llama.cpp
        {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                   "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}},
    ],
    ids=["vllm", "openai", "llamacpp"],
)  # fmt: skip
def test_upstream_context_overflow_is_prompt_is_too_long(gateway, upstream, upstream_error):
    upstream.json_reply(upstream_error, status=400)
    response = _post(gateway, VALID)
    message = _envelope(response, 400, "invalid_request_error")
    assert message.startswith("prompt is too long: 5000 tokens > 4096 maximum")
    assert response.headers.get("x-should-retry") == "false"


def test_upstream_timeout_before_the_response(make_gateway, upstream):
    gateway = make_gateway(upstream={"first_byte_timeout": 0.3, "idle_timeout": 0.3})
    upstream.queue(
        Reply(body=completion(), hang=30.0)
    )  # a gateway that waited for it would get a 200, or the client's 10 s timeout
    message = _envelope(_post(gateway, VALID), 504, "timeout_error")
    assert "timed out" in message

    upstream.queue(Reply(chunks=text_stream("late"), hang=30.0))
    with pytest.raises(anthropic.InternalServerError) as caught:
        with _sdk(gateway).messages.stream(**VALID) as stream:
            stream.get_final_message()
    assert caught.value.status_code == 504 and caught.value.body["error"]["type"] == "timeout_error"


def test_upstream_timeout_message_says_what_happened(make_gateway, upstream):
    gateway = make_gateway(upstream={"first_byte_timeout": 0.3})
    upstream.queue(Reply(body=completion(), hang=1.0))
    message = _envelope(_post(gateway, VALID), 504, "timeout_error")
    assert "()" not in message


# -- upstream failures after the stream started -----------------------------------------------


def _stream_frames(gateway, timeout: float = 10) -> list:
    started = time.monotonic()
    response = _post(gateway, {**VALID, "stream": True}, timeout=timeout)
    assert time.monotonic() - started < timeout
    assert response.status_code == 200
    assert response.headers["request-id"].startswith("req_")
    frames = sse_frames(response.text)
    assert all(event is not None for event, _ in frames)
    assert frames[0][0] == "message_start"
    return frames


def test_error_chunk_mid_stream_ends_with_an_error_event(gateway, upstream):
    upstream.stream_reply(
        [chunk({"role": "assistant", "content": "partial"}), ("sleep", 0.05),
         {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}],
        done=False,
    )  # fmt: skip
    frames = _stream_frames(gateway)
    names = [event for event, _ in frames]
    assert names[-1] == "error" and "message_stop" not in names
    assert (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "partial"}},
    ) in frames
    error = frames[-1][1]
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert "CUDA out of memory" in error["error"]["message"]

    upstream.stream_reply(
        [chunk({"role": "assistant", "content": "partial"}), {"error": {"message": "boom"}}], done=False
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        with _sdk(gateway).messages.stream(**VALID) as stream:
            stream.get_final_message()
    assert caught.value.body["error"]["type"] == "api_error" and "boom" in caught.value.body["error"]["message"]


def test_context_overflow_reported_as_a_streams_first_event_is_a_400(gateway, upstream):
    """Before anything of the stream went out, the client gets the status Anthropic answers a
    prompt that is too long with, not a 200 and an error event."""
    upstream.stream_reply(
        [{"error": {"message": "input (5000 tokens) is longer than the model's context length (4096 tokens)"}}],
        done=False,
    )
    message = _envelope(_post(gateway, {**VALID, "stream": True}), 400, "invalid_request_error")
    assert message.startswith("prompt is too long: 5000 tokens > 4096 maximum")
    with pytest.raises(anthropic.BadRequestError):
        upstream.stream_reply(
            [{"error": {"message": "input (5000 tokens) is longer than the model's context length (4096 tokens)"}}],
            done=False,
        )
        with _sdk(gateway).messages.stream(**VALID) as stream:
            stream.get_final_message()


def test_context_overflow_reported_mid_stream(gateway, upstream):
    upstream.stream_reply(
        [chunk({"role": "assistant", "content": "a"}), ("sleep", 0.05),
         {"error": {"message": "input (5000 tokens) is longer than the model's context length (4096 tokens)"}}],
        done=False,
    )  # fmt: skip
    frames = _stream_frames(gateway)
    error = frames[-1][1]["error"]
    assert frames[-1][0] == "error"
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: 5000 tokens > 4096 maximum")


def test_connection_dropped_mid_stream_ends_with_an_error_event(gateway, upstream):
    upstream.stream_reply([chunk({"role": "assistant", "content": "partial"}), ("sleep", 0.05)], drop=True)
    frames = _stream_frames(gateway)
    names = [event for event, _ in frames]
    assert names[-1] == "error" and "message_stop" not in names
    assert frames[-1][1]["error"]["type"] == "api_error"

    upstream.stream_reply([chunk({"role": "assistant", "content": "partial"}), ("sleep", 0.05)], drop=True)
    with pytest.raises(anthropic.APIStatusError):
        with _sdk(gateway).messages.stream(**VALID) as stream:
            stream.get_final_message()


def test_connection_dropped_while_answering_a_non_streaming_call(gateway, upstream):
    # With stop sequences the gateway reads a stream even for a plain call.
    upstream.stream_reply([chunk({"role": "assistant", "content": "partial"}), ("sleep", 0.05)], drop=True)
    _envelope(_post(gateway, {**VALID, "stop_sequences": ["zz"]}), 502, "api_error")


def test_stream_closed_without_done_or_finish_reason_still_ends_cleanly(gateway, upstream):
    # The upstream closes the body properly but sends neither finish_reason nor [DONE]:
    # the client gets a well-formed end (today: a complete message) rather than a hang.
    upstream.stream_reply([chunk({"role": "assistant", "content": "partial"})], done=False)
    frames = _stream_frames(gateway)
    names = [event for event, _ in frames]
    assert names[-1] in ("message_stop", "error")
    if names[-1] == "message_stop":
        assert names[-2] == "message_delta"
        assert "".join(d["delta"]["text"] for e, d in frames if e == "content_block_delta") == "partial"


def test_first_chunk_later_than_first_byte_timeout(make_gateway, upstream):
    """Nothing of the stream went out: a 504, which the SDKs retry (an error event they do not)."""
    gateway = make_gateway(upstream={"first_byte_timeout": 0.3, "idle_timeout": 0.3})
    upstream.stream_reply([("sleep", 1.0), *text_stream("late")])
    _envelope(_post(gateway, {**VALID, "stream": True}, timeout=5), 504, "timeout_error")


def test_upstream_going_silent_mid_stream(make_gateway, upstream):
    gateway = make_gateway(upstream={"first_byte_timeout": 0.3, "idle_timeout": 0.3})
    upstream.stream_reply([chunk({"role": "assistant", "content": "a"}), ("sleep", 1.0), *text_stream("b")])
    frames = _stream_frames(gateway, timeout=5)
    assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] == "timeout_error"
    assert "message_stop" not in [event for event, _ in frames]


def test_garbage_from_the_upstream(gateway, upstream):
    upstream.stream_reply([chunk({"role": "assistant", "content": "a"}), b"data: {not json\n\n"], done=False)
    frames = _stream_frames(gateway)
    assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] == "api_error"

    upstream.queue(Reply(body="<html>502 Bad Gateway</html>"))
    message = _envelope(_post(gateway, VALID), 502, "api_error")
    assert "upstream" in message


def test_json_answer_to_a_stream_request_is_not_silently_empty(gateway, upstream):
    upstream.json_reply(completion("Hello there"))
    frames = _stream_frames(gateway)
    text = "".join(d["delta"]["text"] for e, d in frames if e == "content_block_delta")
    assert text == "Hello there" or frames[-1][0] == "error"


def test_text_before_an_error_chunk_is_not_lost_when_they_arrive_together(gateway, upstream):
    together = (
        b"data: " + json.dumps(chunk({"role": "assistant", "content": "partial"})).encode() + b"\n\n"
        b'data: {"error": {"message": "boom"}}\n\n'
    )
    upstream.stream_reply([together], done=False)
    frames = _stream_frames(gateway)
    assert frames[-1][0] == "error"
    assert "".join(d["delta"]["text"] for e, d in frames if e == "content_block_delta") == "partial"


def test_an_upstream_that_cannot_take_images_is_a_client_error_not_a_retryable_502(no_retry, upstream):
    gateway = no_retry
    refusal = "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
    upstream.json_reply({"error": {"code": 500, "message": refusal, "type": "server_error"}}, status=500)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    response = _post(
        gateway, {**VALID, "messages": [{"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}]}
    )
    message = _envelope(response, 400, "invalid_request_error")
    assert "does not accept images" in message and "vision = false" in message
    assert response.headers.get("x-should-retry") == "false"


def test_the_gateways_upstream_key_is_redacted_from_upstream_errors_whatever_its_shape(make_gateway, upstream):
    """A key with no recognisable pattern (not `sk-…`, not after `Bearer`) is still the key."""
    key = "upstream-oa-SECRET-xyz"
    gateway = make_gateway(upstream={"api_key": key, "max_retries": 0})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    upstream.json_reply(
        {"error": {"message": f"Incorrect API key provided: {key}.", "type": "invalid_request_error"}}, status=400
    )
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="test-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert key not in caught.value.response.text and "Incorrect API key provided: [redacted]." in caught.value.message

    upstream.stream_reply([chunk({"content": "a"}), {"error": {"message": f"auth failed for {key}"}}])
    with pytest.raises(anthropic.APIStatusError) as streamed:
        with client.messages.stream(
            model="test-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            stream.get_final_message()
    assert key not in str(streamed.value.body) and "[redacted]" in str(streamed.value.body)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream-answered-with-json"])
def test_a_200_carrying_an_error_body_is_the_upstreams_error_not_an_empty_reply(client, upstream, stream):
    upstream.json_reply({"error": {"message": "model is loading, try later", "type": "server_error"}}, status=200)
    with pytest.raises(anthropic.APIStatusError) as caught:
        if stream:
            with client.messages.stream(
                model="test-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            ) as events:
                events.get_final_message()
        else:
            client.messages.create(model="test-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert "model is loading" in str(caught.value.body)

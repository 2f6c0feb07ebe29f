"""Streaming over a real socket: the SSE wire format (raw httpx), the SDK's helpers,
and stop sequences matched by the gateway (including closing the upstream early)."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import pytest

from tests.support.fakes import Reply, chunk, completion, text_stream
from tests.support.servers import sse_frames
from tests.support.waiting import eventually

USER = [{"role": "user", "content": "Hello"}]
HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}


def _post_stream(gateway, body: dict, timeout: float = 10) -> httpx.Response:
    response = httpx.post(f"{gateway.url}/v1/messages", json={"stream": True, **body}, headers=HEADERS, timeout=timeout)
    return response


# -- wire format ------------------------------------------------------------------------


def test_sse_wire_format_and_exact_event_order(gateway, upstream):
    upstream.stream_reply(text_stream("Hel", "lo", prompt=9))
    response = _post_stream(gateway, {"model": "test-model", "max_tokens": 20, "messages": USER})

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["request-id"].startswith("req_")
    assert "data: [DONE]" not in response.text
    frames = sse_frames(response.text)
    # Every frame has an `event:` line (the SDKs drop frames without one) whose name is the JSON type.
    for event, data in frames:
        assert event is not None, f"frame without an event: line: {data!r}"
        assert isinstance(data, dict) and data["type"] == event
    names = [event for event, _ in frames if event != "ping"]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [d for e, d in frames if e != "ping"]
    start = data[0]["message"]
    assert start["type"] == "message" and start["role"] == "assistant" and start["model"] == "test-model"
    assert start["content"] == [] and start["stop_reason"] is None and start["stop_sequence"] is None
    assert start["id"].startswith("msg_")
    assert data[1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert [d["delta"] for d in data[2:4]] == [
        {"type": "text_delta", "text": "Hel"},
        {"type": "text_delta", "text": "lo"},
    ]
    assert all(d["index"] == 0 for d in data[1:5])
    # stop_details and container present, null: the TypeScript SDK's MessageStream copies
    # delta.stop_details into finalMessage() as it is (absent, it was undefined, not null).
    assert data[5]["delta"] == {
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "stop_details": None,
        "container": None,
    }
    assert data[5]["usage"]["output_tokens"] == 2 and data[5]["usage"]["input_tokens"] == 9
    assert data[6] == {"type": "message_stop"}


def test_sse_frames_survive_arbitrary_upstream_chunking(gateway, upstream):
    # One chunk split across TCP writes, CRLF line ends, an SSE comment and two chunks in one write.
    first = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"A"},"finish_reason":null}]}'
    upstream.stream_reply(
        [
            first[:20],
            ("sleep", 0.02),
            first[20:] + b"\r\n\r\n",
            b": keep-alive\n\n",
            b'data: {"choices":[{"index":0,"delta":{"content":"B"},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{"content":"C"},"finish_reason":"stop"}]}\n\n',
        ]
    )
    response = _post_stream(gateway, {"model": "test-model", "max_tokens": 20, "messages": USER})
    frames = sse_frames(response.text)
    text = "".join(d["delta"]["text"] for e, d in frames if e == "content_block_delta")
    assert text == "ABC"
    assert [e for e, _ in frames][-2:] == ["message_delta", "message_stop"]


def test_sdk_stream_helpers(client, upstream):
    upstream.stream_reply(text_stream("one ", "two ", "three"))
    with client.messages.stream(model="test-model", max_tokens=20, messages=USER) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
        text = stream.get_final_text()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "text" in events  # the SDK's convenience events are derived from the deltas
    assert text == "one two three" == final.content[0].text
    assert final.stop_reason == "end_turn"


def test_max_tokens_finish(client, upstream):
    upstream.stream_reply(text_stream("cut", finish="length"))
    upstream.json_reply(completion("cut", finish="length"))
    with client.messages.stream(model="test-model", max_tokens=1, messages=USER) as stream:
        assert stream.get_final_message().stop_reason == "max_tokens"
    assert client.messages.create(model="test-model", max_tokens=1, messages=USER).stop_reason == "max_tokens"


def test_reasoning_only_stream_still_has_a_text_block(client, upstream):
    upstream.stream_reply([chunk({"role": "assistant", "reasoning_content": "thinking hard"}), chunk({}, "stop")])
    with client.messages.stream(model="test-model", max_tokens=20, messages=USER) as stream:
        final = stream.get_final_message()
    assert any(block.type == "text" for block in final.content)


def test_keepalive_pings_while_the_upstream_is_silent(make_gateway, upstream):
    gateway = make_gateway(server={"keepalive_interval": 0.1})
    upstream.stream_reply(
        [chunk({"role": "assistant", "content": ""}), ("sleep", 0.6), chunk({"content": "late"}), chunk({}, "stop")]
    )
    response = _post_stream(gateway, {"model": "test-model", "max_tokens": 20, "messages": USER})
    comments = [line for line in response.text.splitlines() if line.startswith(":")]
    assert any(event == "ping" for event, _ in sse_frames(response.text)) or comments


# -- stop sequences -------------------------------------------------------------------


STOPS = ["###", "END", "\n\nHuman:", "</answer>", "STOP"]  # more than the 4 OpenAI accepts


def _after_stop_chunks() -> list:
    # What the model would have generated after the stop; the gateway must never show it,
    # and should hang up before it is all written.
    return [("sleep", 0.3), chunk({"content": " never shown"}), ("sleep", 0.05), chunk({"content": " nor this"}),
            ("sleep", 0.05), chunk({"content": " nor this"}), chunk({}, "stop")]  # fmt: skip


def test_stop_sequence_streaming_reports_the_exact_sequence_and_closes_upstream(client, upstream):
    upstream.stream_reply(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "The answer is 42. ST"}),
            chunk({"content": "OP and then"}),
            *_after_stop_chunks(),
        ]  # fmt: skip
    )
    with client.messages.stream(model="test-model", max_tokens=50, messages=USER, stop_sequences=STOPS) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()

    assert text == "The answer is 42. "
    assert final.content[0].text == "The answer is 42. "
    assert final.stop_reason == "stop_sequence"
    assert final.stop_sequence == "STOP"
    # The upstream's usage never came (the stream was closed at the stop): the prompt is
    # counted (here by the estimate) and the output is one token per chunk received.
    assert final.usage.output_tokens == 2 and final.usage.input_tokens > 0
    sent = upstream.requests[0]
    assert sent["stream"] is True
    assert len(sent.get("stop") or []) <= 4  # never more than a server accepts
    # The gateway hung up on the upstream once the stop matched: the backend stops generating.
    eventually(lambda: upstream.disconnects == 1, "the upstream saw it", timeout=3)
    assert upstream.completed == 0


def test_stop_sequence_raw_events(gateway, upstream):
    upstream.stream_reply([chunk({"role": "assistant", "content": "abc"}), chunk({"content": "def</ans"}), chunk({"content": "wer>ghi"}),
                           *_after_stop_chunks()])  # fmt: skip
    response = _post_stream(
        gateway, {"model": "test-model", "max_tokens": 50, "messages": USER, "stop_sequences": STOPS}
    )
    frames = sse_frames(response.text)
    assert all(event is not None for event, _ in frames)
    text = "".join(d["delta"]["text"] for e, d in frames if e == "content_block_delta")
    assert text == "abcdef"
    delta = next(d for e, d in frames if e == "message_delta")
    assert delta["delta"] == {
        "stop_reason": "stop_sequence",
        "stop_sequence": "</answer>",
        "stop_details": None,
        "container": None,
    }
    assert [e for e, _ in frames][-1] == "message_stop"


def test_stop_sequence_non_streaming(client, upstream):
    # With stop sequences the gateway reads the upstream as a stream even for a plain call.
    upstream.stream_reply(
        [
            chunk({"role": "assistant", "content": "line one\n\nHu"}),
            chunk({"content": "man: more"}),
            *_after_stop_chunks(),
        ]
    )
    message = client.messages.create(model="test-model", max_tokens=50, messages=USER, stop_sequences=STOPS)
    assert message.content[0].text == "line one"
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "\n\nHuman:"
    assert (
        message.usage.output_tokens == 2 and message.usage.input_tokens > 0
    )  # not the zeros of a usage never received
    assert upstream.requests[0]["stream"] is True
    eventually(lambda: upstream.disconnects == 1, "the upstream saw it", timeout=3)


def test_earliest_stop_wins_and_unmatched_stops_change_nothing(client, upstream):
    upstream.stream_reply(text_stream("x END y ### z"))
    message = client.messages.create(model="test-model", max_tokens=50, messages=USER, stop_sequences=["###", "END"])
    assert (message.content[0].text, message.stop_sequence) == ("x ", "END")

    upstream.stream_reply(text_stream("no stop ", "here #", "#"))
    message = client.messages.create(model="test-model", max_tokens=50, messages=USER, stop_sequences=["###", "END"])
    assert message.content[0].text == "no stop here ##"  # a held-back partial match is released at the end
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)


def test_stop_sequence_at_the_very_start_gives_an_empty_answer(client, upstream):
    upstream.stream_reply([chunk({"role": "assistant", "content": "STOP right there"}), *_after_stop_chunks()])
    with client.messages.stream(model="test-model", max_tokens=50, messages=USER, stop_sequences=["STOP"]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "STOP"
    assert "".join(b.text for b in final.content if b.type == "text") == ""


def test_stop_sequences_with_the_async_client(gateway, upstream):
    upstream.stream_reply([chunk({"role": "assistant", "content": "alpha END beta"}), *_after_stop_chunks()])

    async def run() -> anthropic.types.Message:
        async with anthropic.AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0) as aclient:
            async with aclient.messages.stream(
                model="test-model", max_tokens=50, messages=USER, stop_sequences=STOPS
            ) as stream:
                return await stream.get_final_message()

    final = asyncio.run(asyncio.wait_for(run(), 20))
    assert final.content[0].text == "alpha "
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")


def test_client_hanging_up_closes_the_upstream_stream(gateway, upstream):
    upstream.stream_reply(
        [
            chunk({"role": "assistant", "content": "first"}),
            *[item for _ in range(40) for item in (("sleep", 0.05), chunk({"content": " more"}))],
        ]
    )
    body = {"model": "test-model", "max_tokens": 50, "messages": USER, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, timeout=10) as response:
        for line in response.iter_lines():
            if "first" in line:
                break  # hang up after the first text
    eventually(lambda: upstream.disconnects == 1, "the upstream saw it", timeout=3)
    assert upstream.completed == 0


def test_prefill_with_stop_sequences(make_gateway, upstream):
    gateway = make_gateway(upstream={"flavor": "vllm"})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    upstream.stream_reply([chunk({"role": "assistant", "content": "42</answer> trailing"}), *_after_stop_chunks()])
    message = client.messages.create(
        model="test-model", max_tokens=50, stop_sequences=["</answer>"],
        messages=[{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "<answer>"}],
    )  # fmt: skip
    assert message.content[0].text == "42"
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "</answer>")
    assert upstream.requests[0]["continue_final_message"] is True


def test_stop_sequence_split_over_many_chunks(client, upstream):
    upstream.stream_reply([chunk({"role": "assistant", "content": "ab<"}), chunk({"content": "/"}), chunk({"content": "an"}),
                           chunk({"content": "swer"}), chunk({"content": ">cd"}), *_after_stop_chunks()])  # fmt: skip
    with client.messages.stream(
        model="test-model", max_tokens=50, messages=USER, stop_sequences=["</answer>", "</ans!"]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "ab"
    assert final.stop_sequence == "</answer>"


def test_a_server_that_reports_no_usage_gets_counted_usage_streamed_and_not(client, upstream):
    """Servers that ignore `stream_options.include_usage` (or send no `usage`): clients that
    track their context by the usage (Claude Code's auto-compaction) need real counts."""
    body = completion("Paris is the capital.")
    del body["usage"]
    upstream.json_reply(body)
    upstream.stream_reply([chunk({"role": "assistant", "content": ""}), chunk({"content": "Paris is"}),
                           chunk({"content": " the capital."}), chunk({}, "stop")])  # fmt: skip
    question = [{"role": "user", "content": "What is the capital of France? " * 20}]

    plain = client.messages.create(model="test-model", max_tokens=50, messages=question)
    with client.messages.stream(model="test-model", max_tokens=50, messages=question) as stream:
        streamed = stream.get_final_message()

    for message in (plain, streamed):
        assert message.content[0].text == "Paris is the capital."
        assert message.usage.input_tokens >= 100  # 620 characters of question, about four a token
        assert message.usage.output_tokens >= 2


@pytest.mark.parametrize("native", [False, True], ids=["translating", "passthrough"])
def test_a_refusal_after_keepalives_is_an_error_event_and_is_recorded(make_gateway, upstream, native):
    """Committed to 200 before the upstream answered: its refusal arrives as an `error` event,
    and the log and metrics still count it as the upstream's error, not as a success."""

    from tests.support.fake_anthropic import FakeAnthropic, NativeReply

    if native:
        server = FakeAnthropic().start()
        server.replies.append(
            NativeReply(status=500, body={"type": "error", "error": {"type": "api_error", "message": "boom"}}, hang=0.5)
        )
        url, extra, models = (
            server.url,
            {"protocol": "anthropic"},
            [{"name": "test-model", "upstream": "default", "upstream_model": "native-model"}],
        )
    else:
        upstream.queue(Reply(status=500, body={"error": {"message": "boom"}}, hang=0.5))
        url, extra, models = upstream.url, {}, None
    gateway = make_gateway(
        url=url, server={"keepalive_interval": 0.1}, upstream={"max_retries": 0, **extra}, models=models
    )
    body = {"model": "test-model", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    frames = sse_frames(_post_stream(gateway, body).text)
    assert frames[-1][0] == "error" and "boom" in frames[-1][1]["error"]["message"]
    counted = lambda: any(  # noqa: E731
        row.startswith("dragoman_upstream_errors_total{")
        for row in httpx.get(gateway.url + "/metrics").text.splitlines()
    )
    eventually(counted, "the failed stream counted")
    if native:
        server.stop()


def test_a_server_answering_a_stream_with_json_and_no_usage_gets_counted_usage(client, upstream):
    body = completion("Paris is the capital of France, as it has long been.")
    del body["usage"]
    upstream.json_reply(body)  # JSON to a stream request: the server ignored `stream: true`
    with client.messages.stream(
        model="test-model", max_tokens=50, messages=[{"role": "user", "content": "Capital? " * 40}]
    ) as stream:
        message = stream.get_final_message()
    assert message.content[0].text.startswith("Paris")
    assert message.usage.input_tokens >= 30 and message.usage.output_tokens >= 5  # counted, not 0/0

"""POST /v1/messages over a real socket: the Message the SDK sees, and the request
the upstream receives (system, sampling, model mapping, prefill, ignored fields)."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import pytest

from tests.support.fakes import chunk, completion, text_stream, usage_chunk

USER = [{"role": "user", "content": "Hello"}]


def _comparable(message: anthropic.types.Message) -> dict:
    data = message.model_dump()
    data.pop("id")
    return data


# -- one Message, however it is asked for ---------------------------------------------------


def test_non_streaming_and_streaming_give_the_same_message(client, upstream):
    upstream.json_reply(completion("Hello world", prompt=12, completion_tokens=3))
    upstream.stream_reply(text_stream("Hel", "lo", " world", prompt=12))
    upstream.stream_reply(text_stream("Hel", "lo", " world", prompt=12))

    plain = client.messages.create(model="test-model", max_tokens=50, messages=USER)
    with client.messages.stream(model="test-model", max_tokens=50, messages=USER) as stream:
        pieces = list(stream.text_stream)
        streamed = stream.get_final_message()
    events = list(client.messages.create(model="test-model", max_tokens=50, messages=USER, stream=True))

    # The first token goes alone; tokens that reach the gateway in one read may share a delta.
    assert pieces[0] == "Hel" and "".join(pieces) == "Hello world"
    assert plain.id.startswith("msg_") and streamed.id.startswith("msg_") and plain.id != streamed.id
    assert plain.type == "message" and plain.role == "assistant"
    assert _comparable(plain) == _comparable(streamed)
    assert [b.model_dump(exclude_none=True) for b in plain.content] == [{"type": "text", "text": "Hello world"}]
    assert (plain.stop_reason, plain.stop_sequence) == ("end_turn", None)
    assert (plain.usage.input_tokens, plain.usage.output_tokens) == (12, 3)
    assert plain.model == "test-model"

    # The raw events fold to the same message.
    start = events[0]
    assert start.type == "message_start"
    assert start.message.content == [] and start.message.stop_reason is None
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    delta = next(e for e in events if e.type == "message_delta")
    assert text == "Hello world"
    assert delta.delta.stop_reason == "end_turn" and delta.usage.output_tokens == 3
    assert delta.usage.input_tokens == 12


def test_async_client_create_stream_and_raw_events(gateway, upstream):
    upstream.json_reply(completion("Bonjour", prompt=7, completion_tokens=2))
    upstream.stream_reply(text_stream("Bon", "jour", prompt=7))
    upstream.stream_reply(text_stream("Bon", "jour", prompt=7))

    async def run() -> tuple:
        async with anthropic.AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0) as aclient:
            plain = await aclient.messages.create(model="test-model", max_tokens=20, messages=USER)
            async with aclient.messages.stream(model="test-model", max_tokens=20, messages=USER) as stream:
                pieces = [piece async for piece in stream.text_stream]
                final = await stream.get_final_message()
            raw = await aclient.messages.create(model="test-model", max_tokens=20, messages=USER, stream=True)
            types = [event.type async for event in raw]
            return plain, pieces, final, types

    plain, pieces, final, types = asyncio.run(asyncio.wait_for(run(), 20))
    assert plain.content[0].text == "Bonjour"
    assert pieces == ["Bon", "jour"]
    assert _comparable(plain) == _comparable(final)
    assert types == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip


def test_concurrent_async_requests_are_independent(gateway, upstream):
    # The fake answers in arrival order; every reply says which request it was for.
    for index in range(8):
        upstream.json_reply(completion(f"reply {index}"))

    async def run() -> list[str]:
        async with anthropic.AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0) as aclient:
            calls = [aclient.messages.create(model="test-model", max_tokens=5, messages=USER) for _ in range(8)]
            return [m.content[0].text for m in await asyncio.gather(*calls)]

    texts = asyncio.run(asyncio.wait_for(run(), 20))
    assert sorted(texts) == sorted(f"reply {i}" for i in range(8))


# -- what the upstream receives ---------------------------------------------------------


def test_system_and_sampling_fields_reach_the_upstream(client, upstream):
    client.messages.create(
        model="test-model",
        max_tokens=123,
        system="Be brief.",
        messages=USER,
        # This SDK version has no sampling parameters any more; older clients still send them.
        extra_body={"temperature": 0.25, "top_p": 0.9, "top_k": 40},
    )
    sent = upstream.requests[0]
    assert sent["model"] == "test-model"
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert sent["max_tokens"] == 123
    assert sent["temperature"] == 0.25
    assert sent["top_p"] == 0.9
    assert sent["top_k"] == 40
    assert sent.get("stream") in (False, None)
    assert "stream_options" not in sent


def test_system_blocks_are_joined(client, upstream):
    client.messages.create(
        model="test-model",
        max_tokens=10,
        system=[
            {"type": "text", "text": "One."},
            {"type": "text", "text": "Two.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=USER,
    )
    assert upstream.requests[0]["messages"][0] == {"role": "system", "content": "One.\n\nTwo."}


def test_streams_ask_the_upstream_for_usage(client, upstream):
    upstream.stream_reply(text_stream("ok"))
    with client.messages.stream(model="test-model", max_tokens=10, messages=USER) as stream:
        stream.until_done()
    sent = upstream.requests[0]
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


def test_usage_from_a_separate_final_chunk_and_cached_tokens(client, upstream):
    upstream.stream_reply(
        [
            chunk({"role": "assistant", "content": "Hi"}),
            chunk({}, "stop"),
            usage_chunk(prompt=100, completion_tokens=4, cached=60),
        ]
    )
    with client.messages.stream(model="test-model", max_tokens=10, messages=USER) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == 4
    assert final.usage.cache_read_input_tokens == 60
    assert final.usage.input_tokens == 40  # Anthropic's input_tokens excludes cache reads

    upstream.json_reply(completion("Hi", prompt=100, completion_tokens=4, cached=60))
    plain = client.messages.create(model="test-model", max_tokens=10, messages=USER)
    assert (plain.usage.input_tokens, plain.usage.cache_read_input_tokens, plain.usage.output_tokens) == (40, 60, 4)


def test_configured_model_name_is_mapped_and_echoed(make_gateway, upstream):
    gateway = make_gateway(
        models=[
            {
                "name": "claude-sonnet-4-6",
                "upstream": "default",
                "upstream_model": "test-model",
                "aliases": ["claude-haiku-*"],
            }
        ]
    )
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    upstream.json_reply(completion("plain"))
    upstream.stream_reply(text_stream("streamed"))

    plain = client.messages.create(model="claude-sonnet-4-6", max_tokens=10, messages=USER)
    with client.messages.stream(model="claude-haiku-4-5-20251001", max_tokens=10, messages=USER) as stream:
        streamed = stream.get_final_message()

    assert [r["model"] for r in upstream.requests] == ["test-model", "test-model"]
    assert plain.model == "claude-sonnet-4-6"
    assert streamed.model == "claude-haiku-4-5-20251001"


def test_metadata_user_id_is_accepted_and_forwarded_where_the_server_takes_it(make_gateway, upstream):
    vllm = make_gateway(upstream={"flavor": "vllm"})
    openai_like = make_gateway(upstream={"flavor": "openai"})
    for gateway in (vllm, openai_like):
        client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
        message = client.messages.create(
            model="test-model", max_tokens=10, messages=USER, metadata={"user_id": "user-1234"}
        )
        assert message.content[0].text == "Hello!"
    to_vllm, to_openai = upstream.requests
    assert "user" not in to_vllm  # vLLM has no use for it
    assert to_openai["user"] == "user-1234"
    assert "top_k" not in to_openai


def test_unknown_and_newer_fields_are_accepted(client, upstream):
    cache = {"type": "ephemeral", "ttl": "5m"}
    message = client.messages.create(
        model="test-model",
        max_tokens=10,
        system=[{"type": "text", "text": "Sys", "cache_control": cache}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Use the tool", "cache_control": cache}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}, "cache_control": cache}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "found", "cache_control": cache}],
                        "cache_control": cache,
                    },
                    {"type": "text", "text": "Thanks", "cache_control": cache},
                ],
            },
        ],  # fmt: skip
        tools=[
            {
                "name": "lookup",
                "description": "Look up",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
                "cache_control": cache,
            }
        ],
        extra_body={
            "cache_control": cache,
            "context_management": {
                "edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1000}}]
            },
            "output_config": {"effort": "high"},
            "service_tier": "auto",
            "container": None,
            "diagnostics": {"cache_divergence": True},
            "inference_geo": "us",
            "speed": "standard",
            "some_future_field": {"nested": [1, 2, 3]},
        },
        extra_headers={"anthropic-beta": "context-management-2025-06-27,prompt-caching-2024-07-31"},
    )
    assert message.content[0].text == "Hello!"
    sent = json.dumps(upstream.requests[0])
    for dropped in (
        "cache_control",
        "context_management",
        "service_tier",
        "diagnostics",
        "some_future_field",
        "container",
    ):
        assert dropped not in sent
    messages = upstream.requests[0]["messages"]
    assert messages[0] == {"role": "system", "content": "Sys"}
    assert messages[-2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "found"}
    assert messages[-1] == {"role": "user", "content": "Thanks"}


def test_anthropic_beta_headers_are_accepted(client, upstream):
    upstream.json_reply(completion("Hello!"))
    upstream.stream_reply(text_stream("beta"))
    message = client.beta.messages.create(
        model="test-model",
        max_tokens=10,
        messages=USER,
        betas=["interleaved-thinking-2025-05-14", "fine-grained-tool-streaming-2025-05-14", "context-1m-2025-08-07"],
    )
    assert message.content[0].text == "Hello!"
    with client.beta.messages.stream(
        model="test-model", max_tokens=10, messages=USER, betas=["token-efficient-tools-2025-02-19"]
    ) as stream:
        assert stream.get_final_message().content[0].text == "beta"
    # anthropic-* headers are for the gateway, not the upstream.
    assert all(not key.lower().startswith("anthropic-") for headers in upstream.headers for key in headers)


def test_claude_code_billing_header_block_is_dropped(client, upstream):
    client.messages.create(
        model="test-model",
        max_tokens=10,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3.abc; cc_entrypoint=cli; cch=0a1b2;"},
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "Project instructions."},
        ],
        messages=USER,
    )
    system = upstream.requests[0]["messages"][0]
    assert system == {
        "role": "system",
        "content": "You are Claude Code, Anthropic's official CLI for Claude.\n\nProject instructions.",
    }
    assert "billing" not in json.dumps(upstream.requests[0])


def test_keep_billing_header_option_keeps_it(make_gateway, upstream):
    gateway = make_gateway(server={"keep_billing_header": True})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    billing = "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli;"
    client.messages.create(
        model="test-model",
        max_tokens=10,
        system=[{"type": "text", "text": billing}, {"type": "text", "text": "Rest"}],
        messages=USER,
    )
    assert upstream.requests[0]["messages"][0]["content"] == f"{billing}\n\nRest"


# -- prefill --------------------------------------------------------------------------


PREFILL = [{"role": "user", "content": "What is 6*7? Answer in JSON."}, {"role": "assistant", "content": '{"answer": '}]


def test_prefill_is_continued_not_repeated_vllm(make_gateway, upstream):
    gateway = make_gateway(upstream={"flavor": "vllm"})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    upstream.json_reply(completion("42}"))
    upstream.stream_reply(text_stream("4", "2}"))

    plain = client.messages.create(model="test-model", max_tokens=10, messages=PREFILL)
    with client.messages.stream(model="test-model", max_tokens=10, messages=PREFILL) as stream:
        streamed = stream.get_final_message()

    assert plain.content[0].text == "42}"
    assert streamed.content[0].text == "42}"
    for sent in upstream.requests:
        assert sent["messages"][-1] == {"role": "assistant", "content": '{"answer":'}
        assert sent["continue_final_message"] is True
        assert sent["add_generation_prompt"] is False


def test_prefill_with_a_discovered_vllm_upstream(gateway, client, upstream):
    gateway.wait_discovered()  # the fake lists its model as owned_by vllm
    upstream.json_reply(completion("42}"))
    message = client.messages.create(model="test-model", max_tokens=10, messages=PREFILL)
    assert message.content[0].text == "42}"
    assert upstream.requests[0]["continue_final_message"] is True


def test_prefill_native_servers_get_no_vllm_flags(make_gateway, upstream):
    gateway = make_gateway(upstream={"flavor": "llamacpp"})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    upstream.json_reply(completion("42}"))
    message = client.messages.create(model="test-model", max_tokens=10, messages=PREFILL)
    assert message.content[0].text == "42}"
    sent = upstream.requests[0]
    assert sent["messages"][-1] == {"role": "assistant", "content": '{"answer":'}
    assert "continue_final_message" not in sent and "add_generation_prompt" not in sent


# -- roles and turns --------------------------------------------------------------------


def test_consecutive_same_role_turns_are_merged(client, upstream):
    client.messages.create(
        model="test-model",
        max_tokens=10,
        messages=[{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}]}],
    )
    users = [m for m in upstream.requests[0]["messages"] if m["role"] == "user"]
    assert len(users) == 1
    content = users[0]["content"]
    text = content if isinstance(content, str) else "".join(p["text"] for p in content)
    assert "a" in text and "b" in text


def test_raw_http_body_shape(gateway, upstream):
    """What a non-SDK client sees: every documented field present, JSON content type."""
    upstream.json_reply(completion("raw", prompt=3, completion_tokens=1))
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "test-model", "max_tokens": 5, "messages": USER},
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        timeout=10,
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["request-id"].startswith("req_")
    body = response.json()
    assert set(body) >= {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert body["type"] == "message" and body["stop_sequence"] is None
    assert body["content"] == [{"type": "text", "text": "raw"}]
    assert body["usage"]["input_tokens"] == 3 and body["usage"]["output_tokens"] == 1


def test_max_tokens_zero_warms_the_cache_without_generating(client, upstream):
    message = client.messages.create(model="test-model", max_tokens=0, messages=USER)
    assert message.type == "message"
    assert message.usage.output_tokens == 0
    assert "".join(b.text for b in message.content if b.type == "text") == ""


# -- max_tokens fitted to the context window ----------------------------------------------

# The fake's /tokenize counts "Hello" as 6 tokens: a window of 20 leaves room for 14.
WINDOWED = [
    {"name": "windowed", "upstream": "default", "upstream_model": "test-model", "context_window": 20},
    {
        "name": "capped",
        "upstream": "default",
        "upstream_model": "test-model",
        "context_window": 20,
        "max_output_tokens": 10,
    },
]


@pytest.mark.parametrize(
    ("model", "asked", "sent", "stop_reason"),
    [
        ("windowed", 50, 14, "model_context_window_exceeded"),  # the window cut the reply, not the 50 asked
        ("windowed", 14, 14, "max_tokens"),  # exactly what the window leaves: the client's limit
        ("capped", 50, 10, "max_tokens"),  # the model's output cap, which the window would allow
    ],
    ids=["lowered-by-the-window", "fits", "lowered-by-the-output-cap"],
)
def test_a_reply_cut_at_a_limit_the_window_set_says_so_on_every_path(
    make_gateway, upstream, model, asked, sent, stop_reason
):
    gateway = make_gateway(upstream={"flavor": "vllm"}, models=WINDOWED)
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    request = {"model": model, "max_tokens": asked, "messages": USER}
    upstream.json_reply(completion("Partial answ", finish="length", prompt=6, completion_tokens=sent))
    upstream.stream_reply(text_stream("Partial", " answ", finish="length", prompt=6))
    upstream.stream_reply(text_stream("Partial", " answ", finish="length", prompt=6))

    plain = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    folded = client.messages.create(**request, stop_sequences=["never-seen"])  # read from the upstream's stream

    assert [r["max_tokens"] for r in upstream.requests] == [sent] * 3
    for message in (plain, streamed, folded):
        assert message.stop_reason == stop_reason and message.stop_sequence is None
        assert message.content[0].text == "Partial answ"


def test_a_model_unknown_while_another_upstreams_list_is_unreadable_is_a_502_not_a_404(upstream, dead_port):
    """Two upstreams without [[models]], one down at start: a name that may be its is not
    'not found' (final, not retried) but a 502 the SDKs retry; a name of the live one works."""
    from dragoman.core.config_load import from_dict
    from tests.support.servers import GatewayServer

    down = f"http://127.0.0.1:{dead_port}/v1"
    config = from_dict(
        {"upstreams": {"live": {"url": upstream.url, "max_retries": 0}, "down": {"url": down, "max_retries": 0}}}
    )
    gateway = GatewayServer(config).start()
    try:
        client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
        upstream.json_reply(completion("from the live one"))
        assert (
            client.messages.create(model="test-model", max_tokens=5, messages=USER).content[0].text
            == "from the live one"
        )
        with pytest.raises(anthropic.InternalServerError) as caught:
            client.messages.create(model="a-model-of-the-down-one", max_tokens=5, messages=USER)
        assert caught.value.status_code == 502 and "down" in caught.value.body["error"]["message"]
    finally:
        gateway.stop()

"""The tool loop over a real socket: tools -> tool_use -> tool_result -> final text,
non-streaming and streaming, single and parallel calls, ids kept end to end."""

from __future__ import annotations

import asyncio
import json
import re

import anthropic
import httpx
import pytest

from tests.support.fakes import chunk, completion, text_stream, usage_chunk
from tests.support.servers import sse_frames

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {
    "name": "get_time",
    "description": "Local time in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _tool_stream(*calls: tuple[str | None, str, list[str]], text: str | None = None) -> list:
    """A streamed assistant turn: optional text, then each call as a head chunk with the
    name and then its argument fragments, the way vLLM streams them."""
    chunks: list = [chunk({"role": "assistant", "content": text or ""})]
    for index, (call_id, name, fragments) in enumerate(calls):
        head = {"index": index, "type": "function", "function": {"name": name, "arguments": ""}}
        if call_id is not None:
            head["id"] = call_id
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [chunk({"tool_calls": [{"index": index, "function": {"arguments": f}}]}) for f in fragments]
    chunks += [chunk({}, "tool_calls"), usage_chunk(20, 9)]
    return chunks


def _follow_up(first: anthropic.types.Message, results: dict[str, str]) -> list:
    return [
        *ASK,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": i, "content": r} for i, r in results.items()],
        },
    ]


def test_tool_loop_non_streaming(client, upstream):
    upstream.json_reply(
        completion(
            "Let me check.", finish="tool_calls", tool_calls=[_call("call_abc123", "get_weather", {"city": "Paris"})]
        )
    )
    upstream.json_reply(completion("It is sunny in Paris."))

    first = client.messages.create(model="test-model", max_tokens=100, messages=ASK, tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"]
    use = first.content[1]
    assert use.id == "call_abc123" and use.name == "get_weather" and use.input == {"city": "Paris"}

    sent_tools = upstream.requests[0]["tools"]
    assert [t["function"] for t in sent_tools] == [
        {"name": "get_weather", "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}
    ]

    final = client.messages.create(
        model="test-model", max_tokens=100, messages=_follow_up(first, {use.id: "18C, sunny"}), tools=[WEATHER]
    )
    assert final.content[0].text == "It is sunny in Paris."
    assert final.stop_reason == "end_turn"

    history = upstream.requests[1]["messages"]
    assistant = history[1]
    assert assistant["role"] == "assistant" and assistant["content"] == "Let me check."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_abc123"]
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert history[2] == {"role": "tool", "tool_call_id": "call_abc123", "content": "18C, sunny"}


def test_tool_loop_streaming(client, upstream):
    upstream.stream_reply(_tool_stream(("call_s1", "get_weather", ['{"ci', 'ty": "Pa', 'ris", "unit"', ': "C"}'])))
    upstream.stream_reply(text_stream("Sunny", " and warm."))

    with client.messages.stream(model="test-model", max_tokens=100, messages=ASK, tools=[WEATHER]) as stream:
        events = list(stream)
        first = stream.get_final_message()

    raw = [e for e in events if e.type in ("content_block_start", "content_block_delta", "content_block_stop")]
    tool_start = next(e for e in raw if e.type == "content_block_start" and e.content_block.type == "tool_use")
    assert tool_start.content_block.id == "call_s1" and tool_start.content_block.name == "get_weather"
    assert tool_start.content_block.input == {}
    partials = [
        e.delta.partial_json for e in raw if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert json.loads("".join(partials)) == {"city": "Paris", "unit": "C"}
    assert len(partials) >= 2  # streamed, not buffered into one delta

    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].input == {"city": "Paris", "unit": "C"}  # parsed by the SDK

    with client.messages.stream(
        model="test-model", max_tokens=100, messages=_follow_up(first, {"call_s1": "18C"}), tools=[WEATHER]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Sunny and warm."
    sent = upstream.requests[1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_s1"
    assert sent[2] == {"role": "tool", "tool_call_id": "call_s1", "content": "18C"}


def test_upstream_tool_shapes_carry_type_function(client, upstream):
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ]
    client.messages.create(model="test-model", max_tokens=10, messages=history, tools=[WEATHER])
    sent = upstream.requests[0]
    assert [t.get("type") for t in sent["tools"]] == ["function"]
    assert [c.get("type") for c in sent["messages"][1]["tool_calls"]] == ["function"]


def test_parallel_tool_calls_non_streaming(client, upstream):
    calls = [_call("call_1", "get_weather", {"city": "Paris"}), _call("call_2", "get_time", {"city": "Tokyo"})]
    upstream.json_reply(completion(None, finish="tool_calls", tool_calls=calls))
    upstream.json_reply(completion("Done."))

    first = client.messages.create(model="test-model", max_tokens=100, messages=ASK, tools=[WEATHER, TIME])
    assert [(b.type, b.id, b.name, b.input) for b in first.content] == [
        ("tool_use", "call_1", "get_weather", {"city": "Paris"}),
        ("tool_use", "call_2", "get_time", {"city": "Tokyo"}),
    ]
    client.messages.create(
        model="test-model",
        max_tokens=100,
        messages=_follow_up(first, {"call_1": "rain", "call_2": "09:00"}),
        tools=[WEATHER, TIME],
    )
    history = upstream.requests[1]["messages"]
    assert [c["id"] for c in history[1]["tool_calls"]] == ["call_1", "call_2"]
    assert history[2:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        {"role": "tool", "tool_call_id": "call_2", "content": "09:00"},
    ]


def test_parallel_tool_calls_streaming(client, upstream):
    upstream.stream_reply(
        _tool_stream(
            ("call_p1", "get_weather", ['{"city":', ' "Paris"}']),
            ("call_p2", "get_time", ['{"city": "Tok', 'yo"}']),
            text="Checking both.",
        )
    )
    with client.messages.stream(model="test-model", max_tokens=100, messages=ASK, tools=[WEATHER, TIME]) as stream:
        events = list(stream)
        final = stream.get_final_message()

    starts = [e for e in events if e.type == "content_block_start"]
    assert [e.index for e in starts] == [0, 1, 2]
    assert [e.content_block.type for e in starts] == ["text", "tool_use", "tool_use"]
    # Blocks are strictly sequential: each one stops before the next starts.
    order = [(e.type, e.index) for e in events if e.type in ("content_block_start", "content_block_stop")]
    assert order == [("content_block_start", 0), ("content_block_stop", 0), ("content_block_start", 1),
                     ("content_block_stop", 1), ("content_block_start", 2), ("content_block_stop", 2)]  # fmt: skip
    assert final.content[0].text == "Checking both."
    assert [(b.id, b.name, b.input) for b in final.content[1:]] == [
        ("call_p1", "get_weather", {"city": "Paris"}),
        ("call_p2", "get_time", {"city": "Tokyo"}),
    ]
    assert final.stop_reason == "tool_use"


def test_parallel_tool_calls_whose_fragments_interleave_streaming(client, upstream):
    """A server that introduces both calls in one chunk, then alternates their fragments."""
    fragments = [(0, '{"city"'), (1, '{"city"'), (0, ': "Paris"}'), (1, ': "Tokyo"}')]
    upstream.stream_reply([
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{"index": 0, "id": "call_i1", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
                              {"index": 1, "id": "call_i2", "type": "function", "function": {"name": "get_time", "arguments": ""}}]}),
        *[chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for i, f in fragments],
        chunk({}, "tool_calls"), usage_chunk(20, 9),
    ])  # fmt: skip
    with client.messages.stream(model="test-model", max_tokens=100, messages=ASK, tools=[WEATHER, TIME]) as stream:
        events = list(stream)
        final = stream.get_final_message()

    order = [
        (e.type, e.index)
        for e in events
        if e.type in ("content_block_start", "content_block_delta", "content_block_stop")
    ]
    assert order == [("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0), ("content_block_stop", 0),
                     ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1), ("content_block_stop", 1)]  # fmt: skip
    assert [(b.type, b.id, b.name, b.input) for b in final.content] == [
        ("tool_use", "call_i1", "get_weather", {"city": "Paris"}),
        ("tool_use", "call_i2", "get_time", {"city": "Tokyo"}),
    ]
    assert final.stop_reason == "tool_use"


def test_missing_upstream_tool_ids_are_generated_and_then_kept(client, upstream):
    # Some servers (older Ollama, llama.cpp templates) send tool calls without ids.
    upstream.stream_reply(_tool_stream((None, "get_weather", ['{"city": "Oslo"}'])))
    with client.messages.stream(model="test-model", max_tokens=100, messages=ASK, tools=[WEATHER]) as stream:
        first = stream.get_final_message()
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.id.startswith("toolu_")
    client.messages.create(
        model="test-model", max_tokens=100, messages=_follow_up(first, {use.id: "cold"}), tools=[WEATHER]
    )
    history = upstream.requests[1]["messages"]
    assert history[1]["tool_calls"][0]["id"] == use.id
    assert history[2]["tool_call_id"] == use.id


def test_tool_choice_is_translated(client, upstream):
    for choice in ({"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_time"}, {"type": "none"}):
        client.messages.create(
            model="test-model", max_tokens=10, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice
        )
    assert [r.get("tool_choice") for r in upstream.requests] == [
        "auto",
        "required",
        {"type": "function", "function": {"name": "get_time"}},
        "none",
    ]
    client.messages.create(
        model="test-model",
        max_tokens=10,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert upstream.requests[-1]["parallel_tool_calls"] is False


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_disable_parallel_tool_use_keeps_one_call_from_a_server_that_sent_two(client, upstream, stream):
    """Servers that ignore `parallel_tool_calls: false` (many): Anthropic promises at most one tool_use."""
    two = [_call("call_a", "get_weather", {"city": "Paris"}), _call("call_b", "get_weather", {"city": "Rome"})]
    if stream:
        upstream.stream_reply([chunk({"role": "assistant", "content": None}),
                               chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(two)]}), chunk({}, "tool_calls")])  # fmt: skip
    else:
        upstream.json_reply(completion(None, finish="tool_calls", tool_calls=two))
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    if stream:
        with client.messages.stream(
            model="test-model", max_tokens=50, messages=ASK, tools=[WEATHER], tool_choice=choice
        ) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(
            model="test-model", max_tokens=50, messages=ASK, tools=[WEATHER], tool_choice=choice
        )
    assert [(b.type, b.id, b.input) for b in message.content] == [("tool_use", "call_a", {"city": "Paris"})]
    assert message.stop_reason == "tool_use"


def test_tool_result_with_error_flag_and_blocks(client, upstream):
    messages = [
        *ASK,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_x", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_x", "is_error": True, "content": [{"type": "text", "text": "service down"}]},
            {"type": "text", "text": "Try again later?"},
        ]},
    ]  # fmt: skip
    client.messages.create(model="test-model", max_tokens=10, messages=messages, tools=[WEATHER])
    history = upstream.requests[0]["messages"]
    tool = next(m for m in history if m["role"] == "tool")
    assert (
        tool["tool_call_id"] == "toolu_x" and "service down" in tool["content"] and "error" in tool["content"].lower()
    )
    assert history[-1]["role"] == "user"


def test_unanswered_tool_use_is_rejected_with_anthropics_wording(client, upstream):
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_lost", "name": "get_weather", "input": {}}],
        },
        {"role": "user", "content": "never mind"},
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="test-model", max_tokens=10, messages=messages, tools=[WEATHER])
    assert "tool_use` ids were found without `tool_result` blocks immediately after: toolu_lost" in caught.value.message
    assert upstream.requests == []


def test_invalid_tool_arguments_from_the_model_stream_through_as_written(gateway, upstream):
    """Claude Code answers such a call with a validation error, and the model tries again; an
    error event would end the turn and start retries that regenerate the whole reply."""
    upstream.stream_reply(_tool_stream(("call_bad", "get_weather", ['{"city": Paris}'])))
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "test-model", "max_tokens": 100, "messages": ASK, "tools": [WEATHER], "stream": True},
        timeout=10,
    )
    frames = sse_frames(response.text)
    names = [event for event, _ in frames]
    assert names[-1] == "message_stop" and "error" not in names
    written = "".join(
        d["delta"]["partial_json"]
        for e, d in frames
        if e == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    )
    assert written == '{"city": Paris}'
    assert next(d for e, d in frames if e == "message_delta")["delta"]["stop_reason"] == "tool_use"


def test_invalid_tool_arguments_non_streaming(client, upstream):
    upstream.json_reply(
        completion(
            None,
            finish="tool_calls",
            tool_calls=[{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}],
        )
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model="test-model", max_tokens=100, messages=ASK, tools=[WEATHER])
    assert caught.value.status_code == 502
    assert "get_weather" in caught.value.message


def test_tool_loop_with_the_async_client(gateway, upstream):
    upstream.stream_reply(_tool_stream(("call_a1", "get_weather", ['{"city"', ': "Rome"}'])))
    upstream.json_reply(completion("Warm in Rome."))

    async def run() -> tuple[anthropic.types.Message, anthropic.types.Message]:
        async with anthropic.AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0) as aclient:
            async with aclient.messages.stream(
                model="test-model", max_tokens=100, messages=ASK, tools=[WEATHER]
            ) as stream:
                first = await stream.get_final_message()
            final = await aclient.messages.create(
                model="test-model", max_tokens=100, messages=_follow_up(first, {"call_a1": "25C"}), tools=[WEATHER]
            )
            return first, final

    first, final = asyncio.run(asyncio.wait_for(run(), 20))
    assert [(b.type, b.id, b.input) for b in first.content] == [("tool_use", "call_a1", {"city": "Rome"})]
    assert final.content[0].text == "Warm in Rome."
    assert upstream.requests[1]["messages"][2] == {"role": "tool", "tool_call_id": "call_a1", "content": "25C"}


def test_a_server_tool_id_anthropic_refuses_reaches_the_client_valid_and_the_server_as_it_was(client, upstream):
    """vLLM's Kimi-K2 parser names calls `functions.NAME:N`; Anthropic's API refuses such ids in
    a history, so the client gets an encoded one, which comes back to the server decoded."""
    kimi_id = "functions.get_weather:0"
    upstream.json_reply(
        completion(None, finish="tool_calls", tool_calls=[_call(kimi_id, "get_weather", {"city": "Paris"})])
    )
    first = client.messages.create(model="test-model", max_tokens=50, messages=ASK, tools=[WEATHER])
    call = first.content[0]
    assert call.type == "tool_use" and re.fullmatch(r"[a-zA-Z0-9_-]+", call.id)

    upstream.json_reply(completion("Sunny."))
    history = [*ASK, {"role": "assistant", "content": [call.model_dump()]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]}]  # fmt: skip
    client.messages.create(model="test-model", max_tokens=50, messages=history, tools=[WEATHER])
    sent = upstream.requests[-1]["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == kimi_id and sent[-1]["tool_call_id"] == kimi_id


def test_a_server_reusing_tool_ids_gives_the_client_unique_ones_and_gets_its_own_back(client, upstream):
    """TGI-style servers name calls `0`, `1`... per reply: Claude Code drops a call whose id it
    has seen and loops. The client gets unique ids; the server sees its own in the history."""
    two = [_call("0", "get_weather", {"city": "Paris"}), _call("0", "get_weather", {"city": "Rome"})]
    upstream.json_reply(completion(None, finish="tool_calls", tool_calls=two))
    first = client.messages.create(model="test-model", max_tokens=50, messages=ASK, tools=[WEATHER])
    ids = [block.id for block in first.content]
    assert len(set(ids)) == 2

    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": "sunny"} for i in ids]}]  # fmt: skip
    upstream.json_reply(completion(None, finish="tool_calls", tool_calls=[_call("0", "get_weather", {"city": "Oslo"})]))
    second = client.messages.create(model="test-model", max_tokens=50, messages=history, tools=[WEATHER])
    assert second.content[0].id not in ids  # "0" again: taken by the conversation
    sent = upstream.requests[-1]["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["0", "0"] and [m["tool_call_id"] for m in sent[2:4]] == [
        "0",
        "0",
    ]

"""Extended thinking over a real socket with the official SDK: a scripted upstream
emits reasoning the way vLLM (old `reasoning_content`, new `reasoning`), Ollama,
DeepSeek and SGLang do; the client sees thinking blocks (streamed as thinking_delta
then signature_delta). Effort and validation: test_thinking_effort.py; replay and
the model registry: test_thinking_registry.py."""

from __future__ import annotations

import json

import pytest

from tests.support.fakes import chunk, completion, usage_chunk
from tests.support.openai_shapes import usage
from tests.support.thinking_scaffold import (
    ANSWER,
    PIECES,
    REASONING,
    THINK,
    TOOL_STREAMS,
    USER,
    WEATHER_TOOL,
    _blocks,
    _stream,
    ollama,
    sglang,
    vllm_new,
    vllm_old,
    vllm_stream,
)


def vllm_both() -> list:
    """The transition (vLLM PR #27752): `reasoning` added, `reasoning_content` kept with the same text."""
    return vllm_stream("reasoning", "reasoning_content")


def deepseek() -> list:
    """`reasoning_content`, `content: null` while reasoning; usage on the finishing chunk."""
    return [
        chunk({"role": "assistant", "content": None, "reasoning_content": ""}),
        *[chunk({"content": None, "reasoning_content": p}) for p in PIECES],
        chunk({"content": "Hello", "reasoning_content": None}),
        chunk({"content": " there", "reasoning_content": None}),
        chunk({"content": "", "reasoning_content": None}, "stop", usage=usage(10, 7)),
    ]


STREAMS = {
    "vllm-old": vllm_old,
    "vllm-new": vllm_new,
    "vllm-both": vllm_both,
    "ollama": ollama,
    "deepseek": deepseek,
    "sglang": sglang,
}


COMPLETIONS = {
    "vllm-old": lambda: completion(ANSWER, completion_tokens=7, reasoning_content=REASONING),
    "vllm-new": lambda: completion(ANSWER, completion_tokens=7, reasoning=REASONING),
    "vllm-both": lambda: completion(ANSWER, completion_tokens=7, reasoning=REASONING, reasoning_content=REASONING),
    "ollama": lambda: completion(ANSWER, completion_tokens=7, reasoning=REASONING),
    "deepseek": lambda: completion(ANSWER, completion_tokens=7, reasoning_content=REASONING),
    "sglang": lambda: completion(ANSWER, completion_tokens=7, reasoning_content=REASONING),
}


FLAVORS = {
    "vllm-old": "vllm",
    "vllm-new": "vllm",
    "vllm-both": "vllm",
    "ollama": "ollama",
    "deepseek": "generic",
    "sglang": "sglang",
}


BACKENDS = list(STREAMS)


def _shape(events: list) -> list[tuple[str, ...]]:
    """The raw event sequence, consecutive repeats collapsed: ('content_block_start', 'thinking'), ..."""
    shape: list[tuple[str, ...]] = []
    for event in events:
        if event.type == "content_block_start":
            item: tuple[str, ...] = (event.type, event.content_block.type)
        elif event.type == "content_block_delta":
            item = (event.type, event.delta.type)
        else:
            item = (event.type,)
        if not shape or shape[-1] != item:
            shape.append(item)
    return shape


THINKING_THEN_TEXT = [
    ("message_start",),
    ("content_block_start", "thinking"),
    ("content_block_delta", "thinking_delta"),
    ("content_block_delta", "signature_delta"),
    ("content_block_stop",),
    ("content_block_start", "text"),
    ("content_block_delta", "text_delta"),
    ("content_block_stop",),
    ("message_delta",),
    ("message_stop",),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_streamed_reasoning_becomes_a_leading_signed_thinking_block(gw, fake, backend):
    client = gw(FLAVORS[backend])
    fake.stream_reply(STREAMS[backend]())

    events, final = _stream(client, model="thinker", thinking=THINK)

    assert _shape(events) == THINKING_THEN_TEXT
    thinking_deltas = [
        e.delta.thinking for e in events if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    ]
    assert "".join(thinking_deltas) == REASONING
    assert len(thinking_deltas) == 2  # streamed as it arrives, not buffered
    signature = next(
        e.delta.signature for e in events if e.type == "content_block_delta" and e.delta.type == "signature_delta"
    )
    assert signature
    starts = [e for e in events if e.type == "content_block_start"]
    assert [e.index for e in starts] == [0, 1]

    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == REASONING and final.content[0].signature == signature
    assert final.content[1].text == ANSWER
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (10, 7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_streamed_reasoning_becomes_a_leading_signed_thinking_block(gw, fake, backend):
    client = gw(FLAVORS[backend])
    fake.json_reply(COMPLETIONS[backend]())

    message = client.messages.create(model="thinker", max_tokens=8000, messages=USER, thinking=THINK)

    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == REASONING and message.content[0].signature
    assert message.content[1].text == ANSWER
    assert message.stop_reason == "end_turn"


@pytest.mark.parametrize("backend", BACKENDS)
def test_streaming_and_non_streaming_agree(gw, fake, backend):
    client = gw(FLAVORS[backend])
    fake.stream_reply(STREAMS[backend]())
    fake.json_reply(COMPLETIONS[backend]())

    _, streamed = _stream(client, model="thinker", thinking={"type": "adaptive"})
    plain = client.messages.create(model="thinker", max_tokens=8000, messages=USER, thinking={"type": "adaptive"})

    assert _blocks(streamed) == _blocks(plain)
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (plain.stop_reason, plain.usage.output_tokens)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("thinking", [None, {"type": "disabled"}], ids=["absent", "disabled"])
def test_reasoning_is_hidden_when_thinking_was_not_requested(gw, fake, backend, thinking):
    client = gw(FLAVORS[backend])
    fake.stream_reply(STREAMS[backend]())
    fake.json_reply(COMPLETIONS[backend]())
    extra = {"thinking": thinking} if thinking else {}

    events, streamed = _stream(client, model="thinker", **extra)
    plain = client.messages.create(model="thinker", max_tokens=8000, messages=USER, **extra)

    assert ("content_block_start", "thinking") not in _shape(events)
    assert not any(
        e.type == "content_block_delta" and e.delta.type in ("thinking_delta", "signature_delta") for e in events
    )
    assert _blocks(streamed) == _blocks(plain) == [{"type": "text", "text": ANSWER}]
    for body in fake.requests:
        assert "reasoning_effort" not in body and "chat_template_kwargs" not in body


def _reasoning_only_stream(field: str) -> list:
    return [
        chunk({"role": "assistant", "content": ""}),
        *[chunk({field: p}) for p in PIECES],
        chunk({"content": ""}),
        chunk({}, "stop"),
        usage_chunk(10, 7),
    ]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_an_answer_that_is_all_reasoning_comes_back_as_text(gw, fake, field):
    client = gw()
    fake.stream_reply(_reasoning_only_stream(field))
    fake.json_reply(completion("", completion_tokens=7, **{field: REASONING}))
    fake.stream_reply(_reasoning_only_stream(field))
    fake.json_reply(completion(None, completion_tokens=7, **{field: REASONING}))

    # Thinking not requested: an ordinary text block, in both modes.
    _, streamed = _stream(client, model="thinker")
    plain = client.messages.create(model="thinker", max_tokens=8000, messages=USER)
    assert _blocks(streamed) == _blocks(plain) == [{"type": "text", "text": REASONING}]

    # Thinking requested: the thinking block, and still a text block with the answer.
    _, streamed = _stream(client, model="thinker", thinking=THINK)
    plain = client.messages.create(model="thinker", max_tokens=8000, messages=USER, thinking=THINK)
    assert _blocks(streamed) == _blocks(plain)
    assert [b.type for b in plain.content] == ["thinking", "text"]
    assert plain.content[0].thinking == REASONING and plain.content[0].signature
    assert plain.content[-1].text == REASONING
    assert plain.stop_reason == "end_turn"


@pytest.mark.parametrize("variant", list(TOOL_STREAMS))
def test_reasoning_then_a_tool_call(gw, fake, variant):
    client = gw("ollama" if variant == "ollama" else "vllm")
    field = "reasoning" if variant == "ollama" else variant
    fake.stream_reply(TOOL_STREAMS[variant]())
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    fake.json_reply(
        completion(None, finish="tool_calls", tool_calls=[call], **{field: "I need the weather. Calling the tool."})
    )

    events, streamed = _stream(client, model="thinker", thinking=THINK, tools=[WEATHER_TOOL])
    plain = client.messages.create(
        model="thinker", max_tokens=8000, messages=USER, thinking=THINK, tools=[WEATHER_TOOL]
    )

    assert _shape(events) == [
        ("message_start",),
        ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop",),
        ("content_block_start", "tool_use"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop",),
        ("message_delta",),
        ("message_stop",),
    ]
    for message in (streamed, plain):
        assert [b.type for b in message.content] == ["thinking", "tool_use"]
        assert message.content[0].thinking == "I need the weather. Calling the tool."
        assert message.content[0].signature
        tool = message.content[1]
        assert (tool.id, tool.name, tool.input) == ("call_1", "get_weather", {"city": "Paris"})
        assert message.stop_reason == "tool_use"


def test_reasoning_text_and_tool_call_in_one_turn(gw, fake):
    client = gw()
    fake.stream_reply(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning": "Plan: say something, then call."}),
            chunk({"content": "Checking."}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_9",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                        }
                    ]
                }
            ),
            chunk({}, "tool_calls"),
            usage_chunk(),
        ]
    )
    _, message = _stream(client, model="thinker", thinking={"type": "adaptive"}, tools=[WEATHER_TOOL])
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[2].input == {"city": "Oslo"}
    assert message.stop_reason == "tool_use"


def test_a_stream_answered_with_json_still_has_its_thinking_block(gw, fake):
    """An upstream that ignores `stream: true` and answers with a whole completion."""
    client = gw()
    fake.json_reply(completion(ANSWER, completion_tokens=7, reasoning_content=REASONING))
    events, message = _stream(client, model="thinker", thinking=THINK)
    assert fake.requests[-1]["stream"] is True
    assert _shape(events) == THINKING_THEN_TEXT
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == REASONING and message.content[0].signature
    assert message.content[1].text == ANSWER


def test_reasoning_survives_the_stop_sequence_path(gw, fake):
    """A non-streaming request with stop sequences is read from an upstream stream and folded."""
    client = gw()
    fake.stream_reply(
        [
            chunk({"role": "assistant", "content": ""}),
            *[chunk({"reasoning_content": p}) for p in PIECES],
            chunk({"content": "Hello END and more"}),
            chunk({}, "stop"),
            usage_chunk(10, 7),
        ]
    )
    message = client.messages.create(
        model="thinker", max_tokens=8000, messages=USER, thinking=THINK, stop_sequences=["END"]
    )
    assert fake.requests[-1]["stream"] is True
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == REASONING and message.content[0].signature
    assert message.content[1].text == "Hello "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")


@pytest.mark.parametrize("stream", [False, True])
def test_hidden_reasoning_does_not_become_the_answer_when_a_stop_sequence_cuts_it(gw, fake, stream):
    """Thinking not requested, the model reasons, then answers `END ...` with stop
    sequence `END`: the answer is empty, not the hidden reasoning."""
    client = gw()
    fake.stream_reply(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning_content": "secret plan"}),
            chunk({"content": "END and more"}),
            chunk({}, "stop"),
            usage_chunk(10, 7),
        ]
    )
    if stream:
        _, message = _stream(client, model="thinker", stop_sequences=["END"])
    else:
        message = client.messages.create(model="thinker", max_tokens=8000, messages=USER, stop_sequences=["END"])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    assert "secret plan" not in json.dumps(_blocks(message))

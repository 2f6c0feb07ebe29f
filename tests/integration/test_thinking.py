"""Extended thinking over a real socket with the official SDK: a scripted upstream
emits reasoning the way vLLM (old `reasoning_content`, new `reasoning`), Ollama,
DeepSeek and SGLang do; the client sees thinking blocks (streamed as thinking_delta
then signature_delta), the upstream sees the effort, the off switch, replayed
reasoning and the right max-tokens field. Plus the models.dev registry fetched at
run time, and `dragoman models`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.core import capabilities
from tests.support.fakes import FakeUpstream, chunk, completion, usage_chunk
from tests.support.servers import GatewayServer, make_config

USER = [{"role": "user", "content": "Hello"}]
THINK = {"type": "enabled", "budget_tokens": 4096}
REASONING = "Let me think. The user greets."
ANSWER = "Hello there"
RAW_EVENTS = {
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


# One fake upstream for the module, and one gateway per (flavor, server settings),
# started on first use: starting a gateway costs far more than a request.
MODELS = [
    {"name": "thinker", "upstream_model": "served-thinker", "reasoning": True},
    {"name": "plain", "upstream_model": "llama-3.1-8b", "reasoning": False},
    {"name": "plain-strict", "upstream_model": "llama-3.1-8b", "reasoning": False, "strict_thinking": True},
    {"name": "plain-lenient", "upstream_model": "llama-3.1-8b", "reasoning": False, "strict_thinking": False},
    {"name": "thinker-xhigh", "upstream_model": "served-thinker", "reasoning": True, "reasoning_efforts": ["low", "medium", "high", "xhigh"]},
    {"name": "thinker-lowhigh", "upstream_model": "served-thinker", "reasoning": True, "reasoning_efforts": ["low", "high"]},
    {"name": "thinker-switch", "upstream_model": "served-thinker", "reasoning": True, "thinking_off": "enable_thinking"},
    {"name": "thinker-lowest", "upstream_model": "served-thinker", "reasoning": True, "thinking_off": "lowest_effort",
     "reasoning_efforts": ["minimal", "low", "medium", "high"]},
    {"name": "thinker-replay", "upstream_model": "served-thinker", "reasoning": True, "reasoning_replay": True},
    {"name": "thinker-capped", "upstream_model": "served-thinker", "reasoning": True, "max_output_tokens": 500},
]  # fmt: skip


@pytest.fixture(scope="module")
def _shared(tmp_path_factory) -> Iterator[tuple[FakeUpstream, dict]]:
    with pytest.MonkeyPatch.context() as patch:
        # No real models.dev cache or fetch: an empty cache dir and an unreachable URL.
        patch.setenv("DRAGOMAN_CACHE_DIR", str(tmp_path_factory.mktemp("registry")))
        patch.setattr(capabilities, "REGISTRY_URL", "http://127.0.0.1:9/api.json")
        fake = FakeUpstream().start()
        gateways: dict = {}
        try:
            yield fake, gateways
        finally:
            for server in gateways.values():
                server.stop()
            fake.stop()


@pytest.fixture
def fake(_shared) -> FakeUpstream:
    """The module's upstream, emptied for this test."""
    upstream = _shared[0]
    upstream.replies.clear()
    upstream.requests.clear()
    upstream.headers.clear()
    upstream.responder = None
    return upstream


@pytest.fixture
def gw(_shared, fake) -> Callable[..., anthropic.Anthropic]:
    """gw(flavor="vllm", **server) -> an SDK client for a gateway serving MODELS."""
    gateways = _shared[1]

    def client(flavor: str = "vllm", **server: Any) -> anthropic.Anthropic:
        key = (flavor, json.dumps(server, sort_keys=True))
        if key not in gateways:
            models = [{"upstream": "default", **m} for m in MODELS]
            gateways[key] = GatewayServer(
                make_config(fake.url, server=server, upstream={"flavor": flavor}, models=models)
            ).start()
        return anthropic.Anthropic(base_url=gateways[key].url, api_key="test-key", max_retries=0)

    return client


# -- how each backend sends reasoning -------------------------------------------------------

PIECES = ["Let me think. ", "The user greets."]


def _usage(prompt: int = 10, completion_tokens: int = 7) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}


def vllm_old() -> list:
    return [
        chunk({"role": "assistant", "content": ""}),
        *[chunk({"reasoning_content": p}) for p in PIECES],
        chunk({"content": "Hello"}),
        chunk({"content": " there"}),
        chunk({}, "stop"),
        usage_chunk(10, 7),
    ]


def vllm_new() -> list:
    return [
        chunk({"role": "assistant", "content": ""}),
        *[chunk({"reasoning": p}) for p in PIECES],
        chunk({"content": "Hello"}),
        chunk({"content": " there"}),
        chunk({}, "stop"),
        usage_chunk(10, 7),
    ]


def vllm_both() -> list:
    """The transition (vLLM PR #27752): `reasoning` added, `reasoning_content` kept with the same text."""
    return [
        chunk({"role": "assistant", "content": ""}),
        *[chunk({"reasoning": p, "reasoning_content": p}) for p in PIECES],
        chunk({"content": "Hello"}),
        chunk({"content": " there"}),
        chunk({}, "stop"),
        usage_chunk(10, 7),
    ]


def ollama() -> list:
    """`reasoning`, content in separate later chunks, finish_reason in its own empty chunk."""
    return [
        *[chunk({"role": "assistant", "content": "", "reasoning": p}) for p in PIECES],
        chunk({"role": "assistant", "content": "Hello"}),
        chunk({"role": "assistant", "content": " there"}),
        chunk({"role": "assistant", "content": ""}, "stop"),
        usage_chunk(10, 7),
    ]


def deepseek() -> list:
    """`reasoning_content`, `content: null` while reasoning; usage on the finishing chunk."""
    return [
        chunk({"role": "assistant", "content": None, "reasoning_content": ""}),
        *[chunk({"content": None, "reasoning_content": p}) for p in PIECES],
        chunk({"content": "Hello", "reasoning_content": None}),
        chunk({"content": " there", "reasoning_content": None}),
        chunk({"content": "", "reasoning_content": None}, "stop", usage=_usage()),
    ]


def sglang() -> list:
    """`reasoning_content` serialised on every chunk, null on the content ones."""
    return [
        chunk({"role": "assistant", "content": None, "reasoning_content": None}),
        *[chunk({"content": None, "reasoning_content": p}) for p in PIECES],
        chunk({"content": "Hello", "reasoning_content": None}),
        chunk({"content": " there", "reasoning_content": None}),
        chunk({"content": None, "reasoning_content": None}, "stop"),
        usage_chunk(10, 7),
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


def _stream(client: anthropic.Anthropic, **kw: Any) -> tuple[list, anthropic.types.Message]:
    kw.setdefault("max_tokens", 8000)
    kw.setdefault("messages", USER)
    with client.messages.stream(**kw) as stream:
        events = [e for e in stream if e.type in RAW_EVENTS]
        final = stream.get_final_message()
    return events, final


def _blocks(message: anthropic.types.Message) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in message.content]


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


# -- reasoning -> thinking blocks ------------------------------------------------------------


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


def _tool_stream(field: str) -> list:
    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({field: "I need the weather. "}),
        chunk({field: "Calling the tool."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({}, "tool_calls"),
        usage_chunk(30, 12),
    ]


def _ollama_tool_stream() -> list:
    """Ollama: the whole call in one chunk, finish_reason in its own empty chunk."""
    call = {
        "id": "call_1",
        "index": 0,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    return [
        chunk({"role": "assistant", "content": "", "reasoning": "I need the weather. "}),
        chunk({"role": "assistant", "content": "", "reasoning": "Calling the tool."}),
        chunk({"role": "assistant", "content": "", "tool_calls": [call]}),
        chunk({"role": "assistant", "content": ""}, "tool_calls"),
        usage_chunk(30, 12),
    ]


TOOL_STREAMS = {
    "reasoning_content": lambda: _tool_stream("reasoning_content"),
    "reasoning": lambda: _tool_stream("reasoning"),
    "ollama": _ollama_tool_stream,
}


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


# -- usage ------------------------------------------------------------------------------------

REASONING_USAGE = {
    "prompt_tokens": 20,
    "completion_tokens": 150,
    "total_tokens": 170,
    "completion_tokens_details": {"reasoning_tokens": 120},
}


def test_output_tokens_include_reasoning_tokens(gw, fake):
    client = gw()
    fake.stream_reply(
        [chunk({"role": "assistant", "content": ""}), chunk({"reasoning": REASONING}), chunk({"content": ANSWER}), chunk({}, "stop"),
         {**usage_chunk(), "usage": REASONING_USAGE}]
    )  # fmt: skip
    body = completion(ANSWER, reasoning=REASONING)
    body["usage"] = REASONING_USAGE
    fake.json_reply(body)

    events, streamed = _stream(client, model="thinker", thinking=THINK)
    plain = client.messages.create(model="thinker", max_tokens=8000, messages=USER, thinking=THINK)

    delta = next(e for e in events if e.type == "message_delta")
    assert delta.usage.output_tokens == 150
    for message in (streamed, plain):
        assert (message.usage.input_tokens, message.usage.output_tokens) == (20, 150)


def test_a_backend_without_reasoning_text_still_applies_the_effort(gw, fake):
    """OpenAI's o-series over Chat Completions: no reasoning text, only a token count."""
    client = gw("openai")
    body = completion(ANSWER)
    body["usage"] = REASONING_USAGE
    fake.json_reply(body)

    raw = client.messages.with_raw_response.create(
        model="thinker", max_tokens=20000, messages=USER, thinking={"type": "enabled", "budget_tokens": 16000}
    )
    message = raw.parse()
    assert raw.headers.get("x-reasoning-effort") == "high"
    assert fake.requests[-1]["reasoning_effort"] == "high"
    assert _blocks(message) == [{"type": "text", "text": ANSWER}]
    assert message.usage.output_tokens == 150


# -- effort: request mapping and X-Reasoning-Effort ---------------------------------------------


@pytest.mark.parametrize(
    ("fields", "effort"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2049}}, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8192}}, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8193}}, "high"),
        ({"thinking": {"type": "enabled"}}, "medium"),  # no budget: medium, as the specifications have it
        ({"thinking": {"type": "adaptive"}}, None),  # the model's default
        ({"thinking": {"type": "disabled"}}, None),
        ({}, None),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, "high"),  # what Claude Code sends
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "high"),
        ({"thinking": {"type": "enabled", "budget_tokens": 16000}, "output_config": {"effort": "low"}}, "low"),
        ({"output_config": {"effort": "high"}, "extra_body": {"reasoning_effort": "low"}}, "low"),
        ({"extra_body": {"reasoning_effort": "medium"}}, "medium"),
    ],
)
def test_effort_goes_upstream_and_comes_back_in_a_header(gw, fake, fields, effort):
    client = gw()
    fake.json_reply(completion(ANSWER))
    raw = client.messages.with_raw_response.create(model="thinker", max_tokens=20000, messages=USER, **fields)
    raw.parse()
    sent = fake.requests[-1]
    assert sent.get("reasoning_effort") == effort
    assert raw.headers.get("x-reasoning-effort") == effort


def test_effort_header_on_a_stream(gw, fake):
    client = gw()
    fake.stream_reply(vllm_new())
    raw = client.messages.with_raw_response.create(
        model="thinker",
        max_tokens=8000,
        messages=USER,
        stream=True,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert raw.headers.get("x-reasoning-effort") == "low"
    events = list(raw.parse())
    assert events[-1].type == "message_stop"
    assert fake.requests[-1]["reasoning_effort"] == "low"


def test_enabled_thinking_without_a_budget_streams_and_counts(gw, fake):
    """`{"type": "enabled"}` alone is no 400 on a stream or a count either."""
    client = gw()
    fake.stream_reply(vllm_new())
    with client.messages.stream(model="thinker", max_tokens=500, messages=USER, thinking={"type": "enabled"}) as stream:  # type: ignore[typeddict-item]
        message = stream.get_final_message()
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert fake.requests[-1]["reasoning_effort"] == "medium"
    counted = client.messages.count_tokens(model="thinker", messages=USER, thinking={"type": "enabled"})  # type: ignore[typeddict-item]
    assert counted.input_tokens > 0


def test_budget_thresholds_from_the_server_config(gw, fake):
    client = gw(effort_budgets=[2000, 4000])
    for budget, effort in (
        (1024, "low"),
        (2000, "low"),
        (2001, "medium"),
        (4000, "medium"),
        (4001, "high"),
        (8000, "high"),
    ):
        fake.json_reply(completion(ANSWER))
        client.messages.create(
            model="thinker", max_tokens=16000, messages=USER, thinking={"type": "enabled", "budget_tokens": budget}
        )
        assert fake.requests[-1]["reasoning_effort"] == effort


def test_max_means_the_models_highest_configured_effort(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER))
    raw = client.messages.with_raw_response.create(
        model="thinker-xhigh", max_tokens=8000, messages=USER, output_config={"effort": "max"}
    )
    assert raw.headers.get("x-reasoning-effort") == "xhigh"
    assert fake.requests[-1]["reasoning_effort"] == "xhigh"


# -- validation errors --------------------------------------------------------------------------


def _error(excinfo: pytest.ExceptionInfo) -> str:
    body = excinfo.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    return body["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_unsupported_effort_is_a_400_naming_output_config_effort(gw, fake, stream):
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            _stream(client, model="thinker-lowhigh", output_config={"effort": "medium"})
        else:
            client.messages.create(
                model="thinker-lowhigh", max_tokens=8000, messages=USER, output_config={"effort": "medium"}
            )
    assert caught.value.status_code == 400
    message = _error(caught)
    assert "output_config.effort" in message and "'medium'" in message
    assert "low, high, xhigh, max" in message
    assert fake.requests == []


def test_unsupported_reasoning_effort_is_a_400_naming_reasoning_effort(gw, fake):
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="thinker",
            max_tokens=8000,
            messages=USER,
            output_config={"effort": "low"},
            extra_body={"reasoning_effort": "ultra"},
        )
    message = _error(caught)
    assert message.startswith("reasoning_effort:") and "'ultra'" in message
    assert "low, medium, high, xhigh, max" in message
    assert fake.requests == []


def test_claude_codes_controls_are_ignored_on_a_model_that_does_not_reason(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER, reasoning_content=REASONING))
    fake.stream_reply(vllm_old())
    cc = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}

    raw = client.messages.with_raw_response.create(model="plain", max_tokens=8000, messages=USER, **cc)
    plain = raw.parse()
    _, streamed = _stream(client, model="plain", **cc)

    assert "x-reasoning-effort" not in raw.headers
    for body in fake.requests:
        assert "reasoning_effort" not in body and "chat_template_kwargs" not in body
        assert body["model"] == "llama-3.1-8b"
    assert _blocks(plain) == _blocks(streamed) == [{"type": "text", "text": ANSWER}]


@pytest.mark.parametrize(
    ("server", "model"),
    [({"strict_thinking": True}, "plain"), ({}, "plain-strict")],
    ids=["server-strict", "model-strict"],
)
@pytest.mark.parametrize("thinking", [{"type": "adaptive"}, THINK], ids=["adaptive", "enabled"])
@pytest.mark.parametrize("stream", [False, True])
def test_strict_thinking_rejects_thinking_on_a_model_that_does_not_reason(gw, fake, server, model, thinking, stream):
    client = gw(**server)
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            _stream(client, model=model, thinking=thinking)
        else:
            client.messages.create(model=model, max_tokens=8000, messages=USER, thinking=thinking)
    message = _error(caught)
    assert "Failed to process thinking request" in message and repr(model) in message
    assert fake.requests == []
    # Without thinking (or with it disabled) the same model still answers.
    fake.json_reply(completion(ANSWER))
    fake.json_reply(completion(ANSWER))
    assert (
        client.messages.create(model=model, max_tokens=100, messages=USER, thinking={"type": "disabled"})
        .content[0]
        .text
        == ANSWER
    )
    assert (
        client.messages.create(model=model, max_tokens=100, messages=USER, output_config={"effort": "high"})
        .content[0]
        .text
        == ANSWER
    )
    assert len(fake.requests) == 2


def test_model_level_strict_false_overrides_a_strict_server(gw, fake):
    client = gw(strict_thinking=True)
    fake.json_reply(completion(ANSWER))
    message = client.messages.create(
        model="plain-lenient", max_tokens=100, messages=USER, thinking={"type": "adaptive"}
    )
    assert message.content[0].text == ANSWER


@pytest.mark.parametrize("strict", [False, True])
def test_explicit_reasoning_effort_on_a_model_that_does_not_reason_is_a_400(gw, fake, strict):
    client = gw(strict_thinking=strict)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="plain", max_tokens=100, messages=USER, extra_body={"reasoning_effort": "high"})
    message = _error(caught)
    assert message.startswith("reasoning_effort:") and "plain" in message
    assert fake.requests == []


# -- off switch and max tokens field -------------------------------------------------------------


def test_disabled_thinking_sends_enable_thinking_false(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER))
    fake.json_reply(completion(ANSWER))
    fake.json_reply(completion(ANSWER))

    raw = client.messages.with_raw_response.create(
        model="thinker-switch", max_tokens=100, messages=USER, thinking={"type": "disabled"}
    )
    raw.parse()
    assert fake.requests[-1]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "reasoning_effort" not in fake.requests[-1]
    assert "x-reasoning-effort" not in raw.headers

    # Absent or adaptive thinking does not flip the switch.
    client.messages.create(model="thinker-switch", max_tokens=100, messages=USER)
    client.messages.create(model="thinker-switch", max_tokens=100, messages=USER, thinking={"type": "adaptive"})
    for body in fake.requests[1:]:
        assert "chat_template_kwargs" not in body


def test_disabled_thinking_as_lowest_effort(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER, reasoning="hidden"))
    raw = client.messages.with_raw_response.create(
        model="thinker-lowest", max_tokens=100, messages=USER, thinking={"type": "disabled"}
    )
    message = raw.parse()
    assert fake.requests[-1]["reasoning_effort"] == "minimal"
    assert "chat_template_kwargs" not in fake.requests[-1]
    assert raw.headers.get("x-reasoning-effort") == "minimal"
    assert _blocks(message) == [{"type": "text", "text": ANSWER}]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_reasoning_model_gets_max_completion_tokens(gw, fake, stream):
    client = gw("openai")
    for _ in range(2):
        if stream:
            fake.stream_reply(vllm_new())
        else:
            fake.json_reply(completion(ANSWER))
    for model in ("thinker", "plain"):
        if stream:
            _stream(client, model=model, max_tokens=777)
        else:
            client.messages.create(model=model, max_tokens=777, messages=USER)
    thinker, plain = fake.requests
    assert thinker["max_completion_tokens"] == 777 and "max_tokens" not in thinker
    assert plain["max_tokens"] == 777 and "max_completion_tokens" not in plain


def test_openai_reasoning_model_output_cap_lowers_max_completion_tokens(gw, fake):
    client = gw("openai")
    fake.json_reply(completion(ANSWER))
    raw = client.messages.with_raw_response.create(
        model="thinker-capped", max_tokens=8000, messages=USER, thinking=THINK
    )
    raw.parse()
    sent = fake.requests[-1]
    assert sent["max_completion_tokens"] == 500 and "max_tokens" not in sent
    assert raw.headers.get("x-max-tokens-applied") == "500"
    assert raw.headers.get("x-reasoning-effort") == "medium"


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llamacpp", "ollama", "generic"])
def test_other_flavors_keep_max_tokens_for_reasoning_models(gw, fake, flavor):
    client = gw(flavor)
    fake.json_reply(completion(ANSWER))
    client.messages.create(model="thinker", max_tokens=5321, messages=USER, thinking=THINK)
    assert fake.requests[-1]["max_tokens"] == 5321 and "max_completion_tokens" not in fake.requests[-1]


# -- reasoning replay -----------------------------------------------------------------------------

REPLAY_FIELD = {
    "generic": "reasoning_content",
    "llamacpp": "reasoning_content",
    "sglang": "reasoning_content",
    "vllm": "reasoning",
    "ollama": "reasoning",
}
OTHER_FIELD = {"reasoning": "reasoning_content", "reasoning_content": "reasoning"}


def _assistant_messages(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] == "assistant"]


@pytest.mark.parametrize("flavor", list(REPLAY_FIELD))
def test_replay_sends_echoed_thinking_back_in_the_profiles_field(gw, fake, flavor):
    client = gw(flavor)
    field = REPLAY_FIELD[flavor]
    fake.json_reply(completion(ANSWER))
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "First thought.", "signature": "dragoman-unsigned"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Hello!"},
        ]},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Plain answer, no thinking."}]},
        {"role": "user", "content": "Thanks"},
    ]  # fmt: skip
    client.messages.create(
        model="thinker-replay", max_tokens=8000, messages=messages, thinking=THINK, tools=[WEATHER_TOOL]
    )

    first, with_call, plain_turn = _assistant_messages(fake.requests[-1])
    assert first[field] == "First thought." and first["content"] == "Hello!"
    # A turn with tool calls always carries the field, empty when nothing was thought.
    assert with_call[field] == "" and with_call["tool_calls"][0]["id"] == "call_1"
    # A turn without thinking or tool calls does not.
    assert field not in plain_turn
    for message in (first, with_call, plain_turn):
        assert OTHER_FIELD[field] not in message
    assert "opaque" not in json.dumps(fake.requests[-1])  # redacted thinking cannot be replayed


@pytest.mark.parametrize("flavor", ["generic", "vllm"])
def test_without_replay_echoed_thinking_is_dropped(gw, fake, flavor):
    client = gw(flavor)
    fake.json_reply(completion(ANSWER))
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Secret thought.", "signature": "dragoman-unsigned"},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
    ]  # fmt: skip
    client.messages.create(model="thinker", max_tokens=8000, messages=messages, thinking=THINK, tools=[WEATHER_TOOL])
    sent = fake.requests[-1]
    (assistant,) = _assistant_messages(sent)
    assert "reasoning" not in assistant and "reasoning_content" not in assistant
    assert "Secret thought." not in json.dumps(sent)


@pytest.mark.parametrize(("flavor", "variant"), [("generic", "reasoning_content"), ("ollama", "ollama")])
def test_tool_loop_with_replay_round_trips_the_sdks_own_blocks(gw, fake, flavor, variant):
    """DeepSeek-style interleaving: the SDK's message content is echoed back as is, and
    the reasoning reaches the backend in its field on the tool-call turn."""
    client = gw(flavor)
    field = REPLAY_FIELD[flavor]
    fake.stream_reply(TOOL_STREAMS[variant]())
    fake.stream_reply(vllm_old() if field == "reasoning_content" else vllm_new())

    _, first = _stream(client, model="thinker-replay", thinking=THINK, tools=[WEATHER_TOOL])
    assert first.stop_reason == "tool_use"
    tool = first.content[1]
    history = [
        *USER,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "sunny"}]},
    ]
    _, second = _stream(client, model="thinker-replay", thinking=THINK, tools=[WEATHER_TOOL], messages=history)

    (assistant,) = _assistant_messages(fake.requests[-1])
    assert assistant[field] == "I need the weather. Calling the tool."
    assert assistant["tool_calls"][0]["id"] == tool.id
    assert [m["role"] for m in fake.requests[-1]["messages"]] == ["user", "assistant", "tool"]
    assert [b.type for b in second.content] == ["thinking", "text"]


# -- the models.dev registry at run time ----------------------------------------------------------


class _RegistryServer:
    """models.dev on loopback (stdlib HTTP server): every GET gets `body`."""

    def __init__(self, body: dict) -> None:
        payload = json.dumps(body).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api.json"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_model_the_fetched_registry_lists_as_reasoning_gets_reasoning_controls(
    make_gateway, upstream, monkeypatch, tmp_path
):
    """No cache yet: the gateway fetches the registry after startup, and a discovered
    model it lists as reasoning (a name no family rule knows) is then treated as one."""
    registry = _RegistryServer({"acme": {"models": {"acme/house-model": {"reasoning": True}}}})
    try:
        monkeypatch.setenv("DRAGOMAN_CACHE_DIR", str(tmp_path / "fresh"))
        monkeypatch.setattr(capabilities, "REGISTRY_URL", registry.url)
        upstream.models = [{"id": "house-model", "object": "model", "owned_by": "vllm"}]
        gateway = make_gateway(upstream={"flavor": "vllm"})
        gateway.wait_discovered()
        router = gateway.app.state.gateway.router
        assert _wait(lambda: router.registry.lookup("house-model") is True)
        assert json.loads((tmp_path / "fresh" / "models.dev.json").read_text())["acme"]
    finally:
        registry.close()

    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    upstream.json_reply(completion(ANSWER, reasoning=REASONING))
    raw = client.messages.with_raw_response.create(model="house-model", max_tokens=8000, messages=USER, thinking=THINK)
    message = raw.parse()
    assert upstream.requests[-1]["reasoning_effort"] == "medium"
    assert raw.headers.get("x-reasoning-effort") == "medium"
    assert [b.type for b in message.content] == ["thinking", "text"]


def test_an_unanswering_registry_does_not_slow_requests(make_gateway, upstream, monkeypatch, tmp_path):
    """The registry fetch hangs (a socket that accepts and never answers): requests
    are served at once, by the name rules."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        monkeypatch.setenv("DRAGOMAN_CACHE_DIR", str(tmp_path / "empty"))
        monkeypatch.setattr(capabilities, "REGISTRY_URL", f"http://127.0.0.1:{silent.getsockname()[1]}/api.json")
        monkeypatch.setattr(
            capabilities.refresh_registry, "__defaults__", (60.0,)
        )  # a request that waited for it would fail
        upstream.models = [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]
        gateway = make_gateway(upstream={"flavor": "vllm"})
        gateway.wait_discovered()
        client = anthropic.Anthropic(
            base_url=gateway.url, api_key="k", max_retries=0, timeout=10.0
        )  # the fetch gives up only at 60 s
        upstream.json_reply(completion(ANSWER))
        client.messages.create(
            model="Qwen/Qwen3-8B", max_tokens=2000, messages=USER, thinking={"type": "enabled", "budget_tokens": 1024}
        )
        assert upstream.requests[-1]["reasoning_effort"] == "low"  # Qwen3: reasoning by name
        assert not (tmp_path / "empty" / "models.dev.json").exists()
    finally:
        silent.close()


# -- dragoman models --------------------------------------------------------------------------


def _models_cli(tmp_path: Path, *args: str, registry: dict | None = None) -> dict[str, str]:
    """Run `dragoman models ARGS` with a fresh, private registry cache (so nothing is
    fetched); {model name: its line}."""
    cache = tmp_path / "cli-cache"
    cache.mkdir(exist_ok=True)
    (cache / "models.dev.json").write_text(json.dumps(registry or {}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_")}
    env["DRAGOMAN_CACHE_DIR"] = str(cache)
    result = subprocess.run(
        [sys.executable, "-m", "dragoman", "models", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return {line.split("\t", 1)[0]: line for line in lines}


def test_models_command_says_which_upstream_models_reason_and_why(tmp_path, upstream):
    upstream.models = [
        {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"},
        {"id": "llama-3.1-8b", "object": "model", "owned_by": "vllm"},
        {"id": "house-model", "object": "model", "owned_by": "vllm"},
    ]
    registry = {"acme": {"models": {"house-model": {"reasoning": True}}}}
    lines = _models_cli(tmp_path, "--upstream", upstream.url, registry=registry)

    assert set(lines) == {"Qwen/Qwen3-8B", "llama-3.1-8b", "house-model"}
    assert "\treasoning (name matches a known reasoning family)" in lines["Qwen/Qwen3-8B"]
    assert "not reasoning (unknown model: not reasoning)" in lines["llama-3.1-8b"]
    assert "\treasoning (listed in the models.dev registry)" in lines["house-model"]
    assert "upstream=default" in lines["Qwen/Qwen3-8B"] and "model=Qwen/Qwen3-8B" in lines["Qwen/Qwen3-8B"]


def test_models_command_says_when_the_registry_was_out_of_reach(tmp_path, upstream):
    """Offline (here: the proxy every fetch goes through refuses connections), `models` says where
    its reasoning decisions came from instead; the lines themselves are as before."""
    upstream.models = [{"id": "llama-3.1-8b", "object": "model", "owned_by": "vllm"}]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_")}
        env |= {"DRAGOMAN_CACHE_DIR": str(tmp_path / "no-cache"), "HTTPS_PROXY": proxy, "NO_PROXY": "127.0.0.1"}
        result = subprocess.run([sys.executable, "-m", "dragoman", "models", "--upstream", upstream.url],
                                capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("llama-3.1-8b\t"), result.stdout
    assert "the models.dev registry could not be fetched (offline?)" in result.stderr, result.stderr
    assert "configuration and model names only" in result.stderr


def test_models_command_reports_configuration_decisions(tmp_path, upstream):
    upstream.models = [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]
    config = tmp_path / "dragoman.toml"
    config.write_text(
        f"""
[upstreams.configured]
url = "{upstream.url}"
[upstreams.discovered]
url = "{upstream.url}"

[[models]]
name = "my-llama"
upstream = "configured"
upstream_model = "llama-3.1-8b"
reasoning = true

[[models]]
name = "quiet-qwen"
upstream = "configured"
upstream_model = "Qwen/Qwen3-8B"
reasoning = false
"""
    )
    lines = _models_cli(tmp_path, "--config", str(config))
    assert "\treasoning (set in the configuration)" in lines["my-llama"]
    assert "model=llama-3.1-8b" in lines["my-llama"]
    assert "not reasoning (set in the configuration)" in lines["quiet-qwen"]
    # The upstream without configured models serves (and reports) what it lists.
    assert "upstream=discovered" in lines["Qwen/Qwen3-8B"]
    assert "\treasoning (name matches a known reasoning family)" in lines["Qwen/Qwen3-8B"]


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "json"])
def test_omitted_thinking_carries_its_reasoning_back_to_a_replay_model(gw, fake, streamed):
    """Claude Code asks for display "omitted" in `-p` runs and echoes the blocks back: a model
    that needs its reasoning replayed still gets it, carried in the block's signature."""
    client = gw("generic")
    omitted = {**THINK, "display": "omitted"}
    if streamed:
        fake.stream_reply(TOOL_STREAMS["reasoning_content"]())
        _, first = _stream(client, model="thinker-replay", thinking=omitted, tools=[WEATHER_TOOL])
    else:
        tool_call = {
            "id": "call_w",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        fake.json_reply(
            completion(
                None,
                finish="tool_calls",
                tool_calls=[tool_call],
                reasoning_content="I need the weather. Calling the tool.",
            )
        )
        first = client.messages.create(
            model="thinker-replay", max_tokens=8000, messages=USER, thinking=omitted, tools=[WEATHER_TOOL]
        )
    thinking, tool = first.content[0], first.content[1]
    assert thinking.type == "thinking" and thinking.thinking == ""  # not shown, as asked
    fake.stream_reply(vllm_old())
    history = [*USER, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "sunny"}]}]  # fmt: skip
    _stream(client, model="thinker-replay", thinking=omitted, tools=[WEATHER_TOOL], messages=history)
    (assistant,) = _assistant_messages(fake.requests[-1])
    assert assistant["reasoning_content"] == "I need the weather. Calling the tool."


# -- thinking.budget_tokens: Anthropic's checks ---------------------------------------------------

INTERLEAVED = "interleaved-thinking-2025-05-14"


REFUSED_BUDGETS = pytest.mark.parametrize(
    ("max_tokens", "thinking", "extra", "message"),
    [
        (8000, {"type": "enabled", "budget_tokens": 1000}, {}, "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
        (4096, THINK, {}, "`max_tokens` must be greater than `thinking.budget_tokens`."),
        (8000, THINK, {"tools": [WEATHER_TOOL], "tool_choice": {"type": "any"}}, "Thinking may not be enabled when tool_choice forces tool use."),
    ],
    ids=["below-1024", "not-below-max-tokens", "forced-tool-use"],
)  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@REFUSED_BUDGETS
def test_a_thinking_budget_anthropic_refuses_is_a_400_before_the_upstream(
    gw, fake, stream, max_tokens, thinking, extra, message
):
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            _stream(client, model="thinker", max_tokens=max_tokens, thinking=thinking, **extra)
        else:
            client.messages.create(model="thinker", max_tokens=max_tokens, messages=USER, thinking=thinking, **extra)
    assert caught.value.status_code == 400
    assert _error(caught).startswith(message)
    assert fake.requests == []


@pytest.mark.parametrize("stream", [False, True])
@REFUSED_BUDGETS
def test_a_compaction_request_gets_the_same_thinking_checks(gw, fake, stream, max_tokens, thinking, extra, message):
    """The summary is asked for without thinking or tools, but the request as sent is checked
    as any other: Anthropic answers it the same 400."""
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.beta.messages.create(model="thinker", max_tokens=max_tokens, messages=USER, thinking=thinking,
                                    compaction={"type": "summarize"}, stream=stream, **extra)  # fmt: skip
    assert caught.value.status_code == 400
    assert _error(caught).startswith(message)
    assert fake.requests == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {
                "tools": [{"name": "read", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "write"},
            },
            "tool_choice.name: no tool named 'write' in tools",
        ),
        ({"tools": [{"name": "read", "input_schema": "not a schema"}]}, "tools.0.input_schema"),
    ],
)
def test_a_compaction_request_gets_every_check_of_an_ordinary_request(gw, fake, extra, message):
    """The summary's request has no tools, but the request as sent is checked as any other."""
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as ordinary:
        client.messages.create(model="thinker", max_tokens=2000, messages=USER, **extra)
    with pytest.raises(anthropic.BadRequestError) as compacting:
        client.beta.messages.create(
            model="thinker", max_tokens=2000, messages=USER, compaction={"type": "summarize"}, **extra
        )
    assert _error(ordinary).startswith(message)
    assert _error(compacting) == _error(ordinary)
    assert fake.requests == []


def test_a_compaction_request_with_the_interleaved_beta_may_pass_max_tokens(gw, fake):
    client = gw()
    fake.json_reply(completion("They said hello."))
    compacted = client.beta.messages.create(
        model="thinker", max_tokens=2000, messages=USER, thinking={"type": "enabled", "budget_tokens": 16000},
        compaction={"type": "summarize"}, betas=[INTERLEAVED],
    )  # fmt: skip
    assert compacted.stop_reason == "compaction" and compacted.content[0].content == "They said hello."
    assert len(fake.requests) == 1


def test_the_interleaved_thinking_beta_lets_the_budget_pass_max_tokens(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER))
    message = client.beta.messages.create(
        model="thinker", max_tokens=2000, messages=USER, thinking={"type": "enabled", "budget_tokens": 16000},
        betas=["claude-code-20250219", INTERLEAVED],  # sent comma-separated
    )  # fmt: skip
    assert message.content[-1].text == ANSWER
    assert fake.requests[-1]["max_tokens"] == 2000  # still the client's cap

    # The SDK joins betas into one header; clients may also repeat the header.
    body = {
        "model": "thinker",
        "max_tokens": 2000,
        "messages": USER,
        "thinking": {"type": "enabled", "budget_tokens": 16000},
    }
    base = str(client.base_url).rstrip("/")
    fake.json_reply(completion(ANSWER))
    headers = [("x-api-key", "test-key"), ("anthropic-version", "2023-06-01"), ("anthropic-beta", "claude-code-20250219"),
               ("anthropic-beta", INTERLEAVED)]  # fmt: skip
    repeated = httpx.post(f"{base}/v1/messages", json=body, headers=headers, timeout=10)
    assert repeated.status_code == 200, repeated.text
    fake.json_reply(completion(ANSWER))
    without = httpx.post(f"{base}/v1/messages", json=body, headers=headers[:3], timeout=10)
    assert without.status_code == 400 and without.json()["error"]["message"].startswith("`max_tokens` must be greater")


def test_what_claude_code_sends_for_thinking_still_passes(gw, fake):
    """Claude Code's legacy models: budget max_tokens - 1 (or MAX_THINKING_TOKENS), with the
    interleaved beta; its newer ones: adaptive; with thinking off: disabled."""
    client = gw()
    betas = ["claude-code-20250219", INTERLEAVED, "context-management-2025-06-27"]
    for thinking in ({"type": "enabled", "budget_tokens": 31999}, {"type": "enabled", "budget_tokens": 8000},
                     {"type": "adaptive"}, {"type": "adaptive", "display": "omitted"}, {"type": "disabled"}):  # fmt: skip
        fake.stream_reply(vllm_new())
        with client.beta.messages.stream(
            model="thinker", max_tokens=32000, messages=USER, thinking=thinking, betas=betas
        ) as stream:
            final = stream.get_final_message()
        assert final.content[-1].text == ANSWER, thinking
    assert len(fake.requests) == 5

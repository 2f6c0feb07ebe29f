"""Shared shapes of the extended thinking tests (tests/integration/thinking): the requests, the upstream streams of each reasoning flavor, and readers of the blocks the SDK returns."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.support.fakes import chunk, usage_chunk

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


PIECES = ["Let me think. ", "The user greets."]


def vllm_stream(*fields: str) -> list:
    """A vLLM stream whose reasoning comes under `fields` (`reasoning_content` before PR #27752,
    `reasoning` after, both during the transition), then the answer "Hello there"."""
    return [
        chunk({"role": "assistant", "content": ""}),
        *[chunk(dict.fromkeys(fields, p)) for p in PIECES],
        chunk({"content": "Hello"}),
        chunk({"content": " there"}),
        chunk({}, "stop"),
        usage_chunk(10, 7),
    ]


def vllm_old() -> list:
    return vllm_stream("reasoning_content")


def vllm_new() -> list:
    return vllm_stream("reasoning")


def ollama() -> list:
    """`reasoning`, content in separate later chunks, finish_reason in its own empty chunk."""
    return [
        *[chunk({"role": "assistant", "content": "", "reasoning": p}) for p in PIECES],
        chunk({"role": "assistant", "content": "Hello"}),
        chunk({"role": "assistant", "content": " there"}),
        chunk({"role": "assistant", "content": ""}, "stop"),
        usage_chunk(10, 7),
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


def _stream(client: anthropic.Anthropic, **kw: Any) -> tuple[list, anthropic.types.Message]:
    kw.setdefault("max_tokens", 8000)
    kw.setdefault("messages", USER)
    with client.messages.stream(**kw) as stream:
        events = [e for e in stream if e.type in RAW_EVENTS]
        final = stream.get_final_message()
    return events, final


def _blocks(message: anthropic.types.Message) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in message.content]


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


def _error(excinfo: pytest.ExceptionInfo) -> str:
    body = excinfo.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    return body["error"]["message"]

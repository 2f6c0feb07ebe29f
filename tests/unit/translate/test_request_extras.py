"""Deferred tools, tool references, omitted thinking text, max_tokens 0."""

from __future__ import annotations

import msgspec

from dragoman.core.capabilities import ModelCaps, ReasoningCaps
from dragoman.core.profiles import PROFILES
from dragoman.protocol import anthropic, openai
from dragoman.translate.request import to_chat_request
from dragoman.translate.stream import StreamTranslator
from tests.support.helpers import OPTIONS

SCHEMA = {"type": "object", "properties": {}}


PLAIN = ModelCaps()


def _chat(body: dict, caps: ModelCaps = PLAIN) -> dict:
    request = anthropic.MESSAGES_REQUEST.decode(msgspec.json.encode({"model": "m", "max_tokens": 10, **body}))
    translated = to_chat_request(
        request, upstream_model="m", profile=PROFILES["vllm"], caps=caps, stream=False, options=OPTIONS
    )
    return msgspec.json.decode(openai.ENCODER.encode(translated.chat))


TOOLS = [
    {"name": "search", "input_schema": SCHEMA},
    {"name": "fetch", "input_schema": SCHEMA, "defer_loading": True},
]


def test_deferred_tools_stay_hidden_until_loaded():
    chat = _chat({"tools": TOOLS, "messages": [{"role": "user", "content": "hi"}]})
    assert [t["function"]["name"] for t in chat["tools"]] == ["search"]


def test_a_tool_reference_loads_the_deferred_tool_and_reads_as_text():
    messages = [
        {"role": "user", "content": "find a fetch tool"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {}}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "tool_reference", "tool_name": "fetch"}],
                }
            ],
        },
    ]
    chat = _chat({"tools": TOOLS, "messages": messages})
    assert [t["function"]["name"] for t in chat["tools"]] == ["search", "fetch"]
    tool_message = next(m for m in chat["messages"] if m["role"] == "tool")
    assert "fetch" in tool_message["content"]


def test_max_tokens_zero_sends_one_token_upstream():
    chat = _chat({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]})
    assert chat["max_tokens"] == 1


def _reasoning_translator(omit: bool) -> list:
    translator = StreamTranslator(
        model="m", message_id="msg_1", new_tool_id=lambda: "toolu_1", surface_thinking=True, omit_thinking_text=omit
    )
    events = translator.start()
    events += translator.feed(
        openai.ChatChunk(choices=[openai.ChunkChoice(delta=openai.ResponseMessage(reasoning="secret plan"))])
    )
    events += translator.feed(
        openai.ChatChunk(
            choices=[openai.ChunkChoice(delta=openai.ResponseMessage(content="answer"), finish_reason="stop")]
        )
    )
    return msgspec.to_builtins(events + translator.finish())


def test_thinking_display_omitted_keeps_the_block_and_signature_but_not_the_text():
    events = _reasoning_translator(omit=True)
    assert "secret plan" not in str(events)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert any(e["type"] == "content_block_delta" and e["delta"]["type"] == "signature_delta" for e in events)
    assert "secret plan" in str(_reasoning_translator(omit=False))


def test_display_omitted_is_planned_from_the_request():
    caps = ModelCaps(reasoning=ReasoningCaps(reasoning=True))
    request = msgspec.convert(
        {
            "model": "m",
            "max_tokens": 10,
            "thinking": {"type": "adaptive", "display": "omitted"},
            "messages": [{"role": "user", "content": "hi"}],
        },
        anthropic.MessagesRequest,
    )
    translated = to_chat_request(
        request, upstream_model="m", profile=PROFILES["vllm"], caps=caps, stream=True, options=OPTIONS
    )
    assert translated.surface_thinking and translated.omit_thinking_text

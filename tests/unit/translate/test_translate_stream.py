"""OpenAI chunk streams -> Anthropic stream events.

Every case is checked against the same invariants:
- the event grammar the SDKs rely on holds (tests/support/helpers.py::check_grammar);
- our fold, the official SDK's accumulator (fed the real SSE bytes) and `to_message`
  of the equivalent non-streaming completion all describe the same message;
- that message is the one the case expects.
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from dragoman.core.errors import GatewayError, InvalidRequest, UpstreamError
from dragoman.protocol import anthropic as a
from dragoman.translate.fold import fold
from dragoman.translate.reply import stop_reason_of
from dragoman.translate.response import to_message
from dragoman.translate.stream import StreamTranslator
from tests.support.helpers import (
    as_dicts,
    check_grammar,
    chunk,
    decode_chunk,
    decode_completion,
    merge_chunks,
    sdk_fold,
    summary,
    tool_ids,
    usage,
    usage_chunk,
)


def translator(**kwargs: Any) -> StreamTranslator:
    return StreamTranslator(model="claude-test", message_id="msg_test", new_tool_id=tool_ids(), **kwargs)


def run(chunks: list[dict[str, Any]], **kwargs: Any) -> list[a.StreamEvent]:
    t = translator(**kwargs)
    events = t.start()
    for body in chunks:
        events += t.feed(decode_chunk(body))
    return events + t.finish()


def no_usage() -> dict[str, int]:
    return {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}


def tokens(prompt: int, output: int, cached: int = 0) -> dict[str, int]:
    return {
        "input_tokens": prompt - cached,
        "output_tokens": output,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def text_block(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_block(id: str, name: str, input: dict) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def thinking_block(value: str) -> dict[str, Any]:
    from dragoman.translate.thinking import SIGNATURE

    return {"type": "thinking", "thinking": value, "signature": SIGNATURE}


@dataclass
class Case:
    id: str
    chunks: list[dict[str, Any]]
    content: list[dict[str, Any]]
    stop_reason: str
    usage: dict[str, int] = field(default_factory=no_usage)
    stop_sequence: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    blocks: list[tuple] | None = None  # the exact block events, when the case is about them (see block_events)


def tc(
    index: int | None = None, id: str | None = None, name: str | None = None, arguments: Any = None
) -> dict[str, Any]:
    """One `tool_calls[]` entry of a delta, with only the fields given."""
    out: dict[str, Any] = {}
    if index is not None:
        out["index"] = index
    if id is not None:
        out["id"] = id
        out["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    if function:
        out["function"] = function
    return out


def calls(*entries: dict[str, Any], **delta: Any) -> dict[str, Any]:
    return chunk({"tool_calls": list(entries), **delta})


def block_events(events: list[a.StreamEvent]) -> list[tuple]:
    """The content block events, compactly: ("start", i, id, name) for a tool block,
    ("start", i, "text") for a text block, ("json", i, partial) and ("text", i, text)
    for deltas, ("stop", i)."""
    out: list[tuple] = []
    for event in events:
        if isinstance(event, a.ContentBlockStart):
            block = event.content_block
            if isinstance(block, a.OutToolUseBlock):
                out.append(("start", event.index, block.id, block.name))
            else:
                out.append(("start", event.index, block.__struct_config__.tag))
        elif isinstance(event, a.ContentBlockDelta):
            delta = event.delta
            if isinstance(delta, a.InputJSONDelta):
                out.append(("json", event.index, delta.partial_json))
            else:
                out.append(("text", event.index, getattr(delta, "text", delta)))
        elif isinstance(event, a.ContentBlockStop):
            out.append(("stop", event.index))
    return out


CASES = [
    Case(
        "text",
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({"content": " world"}),
            chunk({}, "stop"),
            usage_chunk(12, 3),
        ],  # fmt: skip
        [text_block("Hello world")],
        "end_turn",
        tokens(12, 3),
    ),
    Case(
        "empty-reply",
        [chunk({"role": "assistant", "content": ""}), chunk({}, "stop"), usage_chunk(5, 0)],
        [text_block("")],
        "end_turn",
        tokens(5, 0),
    ),
    Case(
        "vllm-tool-call",
        [
            chunk({"role": "assistant", "content": None}),
            calls(tc(0, "chatcmpl-tool-1a2b", "get_weather", "")),
            calls(tc(0, arguments='{"ci')),
            calls(tc(0, arguments='ty": "Pa')),
            calls(tc(0, arguments='ris", "unit')),
            calls(tc(0, arguments='": "c\\u00b0"}')),
            chunk({}, "tool_calls"),
            usage_chunk(40, 18),
        ],
        [tool_block("chatcmpl-tool-1a2b", "get_weather", {"city": "Paris", "unit": "c\u00b0"})],
        "tool_use",
        tokens(40, 18),
    ),
    Case(
        "vllm-parallel-calls",
        [
            calls(tc(0, "call_a", "get_weather", '{"city": ')),
            calls(tc(0, arguments='"Paris"}')),
            calls(tc(1, "call_b", "get_time", "")),
            calls(tc(1, arguments='{"tz": "CET"}')),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "get_weather", {"city": "Paris"}), tool_block("call_b", "get_time", {"tz": "CET"})],
        "tool_use",
    ),
    Case(
        "id-repeated-on-every-fragment",
        [
            calls(tc(0, "call_a", "get_weather", '{"city"')),
            calls(tc(0, "call_a", arguments=': "Paris"}')),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
    ),
    Case(
        "ollama-whole-calls-in-one-chunk",
        [
            chunk({"role": "assistant", "content": ""}),
            calls(
                tc(0, "call_k2x", "get_weather", '{"city":"Paris"}'),
                tc(1, "call_p9q", "get_weather", '{"city":"Rome"}'),
                role="assistant",
                content="",
            ),
            chunk({"role": "assistant", "content": ""}, "tool_calls"),
            usage_chunk(30, 20),
        ],
        [
            tool_block("call_k2x", "get_weather", {"city": "Paris"}),
            tool_block("call_p9q", "get_weather", {"city": "Rome"}),
        ],
        "tool_use",
        tokens(30, 20),
    ),
    Case(
        "object-arguments",
        [calls(tc(0, "call_1", "get_weather", {"city": "Oslo", "days": 2})), chunk({}, "tool_calls")],
        [tool_block("call_1", "get_weather", {"city": "Oslo", "days": 2})],
        "tool_use",
    ),
    Case(
        "llamacpp-usage-on-finish-chunk",
        [
            chunk({"role": "assistant", "content": None}),
            calls(tc(0, "OVW3pHXaJ1ffTz5Wz5Hq4gJd", "get_weather", "{")),
            calls(tc(0, arguments='"city":"Paris"')),
            calls(tc(0, arguments="}")),
            {**chunk({}, "tool_calls", usage=usage(55, 12)), "timings": {"prompt_n": 55, "predicted_n": 12}},
        ],
        [tool_block("OVW3pHXaJ1ffTz5Wz5Hq4gJd", "get_weather", {"city": "Paris"})],
        "tool_use",
        tokens(55, 12),
    ),
    Case(
        "text-then-tool-calls",
        [
            chunk({"content": "I'll check "}),
            chunk({"content": "both."}),
            calls(tc(0, "call_a", "get_weather", '{"city": "Paris"}')),
            calls(tc(1, "call_b", "get_weather", '{"city": "Rome"}')),
            chunk({}, "tool_calls"),
            usage_chunk(20, 9),
        ],
        [
            text_block("I'll check both."),
            tool_block("call_a", "get_weather", {"city": "Paris"}),
            tool_block("call_b", "get_weather", {"city": "Rome"}),
        ],
        "tool_use",
        tokens(20, 9),
    ),
    Case(
        "tool-call-with-finish-stop",
        [calls(tc(0, "call_a", "get_weather", '{"city": "Paris"}')), chunk({}, "stop")],
        [tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
    ),
    Case(
        "missing-tool-ids",
        [
            calls(tc(0, name="get_weather", arguments="{}")),
            calls(tc(1, name="get_time", arguments="{}")),
            chunk({}, "tool_calls"),
        ],
        [tool_block("toolu_test1", "get_weather", {}), tool_block("toolu_test2", "get_time", {})],
        "tool_use",
    ),
    Case(
        "empty-arguments",
        [calls(tc(0, "call_a", "list_files", "")), chunk({}, "tool_calls")],
        [tool_block("call_a", "list_files", {})],
        "tool_use",
    ),
    Case(
        "truncated-arguments-at-length",
        [calls(tc(0, "call_a", "write_file", '{"path": "a.txt", "text": "Once upon')), chunk({}, "length")],
        [tool_block("call_a", "write_file", {"path": "a.txt", "text": "Once upon"})],
        "max_tokens",
    ),
    Case(
        "shortened-tool-name-mapped-back",
        [calls(tc(0, "call_a", "mcp__srv__short_1f2e3d4c", "{}")), chunk({}, "tool_calls")],
        [tool_block("call_a", "mcp__srv__" + "very_long_name_" * 5, {})],
        "tool_use",
        options={"tool_names": {"mcp__srv__short_1f2e3d4c": "mcp__srv__" + "very_long_name_" * 5}},
    ),
    Case(
        "usage-chunk-with-cached-tokens",
        [chunk({"content": "ok"}), chunk({}, "stop"), usage_chunk(1000, 2, cached=960)],
        [text_block("ok")],
        "end_turn",
        tokens(1000, 2, cached=960),
    ),
    Case(
        "length",
        [chunk({"content": "The list: 1, 2,"}), chunk({}, "length"), usage_chunk(10, 8)],
        [text_block("The list: 1, 2,")],
        "max_tokens",
        tokens(10, 8),
    ),
    # max_tokens lowered to the room the prompt left in the context window (backends.fitting):
    # a reply cut at it was stopped by the window; one the model ended says so as ever.
    Case(
        "length-at-a-window-bound-limit",
        [chunk({"content": "The list: 1, 2,"}), chunk({}, "length"), usage_chunk(10, 8)],
        [text_block("The list: 1, 2,")],
        "model_context_window_exceeded",
        tokens(10, 8),
        options={"window_bound": True},
    ),
    Case(
        "truncated-arguments-at-a-window-bound-limit",
        [calls(tc(0, "call_a", "write_file", '{"path": "a.txt", "text": "Once upon')), chunk({}, "length")],
        [tool_block("call_a", "write_file", {"path": "a.txt", "text": "Once upon"})],
        "model_context_window_exceeded",
        options={"window_bound": True},
    ),
    Case(
        "reasoning-cut-at-a-window-bound-limit",
        [chunk({"reasoning": "Let me think about"}), chunk({"reasoning": " this"}), chunk({}, "length")],
        [thinking_block("Let me think about this")],
        "model_context_window_exceeded",
        options={"window_bound": True, "surface_thinking": True},
    ),
    Case(
        "ended-by-the-model-under-a-window-bound-limit",
        [chunk({"content": "Done."}), chunk({}, "stop")],
        [text_block("Done.")],
        "end_turn",
        options={"window_bound": True},
    ),
    Case(
        "tool-call-under-a-window-bound-limit",
        [calls(tc(0, "call_a", "get_weather", '{"city": "Paris"}')), chunk({}, "tool_calls")],
        [tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
        options={"window_bound": True},
    ),
    Case(
        "stop-sequence-then-length-under-a-window-bound-limit",
        [chunk({"content": "One. END Two."}), chunk({}, "length")],
        [text_block("One. ")],
        "stop_sequence",
        stop_sequence="END",
        options={"window_bound": True, "stop_sequences": ["END"]},
    ),
    Case(
        "content-filter",
        [chunk({"content": "I"}), chunk({}, "content_filter")],
        [text_block("I")],
        "refusal",
    ),
    Case(
        "refusal",
        [chunk({"role": "assistant", "refusal": "I can't "}), chunk({"refusal": "help with that."}), chunk({}, "stop")],
        [text_block("I can't help with that.")],
        "end_turn",
    ),
    Case(
        "reasoning-surfaced",
        [chunk({"reasoning": "2+2"}), chunk({"reasoning": " is 4"}), chunk({"content": "4"}), chunk({}, "stop")],
        [thinking_block("2+2 is 4"), text_block("4")],
        "end_turn",
        options={"surface_thinking": True},
    ),
    Case(
        "reasoning-content-surfaced-then-tool",
        [
            chunk({"reasoning_content": "Need weather."}),
            calls(tc(0, "call_a", "get_weather", '{"city": "Paris"}')),
            chunk({}, "tool_calls"),
        ],
        [thinking_block("Need weather."), tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
        options={"surface_thinking": True},
    ),
    Case(
        "reasoning-hidden",
        [chunk({"reasoning": "2+2 is 4"}), chunk({"content": "4"}), chunk({}, "stop")],
        [text_block("4")],
        "end_turn",
    ),
    Case(
        "reasoning-only-answer",
        [chunk({"reasoning_content": "The answer "}), chunk({"reasoning_content": "is 4."}), chunk({}, "stop")],
        [text_block("The answer is 4.")],
        "end_turn",
    ),
    Case(
        "whitespace-before-the-arguments",
        [
            calls(tc(0, "call_a", "get_weather", "\n")),
            calls(tc(0, arguments=' {"city"')),
            calls(tc(0, arguments=': "Paris"}')),
            chunk({}, "tool_calls"),
        ],  # fmt: skip
        [tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
    ),
    Case(
        "whitespace-only-arguments",
        [calls(tc(0, "call_a", "list_files", " ")), calls(tc(0, arguments="\n")), chunk({}, "tool_calls")],
        [tool_block("call_a", "list_files", {})],
        "tool_use",
    ),
    Case(
        "id-before-name",
        [
            calls(tc(0, "call_a")),
            calls(tc(0, name="get_weather")),
            calls(tc(0, arguments='{"city": "Paris"}')),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
    ),
    Case(
        "name-before-id",
        [
            calls(tc(0, name="get_weather")),
            calls(tc(0, "call_a", arguments='{"city": ')),
            calls(tc(0, arguments='"Paris"}')),
            calls(tc(1, name="get_time")),
            calls(tc(1, "call_b", arguments="{}")),
            chunk({}, "tool_calls"),
        ],  # fmt: skip
        [tool_block("call_a", "get_weather", {"city": "Paris"}), tool_block("call_b", "get_time", {})],
        "tool_use",
    ),
    Case(
        "arguments-before-name",
        [
            calls(tc(0, "call_a", arguments='{"city": ')),
            calls(tc(0, name="get_weather", arguments='"Paris"}')),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
    ),
    Case(
        "finish-tool-calls-without-a-parsed-call",
        [chunk({"content": '<tool_call>{"name": "get_weather"'}), chunk({}, "tool_calls")],
        [text_block('<tool_call>{"name": "get_weather"')],
        "end_turn",
    ),
    Case(
        "reasoning-hidden-cut-by-max-tokens",
        [chunk({"reasoning": "Let me think about"}), chunk({"reasoning": " this"}), chunk({}, "length")],
        [text_block("")],
        "max_tokens",
    ),
    Case(
        "reasoning-surfaced-cut-by-max-tokens",
        [chunk({"reasoning": "Let me think about"}), chunk({"reasoning": " this"}), chunk({}, "length")],
        [thinking_block("Let me think about this")],
        "max_tokens",
        options={"surface_thinking": True},
    ),
    Case(
        "reasoning-omitted-cut-by-max-tokens",
        [chunk({"reasoning": "The answer is 4."}), chunk({}, "length")],
        [
            {**thinking_block(""), "signature": "dragoman-b64:" + base64.b64encode(b"The answer is 4.").decode()}
        ],  # carried
        "max_tokens",
        options={"surface_thinking": True, "omit_thinking_text": True},
    ),
    Case(
        "one-tool-call-asked-for-parallel-calls-came",
        [
            chunk({"content": "Checking."}),
            calls(tc(0, "call_a", "get_weather", '{"city": ')),
            calls(tc(0, arguments='"Paris"}')),
            calls(tc(1, "call_b", "get_time", "")),
            calls(tc(1, arguments='{"tz": "CET"}')),
            chunk({}, "tool_calls"),
        ],
        [text_block("Checking."), tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
        options={"single_tool_call": True},
    ),
    Case(
        "one-tool-call-asked-whole-calls-in-one-chunk",
        [
            calls(
                tc(0, "call_k2x", "get_weather", '{"city":"Paris"}'),
                tc(1, "call_p9q", "get_weather", '{"city":"Rome"}'),
            ),
            chunk({}, "tool_calls"),
        ],  # fmt: skip
        [tool_block("call_k2x", "get_weather", {"city": "Paris"})],
        "tool_use",
        options={"single_tool_call": True},
    ),
    Case(
        "kimi-tool-id-encoded",
        [calls(tc(0, "functions.get_weather:0", "get_weather", '{"city": "Paris"}')), chunk({}, "tool_calls")],
        [tool_block("toolu_b64_ZnVuY3Rpb25zLmdldF93ZWF0aGVyOjA", "get_weather", {"city": "Paris"})],
        "tool_use",
    ),
    # Parallel calls whose fragments interleave (servers that introduce several calls in one
    # chunk, then send their arguments by index): one block at a time, in the order the calls
    # began; a call waits, its fragments gathered, until the live one's arguments are whole.
    Case(
        "interleaved-two-calls-introduced-together-then-continued",
        [
            calls(tc(0, "call_a", "get_weather", ""), tc(1, "call_b", "get_time", "")),
            calls(tc(0, arguments='{"city": '), tc(1, arguments='{"tz": ')),
            calls(tc(0, arguments='"Paris"}'), tc(1, arguments='"CET"}')),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "get_weather", {"city": "Paris"}), tool_block("call_b", "get_time", {"tz": "CET"})],
        "tool_use",
        blocks=[
            ("start", 0, "call_a", "get_weather"),
            ("json", 0, '{"city": '),
            ("json", 0, '"Paris"}'),
            ("stop", 0),
            ("start", 1, "call_b", "get_time"),
            ("json", 1, '{"tz": '),
            ("json", 1, '"CET"}'),
            ("stop", 1),
        ],  # fmt: skip
    ),
    Case(
        "interleaved-alternating-fragments",
        [
            calls(tc(0, "call_a", "get_weather", "")),
            calls(tc(1, "call_b", "get_weather", "")),
            calls(tc(0, arguments='{"city"')),
            calls(tc(1, arguments='{"city"')),
            calls(tc(0, arguments=': "Paris"}')),
            calls(tc(1, arguments=': "Rome"}')),
            chunk({}, "tool_calls"),
            usage_chunk(30, 12),
        ],
        [tool_block("call_a", "get_weather", {"city": "Paris"}), tool_block("call_b", "get_weather", {"city": "Rome"})],
        "tool_use",
        tokens(30, 12),
        blocks=[
            ("start", 0, "call_a", "get_weather"),
            ("json", 0, '{"city"'),
            ("json", 0, ': "Paris"}'),
            ("stop", 0),
            ("start", 1, "call_b", "get_weather"),
            ("json", 1, '{"city"'),
            ("json", 1, ': "Rome"}'),
            ("stop", 1),
        ],  # fmt: skip
    ),
    Case(
        "interleaved-three-calls",
        [
            calls(tc(0, "call_a", "f", ""), tc(1, "call_b", "g", ""), tc(2, "call_c", "h", "")),
            calls(tc(2, arguments='{"c": 3}')),
            calls(tc(1, arguments='{"b": ')),
            calls(tc(0, arguments='{"a": ')),
            calls(tc(0, arguments="1}")),
            calls(tc(1, arguments="2}")),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "f", {"a": 1}), tool_block("call_b", "g", {"b": 2}), tool_block("call_c", "h", {"c": 3})],
        "tool_use",
        blocks=[
            ("start", 0, "call_a", "f"),
            ("json", 0, '{"a": '),
            ("json", 0, "1}"),
            ("stop", 0),
            ("start", 1, "call_b", "g"),
            ("json", 1, '{"b": '),
            ("json", 1, "2}"),
            ("stop", 1),
            ("start", 2, "call_c", "h"),
            ("json", 2, '{"c": 3}'),
            ("stop", 2),
        ],  # fmt: skip
    ),
    Case(
        # A call without arguments is never whole: the next one waits for the end.
        "interleaved-first-call-with-empty-arguments",
        [
            calls(tc(0, "call_a", "list_files", ""), tc(1, "call_b", "get_time", "")),
            calls(tc(1, arguments='{"tz": ')),
            calls(tc(1, arguments='"CET"}')),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "list_files", {}), tool_block("call_b", "get_time", {"tz": "CET"})],
        "tool_use",
        blocks=[
            ("start", 0, "call_a", "list_files"),
            ("stop", 0),
            ("start", 1, "call_b", "get_time"),
            ("json", 1, '{"tz": "CET"}'),
            ("stop", 1),
        ],
    ),
    Case(
        "interleaved-second-call-with-empty-arguments",
        [
            calls(tc(0, "call_a", "get_time", ""), tc(1, "call_b", "list_files", "")),
            calls(tc(0, arguments='{"tz": ')),
            calls(tc(0, arguments='"CET"}')),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "get_time", {"tz": "CET"}), tool_block("call_b", "list_files", {})],
        "tool_use",
        blocks=[
            ("start", 0, "call_a", "get_time"),
            ("json", 0, '{"tz": '),
            ("json", 0, '"CET"}'),
            ("stop", 0),
            ("start", 1, "call_b", "list_files"),
            ("stop", 1),
        ],  # fmt: skip
    ),
    Case(
        "interleaved-one-tool-call-asked",
        [
            calls(tc(0, "call_a", "get_weather", ""), tc(1, "call_b", "get_time", "")),
            calls(tc(0, arguments='{"city": '), tc(1, arguments='{"tz": ')),
            calls(tc(1, arguments='"CET"}')),
            calls(tc(0, arguments='"Paris"}')),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "get_weather", {"city": "Paris"})],
        "tool_use",
        options={"single_tool_call": True},
        blocks=[("start", 0, "call_a", "get_weather"), ("json", 0, '{"city": '), ("json", 0, '"Paris"}'), ("stop", 0)],
    ),
    Case(
        # max_tokens cut both: each is closed into an object when its block ends.
        "interleaved-cut-by-max-tokens",
        [
            calls(
                tc(0, "call_a", "write_file", '{"path": "a.txt"'),
                tc(1, "call_b", "write_file", '{"path": "b.txt", "text": "Once'),
            ),
            calls(tc(0, arguments=', "text": "Hel')),
            chunk({}, "length"),
        ],
        [
            tool_block("call_a", "write_file", {"path": "a.txt", "text": "Hel"}),
            tool_block("call_b", "write_file", {"path": "b.txt", "text": "Once"}),
        ],
        "max_tokens",
        blocks=[
            ("start", 0, "call_a", "write_file"),
            ("json", 0, '{"path": "a.txt"'),
            ("json", 0, ', "text": "Hel'),
            ("json", 0, '"}'),
            ("stop", 0),
            ("start", 1, "call_b", "write_file"),
            ("json", 1, '{"path": "b.txt", "text": "Once'),
            ("json", 1, '"}'),
            ("stop", 1),
        ],  # fmt: skip
    ),
    Case(
        # A waiting call's name (mapped), its id after the name, and Ollama-style object
        # arguments; the server's ids that Anthropic refuses are encoded.
        "interleaved-waiting-call-gets-its-id-late",
        [
            calls(tc(0, "functions.f:0", "mcp__srv__short_1f2e3d4c", "")),
            calls(tc(1, name="g")),
            calls(tc(1, "functions.g:1", arguments={"b": 2})),
            calls(tc(0, arguments='{"a": 1}')),
            chunk({}, "tool_calls"),
        ],
        [
            tool_block("toolu_b64_ZnVuY3Rpb25zLmY6MA", "mcp__srv__long_name", {"a": 1}),
            tool_block("toolu_b64_ZnVuY3Rpb25zLmc6MQ", "g", {"b": 2}),
        ],
        "tool_use",
        options={"tool_names": {"mcp__srv__short_1f2e3d4c": "mcp__srv__long_name"}},
        blocks=[
            ("start", 0, "toolu_b64_ZnVuY3Rpb25zLmY6MA", "mcp__srv__long_name"),
            ("json", 0, '{"a": 1}'),
            ("stop", 0),
            ("start", 1, "toolu_b64_ZnVuY3Rpb25zLmc6MQ", "g"),
            ("json", 1, '{"b":2}'),
            ("stop", 1),
        ],  # fmt: skip
    ),
    Case(
        # Whitespace after a call's whole arguments, once its block has closed, is dropped.
        "whitespace-after-a-closed-call",
        [
            calls(tc(0, "call_a", "f", '{"a": 1}')),
            calls(tc(1, "call_b", "g", '{"b": ')),
            calls(tc(0, arguments="\n")),
            calls(tc(1, arguments="2}")),
            chunk({}, "tool_calls"),
        ],
        [tool_block("call_a", "f", {"a": 1}), tool_block("call_b", "g", {"b": 2})],
        "tool_use",
        blocks=[
            ("start", 0, "call_a", "f"),
            ("json", 0, '{"a": 1}'),
            ("stop", 0),
            ("start", 1, "call_b", "g"),
            ("json", 1, '{"b": '),
            ("json", 1, "2}"),
            ("stop", 1),
        ],  # fmt: skip
    ),
    Case(
        "stop-sequence-split-across-chunks",
        [
            chunk({"content": "Hello wor"}),
            chunk({"content": "ld! ST"}),
            chunk({"content": "OP and more"}),
            chunk({"content": " text"}),
            chunk({}, "stop"),
            usage_chunk(10, 9),
        ],  # fmt: skip
        [text_block("Hello world! ")],
        "stop_sequence",
        tokens(10, 9),
        stop_sequence="STOP",
        options={"stop_sequences": ["STOP"]},
    ),
    Case(
        "stop-sequence-one-char-per-chunk",
        [chunk({"content": c}) for c in "ab\n\nHuman: x"] + [chunk({}, "stop")],
        [text_block("ab")],
        "stop_sequence",
        stop_sequence="\n\nHuman:",
        options={"stop_sequences": ["\n\nHuman:"]},
    ),
    Case(
        "stop-sequence-drops-later-tool-calls",
        [chunk({"content": "Done. <END>"}), calls(tc(0, "call_a", "get_weather", "{}")), chunk({}, "tool_calls")],
        [text_block("Done. ")],
        "stop_sequence",
        stop_sequence="<END>",
        options={"stop_sequences": ["<END>"]},
    ),
    Case(
        "stop-prefix-released-at-finish",
        [chunk({"content": "The E"}), chunk({"content": "N"}), chunk({}, "stop")],
        [text_block("The EN")],
        "end_turn",
        options={"stop_sequences": ["END"]},
    ),
    Case(
        "stop-prefix-then-more-text",
        [chunk({"content": "an EN"}), chunk({"content": "Dless"}), chunk({"content": " ENDing"}), chunk({}, "stop")],
        [text_block("an ")],
        "stop_sequence",
        stop_sequence="END",
        options={"stop_sequences": ["END"]},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_stream_invariants(case: Case) -> None:
    events = run(case.chunks, **case.options)
    check_grammar(events)
    by_sdk = summary(sdk_fold(events))
    by_fold = summary(fold(copy.deepcopy(events)))
    non_streaming = decode_completion(merge_chunks(case.chunks))
    by_message = summary(
        to_message(non_streaming, model="claude-test", message_id="msg_test", new_tool_id=tool_ids(), **case.options)
    )
    expected = {
        "content": case.content,
        "stop_reason": case.stop_reason,
        "stop_sequence": case.stop_sequence,
        "usage": case.usage,
    }
    assert by_fold == expected
    assert by_sdk == expected
    assert by_message == expected


BLOCK_CASES = [c for c in CASES if c.blocks is not None]


@pytest.mark.parametrize("case", BLOCK_CASES, ids=[c.id for c in BLOCK_CASES])
def test_block_events(case: Case) -> None:
    """One start and one stop per call, each call's deltas between them, calls in the order begun."""
    assert block_events(run(case.chunks, **case.options)) == case.blocks


@pytest.mark.parametrize(
    ("finish", "tool_calls", "matched", "window_bound", "expected"),
    [
        ("stop", False, None, False, "end_turn"),
        ("stop", False, None, True, "end_turn"),
        (None, False, None, True, "end_turn"),
        ("length", False, None, False, "max_tokens"),
        ("length", False, None, True, "model_context_window_exceeded"),
        ("length", True, None, False, "max_tokens"),  # a tool call cut short
        ("length", True, None, True, "model_context_window_exceeded"),
        ("length", False, "END", True, "stop_sequence"),
        ("tool_calls", True, None, True, "tool_use"),
        ("tool_calls", False, None, True, "end_turn"),
        ("content_filter", False, None, True, "refusal"),
    ],
)
def test_stop_reason_of(
    finish: str | None, tool_calls: bool, matched: str | None, window_bound: bool, expected: str
) -> None:
    assert stop_reason_of(finish, tool_calls=tool_calls, matched=matched, window_bound=window_bound) == expected


def test_exact_event_sequence_for_a_text_stream() -> None:
    events = as_dicts(run([chunk({"role": "assistant", "content": ""}), chunk({"content": "Hi"}), chunk({"content": " there"}),
                           chunk({}, "stop"), usage_chunk(7, 2)]))  # fmt: skip
    assert events == [
        {
            "type": "message_start",
            "message": {
                "type": "message",
                "id": "msg_test",
                "role": "assistant",
                "model": "claude-test",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "stop_details": None,
                "container": None,
                "diagnostics": None,
                "usage": events[0]["message"]["usage"],
            },
        },  # fmt: skip
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None, "stop_details": None, "container": None},
            "usage": {
                "input_tokens": 7,
                "output_tokens": 2,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        },  # fmt: skip
        {"type": "message_stop"},
    ]
    assert events[0]["message"]["usage"]["output_tokens"] >= 0


def test_blocks_are_emitted_as_soon_as_text_arrives() -> None:
    t = translator()
    t.start()
    first = as_dicts(t.feed(decode_chunk(chunk({"content": "Hel"}))))
    assert [e["type"] for e in first] == ["content_block_start", "content_block_delta"]
    assert first[1]["delta"] == {"type": "text_delta", "text": "Hel"}


def test_vllm_tool_call_arguments_stream_through_as_they_arrive() -> None:
    t = translator()
    t.start()
    opened = as_dicts(t.feed(decode_chunk(calls(tc(0, "call_a", "get_weather", "")))))
    assert opened == [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}},
        }
    ]
    piece = as_dicts(t.feed(decode_chunk(calls(tc(0, arguments='{"ci')))))
    assert piece == [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"ci'}}
    ]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}, UpstreamError),
        ("backend crashed", UpstreamError),
        (
            {
                "message": "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens.",
                "type": "BadRequestError",
            },
            InvalidRequest,
        ),  # fmt: skip
    ],
    ids=["vllm-error-object", "error-string", "context-overflow"],
)
def test_error_chunk_raises(error: Any, kind: type[GatewayError]) -> None:
    t = translator()
    t.start()
    t.feed(decode_chunk(chunk({"content": "partial"})))
    with pytest.raises(kind) as caught:
        t.feed(decode_chunk({"error": error}))
    if kind is InvalidRequest:
        assert caught.value.message.startswith("prompt is too long: 5000 tokens > 4096 maximum")
    else:
        assert (error if isinstance(error, str) else error["message"]) in caught.value.message


def test_done_after_a_stop_sequence_and_nothing_more_is_emitted() -> None:
    t = translator(stop_sequences=["</answer>"])
    events = t.start()
    events += t.feed(decode_chunk(chunk({"content": "42</ans"})))
    assert not t.done
    events += t.feed(decode_chunk(chunk({"content": "wer> trailing"})))
    assert t.done
    late = t.feed(decode_chunk(chunk({"content": "more text"}))) + t.feed(
        decode_chunk(calls(tc(0, "call_a", "f", "{}")))
    )
    assert late == []
    events += t.finish()
    check_grammar(events)
    texts = [e["delta"]["text"] for e in as_dicts(events) if e["type"] == "content_block_delta"]
    assert "".join(texts) == "42"
    assert as_dicts(events)[-2]["delta"] == {
        "stop_reason": "stop_sequence",
        "stop_sequence": "</answer>",
        "stop_details": None,
        "container": None,
    }


def test_possible_stop_prefix_is_held_back_until_resolved() -> None:
    t = translator(stop_sequences=["END"])
    t.start()
    held = as_dicts(t.feed(decode_chunk(chunk({"content": "The E"}))))
    assert [e["delta"]["text"] for e in held if e["type"] == "content_block_delta"] == ["The "]
    released = as_dicts(t.feed(decode_chunk(chunk({"content": "ast"}))))
    assert [e["delta"]["text"] for e in released if e["type"] == "content_block_delta"] == ["East"]
    assert not t.done


def test_usage_only_after_finish_reaches_the_message_delta() -> None:
    t = translator()
    events = t.start() + t.feed(decode_chunk(chunk({"content": "x"}))) + t.feed(decode_chunk(chunk({}, "stop")))
    events += t.feed(decode_chunk(usage_chunk(100, 1, cached=40)))
    events += t.finish()
    delta = as_dicts(events)[-2]
    assert (
        delta["usage"]["input_tokens"] == 60
        and delta["usage"]["cache_read_input_tokens"] == 40
        and delta["usage"]["output_tokens"] == 1
    )


def test_interleaved_tool_calls_stream_the_live_call_as_its_fragments_arrive() -> None:
    t = translator()
    t.start()

    def feed(body: dict[str, Any]) -> list[tuple]:
        return block_events(t.feed(decode_chunk(body)))

    assert feed(calls(tc(0, "call_a", "f", ""), tc(1, "call_b", "g", ""))) == [("start", 0, "call_a", "f")]
    assert feed(calls(tc(1, arguments='{"b": '))) == []  # call_b waits behind call_a
    assert feed(calls(tc(0, arguments='{"a": '))) == [("json", 0, '{"a": ')]
    assert feed(calls(tc(0, arguments="1}"))) == [
        ("json", 0, "1}"),
        ("stop", 0),
        ("start", 1, "call_b", "g"),
        ("json", 1, '{"b": '),
    ]
    assert feed(calls(tc(1, arguments="2}"))) == [("json", 1, "2}")]
    assert block_events(t.finish()) == [("stop", 1)]


def test_text_after_interleaved_calls_follows_them_all() -> None:
    """Text closes the live call and brings out the one waiting behind it first. (No
    non-streaming completion says this order: its text comes before its calls.)"""
    chunks = [
        calls(tc(0, "call_a", "list_files", ""), tc(1, "call_b", "get_time", "")),
        calls(tc(1, arguments='{"tz": "CET"}')),
        chunk({"content": "Checking."}),
        chunk({}, "tool_calls"),
    ]
    events = run(chunks)
    check_grammar(events)
    assert block_events(events) == [
        ("start", 0, "call_a", "list_files"), ("stop", 0),
        ("start", 1, "call_b", "get_time"), ("json", 1, '{"tz": "CET"}'), ("stop", 1),
        ("start", 2, "text"), ("text", 2, "Checking."), ("stop", 2),
    ]  # fmt: skip
    content = [
        tool_block("call_a", "list_files", {}),
        tool_block("call_b", "get_time", {"tz": "CET"}),
        text_block("Checking."),
    ]
    assert summary(sdk_fold(events))["content"] == content
    assert summary(fold(events))["content"] == content


@pytest.mark.parametrize(
    "late",
    [
        [
            calls(tc(0, "call_a", "f", '{"a": ')),
            chunk({"content": "x"}),
            calls(tc(0, arguments="1}")),
        ],  # text closed the call
        [
            calls(tc(0, "call_a", "f", '{"a": 1}')),
            calls(tc(1, "call_b", "g", "{}")),
            calls(tc(0, arguments=', "b": 2}')),
        ],  # more after a whole call
        [
            calls(tc(0, "call_a", "f", "")),
            chunk({"content": "x"}),
            calls(tc(0, arguments=" ")),
        ],  # whitespace, but the call had no arguments
    ],
    ids=["after-text", "after-whole-arguments", "whitespace-after-empty-arguments"],
)
def test_a_fragment_for_a_call_already_closed_is_an_error_not_a_corrupt_block(late: list) -> None:
    t = translator()
    t.start()
    for body in late[:-1]:
        t.feed(decode_chunk(body))
    with pytest.raises(UpstreamError, match="tool call 0 after the call had ended"):
        t.feed(decode_chunk(late[-1]))


@pytest.mark.parametrize(
    ("chunks", "content"),
    [
        # servers that omit `index` but give each call its own id
        (
            [
                calls(tc(id="call_a", name="f", arguments='{"a": 1}'), tc(id="call_b", name="g", arguments='{"b": 2}')),
                chunk({}, "tool_calls"),
            ],
            [tool_block("call_a", "f", {"a": 1}), tool_block("call_b", "g", {"b": 2})],
        ),
        # older Ollama: every whole call in a chunk has index 0, with distinct ids
        (
            [calls(tc(0, "call_a", "f", '{"a": 1}'), tc(0, "call_b", "g", '{"b": 2}')), chunk({}, "tool_calls")],
            [tool_block("call_a", "f", {"a": 1}), tool_block("call_b", "g", {"b": 2})],
        ),
        # no indices, and the first call without an id: the next one comes with an id and a name
        (
            [
                calls(tc(name="f", arguments='{"x": 1}')),
                calls(tc(id="call_b", name="g", arguments='{"y": 2}')),
                chunk({}, "tool_calls"),
            ],
            [tool_block("toolu_test1", "f", {"x": 1}), tool_block("call_b", "g", {"y": 2})],
        ),
        # no indices, the id on every fragment, the fragments interleaved
        (
            [
                calls(tc(id="call_a", name="f", arguments='{"a": '), tc(id="call_b", name="g", arguments='{"b": ')),
                calls(tc(id="call_b", arguments="2}")),
                calls(tc(id="call_a", arguments="1}")),
                chunk({}, "tool_calls"),
            ],  # fmt: skip
            [tool_block("call_a", "f", {"a": 1}), tool_block("call_b", "g", {"b": 2})],
        ),
        # older Ollama's index 0 for every call, the id on every fragment, interleaved
        (
            [
                calls(tc(0, "call_a", "f", '{"a": ')),
                calls(tc(0, "call_b", "g", '{"b": ')),
                calls(tc(0, "call_a", arguments="1}")),
                calls(tc(0, "call_b", arguments="2}")),
                chunk({}, "tool_calls"),
            ],  # fmt: skip
            [tool_block("call_a", "f", {"a": 1}), tool_block("call_b", "g", {"b": 2})],
        ),
    ],
    ids=[
        "no-index",
        "same-index-new-id",
        "no-index-first-without-id",
        "no-index-interleaved",
        "same-index-interleaved",
    ],
)
def test_tool_calls_told_apart_by_id(chunks: list, content: list) -> None:
    events = run(chunks)
    check_grammar(events)
    assert summary(sdk_fold(events))["content"] == content
    assert summary(fold(events))["content"] == content


def test_one_tool_call_asked_from_a_server_without_indices_keeps_the_first_whole() -> None:
    chunks = [
        calls(tc(id="call_a", name="f", arguments='{"a": ')), calls(tc(arguments="1}")),
        calls(tc(id="call_b", name="g", arguments='{"b": ')), calls(tc(arguments="2}")),
        chunk({}, "tool_calls"),
    ]  # fmt: skip
    events = run(chunks, single_tool_call=True)
    check_grammar(events)
    assert summary(sdk_fold(events))["content"] == [tool_block("call_a", "f", {"a": 1})]


def test_one_tool_call_asked_from_a_server_reusing_index_0_keeps_the_first_whole() -> None:
    chunks = [
        calls(tc(0, "call_a", "f", '{"x": ')), calls(tc(0, arguments="1}")),
        calls(tc(0, "call_b", "g", '{"y": ')), calls(tc(0, arguments="2}")),
        chunk({}, "tool_calls"),
    ]  # fmt: skip
    events = run(chunks, single_tool_call=True)
    check_grammar(events)
    assert summary(sdk_fold(events))["content"] == [tool_block("call_a", "f", {"x": 1})]


def test_fold_leaves_the_events_untouched() -> None:
    events = run([chunk({"content": "Hello"}), chunk({}, "stop")])
    before = as_dicts(events)
    fold(events)
    assert as_dicts(events) == before


def _final_usage(stopping: StreamTranslator) -> tuple[int, int]:
    from dragoman.protocol import anthropic

    delta = next(e for e in stopping.finish() if isinstance(e, anthropic.MessageDelta))
    return delta.usage.input_tokens or 0, delta.usage.output_tokens


def test_a_reply_cut_by_a_stop_sequence_before_the_usage_gets_a_counted_usage() -> None:
    """The gateway closes the upstream at a stop it matched, so no usage chunk comes:
    the backend supplies the prompt's count, and each chunk of output is a token."""
    from dragoman.protocol import openai

    stopping = translator(stop_sequences=["STOP"])
    stopping.start()
    for text in ("", "one ", "two ", "three STOP four"):
        stopping.feed(openai.ChatChunk(choices=[openai.ChunkChoice(delta=openai.ResponseMessage(content=text))]))
    assert stopping.done and stopping.needs_usage
    stopping.assume_usage(17)
    assert _final_usage(stopping) == (17, 3)
    assert not stopping.needs_usage


def test_a_usage_that_came_is_never_replaced() -> None:
    from dragoman.protocol import openai

    stopping = translator(stop_sequences=["STOP"])
    stopping.start()
    usage = openai.Usage(prompt_tokens=5, completion_tokens=9)
    stopping.feed(
        openai.ChatChunk(choices=[openai.ChunkChoice(delta=openai.ResponseMessage(content="a STOP"))], usage=usage)
    )
    assert stopping.done and not stopping.needs_usage
    stopping.assume_usage(100)
    assert _final_usage(stopping) == (5, 9)


def test_reasoning_tokens_the_server_counted_reach_output_tokens_details_streamed_folded_and_not() -> None:
    reported = {**usage(30, 50), "completion_tokens_details": {"reasoning_tokens": 42}}
    chunks = [
        chunk({"reasoning": "Let me see."}),
        chunk({"content": "4"}),
        chunk({}, "stop"),
        {**usage_chunk(30, 50), "usage": reported},
    ]
    events = run(chunks, surface_thinking=True)
    delta = next(event for event in events if isinstance(event, a.MessageDelta))
    assert delta.usage.output_tokens_details == {"thinking_tokens": 42}
    assert fold(copy.deepcopy(events)).usage.output_tokens_details == {"thinking_tokens": 42}
    assert sdk_fold(events)["usage"]["output_tokens_details"] == {"thinking_tokens": 42}
    message = to_message(
        decode_completion(merge_chunks(chunks)),
        model="m",
        message_id="msg",
        new_tool_id=tool_ids(),
        surface_thinking=True,
    )
    assert message.usage.output_tokens_details == {"thinking_tokens": 42}


def test_without_reasoning_tokens_message_delta_leaves_output_tokens_details_out() -> None:
    from dragoman.protocol.sse import encode

    events = run([chunk({"content": "4"}), chunk({}, "stop"), usage_chunk(3, 1)])
    delta = next(event for event in events if isinstance(event, a.MessageDelta))
    assert b"output_tokens_details" not in encode(delta)


@pytest.mark.parametrize("cut", ['{"ci', '{"city"', '{"city": tr', '{"city": -', '{"city": "Pa\\u00'])
def test_a_tool_call_cut_by_max_tokens_anywhere_ends_as_a_json_object(cut: str) -> None:
    """The SDKs parse the arguments once the block ends: a cut in a key, a literal, a number
    or an escape is closed into an object, never into text that is not JSON."""
    events = run([calls(tc(0, "call_a", "get_weather", cut)), chunk({}, "length")])
    check_grammar(events)
    message = sdk_fold(events)
    assert message["stop_reason"] == "max_tokens" and isinstance(message["content"][0]["input"], dict)


def test_a_cut_that_appending_cannot_close_is_left_as_the_model_wrote_it() -> None:
    events = run([calls(tc(0, "call_a", "get_weather", '{"city": Paris}')), chunk({}, "tool_calls")])
    written = "".join(
        e.delta.partial_json
        for e in events
        if isinstance(e, a.ContentBlockDelta) and isinstance(e.delta, a.InputJSONDelta)
    )
    assert written == '{"city": Paris}'  # no suffix that would still not make it JSON

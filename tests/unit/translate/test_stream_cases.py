"""OpenAI chunk streams -> Anthropic stream events: text, thinking, stops, usage and
single tool calls. Every case is checked against the same invariants
(tests/support/stream_cases.py::check_case):
- the event grammar the SDKs rely on holds (tests/support/helpers.py::check_grammar);
- our fold, the official SDK's accumulator (fed the real SSE bytes) and `to_message`
  of the equivalent non-streaming completion all describe the same message;
- that message is the one the case expects.
Parallel and interleaved tool calls: test_stream_cases_parallel.py.
"""

from __future__ import annotations

import base64

import pytest

from tests.support.helpers import chunk, usage, usage_chunk
from tests.support.stream_cases import Case, calls, check_case, tc, text_block, thinking_block, tokens, tool_block

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
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_stream_invariants(case: Case) -> None:
    check_case(case)

"""OpenAI chunk streams -> Anthropic stream events: parallel tool calls whose fragments
interleave, and the cases after them, checked against the same invariants as
test_stream_cases.py (tests/support/stream_cases.py::check_case)."""

from __future__ import annotations

import pytest

from tests.support.helpers import chunk, usage_chunk
from tests.support.stream_cases import Case, calls, check_blocks, check_case, tc, text_block, tokens, tool_block

CASES = [
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
    check_case(case)


BLOCK_CASES = [c for c in CASES if c.blocks is not None]


@pytest.mark.parametrize("case", BLOCK_CASES, ids=[c.id for c in BLOCK_CASES])
def test_block_events(case: Case) -> None:
    check_blocks(case)

"""OpenAI ChatCompletion -> Anthropic Message (non-streaming)."""

from __future__ import annotations

from typing import Any

import pytest

from dragoman.core.errors import UpstreamError
from dragoman.translate.response import to_message
from tests.support.helpers import completion, decode_completion, summary, tool_ids, usage


def translate(reply: Any, **kwargs: Any) -> dict[str, Any]:
    message = to_message(reply, model="claude-test", message_id="msg_test", new_tool_id=tool_ids(), **kwargs)
    return summary(message)


def call(name: str = "get_weather", arguments: Any = '{"city": "Paris"}', id: str | None = "call_1") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if id is not None:
        out["id"] = id
    return out


def test_message_envelope() -> None:
    message = to_message(completion("Hi"), model="claude-test", message_id="msg_test", new_tool_id=tool_ids())
    assert (message.id, message.model, message.role) == ("msg_test", "claude-test", "assistant")


@pytest.mark.parametrize(
    ("reply", "expected_content", "stop_reason"),
    [
        (completion("Hello there."), [{"type": "text", "text": "Hello there."}], "end_turn"),
        (completion("Partial answ", finish="length"), [{"type": "text", "text": "Partial answ"}], "max_tokens"),
        (completion("", finish="content_filter"), [{"type": "text", "text": ""}], "refusal"),
        (completion("Hi", finish=None), [{"type": "text", "text": "Hi"}], "end_turn"),
        # tool calls decide the stop reason, whatever finish_reason says (named tool_choice gives "stop")
        (
            completion(None, finish="stop", tool_calls=[call()]),
            [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}],
            "tool_use",
        ),
        (
            completion("Let me check.", finish="tool_calls", tool_calls=[call()]),
            [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
            "tool_use",
        ),
        (
            completion(None, finish="length", tool_calls=[call(arguments='{"city": "Par')]),
            [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Par"}}],
            "max_tokens",
        ),
    ],
    ids=["text", "length", "content-filter", "no-finish", "tool-stop", "text-and-tool", "truncated-tool"],
)
def test_content_and_stop_reason(reply: Any, expected_content: list, stop_reason: str) -> None:
    result = translate(reply)
    assert result["content"] == expected_content
    assert result["stop_reason"] == stop_reason
    assert result["stop_sequence"] is None


@pytest.mark.parametrize(
    ("reply", "stop_reason"),
    [
        (completion("Partial answ", finish="length"), "model_context_window_exceeded"),
        (
            completion(None, finish="length", tool_calls=[call(arguments='{"city": "Par')]),
            "model_context_window_exceeded",
        ),
        (completion("Hello there."), "end_turn"),
        (completion(None, finish="tool_calls", tool_calls=[call()]), "tool_use"),
        (completion("", finish="content_filter"), "refusal"),
    ],
    ids=["length", "truncated-tool", "stop", "tool-calls", "content-filter"],
)
def test_a_window_bound_limit_changes_only_a_cut_reply(reply: Any, stop_reason: str) -> None:
    """max_tokens lowered to fit the context window: a reply cut at it was stopped by the window."""
    assert translate(reply, window_bound=True)["stop_reason"] == stop_reason


def test_missing_tool_ids_get_toolu_ids_from_the_factory() -> None:
    reply = completion(
        None, tool_calls=[call(id=None), call("get_time", "{}", id="call_x"), call("get_date", "{}", id=None)]
    )
    ids = [block["id"] for block in translate(reply)["content"]]
    assert ids == ["toolu_test1", "call_x", "toolu_test2"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("", {}),
        ("   ", {}),
        (None, {}),
        ({"city": "Oslo", "days": 3}, {"city": "Oslo", "days": 3}),  # Ollama's native shape: an object
        ('{"city": "Oslo"}', {"city": "Oslo"}),
        ('{"q": "a \\"quoted\\" word", "n": [1, 2', {"q": 'a "quoted" word', "n": [1, 2]}),
        ('{"nested": {"deep": [{"x": "y', {"nested": {"deep": [{"x": "y"}]}}),
        ('{"key":', {"key": None}),
    ],
    ids=["empty", "blank", "null", "dict", "json", "truncated-array", "truncated-nested", "truncated-after-colon"],
)
def test_tool_arguments(arguments: Any, expected: dict) -> None:
    result = translate(completion(None, tool_calls=[call(arguments=arguments)]))
    assert result["content"][0]["input"] == expected


@pytest.mark.parametrize("arguments", ["{not json", '{"a": 1}}', "[1, 2]", '"just a string"', "42", '{"a": 1,'])
def test_invalid_tool_arguments_are_an_upstream_error(arguments: str) -> None:
    with pytest.raises(UpstreamError) as caught:
        translate(completion(None, tool_calls=[call(arguments=arguments)]))
    assert caught.value.status == 502
    assert "get_weather" in caught.value.message


def test_shortened_tool_names_are_mapped_back() -> None:
    long_name = "mcp__server__" + "x" * 70
    reply = completion(None, tool_calls=[call("mcp__short_1234"), call("plain", "{}", id="call_2")])
    content = translate(reply, tool_names={"mcp__short_1234": long_name})["content"]
    assert [block["name"] for block in content] == [long_name, "plain"]


@pytest.mark.parametrize(
    ("reply_usage", "expected"),
    [
        (
            usage(120, 30),
            {"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        ),
        (
            usage(120, 30, cached=100),
            {"input_tokens": 20, "output_tokens": 30, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 0},
        ),
        (
            usage(120, 30, cached=0),
            {"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        ),
        (
            {"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": None}},
            {"input_tokens": 50, "output_tokens": 7, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        ),
        (None, {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}),
    ],
    ids=["plain", "cached", "cached-zero", "cached-null", "no-usage"],
)
def test_usage(reply_usage: dict | None, expected: dict) -> None:
    assert translate(completion("ok", usage=reply_usage))["usage"] == expected


@pytest.mark.parametrize(
    ("content", "stops", "text", "matched"),
    [
        ("The answer is 42.\nUser: next", ["\nUser:"], "The answer is 42.", "\nUser:"),
        ("a STOP b END c", ["END", "STOP"], "a ", "STOP"),
        ("nothing to see", ["END"], "nothing to see", None),
        ("ends with EN", ["END"], "ends with EN", None),
        ("END at once", ["END"], "", "END"),
    ],
    ids=["match", "earliest-of-two", "none", "prefix-only", "at-start"],
)
def test_stop_sequences(content: str, stops: list[str], text: str, matched: str | None) -> None:
    result = translate(completion(content, finish="stop"), stop_sequences=stops)
    assert result["content"] == [{"type": "text", "text": text}]
    assert result["stop_sequence"] == matched
    assert result["stop_reason"] == ("stop_sequence" if matched else "end_turn")


def test_stop_sequence_wins_over_length_and_drops_later_tool_calls() -> None:
    reply = completion("Sure. DONE and then", finish="length", tool_calls=[call()])
    result = translate(reply, stop_sequences=["DONE"])
    assert result["content"] == [{"type": "text", "text": "Sure. "}]
    assert (result["stop_reason"], result["stop_sequence"]) == ("stop_sequence", "DONE")


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_only_answer_becomes_text(field: str) -> None:
    result = translate(completion(None, **{field: "The answer is 4."}))
    assert result["content"] == [{"type": "text", "text": "The answer is 4."}]


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_is_hidden_unless_surfaced(field: str) -> None:
    result = translate(completion("4", **{field: "2+2=4"}))
    assert result["content"] == [{"type": "text", "text": "4"}]


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_surfaces_as_a_signed_thinking_block_first(field: str) -> None:
    reply = completion("4", tool_calls=[call()], **{field: "2+2=4"})
    content = translate(reply, surface_thinking=True)["content"]
    assert [block["type"] for block in content] == ["thinking", "text", "tool_use"]
    assert content[0]["thinking"] == "2+2=4"
    assert isinstance(content[0]["signature"], str) and content[0]["signature"]


def test_completion_without_choices_is_an_upstream_error() -> None:
    with pytest.raises(UpstreamError):
        translate(decode_completion({"id": "x", "choices": [], "usage": usage()}))


def test_refusal_text_reaches_the_client() -> None:
    result = translate(completion(None, refusal="I can't help with that."))
    assert result["content"] == [{"type": "text", "text": "I can't help with that."}]

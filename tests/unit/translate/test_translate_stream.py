"""OpenAI chunk streams -> Anthropic stream events, one behaviour at a time: exact event
sequences, when blocks go out, stop sequences, usage, and tool calls told apart. The table of
cases checked against shared invariants: test_stream_cases*.py."""

from __future__ import annotations

import copy
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
from tests.support.stream_cases import block_events, calls, run, tc, text_block, tool_block, translator


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

"""Cases of OpenAI chunk streams translated to Anthropic events (tests/unit/translate/test_stream_cases*.py):
the `Case` record, builders of chunks and expected blocks, and the invariants every case is checked
against (`check_case`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from dragoman.protocol import anthropic as a
from dragoman.translate.fold import fold
from dragoman.translate.response import to_message
from dragoman.translate.stream import StreamTranslator
from tests.support.helpers import (
    check_grammar,
    chunk,
    decode_chunk,
    decode_completion,
    merge_chunks,
    sdk_fold,
    summary,
    tool_ids,
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


def check_case(case: Case) -> None:
    """The case's events keep the grammar, and our fold, the SDK's accumulator and the
    non-streaming translation of the same completion all give the message it expects."""
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


def check_blocks(case: Case) -> None:
    """One start and one stop per call, each call's deltas between them, calls in the order begun."""
    assert block_events(run(case.chunks, **case.options)) == case.blocks

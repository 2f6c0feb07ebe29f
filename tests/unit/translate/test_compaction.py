"""translate.compaction: the summarizing request (checked as sent, as any request is), and
compaction blocks sent back."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic
from dragoman.translate.checks import check_request
from dragoman.translate.compaction import (
    INSTRUCTIONS,
    SUMMARY_INTRO,
    summarizing,
    summary_of,
    with_summaries,
)


def _request(messages: list[dict[str, Any]], **fields: Any) -> anthropic.MessagesRequest:
    body = {"model": "m", "max_tokens": 100, "messages": messages, **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=anthropic.MessagesRequest)


def test_the_summarizing_request_asks_last_with_no_tools_and_its_own_or_the_given_instructions() -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    request = _request([{"role": "user", "content": "hi"}], tools=tools, tool_choice={"type": "any"}, stream=True,
                       stop_sequences=["x"], compaction={"type": "summarize"})  # fmt: skip
    asked = summarizing(request)
    assert asked.tools is None and asked.tool_choice is None and asked.stop_sequences is None and not asked.stream
    assert asked.compaction is None and asked.messages[-1].content == INSTRUCTIONS
    mine = summarizing(
        _request([{"role": "user", "content": "hi"}], compaction={"type": "summarize", "instructions": " Be terse. "})
    )
    assert mine.messages[-1].content == "Be terse."
    blank = summarizing(
        _request([{"role": "user", "content": "hi"}], compaction={"type": "summarize", "instructions": "  "})
    )
    assert blank.messages[-1].content == INSTRUCTIONS  # empty or blank counts as absent


def test_compaction_blocks_become_user_turns_of_their_summary_and_empty_ones_vanish() -> None:
    request = _request([
        {"role": "assistant", "content": [{"type": "compaction", "content": "They met."}, {"type": "text", "text": "Next?"}]},
        {"role": "assistant", "content": [{"type": "compaction", "content": None}]},
        {"role": "user", "content": "Go on."},
    ])  # fmt: skip
    turns = [(index, m.role, m.content if isinstance(m.content, str) else [type(b).__name__ for b in m.content])
             for index, m in with_summaries(request.messages)]  # fmt: skip
    assert turns == [(0, "user", SUMMARY_INTRO + "They met."), (0, "assistant", ["TextBlock"]), (2, "user", "Go on.")]


def test_the_reply_is_one_compaction_block() -> None:
    message = anthropic.Message(id="msg_1", model="m", content=[anthropic.OutTextBlock(text=" Summary. ")], stop_reason="end_turn",
                                stop_sequence=None, usage=anthropic.Usage(input_tokens=1, output_tokens=2))  # fmt: skip
    compacted = summary_of(message)
    assert compacted.stop_reason == "compaction" and compacted.content == [
        anthropic.OutCompactionBlock(content="Summary.")
    ]
    empty = summary_of(msgspec.structs.replace(message, content=[]))
    assert empty.content == [anthropic.OutCompactionBlock(content=None)]  # a failed compaction, as the API marks it


TOOL = {"name": "f", "input_schema": {"type": "object"}}
INTERLEAVED = frozenset({"interleaved-thinking-2025-05-14"})


@pytest.mark.parametrize(
    ("fields", "betas", "message"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 100}, "max_tokens": 4000}, frozenset(),
         "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4000}, "max_tokens": 4000}, frozenset(),
         "`max_tokens` must be greater than `thinking.budget_tokens`."),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 4000, "tools": [TOOL], "tool_choice": {"type": "any"}},
         frozenset(), "Thinking may not be enabled when tool_choice forces tool use."),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 4000, "tools": [TOOL],
          "tool_choice": {"type": "tool", "name": "f"}}, INTERLEAVED, "Thinking may not be enabled when tool_choice forces tool use."),
        ({"tools": [TOOL, TOOL]}, frozenset(), "tools.1.name: 'f' is the name of an earlier tool"),
        ({"tool_choice": {"type": "any"}}, frozenset(), "tool_choice: type 'any' needs tools"),
    ],
    ids=["below-1024", "not-below-max-tokens", "forced-any", "forced-tool-interleaved", "duplicate-tool", "any-without-tools"],
)  # fmt: skip
def test_a_compaction_request_is_refused_as_the_same_request_without_compaction_is(
    fields: dict[str, Any], betas: frozenset[str], message: str
) -> None:
    """The summary's request drops thinking and tools: the request as sent is checked first,
    with the very message an ordinary request gets."""
    ordinary = _request([{"role": "user", "content": "hi"}], **fields)
    with pytest.raises(InvalidRequest) as plain:
        check_request(ordinary, betas)
    with pytest.raises(InvalidRequest) as compacting:
        summarizing(msgspec.structs.replace(ordinary, compaction=anthropic.CompactionConfig(type="summarize")), betas)
    assert compacting.value.message == plain.value.message and compacting.value.message.startswith(message)


@pytest.mark.parametrize(
    ("fields", "betas"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 16000}, "max_tokens": 2000}, INTERLEAVED),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2000, "tools": [TOOL], "tool_choice": {"type": "auto"}},
         frozenset()),
        ({"thinking": {"type": "adaptive"}, "max_tokens": 2000, "tools": [TOOL], "tool_choice": {"type": "any"}}, frozenset()),
    ],
    ids=["interleaved-past-max-tokens", "auto-tool-choice", "adaptive-forced"],
)  # fmt: skip
def test_a_compaction_request_anthropic_takes_is_summarized(fields: dict[str, Any], betas: frozenset[str]) -> None:
    request = _request([{"role": "user", "content": "hi"}], compaction={"type": "summarize"}, **fields)
    asked = summarizing(request, betas)
    assert asked.thinking is None and asked.tools is None and asked.messages[-1].content == INSTRUCTIONS

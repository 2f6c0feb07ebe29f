"""translate.compaction: the summarizing request, and compaction blocks sent back."""

from __future__ import annotations

from typing import Any

import msgspec

from dragoman.protocol import anthropic
from dragoman.translate.compaction import INSTRUCTIONS, SUMMARY_INTRO, summarizing, summary_of, with_summaries


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
    mine = summarizing(_request([{"role": "user", "content": "hi"}], compaction={"type": "summarize", "instructions": " Be terse. "}))
    assert mine.messages[-1].content == "Be terse."
    blank = summarizing(_request([{"role": "user", "content": "hi"}], compaction={"type": "summarize", "instructions": "  "}))
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
    assert compacted.stop_reason == "compaction" and compacted.content == [anthropic.OutCompactionBlock(content="Summary.")]
    empty = summary_of(msgspec.structs.replace(message, content=[]))
    assert empty.content == [anthropic.OutCompactionBlock(content=None)]  # a failed compaction, as the API marks it

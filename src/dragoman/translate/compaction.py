"""Compaction (`compaction: {"type": "summarize"}`): the conversation summarized by the
model itself, returned as a `compaction` block that later requests send back first, in
place of the messages it stands for. The SDKs' tool runners ask for it
(`compact_before_next_turn()`) when a conversation grows long.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from dragoman.protocol import anthropic
from dragoman.translate.checks import check_request

INSTRUCTIONS = (
    "Write a summary of the conversation so far that lets it go on from the summary alone, without the messages "
    "it replaces: the task and its goal, what was decided and why, the facts and results found (names, paths, "
    "commands, values, errors), what is done and what remains to do. Answer with the summary only."
)
SUMMARY_INTRO = "A summary of the earlier conversation, which it replaces:\n\n"


def summarizing(request: anthropic.MessagesRequest, betas: frozenset[str] = frozenset()) -> anthropic.MessagesRequest:
    """The request that asks the model for the summary: the conversation, then the
    instructions, with no tools to call and nothing to stop early. The request as sent is
    checked first, as any other is (Anthropic refuses a bad thinking budget or tool list on a
    compaction request too): the summary's request no longer has the fields those checks see.
    `betas`: the request's `anthropic-beta` names."""
    check_request(request, betas)
    instructions = (request.compaction.instructions or "").strip() if request.compaction else ""
    ask = anthropic.MessageParam(role="user", content=instructions or INSTRUCTIONS)
    return msgspec.structs.replace(
        request, messages=[*request.messages, ask], tools=None, tool_choice=None, thinking=None, stop_sequences=None,
        stream=False, compaction=None, output_config=None, output_format=None,
    )  # fmt: skip


def with_summaries(messages: list[anthropic.MessageParam]) -> Iterator[tuple[int, anthropic.MessageParam]]:
    """The messages with each `compaction` block made a user turn of its summary's text
    (a failed compaction, without content, is dropped): (index in the request, message)."""
    for index, message in enumerate(messages):
        if isinstance(message.content, str) or not any(
            isinstance(b, anthropic.CompactionBlock) for b in message.content
        ):
            yield index, message
            continue
        rest: list[anthropic.ContentBlockParam] = []
        for block in message.content:
            if isinstance(block, anthropic.CompactionBlock):
                if block.content:
                    yield index, anthropic.MessageParam(role="user", content=SUMMARY_INTRO + block.content)
            else:
                rest.append(block)
        if rest:
            yield index, anthropic.MessageParam(role=message.role, content=rest)


def summary_of(message: anthropic.Message) -> anthropic.Message:
    """The model's answer to `summarizing` as the compaction reply."""
    text = "".join(b.text for b in message.content if isinstance(b, anthropic.OutTextBlock)).strip()
    return msgspec.structs.replace(
        message,
        content=[anthropic.OutCompactionBlock(content=text or None)],
        stop_reason="compaction",
        stop_sequence=None,
    )

"""Fold a stream of Anthropic events into the Message it describes.

The SDKs' accumulators do the same; the gateway uses it to answer a non-streaming
request from an upstream stream (when it must watch the text for stop sequences).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from dragoman.protocol import anthropic as a
from dragoman.translate.tool_args import parse_arguments


def fold(events: Iterable[a.StreamEvent]) -> a.Message:
    message: a.Message | None = None
    blocks: list[a.ContentBlock] = []
    tool_json: dict[int, str] = {}
    for event in events:
        if isinstance(event, a.MessageStart):
            message = msgspec.structs.replace(event.message)  # copies: the events stay untouched
        elif message is None:
            raise ValueError(f"{type(event).__name__} before message_start")
        elif isinstance(event, a.ContentBlockStart):
            blocks.append(msgspec.structs.replace(event.content_block))
        elif isinstance(event, a.ContentBlockDelta):
            block, delta = blocks[event.index], event.delta
            if isinstance(delta, a.TextDelta) and isinstance(block, a.OutTextBlock):
                block.text += delta.text
            elif isinstance(delta, a.ThinkingDelta) and isinstance(block, a.OutThinkingBlock):
                block.thinking += delta.thinking
            elif isinstance(delta, a.SignatureDelta) and isinstance(block, a.OutThinkingBlock):
                block.signature = delta.signature
            elif isinstance(delta, a.InputJSONDelta) and isinstance(block, a.OutToolUseBlock):
                tool_json[event.index] = tool_json.get(event.index, "") + delta.partial_json
            elif isinstance(delta, a.CompactionDelta) and isinstance(block, a.OutCompactionBlock):
                block.content = delta.content
        elif isinstance(event, a.MessageDelta):
            message.stop_reason = event.delta.stop_reason
            message.stop_sequence = event.delta.stop_sequence
            message.usage = a.Usage(
                input_tokens=event.usage.input_tokens,
                output_tokens=event.usage.output_tokens,
                cache_creation_input_tokens=event.usage.cache_creation_input_tokens,
                cache_read_input_tokens=event.usage.cache_read_input_tokens,
                output_tokens_details=event.usage.output_tokens_details or None,
            )
    if message is None:
        raise ValueError("no message_start")
    for index, text in tool_json.items():
        block = blocks[index]
        assert isinstance(block, a.OutToolUseBlock)
        block.input = parse_arguments(
            text, tool=block.name
        )  # a whole message needs an object: else the upstream's error
    message.content = blocks
    return message


def events_of(message: a.Message) -> list[a.StreamEvent]:
    """The stream that folds back into `message` (for an upstream that answered a
    stream request with a whole completion)."""
    start = msgspec.structs.replace(message, content=[], stop_reason=None, stop_sequence=None)
    events: list[a.StreamEvent] = [a.MessageStart(message=start)]
    for index, block in enumerate(message.content):
        if isinstance(block, a.OutTextBlock):
            events.append(a.ContentBlockStart(index=index, content_block=a.OutTextBlock(text="")))
            if block.text:
                events.append(a.ContentBlockDelta(index=index, delta=a.TextDelta(text=block.text)))
        elif isinstance(block, a.OutThinkingBlock):
            events.append(a.ContentBlockStart(index=index, content_block=a.OutThinkingBlock(thinking="", signature="")))
            events.append(a.ContentBlockDelta(index=index, delta=a.ThinkingDelta(thinking=block.thinking)))
            events.append(a.ContentBlockDelta(index=index, delta=a.SignatureDelta(signature=block.signature)))
        elif isinstance(block, a.OutCompactionBlock):
            events.append(a.ContentBlockStart(index=index, content_block=a.OutCompactionBlock(content=None)))
            events.append(a.ContentBlockDelta(index=index, delta=a.CompactionDelta(content=block.content)))
        else:
            events.append(a.ContentBlockStart(index=index, content_block=msgspec.structs.replace(block, input={})))
            events.append(
                a.ContentBlockDelta(
                    index=index, delta=a.InputJSONDelta(partial_json=msgspec.json.encode(block.input).decode())
                )
            )
        events.append(a.ContentBlockStop(index=index))
    usage = message.usage
    events.append(
        a.MessageDelta(
            delta=a.MessageDeltaBody(stop_reason=message.stop_reason, stop_sequence=message.stop_sequence),
            usage=a.MessageDeltaUsage(
                input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                cache_read_input_tokens=usage.cache_read_input_tokens,
                output_tokens_details=usage.output_tokens_details if usage.output_tokens_details is not None else msgspec.UNSET,
            ),
        )
    )  # fmt: skip
    events.append(a.MessageStop())
    return events

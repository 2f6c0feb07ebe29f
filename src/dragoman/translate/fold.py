"""Fold a stream of Anthropic events into the Message it describes.

The SDKs' accumulators do the same; the gateway uses it to answer a non-streaming
request from an upstream stream (when it must watch the text for stop sequences).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from dragoman.core.errors import UpstreamError
from dragoman.protocol import anthropic as a
from dragoman.translate.tool_args import parse_arguments

MAX_FOLDED = 64 * 1024 * 1024  # characters of text, thinking and tool arguments in one folded reply


class Folder:
    """Builds the Message a stream of events describes, as the events come: the stream is
    never held. Text and arguments are kept as pieces and joined once at the end (a string
    grown by `+=` is copied whole each time: a reply of 128k tokens took seconds, 4 MB
    sixteen), and a reply past `limit` characters is refused with an UpstreamError."""

    __slots__ = ("_limit", "_size", "_upstream", "_message", "_blocks", "_pieces")

    def __init__(self, *, limit: int | None = None, upstream: str = "") -> None:
        self._limit = MAX_FOLDED if limit is None else limit
        self._size = 0
        self._upstream = upstream
        self._message: a.Message | None = None
        self._blocks: list[a.ContentBlock] = []
        self._pieces: dict[int, list[str]] = {}  # a block's text, thinking or tool arguments so far

    def feed(self, events: Iterable[a.StreamEvent]) -> None:
        for event in events:
            if isinstance(event, a.MessageStart):
                self._message = msgspec.structs.replace(event.message)  # copies: the events stay untouched
            elif self._message is None:
                raise ValueError(f"{type(event).__name__} before message_start")
            elif isinstance(event, a.ContentBlockStart):
                self._blocks.append(msgspec.structs.replace(event.content_block))
            elif isinstance(event, a.ContentBlockDelta):
                self._delta(event.index, event.delta)
            elif isinstance(event, a.MessageDelta):
                self._end(self._message, event)

    def _delta(self, index: int, delta: a.Delta) -> None:
        block = self._blocks[index]
        if isinstance(delta, a.SignatureDelta) and isinstance(block, a.OutThinkingBlock):
            block.signature = delta.signature
        elif isinstance(delta, a.CompactionDelta) and isinstance(block, a.OutCompactionBlock):
            block.content = delta.content
        elif (
            (isinstance(delta, a.TextDelta) and isinstance(block, a.OutTextBlock))
            or (isinstance(delta, a.ThinkingDelta) and isinstance(block, a.OutThinkingBlock))
            or (isinstance(delta, a.InputJSONDelta) and isinstance(block, a.CALL_BLOCKS))
        ):
            piece = delta.text if isinstance(delta, a.TextDelta) else (
                delta.thinking if isinstance(delta, a.ThinkingDelta) else delta.partial_json
            )  # fmt: skip
            self._size += len(piece)
            if self._size > self._limit:
                name = f"upstream {self._upstream}" if self._upstream else "the upstream"
                raise UpstreamError(
                    f"{name} sent a reply longer than {self._limit // (1024 * 1024)} MiB of text; "
                    "ask for fewer tokens (max_tokens), or stream the reply"
                )
            self._pieces.setdefault(index, []).append(piece)

    @staticmethod
    def _end(message: a.Message, event: a.MessageDelta) -> None:
        message.stop_reason = event.delta.stop_reason
        message.stop_sequence = event.delta.stop_sequence
        message.usage = a.Usage(
            input_tokens=event.usage.input_tokens,
            output_tokens=event.usage.output_tokens,
            cache_creation_input_tokens=event.usage.cache_creation_input_tokens,
            cache_read_input_tokens=event.usage.cache_read_input_tokens,
            output_tokens_details=event.usage.output_tokens_details or None,
            server_tool_use=event.usage.server_tool_use or None,
        )

    def message(self) -> a.Message:
        message = self._message
        if message is None:
            raise ValueError("no message_start")
        for index, pieces in self._pieces.items():
            block, joined = self._blocks[index], "".join(pieces)
            if isinstance(block, a.OutTextBlock):
                block.text += joined
            elif isinstance(block, a.OutThinkingBlock):
                block.thinking += joined
            elif isinstance(block, a.CALL_BLOCKS):  # a whole message needs an object: else the upstream's error
                block.input = parse_arguments(joined, tool=block.name)
        message.content = self._blocks
        return message


def fold(events: Iterable[a.StreamEvent]) -> a.Message:
    folder = Folder()
    folder.feed(events)
    return folder.message()


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
        elif not isinstance(block, a.CALL_BLOCKS):  # a server tool's result: whole, in its start
            events.append(a.ContentBlockStart(index=index, content_block=block))
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
                server_tool_use=usage.server_tool_use if usage.server_tool_use is not None else msgspec.UNSET,
            ),
        )
    )  # fmt: skip
    events.append(a.MessageStop())
    return events

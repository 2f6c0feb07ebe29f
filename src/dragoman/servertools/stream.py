"""The one place a server-tool loop's streams are joined: the events of each model call, and
the result blocks between them, become one client message (one `message_start`, indexes
running on, a model's call to a server tool shown as its `server_tool_use`/`mcp_tool_use`, one
`message_delta` with the summed usage). Written to move onto the pump's transformer hooks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from dragoman.protocol import anthropic as a
from dragoman.servertools.runners import Runner
from dragoman.translate.fold import Folder

Batch = list[a.StreamEvent]


@dataclass(slots=True)
class Call:
    """A model's call to a server tool, as the client sees it."""

    runner: Runner
    id: str
    arguments: Any = None


class Interleaver:
    """Rewrites one model call's events at a time (`model`), then adds `results`, and `end`s."""

    def __init__(self, runners: dict[str, Runner]) -> None:
        self._runners = runners
        self._offset = 0  # client index of the current call's block 0
        self._started = False
        self._folder = Folder()
        self._calls: dict[int, Call] = {}  # by the model call's own index
        self.stop_reason: a.StopReason | None = None
        self.stop_sequence: str | None = None
        self.usage = a.MessageDeltaUsage(input_tokens=0, output_tokens=0)

    def model(self, batch: Batch) -> Batch:
        """One batch of a model call's events, as the client gets them."""
        self._folder.feed(batch)
        out: Batch = []
        for event in batch:
            if isinstance(event, a.MessageStart):
                if not self._started:
                    self._started = True
                    out.append(event)
            elif isinstance(event, a.ContentBlockStart):
                block = event.content_block
                runner = self._runners.get(block.name) if isinstance(block, a.OutToolUseBlock) else None
                if runner is not None:
                    call = self._calls[event.index] = Call(runner, runner.new_id())
                    block = runner.use_block(call.id, {})
                out.append(a.ContentBlockStart(index=event.index + self._offset, content_block=block))
            elif isinstance(event, a.ContentBlockDelta):
                out.append(a.ContentBlockDelta(index=event.index + self._offset, delta=event.delta))
            elif isinstance(event, a.ContentBlockStop):
                out.append(a.ContentBlockStop(index=event.index + self._offset))
            elif isinstance(event, a.MessageDelta):
                self._ended(event)
            elif isinstance(event, a.Ping):
                out.append(event)
        return out

    def _ended(self, event: a.MessageDelta) -> None:
        self.stop_reason, self.stop_sequence = event.delta.stop_reason, event.delta.stop_sequence
        usage, add = self.usage, event.usage
        usage.input_tokens += add.input_tokens
        usage.output_tokens += add.output_tokens
        usage.cache_read_input_tokens += add.cache_read_input_tokens
        usage.cache_creation_input_tokens += add.cache_creation_input_tokens

    def turn(self) -> tuple[list[Any], list[Call], bool]:
        """After a model call: its content as request blocks (a server call under its client id),
        its server calls with their arguments, and whether it also called client tools."""
        message = self._folder.message()
        blocks: list[Any] = []
        calls: list[Call] = []
        client_calls = False
        for index, block in enumerate(message.content):
            if isinstance(block, a.OutTextBlock):
                blocks.append(a.TextBlock(text=block.text))
            elif isinstance(block, a.OutThinkingBlock):
                blocks.append(a.ThinkingBlock(thinking=block.thinking, signature=block.signature))
            elif isinstance(block, a.OutToolUseBlock):
                call = self._calls.get(index)
                if call is not None:
                    call.arguments = block.input
                    calls.append(call)
                client_calls = client_calls or call is None
                blocks.append(
                    a.ToolUseBlock(id=block.id if call is None else call.id, name=block.name, input=block.input)
                )
        self._offset += len(message.content)
        self._folder, self._calls = Folder(), {}
        return blocks, calls, client_calls

    def results(self, blocks: list[a.ContentBlock]) -> Batch:
        """Result blocks, each whole in its `content_block_start`."""
        out: Batch = []
        for block in blocks:
            out += [
                a.ContentBlockStart(index=self._offset, content_block=block),
                a.ContentBlockStop(index=self._offset),
            ]
            self._offset += 1
        return out

    def end(self, stop_reason: a.StopReason | None, server_tool_use: dict[str, int]) -> Batch:
        usage = msgspec.structs.replace(self.usage, server_tool_use=server_tool_use)
        body = a.MessageDeltaBody(stop_reason=stop_reason, stop_sequence=self.stop_sequence)
        return [a.MessageDelta(delta=body, usage=usage), a.MessageStop()]

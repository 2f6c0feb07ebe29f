"""The tool calls of an OpenAI stream as the stream translator assembles them.

OpenAI-compatible servers stream a call as fragments of `tool_calls[]` that name it by
`index` (or, for servers that omit or reuse indices, by `id`). Most send one call after
another, but some introduce several calls in one chunk and then send their argument
fragments interleaved. Anthropic's stream has one open block at a time, so a call begun
while another's arguments are still incomplete waits, with its fragments, until that one
is whole (see StreamTranslator._tool_call).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec


@dataclass(slots=True)
class ToolCall:
    key: int | str  # what names the call in the stream: its index, else its id
    index: int | None  # the upstream's tool_calls[].index
    id: str | None  # the upstream's id
    name: str = ""  # the client's name for the tool
    pieces: list[str] = field(default_factory=list)  # the arguments received so far, none empty
    started: bool = False  # its content_block_start went out

    @property
    def args(self) -> str:
        """The arguments so far, joined when read: `+=` per fragment would copy them whole
        each time (the square of their length, seconds for a few MB)."""
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""


def arguments_complete(text: str) -> bool:
    """Whether `text` is a whole JSON object: nothing but whitespace can follow it. Empty
    arguments are not: servers send `""` with a call's name and its arguments after it."""
    if not text.rstrip().endswith("}"):  # cheap, and true of every JSON object
        return False
    try:
        return isinstance(msgspec.json.decode(text), dict)
    except msgspec.DecodeError:
        return False


def open_call_for(fragment_index: int | None, fragment_id: str | None, opened: list[ToolCall]) -> ToolCall:
    """The open call (the live one, then those waiting, in the order begun) that a fragment
    names: by id, else by index (the call begun last with it, for servers that reuse
    indices), else the call begun last (a server without indices continues it)."""
    if fragment_id is not None:
        for call in opened:
            if call.id == fragment_id:
                return call
    if fragment_index is not None:
        for call in reversed(opened):
            if call.index == fragment_index:
                return call
    return opened[-1]

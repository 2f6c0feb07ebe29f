"""The block types of a request's messages, decoded without their text: what the gateway asks
of a prompt without reading it whole (an image in it; an image given by URL). Decoded from the
`Envelope`'s undecoded messages at most once per request when the envelope can keep them (the
one routes read with: `routes.shape.routed_envelope`), so the `images` condition of a route and
the URL-image check of a passed-through body share one read."""

from __future__ import annotations

from typing import Any

import msgspec


class Source(msgspec.Struct):
    type: str = ""
    content: str | list[Block] | None = None  # a `content` document's blocks


class Block(msgspec.Struct):
    type: str = ""
    source: Source | None = None
    content: str | list[Block] | None = None  # a tool result's blocks


class Message(msgspec.Struct):
    content: str | list[Block] = ""


class Messages(msgspec.Struct):
    messages: list[Message] = []


MESSAGES = msgspec.json.Decoder(Messages)  # every other field is skipped, not built
MESSAGE = msgspec.json.Decoder(Message)


def read(envelope: Any) -> list[Message]:
    """`envelope.messages` decoded (msgspec.DecodeError if one is not a message), kept on the
    envelope when it has room for it (a `__dict__`) for the next reader."""
    kept = getattr(envelope, "__dict__", None)
    if kept is not None and "blocks" in kept:
        return kept["blocks"]  # type: ignore[no-any-return]
    messages = [MESSAGE.decode(raw) for raw in envelope.messages]
    if kept is not None:
        kept["blocks"] = messages
    return messages


def has_image(messages: list[Message]) -> bool:
    """Any image block, tool results' included."""
    for message in messages:
        for block in message.content if isinstance(message.content, list) else ():
            if block.type == "image":
                return True
            inner = block.content if block.type == "tool_result" else None
            if isinstance(inner, list) and any(b.type == "image" for b in inner):
                return True
    return False

"""The block types of a request's messages, decoded without their text: what the gateway asks
of a prompt without reading it whole (an image in it; an image given by URL). Decoded from the
`Envelope`'s undecoded messages at most once per request when the envelope can keep them (the
one routes read with: `routes.shape.routed_envelope`), so the `images` condition of a route and
the URL-image check of a passed-through body share one read.

A block's `content` (and a source's) is kept undecoded: a tool result's text is skipped, not
built (about 40 % of the read of a Claude Code body); the blocks a list holds are decoded when
the scan reaches them, and checked as strictly as if decoded at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

_NONE = msgspec.Raw(b"")
_LIST, _STRING, _NULL = ord("["), ord('"'), ord("n")


class Source(msgspec.Struct):
    type: str = ""
    content: msgspec.Raw = _NONE  # a `content` document's: a string, or blocks


class Block(msgspec.Struct):
    type: str = ""
    source: Source | None = None
    content: msgspec.Raw = _NONE  # a tool result's: a string, or blocks


class Message(msgspec.Struct):
    content: str | list[Block] = ""


class Messages(msgspec.Struct):
    messages: list[Message] = []


MESSAGES = msgspec.json.Decoder(Messages)  # every other field is skipped, not built
MESSAGE = msgspec.json.Decoder(Message)
_BLOCKS = msgspec.json.Decoder(list[Block])


@dataclass(frozen=True, slots=True)
class Seen:
    """What the messages hold. A part that is not a message's (a number for a tool result's
    content, ...) makes the whole read fail: no image that can be seen, but any URL image."""

    images: bool  # an image block, tool results' included
    url_images: bool  # an image given by URL, however deep (tool results, `content` documents)


FAILED = Seen(images=False, url_images=True)


def read(envelope: Any) -> Seen:
    """What `envelope.messages` hold, kept on the envelope when it has room for it (a `__dict__`)
    for the next reader."""
    kept = getattr(envelope, "__dict__", None)
    if kept is not None and "blocks" in kept:
        return kept["blocks"]  # type: ignore[no-any-return]
    try:
        seen = scan([MESSAGE.decode(raw) for raw in envelope.messages])
    except (msgspec.DecodeError, RecursionError):
        seen = FAILED
    if kept is not None:
        kept["blocks"] = seen
    return seen


def read_body(body: bytes) -> Seen:
    """`read`, from a whole body."""
    try:
        return scan(MESSAGES.decode(body).messages)
    except (msgspec.DecodeError, RecursionError):
        return FAILED


def scan(messages: list[Message]) -> Seen:
    """Every part looked at (msgspec.DecodeError for one that is not blocks)."""
    images = urls = False
    for message in messages:
        if isinstance(message.content, list):
            direct, held, url = _look(message.content)
            images, urls = images or direct or held, urls or url
    return Seen(images, urls)


def _look(blocks: list[Block]) -> tuple[bool, bool, bool]:
    """(an image among `blocks`, an image among a tool result's blocks, an image given by URL
    however deep: in a tool result, a `content` document), every part they hold checked."""
    direct = held = urls = False
    for block in blocks:
        kind, source, content = block.type, block.source, block.content
        if kind == "image":
            direct = True
            urls = urls or (source is not None and source.type == "url")
        if content and memoryview(content)[0] != _STRING:  # blocks (or null)
            image, _, url = _look(_inner(content))
            if kind == "tool_result":
                held, urls = held or image, urls or url
        if source is not None and source.content and memoryview(source.content)[0] != _STRING:
            url = _look(_inner(source.content))[2]
            urls = urls or (url and kind not in ("image", "tool_result"))
    return direct, held, urls


def _inner(raw: msgspec.Raw) -> list[Block]:
    """The blocks an undecoded `content` holds: none for null (a string is not asked)."""
    first = memoryview(raw)[0]
    if first == _LIST:
        return _BLOCKS.decode(raw)
    if first == _NULL:
        return []
    raise msgspec.ValidationError("Expected `str | array | null`")

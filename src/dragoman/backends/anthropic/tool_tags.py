"""Passed-through tool ids that say which replica made them, as translated ones do.

Behind an upstream with replicas under cache_aware, a translated reply's tool ids name the
replica that made them (translate/tool_ids.py: its rules, reused here), and any gateway process
reading the conversation's next turn learns where the turn before went (docs/routing.md). On
the passthrough path the same holds: a reply's `tool_use` ids go to the client tagged (a whole
reply, or a stream's `content_block_start`), the request's tagged ids go upstream untagged, so
the server sees its own, and the latest tool call's tag is what routing reads (`latest_tag`).

All of it on the bytes, and only where they can hold it: a request without `toolu_dr` pays one
substring search; a reply or a stream's read without `"tool_use"` one more (JSON strings escape
their quotes, so a text cannot hold either token with its quotes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from dragoman.translate.tool_ids import TAGGED, client_tool_id, replica_tag_of, upstream_tool_id

MARK = TAGGED.encode()
TOOL_USE = b'"tool_use"'
_TAGGED_VALUE = re.compile(rb"toolu_dr[0-9a-f]{6}_[A-Za-z0-9_-]+(?=\")")  # tool_ids.py's, ours only
_SPACE = b" \t\r\n"  # JSON's whitespace
_KEYS = (b'"id"', b'"tool_use_id"')


def untagged(body: bytes) -> bytes:
    """`body` with every tagged id that is the string value of a key `id` or `tool_use_id` put
    back to the server's own (tool_ids.upstream_tool_id); `body` itself when there is none, for
    the cost of one search (from the end: CPython's forward search of an 8-byte needle through
    English and JSON takes 2-3 times as long)."""
    at = body.rfind(MARK)
    if at < 0:
        return body
    view = memoryview(body)  # its pieces joined are copied once
    parts: list[bytes | memoryview] = []  # from the end
    end = len(body)
    while at >= 0:
        found = _TAGGED_VALUE.match(body, at)
        if found is not None and _is_id_value(body, at):
            parts += (view[found.end() + 1 : end], msgspec.json.encode(upstream_tool_id(found[0].decode())))
            end = at - 1  # before its opening quote
        at = body.rfind(MARK, 0, at)
    if not parts:
        return body
    parts.append(view[:end])
    return b"".join(reversed(parts))


def _is_id_value(body: bytes, at: int) -> bool:
    """Whether the string starting at `at` (after its quote) is the value of a key `id` or
    `tool_use_id`, read backwards: `{` or `,`, the key, `:` and the value's quote, whitespace
    allowed between. A quote found so is a real one: one escaped in a string follows a `\\`."""
    end = at - 1
    if end < 0 or body[end] != 0x22:  # the value's opening quote
        return False
    end = _skip_space(body, end - 1)
    if end < 0 or body[end] != 0x3A:  # ':'
        return False
    end = _skip_space(body, end - 1)
    for key in _KEYS:
        if body.endswith(key, 0, end + 1):
            end = _skip_space(body, end - len(key))
            return end >= 0 and body[end] in b"{,"
    return False


def _skip_space(body: bytes, at: int) -> int:
    while at >= 0 and body[at] in _SPACE:
        at -= 1
    return at


def _tag_block(block: Any, tag: str) -> bool:
    """A `tool_use` block's id tagged (an id tool_ids.py would encode, encoded); whether it was one."""
    if not isinstance(block, dict) or block.get("type") != "tool_use" or not isinstance(block.get("id"), str):
        return False
    block["id"] = client_tool_id(block["id"], set(), tag)
    return True


def tagged_message(body: bytes, tag: str) -> bytes:
    """A whole reply with its `tool_use` blocks' ids tagged `tag`; decoded and encoded again
    only when it says `"tool_use"` (a reply that calls a tool)."""
    if not tag or TOOL_USE not in body:
        return body
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body
    content = data.get("content") if isinstance(data, dict) else None
    if not isinstance(content, list) or not [block for block in content if _tag_block(block, tag)]:
        return body
    return msgspec.json.encode(data)


def tagged_events(chunk: bytes, tag: str) -> bytes:
    """Whole SSE events with the id of each `tool_use` block's `content_block_start` tagged
    `tag`: only the `data:` line of such an event is decoded and encoded again."""
    at = chunk.find(TOOL_USE) if tag else -1
    while at >= 0:
        start = chunk.rfind(b"\n", 0, at) + 1
        end = chunk.find(b"\n", at)
        end = len(chunk) if end < 0 else end
        line = _tagged_start(chunk[start:end], tag)
        if line is not None:
            chunk = chunk[:start] + line + chunk[end:]
            end = start + len(line)
        at = chunk.find(TOOL_USE, end)
    return chunk


def _tagged_start(line: bytes, tag: str) -> bytes | None:
    """A `content_block_start` event's data line, its tool_use block's id tagged; None for any
    other line (a `message_delta` whose stop_reason is tool_use, say)."""
    if not line.startswith(b"data:") or b'"content_block_start"' not in line:
        return None
    try:
        data = msgspec.json.decode(line[5:])  # JSON allows the space and \r around it
    except msgspec.DecodeError:
        return None
    if not isinstance(data, dict) or data.get("type") != "content_block_start":
        return None
    if not _tag_block(data.get("content_block"), tag):
        return None
    return b"data: " + msgspec.json.encode(data) + (b"\r" if line.endswith(b"\r") else b"")


class _Block(msgspec.Struct):
    type: str = ""
    id: Any = None


class _Turn(msgspec.Struct):
    role: str = ""
    content: str | list[_Block] = ""


class _Messages(msgspec.Struct):
    messages: list[msgspec.Raw] = []


_TURN = msgspec.json.Decoder(_Turn)
_MESSAGES = msgspec.json.Decoder(_Messages)
_TOOL_USE_TOKEN = re.compile(re.escape(TOOL_USE))  # searched in a Raw message, which is no bytes


def latest_tag(body: bytes, messages: Sequence[msgspec.Raw] | None = None) -> str | None:
    """The tag of the replica that made the conversation's latest tool call, if its id says
    (translate/request.py reads the same of a decoded request). `messages`: the body's, as the
    core read them already (`protocol.anthropic.Envelope`); else read here. Asked of a body that
    has some (`untagged` changed it): it searches nothing first."""
    if messages is None:
        try:
            messages = _MESSAGES.decode(body).messages
        except msgspec.DecodeError:
            return None
    for raw in reversed(messages):
        if _TOOL_USE_TOKEN.search(raw) is None:  # type: ignore[call-overload]  # a buffer
            continue
        try:
            turn = _TURN.decode(raw)
        except msgspec.DecodeError:
            continue
        if turn.role != "assistant" or isinstance(turn.content, str):
            continue
        for block in reversed(turn.content):
            if block.type == "tool_use":
                return replica_tag_of(block.id) if isinstance(block.id, str) else None
    return None

"""Tool-call arguments as backends really send them: JSON text, sometimes empty,
sometimes an object instead of a string, sometimes cut off before its end.

Anthropic's `tool_use.input` is always an object. Empty arguments mean `{}`; a
truncated JSON object is completed by closing what is open (the only repair that
is unambiguous); anything else is an error rather than a broken block.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dragoman.errors import UpstreamError


def completion_suffix(text: str) -> str | None:
    """What to append to make a truncated JSON document complete, or None if
    appending cannot fix it. Returns "" when the text is already complete."""
    stack: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]":
            if not stack or stack.pop() != char:
                return None
    suffix = ('\\' if escaped else "") + ('"' if in_string else "")
    stripped = (text + suffix).rstrip()
    if stripped.endswith(","):
        return None  # would need a deletion, not an append
    if stripped.endswith(":"):
        suffix += "null"
    return suffix + "".join(reversed(stack))


def parse_arguments(raw: str | dict[str, Any] | None, *, tool: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    text = raw.strip()
    if not text:
        return {}
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        suffix = completion_suffix(text)
        value = None
        if suffix:
            try:
                value = msgspec.json.decode(text + suffix)
            except msgspec.DecodeError:
                value = None
        if value is None:
            raise UpstreamError(f"the model called tool {tool!r} with arguments that are not valid JSON: {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise UpstreamError(f"the model called tool {tool!r} with arguments that are not a JSON object: {text[:200]!r}")
    return value

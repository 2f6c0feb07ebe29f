"""Tool-call arguments as backends really send them: JSON text, sometimes empty,
sometimes an object instead of a string, sometimes cut off before its end.

Anthropic's `tool_use.input` is always an object. Empty arguments mean `{}`; a
JSON object cut short (by max_tokens) is completed by appending only: what is open
is closed, and a key, literal or number cut in its middle is finished. Anything
else is an error rather than a broken block.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dragoman.core.errors import UpstreamError

_LITERALS = ("true", "false", "null")


def completion_suffix(text: str) -> str | None:
    """What to append to make a truncated JSON document complete, or None if
    appending cannot fix it (a dangling comma in an object would need an invented
    key, or the text is no JSON to begin with). Returns "" when the text is already
    complete (or no repair applies: the caller's decode judges it). Only appends: a stream has
    sent the text already. A key cut short gets `null` as its value, a literal or a
    number cut short is finished (`tr` -> `true`, `1.` -> `1.0`)."""
    state = _scan(text)
    if state is None:
        return None
    stack, expect, in_string, escaped, is_key, hex_left, token = state
    suffix = ""
    if in_string:
        suffix += ("\\" if escaped else "") + "0" * hex_left + '"'
        if is_key:
            suffix += ":null"
    elif token:
        literal = next((word for word in _LITERALS if word.startswith(token)), None)
        if literal is not None:
            suffix += literal[len(token) :]
        elif token[-1] in "+-.eE":
            suffix += "0"
    elif expect == "colon":
        suffix += ":null"
    elif expect == "value" and text.rstrip().endswith((":", ",")):
        suffix += "null"  # after a colon, or a comma in a list
    elif expect == "key" and text.rstrip().endswith(","):
        return None  # would need an invented key, or a deletion
    suffix += "".join(reversed(stack))
    if suffix:  # what was read as a literal may be none (`Paris`): never a repair that is not JSON
        try:
            msgspec.json.decode(text + suffix)
        except msgspec.DecodeError:
            return None
    return suffix


_State = tuple[list[str], str, bool, bool, bool, int, str]


def _scan(text: str) -> _State | None:
    """Where a JSON text stops: (open containers' closers, what it needs next, in a string,
    after a backslash, the string is a key, \\u digits owed, the number or literal being read);
    None at the first character no JSON text could have there. One pass, locals only: the
    text may be a whole tool call's arguments."""
    stack: list[str] = []  # the open containers' closing characters
    expect = "value"  # what the text needs next: value, key (or end), colon, more (comma or end)
    in_string = escaped = is_key = False
    hex_left = 0  # digits still owed to a \u escape
    token = ""  # a number or literal being read
    for char in text:
        if in_string:
            if hex_left:
                hex_left -= 1
            elif escaped:
                escaped = False
                if char == "u":
                    hex_left = 4
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                expect = "colon" if is_key else "more"
            continue
        if token and (char.isalnum() or char in "+-."):
            token += char
            continue
        token = ""
        if char in " \t\r\n":
            continue
        if char == '"':
            if expect not in ("value", "key"):
                return None
            in_string, is_key = True, expect == "key"
        elif char in "{[":
            if expect != "value":
                return None
            stack.append("}" if char == "{" else "]")
            expect = "key" if char == "{" else "value"
        elif char in "}]":
            if not stack or stack.pop() != char or expect == "colon":
                return None
            expect = "more"
        elif char == ":":
            if expect != "colon":
                return None
            expect = "value"
        elif char == ",":
            if expect != "more" or not stack:
                return None
            expect = "key" if stack[-1] == "}" else "value"
        elif char.isalnum() or char == "-":
            if expect != "value":
                return None
            token, expect = char, "more"
        else:
            return None
    return stack, expect, in_string, escaped, is_key, hex_left, token


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
            raise UpstreamError(
                f"the model called tool {tool!r} with arguments that are not valid JSON: {text[:200]!r}"
            ) from None
    if not isinstance(value, dict):
        raise UpstreamError(f"the model called tool {tool!r} with arguments that are not a JSON object: {text[:200]!r}")
    return value

"""Decoding client bodies with errors that name the offending field.

msgspec reports `Expected `int`, got `str` - at `$.messages[0].content``; clients
are better served by Anthropic's style, `messages.0.content: ...`.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from dragoman.core.errors import InvalidRequest

T = TypeVar("T")

_AT = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"^Object missing required field `(.+)`$")
_TAG = re.compile(r"^Invalid value '(.*)'$")
_FIELD_FIRST = re.compile(r"[\w.\[\]-]+: ")  # `thinking.enabled.budget_tokens: ...`: a message that names its field


def field_path(text: str) -> tuple[str, str]:
    match = _AT.search(text)
    if not match:
        return "", text
    path = re.sub(r"\[(\d+)\]", r".\1", match.group(1))
    return path, text[: match.start()]


def describe(error: msgspec.ValidationError) -> str:
    path, text = field_path(str(error))
    missing = _MISSING.match(text)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        text = "Field required"
    else:
        tag = _TAG.match(text)
        if tag is not None and path.endswith(".type"):  # an unknown block or source type
            text = f"unsupported type {tag.group(1)!r}"
    return f"{path}: {text}" if path else text


def within(where: str, message: str) -> str:
    """A message about a request that is part of a larger one, naming the field as the client
    sent it: within `requests.3.params`, `thinking.enabled.budget_tokens: ...` becomes
    `requests.3.params.thinking.enabled.budget_tokens: ...`, and a message that names no field
    (Anthropic words some checks so) is about the part as a whole, `requests.3.params: ...`."""
    if _FIELD_FIRST.match(message):
        return f"{where}.{message}"
    return f"{where}: {message}"


_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"  # a high half with no low half after it
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a low half with no high half before it
)


def _not_json(body: bytes, error: msgspec.DecodeError) -> str:
    """msgspec says "truncated" of a string with half a UTF-16 surrogate pair: say what it is."""
    found = _LONE_SURROGATE.search(body) if str(error) == "Input data was truncated" else None
    if found is not None:
        return f"the request body is not valid JSON: {found.group().decode()} is half a surrogate pair, not a character (at byte {found.start()})"
    return f"the request body is not valid JSON: {error}"


def decode_request(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as error:
        raise InvalidRequest(describe(error)) from None
    except msgspec.DecodeError as error:
        raise InvalidRequest(_not_json(body, error)) from None
    except RecursionError:
        raise InvalidRequest("the request body is nested too deeply") from None

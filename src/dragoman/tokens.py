"""Token counts when nothing better can answer: about four characters a token,
over every block a real request would send (text, tool inputs and results,
thinking, system, tool schemas), and images by Anthropic's size formula."""

from __future__ import annotations

import msgspec

from dragoman.protocol import anthropic as a

IMAGE_TOKENS = 1600  # Anthropic's cap for an image whose size we do not decode


def _chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, a.ImageBlock):
        return IMAGE_TOKENS * 4
    if isinstance(value, (list, tuple)):
        return sum(_chars(v) for v in value)
    if isinstance(value, msgspec.Struct):
        return sum(_chars(getattr(value, f)) for f in value.__struct_fields__ if f not in ("type", "source") or isinstance(getattr(value, f), str))
    if isinstance(value, dict):
        return len(msgspec.json.encode(value))
    if value is None or isinstance(value, bool):
        return 0
    return len(str(value))


def count_estimate(request: a.CountTokensRequest | a.MessagesRequest) -> int:
    chars = _chars(request.system) + _chars(request.messages) + _chars(request.tools or [])
    return max(1, (chars + 3) // 4)

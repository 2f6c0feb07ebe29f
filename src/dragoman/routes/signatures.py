"""Thinking blocks signed by another backend, taken out before an upstream that checks
signatures (Anthropic's API rejects a signature it did not make). A pure function."""

from __future__ import annotations

from typing import Any

import msgspec

THINKING = frozenset({"thinking", "redacted_thinking"})


def without_thinking(body: bytes) -> bytes | None:
    """`body` with the thinking blocks of its assistant turns taken out, or None when it has none."""
    if b"thinking" not in body:
        return None
    try:
        request: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    messages = request.get("messages") if isinstance(request, dict) else None
    changed = False
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) and message.get("role") == "assistant" else None
        if isinstance(content, list):
            kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in THINKING)]
            if len(kept) != len(content):
                message["content"], changed = kept or [{"type": "text", "text": ""}], True
    return msgspec.json.encode(request) if changed else None

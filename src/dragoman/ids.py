"""Opaque ids in Anthropic's shapes (`msg_...`, `toolu_...`, `req_...`)."""

from __future__ import annotations

import os

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def new_id(prefix: str, size: int = 24) -> str:
    raw = int.from_bytes(os.urandom(18), "big")
    chars = []
    for _ in range(size):
        raw, digit = divmod(raw, 62)
        chars.append(_ALPHABET[digit])
    return prefix + "".join(chars)


def message_id() -> str:
    return new_id("msg_01")


def tool_use_id() -> str:
    return new_id("toolu_01")


def request_id() -> str:
    return new_id("req_01")

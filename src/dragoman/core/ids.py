"""Opaque ids in Anthropic's shapes (`msg_...`, `toolu_...`, `req_...`)."""

from __future__ import annotations

import os

_ALPHABET = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Random bytes mapped onto base62 in one C call; the slight bias of byte % 62 is
# harmless for ids that only need to be unique (24 characters, ~142 bits).
_TO_BASE62 = bytes(_ALPHABET[b % 62] for b in range(256))


def new_id(prefix: str, size: int = 24) -> str:
    return prefix + os.urandom(size).translate(_TO_BASE62).decode()


def message_id() -> str:
    return new_id("msg_01")


def tool_use_id() -> str:
    return new_id("toolu_01")


def request_id() -> str:
    return new_id("req_01")

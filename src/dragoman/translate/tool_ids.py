"""Tool call ids the server chose, in the form Anthropic's API accepts.

Anthropic requires `tool_use.id` to match `^[a-zA-Z0-9_-]+$`; some servers name calls
otherwise (vLLM's Kimi-K2 parser: `functions.get_weather:0`). Such an id goes to the
client encoded (URL-safe base64, whose alphabet fits), so that a conversation stays
valid wherever it is sent next, and is decoded when it comes back, so that the server
sees its own id again (its chat template may read it).
"""

from __future__ import annotations

import base64
import binascii
import re

ENCODED = "toolu_b64_"
_VALID = re.compile(r"[A-Za-z0-9_-]+")


def client_tool_id(upstream_id: str) -> str:
    if _VALID.fullmatch(upstream_id) and not upstream_id.startswith(ENCODED):
        return upstream_id
    return ENCODED + base64.urlsafe_b64encode(upstream_id.encode()).decode().rstrip("=")


def upstream_tool_id(client_id: str) -> str:
    if not client_id.startswith(ENCODED):
        return client_id
    data = client_id[len(ENCODED) :]
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):  # not one of ours after all
        return client_id

"""Tool call ids the server chose, in the form Anthropic's API accepts, and unique.

Anthropic requires `tool_use.id` to match `^[a-zA-Z0-9_-]+$`, and clients match results
to calls by id: Claude Code drops a call whose id it has seen before from its history,
so a server that names every call `call_0` (TGI, some others) would loop for ever.
Some servers name calls otherwise (vLLM's Kimi-K2 parser: `functions.get_weather:0`).
An id that is not valid, or is taken (in the conversation, or earlier in the reply),
goes to the client encoded (URL-safe base64, whose alphabet fits, after a number that
makes it unique) and is decoded when it comes back, so that the server sees its own id
again (its chat template may read it).
"""

from __future__ import annotations

import base64
import binascii
import re

ENCODED = "toolu_b64"  # then an optional number, "_" and the server's id in URL-safe base64
_VALID = re.compile(r"[A-Za-z0-9_-]+")
_ENCODED = re.compile(r"toolu_b64(\d*)_([A-Za-z0-9_-]+)")


def client_tool_id(upstream_id: str, taken: set[str]) -> str:
    """The id the client gets for the server's; it joins `taken`."""
    if upstream_id not in taken and _VALID.fullmatch(upstream_id) and not upstream_id.startswith(ENCODED):
        taken.add(upstream_id)
        return upstream_id
    encoded = base64.urlsafe_b64encode(upstream_id.encode()).decode().rstrip("=")
    candidate, number = f"{ENCODED}_{encoded}", 1
    while candidate in taken:
        number += 1
        candidate = f"{ENCODED}{number}_{encoded}"
    taken.add(candidate)
    return candidate


def upstream_tool_id(client_id: str) -> str:
    found = _ENCODED.fullmatch(client_id)
    if found is None:
        return client_id
    data = found.group(2)
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):  # not one of ours after all
        return client_id

"""Tool call ids the server chose, in the form Anthropic's API accepts, and unique.

Anthropic requires `tool_use.id` to match `^[a-zA-Z0-9_-]+$`, and clients match results
to calls by id: Claude Code drops a call whose id it has seen before from its history,
so a server that names every call `call_0` (TGI, some others) would loop for ever.
Some servers name calls otherwise (vLLM's Kimi-K2 parser: `functions.get_weather:0`).
An id that is not valid, or is taken (in the conversation, or earlier in the reply),
goes to the client encoded (URL-safe base64, whose alphabet fits, after a number that
makes it unique) and is decoded when it comes back, so that the server sees its own id
again (its chat template may read it).

Behind an upstream with replicas, an id also says which replica made it: `toolu_dr`, the
replica's tag (`upstream.placement.replica_tag`), `_`, then the id as it would be without
it. Claude Code sends every id back in the turns after, so any gateway process reading the
conversation learns where its turn before went, with no word to the others (docs/routing.md);
the server gets its own id back, untagged, as before.
"""

from __future__ import annotations

import base64
import binascii
import re

ENCODED = "toolu_b64"  # then an optional number, "_" and the server's id in URL-safe base64
TAGGED = "toolu_dr"  # then the replica's tag, "_" and the id without it
_VALID = re.compile(r"[A-Za-z0-9_-]+")
_ENCODED = re.compile(r"toolu_b64(\d*)_([A-Za-z0-9_-]+)")
_TAGGED = re.compile(r"toolu_dr([0-9a-f]{6})_(.+)")


def tagged(client_id: str, tag: str) -> str:
    """`client_id` saying it came from the replica tagged `tag` ("": from none in particular)."""
    return f"{TAGGED}{tag}_{client_id}" if tag else client_id


def client_tool_id(upstream_id: str, taken: set[str], tag: str = "") -> str:
    """The id the client gets for the server's (made by the replica tagged `tag`); it joins `taken`."""
    candidate = tagged(upstream_id, tag)
    if candidate not in taken and _VALID.fullmatch(upstream_id) and not upstream_id.startswith((ENCODED, TAGGED)):
        taken.add(candidate)
        return candidate
    encoded = base64.urlsafe_b64encode(upstream_id.encode()).decode().rstrip("=")
    candidate, number = tagged(f"{ENCODED}_{encoded}", tag), 1
    while candidate in taken:
        number += 1
        candidate = tagged(f"{ENCODED}{number}_{encoded}", tag)
    taken.add(candidate)
    return candidate


def replica_tag_of(client_id: str) -> str | None:
    """The tag of the replica that made this id, if it says."""
    found = _TAGGED.fullmatch(client_id)
    return None if found is None else found.group(1)


def upstream_tool_id(client_id: str) -> str:
    """The id the server made, for the id the client sent back."""
    found = _TAGGED.fullmatch(client_id)
    if found is not None:
        client_id = found.group(2)
    found = _ENCODED.fullmatch(client_id)
    if found is None:
        return client_id
    data = found.group(2)
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):  # not one of ours after all
        return client_id

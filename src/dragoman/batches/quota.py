"""What one key may keep in batches: `batches.max_queued_requests`, `max_batches` and
`max_stored_bytes`, checked at each create against what the key's batches hold."""

from __future__ import annotations

from dataclasses import dataclass

from dragoman.core.config import BatchesConfig
from dragoman.core.errors import InvalidRequest, RateLimited


@dataclass(slots=True)
class Usage:
    """What one owner's batches hold."""

    batches: int = 0
    stored_bytes: int = 0
    queued: int = 0  # requests in batches still processing


def check_room(config: BatchesConfig, usage: Usage, requests: int, size: int) -> None:
    """Refuse a create of `requests` requests in a body of `size` bytes that would take the key
    past its limits. Waiting frees queued requests (a 429); only deletes free the rest (a 400).
    The messages name the setting, never the key."""
    if usage.queued + requests > config.max_queued_requests:
        raise RateLimited(
            f"batches.max_queued_requests: this key's batches still processing hold {usage.queued} requests; "
            f"{requests} more would pass the limit of {config.max_queued_requests}; retry when some have ended"
        )
    if usage.batches >= config.max_batches:
        raise InvalidRequest(f"batches.max_batches: this key keeps {usage.batches} batches, the most it may; "
                             "delete ended batches to create more")  # fmt: skip
    if usage.stored_bytes + size > config.max_stored_bytes:
        raise InvalidRequest(
            f"batches.max_stored_bytes: this key's batches take {usage.stored_bytes} bytes; this one "
            f"({size} bytes) would pass the limit of {config.max_stored_bytes}; delete ended batches to make room"
        )

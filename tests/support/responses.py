"""A scripted upstream response for driving stream code without a socket."""

from __future__ import annotations

import asyncio


class ScriptedResponse:
    """An upstream event stream whose body arrives in the given reads, one per `readany`;
    notes whether it was released (reused) or closed (dropped)."""

    content_type = "text/event-stream"
    opening = None  # its body has begun (HttpClient's Opening is not in play here)

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = list(reads)
        self.released = self.closed = False

    @property
    def ended(self) -> bool:
        return not self._reads

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        return self._reads.pop(0) if self._reads else b""

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True

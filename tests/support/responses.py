"""A scripted upstream response for driving stream code without a socket, and the client's
side of direct writes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ScriptedResponse:
    """An upstream event stream whose body arrives in the given reads, one per `readany` (a
    float is a silence of that many seconds before the next); notes whether it was released
    (reused) or closed (dropped). `drain_to` hands the reads to a sink as a connection's
    callback would, until the sink declines one, stops, or a silence comes."""

    content_type = "text/event-stream"
    opening = None  # its body has begun (HttpClient's Opening is not in play here)

    def __init__(self, reads: list[bytes | float]) -> None:
        self._reads = list(reads)
        self.released = self.closed = False
        self._stopped = False

    @property
    def ended(self) -> bool:
        return not self._reads

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        while self._reads and isinstance(self._reads[0], float):
            await asyncio.sleep(self._reads.pop(0))  # type: ignore[arg-type]
        return self._reads.pop(0) if self._reads else b""  # type: ignore[return-value]

    async def drain_to(self, sink: Callable[[bytes], bool]) -> None:
        self._stopped = False
        await asyncio.sleep(0)
        while self._reads and isinstance(self._reads[0], bytes) and not self._stopped and sink(self._reads[0]):
            self._reads.pop(0)

    def stop_sink(self) -> None:
        self._stopped = True

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


class ReadyWriter:
    """The client's side of direct writes: always ready, keeps what it was given."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def ready(self) -> bool:
        return True

    def write(self, chunk: bytes) -> None:
        self.written.append(chunk)

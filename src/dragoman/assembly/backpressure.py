"""Back-pressure: at most N requests at once per upstream, a bounded queue behind
them, and a fast 529 with `retry-after` past that, instead of an unbounded pile-up."""

from __future__ import annotations

import asyncio

from dragoman.core.errors import Overloaded


class Limiter:
    def __init__(self, upstream: str, limit: int, queue: int) -> None:
        self._upstream = upstream
        self._slots = asyncio.Semaphore(limit)
        self._queue = queue
        self._waiting = 0

    async def acquire(self, *, queue: bool = True) -> None:
        """A slot; with `queue` (interactive requests) a full queue is a 529 at once,
        without it (batch requests, which have a day) the wait is unbounded."""
        if self._slots.locked():
            if queue and self._waiting >= self._queue:
                raise Overloaded(
                    f"upstream {self._upstream} is at its limit of concurrent requests; try again shortly",
                    retry_after="1",
                )
            self._waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self._waiting -= 1
        else:
            await self._slots.acquire()

    def release(self) -> None:
        self._slots.release()

"""`max_concurrent`: requests at once per key or tenant, and a queue bounded in time.

A request waits for a slot at most `queue_timeout` seconds (a batch's request as long
as it takes); a client that hangs up while queued is cancelled out of the queue
(`server.disconnect`). With Redis, `redis_slots` keeps them there instead.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class _Slots:
    __slots__ = ("semaphore", "users")

    def __init__(self, limit: int) -> None:
        self.semaphore = asyncio.Semaphore(limit)
        self.users = 0  # holding or waiting: the entry goes once nobody is


class Slots(Protocol):
    """Where `max_concurrent` slots are held: this process (`Concurrency`), or Redis."""

    async def acquire(self, key: str, limit: int, timeout: float | None) -> str | None: ...

    def release(self, key: str, lease: str) -> None: ...

    async def close(self) -> None: ...


class Concurrency:
    def __init__(self) -> None:
        self._slots: dict[str, _Slots] = {}

    async def acquire(self, key: str, limit: int, timeout: float | None) -> str | None:
        """A lease ("local") once a slot is held; None if none came within `timeout` (None: no bound)."""
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = _Slots(limit)
        slots.users += 1
        try:
            if slots.semaphore.locked() and timeout == 0:
                raise TimeoutError
            async with asyncio.timeout(timeout):
                await slots.semaphore.acquire()
        except BaseException as error:
            self._leave(key, slots)
            if isinstance(error, TimeoutError):
                return None
            raise
        return "local"

    def release(self, key: str, lease: str = "local") -> None:
        slots = self._slots[key]
        slots.semaphore.release()
        self._leave(key, slots)

    def _leave(self, key: str, slots: _Slots) -> None:
        slots.users -= 1
        if slots.users == 0:
            del self._slots[key]

    async def close(self) -> None:
        pass

    def in_use(self, key: str) -> int:
        slots = self._slots.get(key)
        return 0 if slots is None else slots.users

"""`max_concurrent` shared through Redis: a sorted set of leases per key or tenant.

A request holds a lease (a random member, scored by when it lapses) from the moment it
is admitted to its end; one script call takes a lease if fewer than the limit are held,
dropping lapsed ones first, and one more (not waited for) gives it back. A full set is
asked again every `POLL` to `POLL_MAX` seconds until `queue_timeout`; a client that
hangs up stops asking. A process that dies leaves its leases to lapse after `LEASE`
seconds, and a request that runs longer than that stops counting (a stream of more than
ten minutes lets one more in).

Redis unreachable: `fail_open` counts slots in this process meanwhile, `fail_closed`
answers 503, as for the buckets (`redis_store`).
"""

from __future__ import annotations

import asyncio
import secrets
import time

import redis.asyncio
from redis.exceptions import RedisError

from dragoman.limits.redis_store import LimitsUnavailable, RedisStore
from dragoman.limits.slots import Concurrency

LEASE = 600.0  # seconds a lease lasts unless given back
POLL, POLL_MAX = 0.05, 0.5  # seconds between asks while the set is full

# KEYS[1]: the set. ARGV: limit, lease id, lease ms. 1 if the lease was taken, else 0.
ACQUIRE = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


class SharedConcurrency:
    """The same calls as `slots.Concurrency`, with the slots in Redis."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._redis: redis.asyncio.Redis = store.client
        self._acquire = store.script(ACQUIRE)
        self._local = Concurrency()  # while Redis is away, under fail_open
        self._pending: set[asyncio.Task[None]] = set()

    async def acquire(self, key: str, limit: int, timeout: float | None) -> str | None:
        """A lease once a slot is free, or None if none came within `timeout` (None: no bound)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        lease, pause = secrets.token_hex(8), POLL
        while True:
            if self._store.down():
                return await self._fallback(key, limit, deadline)
            try:
                taken = await self._acquire(keys=[self._store.prefix + key], args=[limit, lease, int(LEASE * 1000)])
            except (RedisError, OSError, TimeoutError) as error:
                self._store.failed(error, ())
                return await self._fallback(key, limit, deadline)
            self._store.back()
            if taken == 1:
                return lease
            if deadline is not None and time.monotonic() + pause > deadline:
                return None
            await asyncio.sleep(pause)
            pause = min(POLL_MAX, pause * 1.5)

    async def _fallback(self, key: str, limit: int, deadline: float | None) -> str | None:
        if not self._store.fail_open:
            raise LimitsUnavailable("the rate-limit store (Redis) is unreachable; try again shortly", retry_after="1")
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return "local" if await self._local.acquire(key, limit, left) == "local" else None

    def release(self, key: str, lease: str) -> None:
        if lease == "local":
            self._local.release(key, lease)
            return
        task = asyncio.get_running_loop().create_task(self._give_back(key, lease))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _give_back(self, key: str, lease: str) -> None:
        try:
            if self._store.pipe is not None:
                await self._store.pipe.call(b"ZREM", self._store.prefix + key, lease)
            else:
                await self._redis.zrem(self._store.prefix + key, lease)
        except (RedisError, OSError, TimeoutError):
            pass  # the lease lapses by itself

    async def close(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

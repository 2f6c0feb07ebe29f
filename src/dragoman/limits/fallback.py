"""Limits while Redis is out, under `fail_open`: each process serves on a local bucket that
holds its share of the rate, starting from the level Redis last reported, not full.

Redis says how many gateway processes are alive: each beats every HEARTBEAT seconds into
a sorted set whose members expire after ALIVE seconds. With N processes, a process's local
bucket has capacity/N, refills at rate/N, and starts at level/N, the level of that bucket
Redis last reported to it. Across all processes, an outage of T seconds thus admits at
most what the shared bucket held plus rate x T, as Redis would; the slack is the processes'
staleness (takes between a process's last report and the outage) and a process count that
changed meanwhile. See docs/operations.md for the bound."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Sequence
from dataclasses import replace

from redis.exceptions import RedisError

from dragoman.limits.store import LocalStore, Taken, Want

HEARTBEAT = 1.0  # seconds between beats
ALIVE = 3.0  # seconds a beat counts a process alive

# KEYS[1]: the set; ARGV: member, its life (ms). The processes alive, this one included.
BEAT = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""


class Share:
    """This process's share of each bucket while Redis is out."""

    def __init__(self, client: object, prefix: str) -> None:
        self._client = client
        self._key = prefix + "alive"
        self._member = secrets.token_hex(8)
        self._beat = client.register_script(BEAT)  # type: ignore[attr-defined]
        self.processes = 1  # as Redis last said
        self._reported: dict[str, float] = {}  # bucket key -> its level as Redis last reported it
        self._seeded: set[str] = set()  # buckets started locally in this outage
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._beating(), name="limits heartbeat")

    async def _beating(self) -> None:
        while not self._closing:  # redis-py can turn a cancellation mid-call into a connection error
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                self.processes = max(1, int(await self._beat(keys=[self._key], args=[self._member, int(ALIVE * 1000)])))
            if self._closing:
                return
            await asyncio.sleep(HEARTBEAT)

    def reported(self, wants: Sequence[Want], levels: Sequence[float]) -> None:
        for want, level in zip(wants, levels, strict=False):
            self._reported[want.key] = level

    def take(self, local: LocalStore, wants: Sequence[Want]) -> Taken:
        """Take from this process's share, seeded once per outage: a rate's bucket scaled by 1/N;
        a budget's (no refill) room above what it needs to admit, as a money budget's bucket
        holds a large span and admits only above a floor near it (`keys.money`)."""
        n = self.processes
        shares = [w if w.per_second == 0 else replace(w, capacity=w.capacity / n, per_second=w.per_second / n,
                                                      need=min(w.need, w.capacity / n))
                  for w in wants]  # fmt: skip
        for want in shares:
            if want.key not in self._seeded:
                self._seeded.add(want.key)
                level = self._reported.get(want.key)
                if want.per_second == 0:  # from where Redis left it, else full: 1/N of the room
                    room = (want.capacity if level is None else level) - want.need
                    local.adjust([(want, want.need + room / n - want.capacity)])
                elif level is not None:  # from where Redis left it, not full
                    local.adjust([(want, level / n - want.capacity)])
        return local.take_now(shares)

    def back(self) -> None:
        """Redis is back: the next outage starts from what it reports until then."""
        self._seeded.clear()

    async def close(self) -> None:
        if self._task is not None:
            self._closing = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await self._client.zrem(self._key, self._member)  # type: ignore[attr-defined]

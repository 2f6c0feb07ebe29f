"""Sessions and cool-downs shared by every gateway process through Redis, when the limits'
store is configured (`limits.redis_url`); without it, each process keeps its own in memory.

Keys, under `limits.redis_prefix` + `routes:`, each with a TTL:

- `s:<session digest>`: a hash of the sticky routes the session took (`r:<route>`), their
  highest threshold (`floor`) and its last reply's prompt size (`last`); SESSION_TTL after its
  last write.
- `f:<model>`: the model's failures in the current cool-down window; gone with the window.
- `c:<model>`: the model is cooled down; gone when the cool-down ends.

A request with a session reads its hash (one round trip) when a sticky route exists; writes
go in the background; cool-downs are polled every POLL seconds, so a request reads memory.
Redis unreachable: memory alone, logged once, asked again after RETRY_AFTER seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

log = logging.getLogger("dragoman.routes")

SESSION_TTL = 3600.0  # seconds a session's routes outlive its last request
POLL = 1.0  # seconds between reads of the cool-downs
RETRY_AFTER = 1.0  # seconds after a failure before Redis is asked again
_FAILED = (RedisError, OSError, TimeoutError)

TOOK = """
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], 1)
local floor = tonumber(redis.call('HGET', KEYS[1], 'floor') or '0')
if tonumber(ARGV[2]) > floor then redis.call('HSET', KEYS[1], 'floor', ARGV[2]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
"""
# KEYS: failures, cooled. ARGV: at once (1/0), failures that cool, window ms, cool-down ms.
FAIL = """
local n = tonumber(ARGV[2])
if ARGV[1] ~= '1' then
  n = redis.call('INCR', KEYS[1])
  if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
end
if ARGV[1] == '1' or n >= tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], 1, 'PX', ARGV[4])
end
"""


class Shared:
    """One process's connection to the shared sessions and cool-downs."""

    def __init__(self, url: str, prefix: str, timeout: float) -> None:
        self.client = redis.asyncio.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                             retry=Retry(NoBackoff(), 0))  # fmt: skip
        self._prefix = prefix + "routes:"
        self._took = self.client.register_script(TOOK)
        self._fail = self.client.register_script(FAIL)
        self._down_until: float | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._closing = False

    def _session_key(self, session: str) -> str:
        return self._prefix + "s:" + hashlib.blake2b(session.encode(), digest_size=16).hexdigest()

    def _up(self) -> bool:
        if self._down_until is None:
            return True
        if time.monotonic() < self._down_until:
            return False
        self._down_until = None
        return True

    def _failed(self, error: BaseException) -> None:
        if self._down_until is None:
            log.warning("routes: Redis is unreachable (%s): sessions and cool-downs are this process's alone "
                        "until it answers", error)  # fmt: skip
        self._down_until = time.monotonic() + RETRY_AFTER

    async def session(self, session: str) -> tuple[set[str], int, int] | None:
        """The session's (routes, floor, last prompt) as every process left them; None if unknown or unreachable."""
        if not self._up():
            return None
        try:
            found = await self.client.hgetall(self._session_key(session))
        except _FAILED as error:
            self._failed(error)
            return None
        if not found:
            return None
        fields = {_text(k): _text(v) for k, v in found.items()}
        routes = {k[2:] for k in fields if k.startswith("r:")}
        return routes, int(fields.get("floor", 0)), int(fields.get("last", 0))

    def took(self, session: str, route: str, threshold: int | None) -> None:
        key, ttl = self._session_key(session), int(SESSION_TTL * 1000)
        self._later(lambda: self._took(keys=[key], args=[route, threshold or 0, ttl]))

    def replied(self, session: str, prompt: int) -> None:
        key, ttl = self._session_key(session), int(SESSION_TTL * 1000)

        async def write() -> None:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hset(key, "last", prompt)
                pipe.pexpire(key, ttl)
                await pipe.execute()

        self._later(write)

    def failed(self, model: str, at_once: bool, failures: int, window: float, cooldown: float) -> None:
        if cooldown <= 0:
            return
        keys = [self._prefix + "f:" + model, self._prefix + "c:" + model]
        args = [int(at_once), failures, max(1, int(window * 1000)), max(1, int(cooldown * 1000))]
        self._later(lambda: self._fail(keys=keys, args=args))

    def _later(self, call: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """`call` in the background (a write: no request waits for it)."""
        if self._closing or not self._up():
            return
        try:
            task = asyncio.get_running_loop().create_task(self._guarded(call))
        except RuntimeError:  # no loop: a test's synchronous call
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, call: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        try:
            await call()
        except _FAILED as error:
            self._failed(error)

    def watch(self, models: Iterable[str], cooled: Callable[[str, float], None]) -> None:
        """Poll the cool-downs of `models` in the background; `cooled(model, seconds left)` for each on."""
        if self._poller is None and not self._closing:
            names = sorted(set(models))
            self._poller = asyncio.get_running_loop().create_task(self._polling(names, cooled), name="route cool-downs")

    async def _polling(self, models: list[str], cooled: Callable[[str, float], None]) -> None:
        while not self._closing:  # redis-py can turn a cancellation mid-call into a connection error
            if models and self._up():
                try:
                    async with self.client.pipeline(transaction=False) as pipe:
                        for model in models:
                            pipe.pttl(self._prefix + "c:" + model)
                        left = await pipe.execute()
                except _FAILED as error:
                    self._failed(error)
                else:
                    for model, ms in zip(models, left, strict=True):
                        if ms > 0:
                            cooled(model, ms / 1000)
            if self._closing:
                return
            await asyncio.sleep(POLL)

    async def close(self) -> None:
        self._closing = True
        running = [t for t in (self._poller, *self._tasks) if t is not None and not t.done()]
        if self._poller is not None:
            self._poller.cancel()
        if running:
            await asyncio.wait(running, timeout=2)
        with contextlib.suppress(*_FAILED):
            await self.client.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

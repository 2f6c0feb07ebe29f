"""Token buckets in Redis, shared by every worker and replica.

One Lua script per request start (`TAKE`: refill, check and take, all buckets or
none) and one when it ends (`ADJUST`, sent without waiting), each a single round trip,
atomic in Redis. Time is Redis's own (`TIME`), so the hosts' clocks need not agree.
A bucket is a hash {t: tokens, at: ms} that expires once it would be full again.

Redis unreachable: `fail_open` serves on buckets in this process (logged once per
outage and counted in `dragoman_limits_store_errors`), `fail_closed` answers 503. Either
way Redis is tried again after `RETRY_AFTER` seconds, so the gateway recovers by itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import redis.asyncio
from redis.exceptions import RedisError

from dragoman.core.errors import GatewayError
from dragoman.limits.store import LocalStore, Taken, Want, refused

log = logging.getLogger("dragoman.limits")

RETRY_AFTER = 1.0  # seconds after a failure before Redis is asked again

# KEYS: the buckets. ARGV, 5 per bucket: capacity, refill per ms, cost, need, ttl in ms.
# Returns {admitted, level...}; levels as strings (Lua numbers would come back truncated).
TAKE = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local levels, admitted = {}, 1
for i = 1, #KEYS do
  local a = (i - 1) * 5
  local cap, rate = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local state = redis.call('HMGET', KEYS[i], 't', 'at')
  local level = cap
  if state[1] then level = math.min(cap, tonumber(state[1]) + (now - tonumber(state[2])) * rate) end
  levels[i] = level
  if level < tonumber(ARGV[a + 4]) then admitted = 0 end
end
local reply = {admitted}
for i = 1, #KEYS do
  local a = (i - 1) * 5
  if admitted == 1 then
    levels[i] = levels[i] - tonumber(ARGV[a + 3])
    redis.call('HSET', KEYS[i], 't', tostring(levels[i]), 'at', now)
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 5])
  end
  reply[i + 1] = tostring(levels[i])
end
return reply
"""

# KEYS: the buckets. ARGV, 4 per bucket: capacity, refill per ms, delta, ttl in ms.
ADJUST = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
for i = 1, #KEYS do
  local a = (i - 1) * 4
  local cap, rate = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local state = redis.call('HMGET', KEYS[i], 't', 'at')
  local level = cap
  if state[1] then level = math.min(cap, tonumber(state[1]) + (now - tonumber(state[2])) * rate) end
  level = math.min(cap, level + tonumber(ARGV[a + 3]))
  redis.call('HSET', KEYS[i], 't', tostring(level), 'at', now)
  redis.call('PEXPIRE', KEYS[i], ARGV[a + 4])
end
return 1
"""


class LimitsUnavailable(GatewayError):
    """Redis is unreachable and `on_redis_error` is `fail_closed`."""

    status = 503
    type = "api_error"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisStore:
    def __init__(self, url: str, *, prefix: str, timeout: float, fail_open: bool,
                 on_error: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        self._redis = redis.asyncio.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._take = self._redis.register_script(TAKE)
        self._adjust = self._redis.register_script(ADJUST)
        self._prefix = prefix
        self._fail_open = fail_open
        self._on_error = on_error
        self._local = LocalStore()  # while Redis is away, under fail_open
        self._down_until: float | None = None  # set while Redis is failing
        self._pending: set[asyncio.Task[None]] = set()

    async def take(self, wants: Sequence[Want]) -> Taken:
        if self._down_until is not None and time.monotonic() < self._down_until:
            return self._fallback(wants)
        keys, args = [self._prefix + w.key for w in wants], []
        for w in wants:
            args += [w.capacity, w.per_second / 1000, w.cost, w.need, _ms(w.ttl)]
        try:
            reply = await self._take(keys=keys, args=args)
        except (RedisError, OSError, TimeoutError) as error:
            self._failed(error)
            return self._fallback(wants)
        self._back()
        levels = [float(level) for level in reply[1:]]
        if reply[0] == 1:
            return Taken(True, levels)
        return refused(levels, wants) or Taken(False, levels, 0, 0.001)  # refilled meanwhile: ask again soon

    def adjust(self, changes: Sequence[tuple[Want, float]]) -> None:
        if not changes:
            return
        if self._down_until is not None and time.monotonic() < self._down_until:
            if self._fail_open:
                self._local.adjust(changes)
            return
        task = asyncio.get_running_loop().create_task(self._send_adjust(changes))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send_adjust(self, changes: Sequence[tuple[Want, float]]) -> None:
        keys, args = [self._prefix + w.key for w, _ in changes], []
        for w, delta in changes:
            args += [w.capacity, w.per_second / 1000, delta, _ms(w.ttl)]
        try:
            await self._adjust(keys=keys, args=args)
        except (RedisError, OSError, TimeoutError) as error:
            self._failed(error)
            if self._fail_open:
                self._local.adjust(changes)

    def _fallback(self, wants: Sequence[Want]) -> Taken:
        if not self._fail_open:
            raise LimitsUnavailable("the rate-limit store (Redis) is unreachable; try again shortly", retry_after="1")
        return self._local.take_now(wants)

    def _failed(self, error: BaseException) -> None:
        self._on_error()
        if self._down_until is None:
            policy = "serving on this process's own buckets" if self._fail_open else "answering 503"
            log.warning("limits: Redis is unreachable (%s); %s until it is back", type(error).__name__, policy)
        self._down_until = time.monotonic() + RETRY_AFTER

    def _back(self) -> None:
        if self._down_until is not None:
            self._down_until = None
            log.warning("limits: Redis is reachable again; buckets are shared again")

    async def close(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self._redis.aclose()

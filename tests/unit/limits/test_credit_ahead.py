"""Credit asked ahead (limits/redis_store.py `_ahead`): when a credit is spent, the next is asked
in a task of its own, so no request waits for that round trip; Redis admits what it did before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from dragoman.limits.redis_store import RedisStore
from tests.support.limits import hourly


def counted(store: RedisStore) -> list[int]:
    """The `extra` of each take the store sends Redis (settlements alone left out)."""
    asked: list[int] = []
    call = store._call

    async def counting(wants: Any, settling: Any, extra: int = 0) -> list[bytes]:
        if wants:
            asked.append(extra)
        return await call(wants, settling, extra)

    store._call = counting  # type: ignore[method-assign]
    return asked


def test_a_spent_credit_is_followed_by_the_next_without_a_request_waiting(own_redis):
    """Of 20 requests only the first two ask Redis; each credit of 3 is followed, as it is
    spent, by one of 4 (the take ahead's own share is credit too). Every request sees the
    levels Redis would have reported, and what was not used goes back at the end."""

    async def run() -> list[int]:
        store = RedisStore(own_redis.url, prefix="t:", timeout=1.0, fail_open=True, credit=3)
        asked = counted(store)
        try:
            for n in range(1, 21):
                taken = await store.take([hourly("k", 10_000)])
                assert taken.admitted and taken.levels == [pytest.approx(10_000 - n, abs=1)]
                await asyncio.sleep(0.01)  # the next request comes after the credit asked ahead
        finally:
            await store.close()
        return asked

    asked = asyncio.run(run())
    assert asked == [0, 3, -3, -3, -3, -3], asked  # first seen: no credit; then given; then ahead at 5, 9, 13, 17
    assert float(redis.Redis.from_url(own_redis.url).hget("t:k", "t")) == pytest.approx(10_000 - 20, abs=1)


def test_a_credit_asked_ahead_holds_at_most_a_64th_and_takes_nothing_near_half(own_redis):
    """A bucket of 128 lends at most 2 (1/64), the take ahead's own share counted in; a bucket
    that would fall to half full lends nothing ahead, and takes nothing for it."""

    async def run() -> None:
        store = RedisStore(own_redis.url, prefix="t:", timeout=1.0, fail_open=True, credit=31)
        asked = counted(store)
        client = redis.Redis.from_url(own_redis.url)
        try:
            for n in range(1, 5):  # Redis; Redis, 2 lent; then those 2
                assert (await store.take([hourly("hold", 128)])).levels == [pytest.approx(128 - n, abs=0.1)]
            await asyncio.sleep(0.05)
            assert asked == [0, 31, -31] and [c.left for c in store._credits.values()] == [2]
            assert float(client.hget("t:hold", "t")) == pytest.approx(128 - 4 - 2, abs=0.1)
            client.hset("t:hold", "t", "64.5")  # others took meanwhile: one more would leave it under half
            for level in (123, 122):  # from the credit (its levels are as it was lent)
                assert (await store.take([hourly("hold", 128)])).levels == [pytest.approx(level, abs=0.1)]
            await asyncio.sleep(0.05)
            assert asked == [0, 31, -31, -31] and not any(c.left for c in store._credits.values())
            assert float(client.hget("t:hold", "t")) == pytest.approx(64.5, abs=0.1)  # nothing taken ahead
            assert (await store.take([hourly("hold", 128)])).levels == [pytest.approx(63.5, abs=0.1)]  # Redis decides
        finally:
            await store.close()

    asyncio.run(run())

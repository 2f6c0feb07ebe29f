"""The token-bucket stores: the in-process one with a hand-driven clock, and Redis (real)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest
import redis

from dragoman.core.config_load import from_dict
from dragoman.limits import fallback, gate, redis_slots
from dragoman.limits.redis_store import LimitsUnavailable, RedisStore
from dragoman.limits.store import LocalStore, Want
from tests.support.limits import evalsha_calls, hourly
from tests.support.redis_server import RedisProcess
from tests.support.waiting import eventually_async


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rpm(key: str, limit: int, cost: float = 1.0, need: float | None = None) -> Want:
    return Want(key, limit, limit / 60, cost, cost if need is None else need, 60)


def test_a_bucket_refills_continuously_not_by_window():
    clock = Clock()
    store = LocalStore(clock)
    for _ in range(60):
        assert store.take_now([rpm("k", 60)]).admitted
    refused = store.take_now([rpm("k", 60)])
    assert not refused.admitted and refused.wait == pytest.approx(1.0)
    clock.now += 0.5
    assert not store.take_now([rpm("k", 60)]).admitted
    clock.now += 0.5  # one token a second, as Anthropic's 60 RPM is one request a second
    assert store.take_now([rpm("k", 60)]).admitted
    clock.now += 3600
    assert store.take_now([rpm("k", 60)]).levels == [59.0]  # full again, never more


def test_all_buckets_or_none():
    store = LocalStore(Clock())
    assert store.take_now([rpm("a", 10), rpm("b", 1)]).admitted
    refused = store.take_now([rpm("a", 10), rpm("b", 1)])
    assert not refused.admitted and refused.refused == 1
    assert store.take_now([rpm("a", 10)]).levels == [8.0]  # "a" was not taken from by the refusal


def test_a_cost_past_the_capacity_runs_into_debt():
    clock = Clock()
    store = LocalStore(clock)
    assert store.take_now([rpm("out", 100, cost=150, need=100)]).admitted
    refused = store.take_now([rpm("out", 100, cost=1)])
    assert refused.wait == pytest.approx(0.6 * 51)  # 51 tokens to go at 100/60 a second


def test_a_budget_does_not_refill():
    store = LocalStore(Clock())
    budget = Want("day", 100, 0.0, 0.0, 1.0, 3600)
    store.adjust([(budget, -100.0)])
    assert math.isinf(store.take_now([budget]).wait)


def test_a_seed_starts_only_a_bucket_not_yet_counted():
    store = LocalStore(Clock())
    budget = Want("spend", 100, 0.0, 0.0, 1.0, 3600)
    asyncio.run(store.seed([(budget, -30.0)]))
    asyncio.run(store.seed([(budget, -30.0)]))  # counted already: not charged twice
    assert store.take_now([Want("spend", 100, 0.0, 0.0, 71.0, 3600)]).refused == 0
    assert store.take_now([Want("spend", 100, 0.0, 0.0, 70.0, 3600)]).admitted


def test_in_an_outage_a_budget_shares_what_is_left_of_it():
    """Each of N processes may spend 1/N of what a budget had left (a money budget's bucket holds
    a large span and admits while its level is above a floor: the room above it is shared)."""
    share = fallback.Share(SimpleNamespace(register_script=lambda script: None), "p:")
    share.processes = 2
    span = 4e15  # keys.money.SPAN
    spend = Want("spend", span, 0.0, 0.0, span - 100 + 1, 3600)  # a budget of 100, 40 spent
    tokens = Want("day", 1000, 0.0, 0.0, 1.0, 3600)  # 600 of 1000 tokens used
    share.reported([spend, tokens], [span - 40, 400.0])
    local = LocalStore(Clock())
    assert share.take(local, [replace(spend, cost=30.0), tokens]).admitted  # 30 of the 60 left is this process's
    assert not share.take(local, [replace(spend, cost=1.0)]).admitted
    for _ in range(200):
        assert share.take(local, [tokens]).admitted
        local.adjust([(tokens, -1.0)])
    assert not share.take(local, [tokens]).admitted  # 200 of the 400 left
    fresh = Want("fresh", span, 0.0, 0.0, span - 100 + 1, 3600)  # never reported: the whole budget's share
    assert share.take(local, [replace(fresh, cost=50.0)]).admitted and not share.take(local, [fresh]).admitted


def shared(redis_url: str, prefix: str, credit: int = 0) -> RedisStore:
    """A Redis store; without credit (limits/credit.py) unless asked: every take a round trip."""
    return RedisStore(redis_url, prefix=prefix, timeout=1.0, fail_open=True, credit=credit)


def test_redis_takes_atomically(redis_url, redis_prefix):
    async def run() -> None:
        store = shared(redis_url, redis_prefix)
        try:
            results = await asyncio.gather(*(store.take([rpm("k", 10)]) for _ in range(30)))
            assert sum(r.admitted for r in results) == 10
            refused = next(r for r in results if not r.admitted)
            assert 0 < refused.wait <= 6.0
        finally:
            await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("client", ["pipe", "redis-py"])
def test_redis_adjusts_and_refunds(redis_url, redis_prefix, client):
    # An option only redis-py reads keeps the calls on redis-py: both send the script the same arguments
    url = redis_url if client == "pipe" else redis_url + "?health_check_interval=30"

    async def run() -> None:
        store = shared(url, redis_prefix)
        assert (store.pipe is not None) == (client == "pipe")
        try:
            taken = await store.take([rpm("out", 1000, cost=500)])
            assert taken.levels[0] == pytest.approx(500, abs=20)
            store.adjust([(rpm("out", 1000), 400.0)])  # rides along with the next round trip
            again = await store.take([rpm("out", 1000, cost=0, need=0)])
            assert again.levels[0] == pytest.approx(900, abs=20)
            store.adjust([(rpm("out", 1000), -300.0)])  # or goes alone, soon
            await eventually_async(lambda: not (store._queued or store._pending), "the lone settlement sent")
            other = RedisStore(url, prefix=redis_prefix, timeout=1.0, fail_open=True)
            seen = await other.take([rpm("out", 1000, cost=0, need=0)])
            await other.close()
            assert seen.levels[0] == pytest.approx(600, abs=20)
        finally:
            await store.close()

    asyncio.run(run())


def test_redis_unreachable_fails_open_and_recovers():
    own = RedisProcess().start()
    errors: list[int] = []

    async def run() -> None:
        store = RedisStore(own.url, prefix="t:", timeout=0.5, fail_open=True, on_error=lambda: errors.append(1),
                           retry_after=0.0)  # ask Redis again at the next request  # fmt: skip
        try:
            assert (await store.take([rpm("k", 3)])).admitted
            own.kill()
            taken = [(await store.take([rpm("k", 3)])).admitted for _ in range(4)]
            assert taken == [True, True, False, False]  # this process's own bucket, from Redis's last level (2)
            assert errors
            own.start()
            assert (await store.take([rpm("k", 3)])).admitted  # Redis again (restarted empty: a full bucket)
            assert (await store.take([rpm("k", 3, cost=0, need=0)])).levels[0] == pytest.approx(2, abs=0.2)
        finally:
            await store.close()

    try:
        asyncio.run(run())
    finally:
        own.stop()


def test_redis_unreachable_fails_closed():
    own = RedisProcess()  # never started: nothing listens there

    async def run() -> None:
        store = RedisStore(own.url, prefix="t:", timeout=0.5, fail_open=False)
        try:
            with pytest.raises(LimitsUnavailable) as caught:
                await store.take([rpm("k", 3)])
            assert caught.value.status == 503
        finally:
            await store.close()

    try:
        asyncio.run(run())
    finally:
        own.stop()


def test_redis_takes_one_round_trip_per_request_with_its_settlement(own_redis):
    async def run() -> None:
        store = RedisStore(own_redis.url, prefix="t:", timeout=1.0, fail_open=True, credit=0)
        try:
            for _ in range(20):
                taken = await store.take([rpm("k", 1000), rpm("out", 1000, cost=100)])
                assert taken.admitted
                store.adjust([(rpm("out", 1000), 90.0)])  # the request ended: rides along with the next
        finally:
            await store.close()  # the last settlement goes alone

    asyncio.run(run())
    stats = redis.Redis.from_url(own_redis.url).info("commandstats")
    calls = {name.removeprefix("cmdstat_"): figures["calls"] for name, figures in stats.items()}
    # 20 takes, then the last settlement alone: 21 script runs (each reads Redis's TIME once);
    # the first EVALSHA found no script, which was loaded once and run again
    assert calls["time"] == 21, calls
    assert calls["evalsha"] == 22 and calls.get("script|load", calls.get("script")) == 1, calls
    sent = set(calls) - {"time", "hmget", "hset", "pexpire"}  # those ran inside the script
    assert sent <= {"evalsha", "script|load", "script", "info", "ping", "hello", "client|setinfo", "client"}, calls


@pytest.mark.parametrize("credit", [0, 7])
def test_redis_budget_does_not_refill(redis_url, redis_prefix, credit):
    """Nor does credit given while it was full admit once this process has spent it: a budget
    is charged only at the request's end, and its credit ends with the charge. (Its ttl, the
    time to its period's end, changes with every request; the credit is the same bucket's.)"""

    async def run() -> None:
        store = shared(redis_url, redis_prefix, credit)
        budget = Want("day:2026-12-05", 100, 0.0, 0.0, 1.0, 3600)
        try:
            assert (await store.take([replace(budget, ttl=3601)])).admitted
            assert (await store.take([budget])).admitted  # taken before: credit asked, and given
            assert len(store._credits) == (1 if credit else 0)
            store.adjust([(budget, -100.0)])
            refused = await store.take([budget])
            assert not refused.admitted and math.isinf(refused.wait)
            assert (
                int(redis.Redis.from_url(redis_url).pttl(redis_prefix + budget.key)) > 3_000_000
            )  # kept till its day ends
        finally:
            await store.close()

    asyncio.run(run())


def test_redis_seeds_only_a_bucket_it_holds_nothing_for(redis_url, redis_prefix):
    async def run() -> None:
        store = shared(redis_url, redis_prefix)
        budget, taken = Want("spend:2026-12", 100, 0.0, 0.0, 1.0, 3600), Want("spend:2026-11", 100, 0.0, 5.0, 1.0, 3600)
        try:
            assert (await store.take([taken])).admitted  # counted here already
            await store.seed([(budget, -30.0), (taken, -30.0)])
            await store.seed([(budget, -30.0)])
            levels = (await store.take([replace(w, cost=0.0, need=0.0) for w in (budget, taken)])).levels
            assert levels == [pytest.approx(70.0), pytest.approx(95.0)]
            assert int(redis.Redis.from_url(redis_url).pttl(redis_prefix + budget.key)) > 3_000_000
        finally:
            await store.close()

    asyncio.run(run())


def test_a_redis_that_never_answers_counts_as_unreachable(monkeypatch):
    """Once, without redis-py's own retries: the request is answered under on_redis_error,
    and the next ones do not ask again until RETRY_AFTER."""
    monkeypatch.setattr(fallback.Share, "start", lambda self: None)  # the heartbeat's connection is its own
    accepted: list[socket.socket] = []
    with socket.socket() as silent:  # accepts connections and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.settimeout(0.05)
        done = threading.Event()

        def accept() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    accepted.append(silent.accept()[0])

        acceptor = threading.Thread(target=accept)
        acceptor.start()
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"

        async def run() -> None:
            store = RedisStore(url, prefix="t:", timeout=0.2, fail_open=True)
            try:
                assert (await store.take([rpm("k", 2)])).admitted  # after redis_timeout, on this process's bucket
                assert (await store.take([rpm("k", 2)])).admitted  # not asked again: Redis is down
                assert not (await store.take([rpm("k", 2)])).admitted
            finally:
                store.client.connection_pool.reset()  # its half-open connection: nothing to close politely

        try:
            asyncio.run(run())
        finally:
            done.set()
            acceptor.join()
            for connection in accepted:
                connection.close()
    assert len(accepted) == 1  # one attempt: no retries


def test_a_shared_lease_never_given_back_lapses(redis_url, redis_prefix):
    async def run() -> None:
        store = shared(redis_url, redis_prefix)
        slots = redis_slots.SharedConcurrency(store, lease=0.3)  # a process that died holding it
        try:
            assert await slots.acquire("k", 1, 0) is not None
            assert await slots.acquire("k", 1, 0) is None  # full, and no queue
            assert await slots.acquire("k", 1, 5) is not None  # waited: the first lapsed
        finally:
            await slots.close()
            await store.close()

    asyncio.run(run())


def test_shared_slots_fall_back_to_the_process_while_redis_is_away():
    own = RedisProcess()  # never started

    async def run() -> None:
        store = RedisStore(own.url, prefix="t:", timeout=0.5, fail_open=True)
        slots = redis_slots.SharedConcurrency(store)
        try:
            lease = await slots.acquire("k", 1, 0)
            assert lease == "local" and await slots.acquire("k", 1, 0) is None
            slots.release("k", lease)
            assert await slots.acquire("k", 1, 0) == "local"
        finally:
            await slots.close()
            await store.close()

    try:
        asyncio.run(run())
    finally:
        own.stop()


def test_credit_admits_without_a_round_trip_and_gives_back_what_it_did_not_use(own_redis):
    """Where the buckets are far from empty, one round trip takes several requests' costs
    (limits/credit.py): fewer scripts run, and at the end Redis holds what was used, no less."""

    async def run() -> None:
        store = RedisStore(own_redis.url, prefix="t:", timeout=1.0, fail_open=True, credit=31)
        try:
            for n in range(1, 21):
                taken = await store.take([hourly("k", 10_000), hourly("out", 100_000, cost=10)])
                assert taken.admitted and taken.levels == [
                    pytest.approx(10_000 - n, abs=1),
                    pytest.approx(100_000 - 10 * n, abs=1),
                ]
        finally:
            await store.close()  # the credit's rest goes back

    asyncio.run(run())
    assert evalsha_calls(own_redis.url) <= 20 // 8 + 3  # 20 requests
    assert level_of(own_redis.url, "t:k") == pytest.approx(9_980, abs=1)
    assert level_of(own_redis.url, "t:out") == pytest.approx(99_800, abs=1)


def through_two_stores(
    redis_url: str, redis_prefix: str, wants: list[Want], credit: int, waves: list[int]
) -> list[int]:
    """Bursts of concurrent takes of `wants` (`waves`: each one's size) through two stores in
    turn, then both closed (what their credits still hold goes back): each wave's admitted."""

    async def run() -> list[int]:
        stores = [shared(redis_url, redis_prefix, credit=credit) for _ in range(2)]
        try:
            return [sum(r.admitted for r in await asyncio.gather(*(stores[i % 2].take(wants) for i in range(size))))
                    for size in waves]  # fmt: skip
        finally:
            for store in stores:
                await store.close()

    return asyncio.run(run())


def level_of(redis_url: str, key: str) -> float:
    return float(redis.Redis.from_url(redis_url).hget(key, "t"))


@pytest.mark.parametrize("capacity", [40, 640])
def test_two_stores_with_credit_never_admit_more_than_a_bucket_holds(redis_url, redis_prefix, capacity):
    """Concurrent requests through two processes: credit is taken from the bucket, none below
    half of it, and a request Redis refuses uses a credit given meanwhile. A bucket of 40 gives
    no credit (1/64 of it is less than a request): exactly the capacity. Of 640, a process may
    hold up to 10 it no longer needs while the other is refused; they go back when it ends."""
    burst, later = through_two_stores(redis_url, redis_prefix, [hourly("burst", capacity)], 7, [capacity + 60, 2])
    assert capacity - (0 if capacity < 64 else capacity // 64) <= burst <= burst + later <= capacity
    assert level_of(redis_url, redis_prefix + "burst") == pytest.approx(capacity - burst - later, abs=0.2)


def test_credit_never_takes_a_budget_past_its_edge(redis_url, redis_prefix):
    """A money budget is a bucket that admits while it holds `need` (keys/money.py: a span far
    larger than the budget): credit keeps half of what is left above `need`, not of the span,
    so two processes admit at most the budget, and what they held goes back."""
    budget = [Want("spend", 10_000, 0.0, 1.0, 10_000 - 1_000 + 1, 3600)]  # 1,000 to spend, 1 a request
    admitted = sum(through_two_stores(redis_url, redis_prefix, budget, 31, [100] * 12))  # later waves with credit
    assert 1_000 - 2 * 31 <= admitted <= 1_000
    assert level_of(redis_url, redis_prefix + "spend") == pytest.approx(10_000 - admitted, abs=0.1)


def test_credit_holds_at_most_a_64th_and_leaves_a_bucket_half_full(redis_url, redis_prefix):
    """Credit is asked for wants taken before, holds at most 1/64 of a bucket, and leaves the
    bucket at least half full: of 128, drained to 68 by another process, one process is given
    two on its second take, then none; the other sees what the credit holds, and the 128 are
    admitted exactly."""
    bucket = [hourly("half", 128)]

    async def run() -> None:
        one, other = shared(redis_url, redis_prefix, credit=31), shared(redis_url, redis_prefix)
        try:
            assert all([(await other.take(bucket)).admitted for _ in range(60)])
            assert (await one.take(bucket)).levels == [pytest.approx(67, abs=0.1)]  # first seen: no credit
            assert (await one.take(bucket)).levels == [pytest.approx(66, abs=0.1)]  # 2 more held (128 / 64)
            assert (await other.take(bucket)).levels == [pytest.approx(63, abs=0.1)]
            assert (await one.take(bucket)).levels == [pytest.approx(65, abs=0.1)]  # from the credit
            assert (await one.take(bucket)).levels == [pytest.approx(64, abs=0.1)]
            assert (await one.take(bucket)).levels == [pytest.approx(62, abs=0.1)]  # half full: Redis decides
            rest = [(await (one if i % 2 else other).take(bucket)).admitted for i in range(70)]
            assert rest == [True] * 62 + [False] * 8
        finally:
            await one.close()
            await other.close()

    asyncio.run(run())


def test_a_small_bucket_gives_no_credit(own_redis):
    """A bucket of fewer than 64 requests is decided in Redis request by request, credit or not."""

    async def run() -> None:
        store = RedisStore(own_redis.url, prefix="t:", timeout=1.0, fail_open=True, credit=31)
        try:
            for n in range(1, 11):
                assert (await store.take([hourly("small", 63)])).levels == [pytest.approx(63 - n, abs=0.1)]
            assert not store._credits
        finally:
            await store.close()

    asyncio.run(run())
    assert evalsha_calls(own_redis.url) == 10 + 1  # + the first, unloaded


def test_credit_0_asks_redis_for_every_request(own_redis):
    """`limits.redis_credit = 0` reaches the store: one script run per request, as before credit."""

    async def run() -> None:
        limits = gate.build(from_dict({"limits": {"redis_url": own_redis.url, "redis_credit": 0,
                                                  "requests_per_minute": 1000}}).limits)  # fmt: skip
        assert limits is not None
        try:
            for _ in range(10):
                assert (await limits.store.take([hourly("k", 1000)])).admitted
        finally:
            await limits.close()

    asyncio.run(run())
    assert evalsha_calls(own_redis.url) == 10 + 1  # + the first, unloaded

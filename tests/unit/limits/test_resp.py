"""The limits' own Redis client (`limits.resp`): pipelined calls, each with its own reply,
and failures that reach every call still waiting. Real Redis where it needs one; a
silent or misbehaving server of the test's own otherwise."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis

from dragoman.limits import fallback
from dragoman.limits.redis_store import LimitsUnavailable, RedisStore
from dragoman.limits.resp import Pipe, encode, parse, supported
from dragoman.limits.store import Want


def rpm(key: str, limit: int, cost: float = 1.0) -> Want:
    return Want(key, limit, limit / 60, cost, cost, 60)


@pytest.fixture(autouse=True)
def _no_heartbeat(monkeypatch):
    monkeypatch.setattr(fallback.Share, "start", lambda self: None)  # its connection is redis-py's, not the pipe's


def test_a_reply_cut_anywhere_is_read_whole_once_it_has_come():
    reply = b"*3\r\n:1\r\n$4\r\n12.5\r\n*2\r\n$-1\r\n+OK\r\n"
    more = parse(b"", 0)[0]  # "not yet"
    for cut in range(len(reply)):
        assert parse(reply[:cut], 0) == (more, 0), cut
    assert parse(reply, 0) == ([1, b"12.5", [None, b"OK"]], len(reply))
    error, _ = parse(b"-NOSCRIPT No matching script\r\n", 0)
    assert isinstance(error, redis.exceptions.NoScriptError)


def test_commands_are_written_as_redis_py_writes_them():
    assert (
        encode([b"EVALSHA", "k", 3, 0.5, 1.0])
        == b"*5\r\n$7\r\nEVALSHA\r\n$1\r\nk\r\n$1\r\n3\r\n$3\r\n0.5\r\n$3\r\n1.0\r\n"
    )
    assert encode([1, 1.0]) == b"*2\r\n$1\r\n1\r\n$3\r\n1.0\r\n"  # remembered apart: 1 is not 1.0 to Redis
    assert encode(["é"]) == b"*1\r\n$2\r\n\xc3\xa9\r\n"  # lengths in bytes


def test_urls_with_options_stay_with_redis_py():
    assert supported("redis://:pw@127.0.0.1:6379/2") and supported("unix:///run/redis.sock") and supported("rediss://h")
    assert not supported("rediss://h?ssl_cert_reqs=none")


def test_concurrent_calls_share_one_write_and_each_gets_its_own_reply(redis_url, redis_prefix):
    async def run() -> None:
        pipe = Pipe(redis_url, 1.0)
        try:
            await pipe.call(b"PING")  # connected: what follows is pipelined
            link = pipe._link
            assert link is not None and link.transport is not None
            writes: list[bytes] = []
            write = link.transport.write
            link.transport.write = lambda data: (writes.append(data), write(data))[1]  # type: ignore[method-assign]
            keys = [f"{redis_prefix}n{i}" for i in range(40)]
            replies = await asyncio.gather(*(pipe.call(b"INCRBY", key, i) for i, key in enumerate(keys)))
            assert replies == list(range(40))
            assert len(writes) <= 2  # the first goes at once, the rest together
        finally:
            await pipe.close()

    asyncio.run(run())


def test_pipelined_takes_each_get_their_own_verdict(redis_url, redis_prefix):
    """Concurrent requests' scripts share round trips; each one's levels and verdict are its own."""

    async def run() -> None:
        store = RedisStore(redis_url, prefix=redis_prefix, timeout=1.0, fail_open=False)
        try:
            wants = [rpm(f"b{i}", 10 + i, cost=float(i % 12)) for i in range(30)]
            taken = await asyncio.gather(*(store.take([want]) for want in wants))
            for want, result in zip(wants, taken, strict=True):
                assert result.admitted
                assert result.levels[0] == pytest.approx(want.capacity - want.cost, abs=0.5)
            again = await asyncio.gather(*(store.take([rpm("shared", 5)]) for _ in range(12)))
            assert sum(result.admitted for result in again) == 5
        finally:
            await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_redis_error_for_one_call_in_a_pipeline_is_that_calls_alone(redis_url, redis_prefix, fail_open):
    """A script that fails in Redis (here: its bucket is not a hash) answers under on_redis_error;
    the calls beside it in the same round trip keep Redis's verdicts."""
    redis.Redis.from_url(redis_url).set(redis_prefix + "broken", "not a bucket")

    async def run() -> None:
        store = RedisStore(redis_url, prefix=redis_prefix, timeout=1.0, fail_open=fail_open)
        try:
            await store.take([rpm("warm", 10)])  # connected, so the next three go in one round trip
            wants = [rpm("a", 10, cost=3), rpm("broken", 10), rpm("b", 10, cost=4)]
            results = await asyncio.gather(*(store.take([want]) for want in wants), return_exceptions=True)
            assert results[0].levels == [pytest.approx(7, abs=0.5)]  # type: ignore[union-attr]
            assert results[2].levels == [pytest.approx(6, abs=0.5)]  # type: ignore[union-attr]
            if fail_open:
                assert results[1].admitted  # type: ignore[union-attr]
            else:
                assert isinstance(results[1], LimitsUnavailable)
        finally:
            await store.close()

    asyncio.run(run())


class Server(asyncio.Protocol):
    """Reads commands; answers the first `answer` with a taken bucket, then drops the connection,
    or (with `answer` None) never answers."""

    def __init__(self, answer: int | None) -> None:
        self.answer, self.seen, self.rest = answer, 0, b""
        self.connections: list[asyncio.Transport] = []

    def __call__(self) -> Server:
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.connections.append(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        buf, pos = self.rest + data, 0
        while True:
            command, pos = parse(buf, pos)
            if not isinstance(command, list):
                break
            self.seen += 1
            if self.answer is None:
                continue
            if self.seen <= self.answer:
                self.transport.write(b"*2\r\n:1\r\n$1\r\n9\r\n")  # type: ignore[attr-defined]
            else:
                self.transport.close()  # type: ignore[attr-defined]
                return
        self.rest = buf[pos:]


@contextlib.asynccontextmanager
async def serving(answer: int | None):
    server = Server(answer)
    listening = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
    try:
        yield server, f"redis://127.0.0.1:{listening.sockets[0].getsockname()[1]}/0"
    finally:
        for transport in server.connections:
            transport.abort()
        listening.close()


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_connection_lost_mid_pipeline_fails_only_the_calls_still_waiting(fail_open):
    async def run() -> None:
        async with serving(answer=3) as (_, url):
            store = RedisStore(url, prefix="t:", timeout=1.0, fail_open=fail_open)
            await store.take([rpm("warm", 10)])  # connected: the five go out in order, the last four together
            results = await asyncio.gather(*(store.take([rpm(f"k{i}", 10)]) for i in range(5)), return_exceptions=True)
            assert [getattr(r, "levels", None) for r in results[:2]] == [[9.0], [9.0]]  # Redis's answers
            for result in results[2:]:  # the connection went: the process's own buckets, or a 503
                if fail_open:
                    assert result.admitted and result.levels == [pytest.approx(9)]  # type: ignore[union-attr]
                else:
                    assert isinstance(result, LimitsUnavailable)
            assert store.down()
            await store.close()

    asyncio.run(run())


def test_a_silent_redis_times_out_every_waiting_call_and_is_dialled_again():
    async def run() -> None:
        async with serving(answer=None) as (server, url):
            pipe = Pipe(url, 0.2)
            results = await asyncio.gather(*(pipe.call(b"PING") for _ in range(3)), return_exceptions=True)
            assert all(isinstance(result, TimeoutError) for result in results), results
            with pytest.raises(TimeoutError):
                await pipe.call(b"PING")
            assert len(server.connections) == 2  # the timed-out connection is not reused
            await pipe.close()

    asyncio.run(run())


def test_a_caller_that_goes_away_does_not_shift_the_replies(redis_url, redis_prefix):
    async def run() -> None:
        pipe = Pipe(redis_url, 1.0)
        try:
            await pipe.call(b"SET", redis_prefix + "x", "1")
            gone = asyncio.ensure_future(pipe.call(b"GET", redis_prefix + "x"))
            kept = asyncio.ensure_future(pipe.call(b"INCR", redis_prefix + "x"))
            await asyncio.sleep(0)
            gone.cancel()
            assert await kept == 2
            assert await pipe.call(b"GET", redis_prefix + "x") == b"2"
        finally:
            await pipe.close()

    asyncio.run(run())


def test_the_database_and_password_of_the_url_are_used(redis_url, redis_prefix):
    async def run() -> None:
        pipe = Pipe(redis_url.rsplit("/", 1)[0] + "/3", 1.0)
        try:
            await pipe.call(b"SET", redis_prefix + "db", "3")
        finally:
            await pipe.close()
        wrong = Pipe(redis_url.replace("redis://", "redis://:not-the-password@"), 1.0)
        with pytest.raises(redis.RedisError):
            await wrong.call(b"PING")
        await wrong.close()

    asyncio.run(run())
    in_three = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/3")
    assert in_three.get(redis_prefix + "db") == b"3"
    in_three.delete(redis_prefix + "db")


def test_a_pipe_used_from_another_event_loop_dials_again(redis_url, redis_prefix):
    pipe = Pipe(redis_url, 1.0)

    async def incr() -> int:
        return await pipe.call(b"INCR", redis_prefix + "loops")  # type: ignore[no-any-return]

    assert asyncio.run(incr()) == 1  # the first loop ends with its connection still open
    assert asyncio.run(incr()) == 2
    asyncio.run(pipe.close())

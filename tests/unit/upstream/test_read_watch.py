"""ReadWatch: one timer per upstream stream turns silence into pings and a dead
upstream into a timeout, without ever cancelling anything but its own read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dragoman.core.errors import UpstreamTimeout
from dragoman.upstream.keepalive import CLOCK_SLACK, ReadWatch, Silence
from tests.support.waiting import eventually_async


class Feed:
    """A read that is safe to cancel and retry, like aiohttp's readany()."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def read(self) -> asyncio.Future[bytes] | object:
        return self.queue.get()


LOOPS = {"asyncio": asyncio.new_event_loop}
try:
    import uvloop

    LOOPS["uvloop"] = uvloop.new_event_loop  # the server's loop: its clock ticks in milliseconds
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(params=sorted(LOOPS), autouse=True)
def loop_kind(request: pytest.FixtureRequest) -> str:
    global run_with
    run_with = LOOPS[request.param]
    return request.param


run_with = asyncio.new_event_loop


def run(coro: object) -> object:
    with asyncio.Runner(loop_factory=run_with) as runner:
        return runner.run(coro)  # type: ignore[arg-type]


async def bounded(coro: Any) -> Any:
    """`coro`, failing if it is not done in 10 s: a timeout that never fires fails the test
    instead of hanging it. Generous on purpose: what a test asserts of times it asserts itself."""
    return await asyncio.wait_for(coro, 10)


def test_data_in_time_passes_and_silence_raises_silence_then_data_resumes() -> None:
    async def main() -> list[object]:
        feed = Feed()
        watch = ReadWatch(interval=0.05, first_byte_timeout=5, idle_timeout=5, upstream="up")
        seen: list[object] = []
        feed.queue.put_nowait(b"a")  # there before the read: no timer can get between (on a loaded machine it could)
        for _ in range(6):
            try:
                data = await watch.read(feed.queue.get())
            except Silence:
                seen.append("ping")
                if seen.count("ping") == 2:
                    feed.queue.put_nowait(b"b")  # after two quiet intervals
                continue
            seen.append(data)
            if data == b"b":
                break
        watch.close()
        return seen

    seen = run(main())
    assert seen[0] == b"a" and seen[-1] == b"b"
    assert seen[1:-1] == ["ping", "ping"]


def test_many_fast_reads_never_ping() -> None:
    """A token every 5 ms for 200 ms: ten intervals, none quiet, so no ping, unless the loop
    itself did not run for an interval (a loaded machine: then the reads did not happen
    either, and a ping is right). So what is asserted is that every ping, if any, came
    after a whole interval without a read as the loop saw it, never within one."""

    async def main() -> tuple[int, list[float]]:
        watch = ReadWatch(interval=0.02, first_byte_timeout=5, idle_timeout=5, upstream="up")
        reads, quiet_before_pings = 0, []
        loop = asyncio.get_running_loop()
        end = loop.time() + 0.2
        last = loop.time()  # the last read, or ping
        while loop.time() < end:
            try:
                await watch.read(asyncio.sleep(0.005))
                reads += 1
            except Silence:
                quiet_before_pings.append(loop.time() - last)
            last = loop.time()
        watch.close()
        return reads, quiet_before_pings

    reads, quiet_before_pings = run(main())  # type: ignore[misc]
    assert reads > 0
    assert all(quiet >= 0.02 - CLOCK_SLACK for quiet in quiet_before_pings), quiet_before_pings


def test_first_byte_timeout_then_idle_timeout() -> None:
    async def main() -> tuple[list[str], float]:
        watch = ReadWatch(interval=0.03, first_byte_timeout=0.5, idle_timeout=60, upstream="up")
        events = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        feed = Feed()
        while True:
            try:
                await watch.read(feed.read())
            except Silence:
                events.append("ping")
            except UpstreamTimeout as error:
                events.append(error.message)
                break
        watch.close()
        return events, loop.time() - start

    events, took = run(bounded(main()))
    assert (
        events[:-1] == ["ping"] * len(events[:-1]) and len(events) >= 3
    )  # pings meanwhile (a stall of 0.45 s could skip them)
    assert events[-1] == "upstream up sent nothing for longer than its idle timeout"
    assert took >= 0.5 - CLOCK_SLACK  # and the first-byte timeout, not the idle one: that would pass `bounded`


def test_after_data_the_idle_timeout_applies() -> None:
    async def main() -> float:
        watch = ReadWatch(interval=60, first_byte_timeout=60, idle_timeout=0.05, upstream="up")
        loop = asyncio.get_running_loop()
        await watch.read(asyncio.sleep(0, b"x"))
        start = loop.time()
        with pytest.raises(UpstreamTimeout):
            await watch.read(Feed().read())
        watch.close()
        return loop.time() - start

    assert run(bounded(main())) >= 0.05 - CLOCK_SLACK  # type: ignore[operator]  # the idle timeout: the others would pass `bounded`


def test_another_cancellation_is_not_swallowed() -> None:
    async def reader(watch_box: list[ReadWatch]) -> None:
        watch = ReadWatch(interval=5, first_byte_timeout=5, idle_timeout=5, upstream="up")
        watch_box.append(watch)
        try:
            await watch.read(Feed().read())
        finally:
            watch.close()

    async def main() -> None:
        box: list[ReadWatch] = []
        task = asyncio.ensure_future(reader(box))
        await eventually_async(lambda: box, "the read begun")
        task.cancel()  # a client hanging up
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())


def test_a_slow_write_to_the_client_is_never_cancelled() -> None:
    async def main() -> list[str]:
        watch = ReadWatch(interval=0.02, first_byte_timeout=5, idle_timeout=5, upstream="up")
        log = []
        await watch.read(asyncio.sleep(0, b"x"))
        await asyncio.sleep(0.1)  # "writing": the timer fires meanwhile and must leave this alone
        log.append("wrote")
        try:
            await watch.read(Feed().read())
        except Silence:
            log.append("ping")
        watch.close()
        return log

    assert run(main()) == ["wrote", "ping"]


def test_close_stops_the_timer() -> None:
    async def main() -> None:
        watch = ReadWatch(interval=0.01, first_byte_timeout=0.02, idle_timeout=0.02, upstream="up")
        watch.close()
        await asyncio.sleep(0.05)  # the task is not cancelled by a timer left behind

    run(main())


def test_head_or_task_returns_a_quick_head_and_hands_over_a_slow_one() -> None:
    from dragoman.upstream.keepalive import head_or_task

    async def head(delay: float) -> str:
        await asyncio.sleep(delay)
        return "head"

    async def main() -> tuple[object, object]:
        quick = await head_or_task(head(0.0), 5)  # generous: a head that is ready at once, on a loaded machine too
        slow = await head_or_task(head(0.2), 0.02)
        assert isinstance(slow, asyncio.Task) and not slow.done()
        return quick, await slow

    assert run(main()) == ("head", "head")


def test_head_or_task_cancelled_cancels_the_upstream_request() -> None:
    from dragoman.upstream.keepalive import head_or_task

    started: list[asyncio.Task[object]] = []

    async def head() -> str:
        started.append(asyncio.current_task())  # type: ignore[arg-type]
        await asyncio.sleep(10)
        return "head"

    async def main() -> bool:
        waiting = asyncio.ensure_future(head_or_task(head(), 5))
        await eventually_async(lambda: started, "the upstream request begun")
        waiting.cancel()  # the client left while the upstream was thinking
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0)
        return started[0].cancelled()

    assert run(main()) is True


def test_head_or_task_raises_the_upstream_error() -> None:
    from dragoman.upstream.keepalive import head_or_task

    async def refused() -> str:
        raise UpstreamTimeout("no")

    async def main() -> None:
        with pytest.raises(UpstreamTimeout):
            await head_or_task(refused(), 1)

    run(main())

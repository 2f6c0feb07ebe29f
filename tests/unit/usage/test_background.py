"""The usage writer's own thread (`usage.background`): its bursts of work run below the event
loop's CPU priority, so that on one CPU they wait for the requests rather than slow them."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from dragoman.usage.background import NICENESS, Background


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_its_work_runs_below_the_loops_priority() -> None:
    async def main() -> tuple[int, int]:
        background = Background("test-usage")
        try:
            return niceness(), await background(niceness)
        finally:
            background.close()

    loop_nice, thread_nice = asyncio.run(main())
    assert thread_nice == min(19, loop_nice + NICENESS)
    assert niceness() == loop_nice  # the caller's own is left as it was


def test_work_runs_in_order_on_one_thread_and_again_after_a_close() -> None:
    async def main() -> list[tuple[int, str]]:
        background = Background("test-usage")
        done = [await background(lambda n=n: (n, threading.current_thread().name)) for n in range(3)]
        background.close()
        done.append(await background(lambda: (3, threading.current_thread().name)))  # a store reopened
        background.close()
        return done

    done = asyncio.run(main())
    assert [n for n, _ in done] == [0, 1, 2, 3]
    assert len({name for _, name in done[:3]}) == 1 and all(name.startswith("test-usage") for _, name in done)

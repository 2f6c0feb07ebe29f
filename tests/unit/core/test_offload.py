"""Slow work off the event loop: a few threads of its own, and a bounded queue before them."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dragoman.core.errors import Overloaded
from dragoman.core.offload import Offload


def test_past_the_waiting_bound_a_call_is_refused_with_a_529() -> None:
    offload = Offload(workers=2, max_waiting=1)
    release = threading.Event()

    async def main() -> None:
        busy = [asyncio.create_task(offload(release.wait, 10)) for _ in range(offload.workers + 1)]
        await asyncio.sleep(0)  # each has taken its place
        with pytest.raises(Overloaded) as refused:
            await offload(len, "x")
        assert refused.value.status == 529
        release.set()
        assert await asyncio.gather(*busy) == [True] * (offload.workers + 1)
        assert await offload(len, "abc") == 3  # places free again

    try:
        asyncio.run(main())
    finally:
        offload.close()


def test_closed_its_waiting_calls_are_cancelled() -> None:
    offload = Offload(workers=1)
    release = threading.Event()

    async def main() -> None:
        running = asyncio.create_task(offload(release.wait, 10))
        waiting = asyncio.create_task(offload(len, "x"))
        await asyncio.sleep(0)  # both have been handed to the pool
        offload.close()
        release.set()
        assert await running is True  # a thread cannot be stopped: it ends on its own
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())

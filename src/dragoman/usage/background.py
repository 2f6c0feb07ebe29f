"""A thread of its own for SQLite's writes of usage records, at a lower CPU priority than the
event loop's.

They come in bursts: once a second SQLite stores a second's records, about 8 µs of CPU each
(20 ms at 2,500 requests a second). On a gateway given one CPU, a burst on an ordinary thread
shares the CPU with the requests served meanwhile, which waited in the run queue for it
(docs/performance.md). At a lower priority the thread runs while the loop waits, and gives
way as soon as a request needs the CPU; under saturation it still gets about a tenth of it,
twice what writing 6,000 records a second costs. (The journal's steps, a few hundred µs
each, stay at the loop's priority: a record must reach the journal within 0.2 s.) On Linux a
thread's nice value is its own; elsewhere the thread keeps the process's priority."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

NICENESS = 10  # added to the process's: CFS weighs a thread at +10 about a tenth of one at +0


def _lower_priority() -> None:
    if sys.platform != "linux":
        return  # setpriority(PRIO_PROCESS, tid) sets one thread's priority only on Linux
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):  # not allowed (an unusual sandbox): the thread keeps the process's
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICENESS))


class Background:
    """One low-priority thread, made when first needed: work given to it runs in order, one
    call at a time. Closed, it makes a new thread if given work again (a store reopened)."""

    __slots__ = ("_name", "_pool")

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None

    async def __call__(self, work: Callable[..., T], *args: object) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._name, initializer=_lower_priority)
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(work, *args))

    def close(self) -> None:
        """The thread ends once the work given to it has (nothing waits for that here)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.shutdown(wait=False)

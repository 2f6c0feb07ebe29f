"""Work too slow for the event loop (a PDF's text, many MB of base64 images to check), run
on threads of its own: a few at a time, so that a flood of it (six hostile PDFs once held
the Files API up for two minutes) waits its turn instead of taking every thread of the
default executor, which storage, the Files API and batches use. Past `max_waiting` calls
waiting, a call is answered 529 at once.

The gateway owns one `Offload` (in `backends.shared.Shared`) and shuts its threads down
in its `close()`; a test makes its own with the bounds it needs."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from dragoman.core.errors import Overloaded

T = TypeVar("T")

WORKERS = 2  # slow translations at once, per gateway
MAX_WAITING = 32  # more waiting than this, and a call is refused


class Offload:
    """The slow-work threads of one gateway, and how many calls may wait for them."""

    __slots__ = ("workers", "max_waiting", "_pool", "_calls")

    def __init__(self, workers: int = WORKERS, max_waiting: int = MAX_WAITING) -> None:
        self.workers = workers
        self.max_waiting = max_waiting
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dragoman-slow")  # threads made on use
        self._calls = 0  # running and waiting

    async def __call__(self, work: Callable[..., T], *args: object) -> T:
        """`work(*args)` on the slow-work threads."""
        if self._calls >= self.workers + self.max_waiting:
            raise Overloaded("too many requests with PDFs or large images are waiting to be read; send it again later")
        self._calls += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(work, *args))
        finally:
            self._calls -= 1

    def close(self) -> None:
        """Calls still waiting are cancelled; a call running ends on its own (a thread cannot be stopped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

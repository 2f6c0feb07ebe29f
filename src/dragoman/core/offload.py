"""Work too slow for the event loop (a PDF's text, many MB of base64 images to check), run
on threads of its own: a few at a time, so that a flood of it (six hostile PDFs once held
the Files API up for two minutes) waits its turn instead of taking every thread of the
default executor, which storage, the Files API and batches use. Past MAX_WAITING calls
waiting, a call is answered 529 at once."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from dragoman.core.errors import Overloaded

T = TypeVar("T")

WORKERS = 2  # slow translations at once, per process
MAX_WAITING = 32  # more waiting than this, and a call is refused

_pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="dragoman-slow")
_calls = 0  # running and waiting


async def offload(work: Callable[..., T], *args: object) -> T:
    """`work(*args)` on the slow-work threads."""
    global _calls
    if _calls >= WORKERS + MAX_WAITING:
        raise Overloaded("too many requests with PDFs or large images are waiting to be read; send it again later")
    _calls += 1
    try:
        return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(work, *args))
    finally:
        _calls -= 1

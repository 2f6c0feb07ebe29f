"""Keeping quiet streams alive, and telling a quiet upstream from a dead one.

Clients abort long silences (Claude Code after a few minutes), while a long prompt
or long reasoning can keep a backend silent for as long. So:
- a stream whose upstream has not answered within one keep-alive interval is
  committed to HTTP 200 and gets SSE comment lines until it does (an upstream
  refusal after that arrives as an `error` event, as Anthropic sends them);
- once `message_start` has gone out, silence is filled with `ping` events;
- silence longer than the upstream's idle timeout is an error, never hidden by pings.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from dragoman.errors import GatewayError, UpstreamTimeout
from dragoman.sse import KEEPALIVE_COMMENT

T = TypeVar("T")


class Silence(Exception):
    """One keep-alive interval passed without data (internal signal, never escapes)."""


async def read_or_ping(read: Awaitable[T], *, interval: float, deadline: float, upstream: str) -> T:
    """Await one read; raise Silence after `interval`, UpstreamTimeout past `deadline`
    (loop time). The read must be safe to cancel and to start again."""
    loop = asyncio.get_running_loop()
    remaining = deadline - loop.time()
    if remaining <= 0:
        raise UpstreamTimeout(f"upstream {upstream} sent nothing for longer than its idle timeout")
    wait = min(interval, remaining)
    try:
        async with asyncio.timeout(wait):
            return await read
    except TimeoutError:
        if loop.time() >= deadline:
            raise UpstreamTimeout(f"upstream {upstream} sent nothing for longer than its idle timeout") from None
        raise Silence from None


async def head_or_task(start: Awaitable[T], interval: float) -> T | asyncio.Task[T]:
    """The upstream's response if it comes within `interval`, else the pending task."""
    task = asyncio.ensure_future(start)
    done, _ = await asyncio.wait({task}, timeout=interval)
    if done:
        return task.result()  # raises the mapped GatewayError: an ordinary HTTP error
    return task  # type: ignore[return-value]


async def late_start(
    task: asyncio.Task[T], interval: float, then: Callable[[T], AsyncIterator[bytes]]
) -> AsyncIterator[bytes]:
    """Comment lines while the upstream thinks, then the stream `then` makes of it."""
    handed_over = False
    try:
        while not task.done():
            yield KEEPALIVE_COMMENT
            await asyncio.wait({task}, timeout=interval)
        try:
            response = task.result()
        except GatewayError as error:
            yield error.event()
            return
        handed_over = True
        async for chunk in then(response):
            yield chunk
    finally:
        if not task.done():
            task.cancel()  # the client left before the upstream answered
        elif not handed_over and not task.cancelled() and task.exception() is None:
            close = getattr(task.result(), "close", None)
            if close is not None:
                close()

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

from dragoman.core.config import UpstreamConfig
from dragoman.core.errors import UpstreamTimeout
from dragoman.protocol.sse import KEEPALIVE_COMMENT
from dragoman.upstream.transport.response import Response

T = TypeVar("T")


class Silence(Exception):
    """One keep-alive interval passed without data (internal signal, never escapes)."""


CLOCK_SLACK = 0.001  # the loop's clock may tick in milliseconds: a timer can fire a little early


class ReadWatch:
    """Times the reads of one upstream stream with a single timer.

    A timeout context per read would arm and cancel a timer for every token; here
    each read only notes the time, and one timer, re-armed lazily when it fires
    early, cancels the read that has waited a keep-alive interval (`Silence`, the
    caller pings) or past the idle deadline (`UpstreamTimeout`). It cancels only a
    read in progress, never a write to the client, and tells its own cancellation
    from any other (a client hanging up). Reads must be safe to cancel and retry.
    """

    __slots__ = ("_loop", "_task", "_interval", "_idle", "_upstream", "_quiet_since", "_deadline",
                 "_reading", "_fired", "_handle", "_armed_at")  # fmt: skip

    def __init__(self, *, interval: float, first_byte_timeout: float, idle_timeout: float, upstream: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task(self._loop)
        self._interval = interval
        self._idle = idle_timeout
        self._upstream = upstream
        now = self._loop.time()
        self._quiet_since = now  # last data, or last Silence
        self._deadline = now + first_byte_timeout
        self._reading = False
        self._fired = False
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = 0.0
        self._arm(now)

    @classmethod
    def for_upstream(cls, upstream: UpstreamConfig, *, interval: float, name: str) -> ReadWatch:
        """The watch for one stream from `upstream`, with its configured timeouts."""
        return cls(
            interval=interval,
            first_byte_timeout=upstream.first_byte_timeout,
            idle_timeout=upstream.idle_timeout,
            upstream=name,
        )

    async def read(self, read: Awaitable[T]) -> T:
        """Await one read; raise Silence after a quiet interval, UpstreamTimeout past the deadline."""
        self._reading = True
        try:
            data = await read
        except asyncio.CancelledError:
            if not self._fired:
                raise
            self._fired = False
            if self._task is not None and self._task.uncancel() > 0:
                raise  # cancelled for another reason too
            now = self._loop.time()
            if now >= self._deadline - CLOCK_SLACK:
                raise UpstreamTimeout(
                    f"upstream {self._upstream} sent nothing for longer than its idle timeout"
                ) from None
            self._quiet_since = now
            self._arm(now)
            raise Silence from None
        finally:
            self._reading = False
        self.touch()
        return data

    def touch(self) -> None:
        """Data arrived (by `read`, or to a sink of `Response.drain_to` meanwhile)."""
        now = self._loop.time()
        self._quiet_since = now
        self._deadline = now + self._idle
        if self._deadline < self._armed_at and self._handle is not None:  # an idle timeout shorter than the interval
            self._handle.cancel()
            self._handle = None
            self._arm(now)

    def expect_by(self, deadline: float) -> None:
        """The next data is due by `deadline` (the loop's clock), not `first_byte_timeout` from
        now: a stream's first body bytes, due within first_byte_timeout of its request."""
        self._deadline = deadline
        if self._handle is not None and self._due() < self._armed_at:
            self._handle.cancel()
            self._handle = None
        self._arm(self._loop.time())

    def _due(self) -> float:
        return min(self._quiet_since + self._interval, self._deadline)

    def _arm(self, now: float) -> None:
        if self._handle is None:
            self._armed_at = max(self._due(), now)
            self._handle = self._loop.call_at(self._armed_at, self._check)

    def _check(self) -> None:
        self._handle = None
        now = self._loop.time()
        due = self._due()
        if now < due - CLOCK_SLACK:
            self._arm(now)  # data came since the timer was set: wait for the new due time
        elif not self._reading or self._task is None:
            self._armed_at = now + self._interval  # busy writing to the client: not the upstream's silence
            self._handle = self._loop.call_at(self._armed_at, self._check)
        else:
            self._fired = True
            self._task.cancel()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def head_or_task(start: Awaitable[T], interval: float) -> T | asyncio.Task[T]:
    """The upstream's response if it comes within `interval`, else the pending task.

    Every stream passes here, so it is one task, one future and one timer (what
    `asyncio.wait` would build, less its bookkeeping). If the caller is cancelled (the
    client left), the upstream request is cancelled with it."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(start, loop=loop)
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    timer = loop.call_later(interval, wake)
    try:
        await waiter
    except BaseException:
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:  # answered as the caller was cancelled
            close = getattr(task.result(), "close", None)
            if close is not None:
                close()
        raise
    finally:
        timer.cancel()
        task.remove_done_callback(wake)
    if task.done():
        return task.result()  # raises the mapped GatewayError: an ordinary HTTP error
    return task


async def late_start(
    task: asyncio.Task[T], interval: float, then: Callable[[T], AsyncIterator[bytes]]
) -> AsyncIterator[bytes]:
    """Comment lines while the upstream thinks, then the stream `then` makes of it."""
    handed_over = False
    try:
        while not task.done():
            yield KEEPALIVE_COMMENT
            await asyncio.wait({task}, timeout=interval)
        response = task.result()  # a refusal raises: the stream's relay sends it as an error event, and records it
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


AFTER_END_GRACE = 1.0  # seconds a server may take to end its body after the stream's own end


class BodyEnds:
    """The bodies one gateway still reads after their stream's own end (`[DONE]`,
    `message_stop`), each for at most `grace` seconds; `close()` (the gateway's) stops them."""

    __slots__ = ("grace", "_reading")

    def __init__(self, grace: float = AFTER_END_GRACE) -> None:
        self.grace = grace
        self._reading: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    def end_body(self, response: Response) -> None:
        """The connection goes back to the pool once the rest of the body, normally only its
        terminator, is read. The client's reply ends now, whatever the server does: one that
        keeps its body open is read in the background for `grace` seconds, and its connection
        is then closed, not reused."""
        if response.ended:
            response.release()
            return
        task = asyncio.ensure_future(self._read_past_end(response))
        self._reading.add(task)
        task.add_done_callback(self._reading.discard)

    async def _read_past_end(self, response: Response) -> None:
        try:
            async with asyncio.timeout(self.grace):
                while await response.readany():
                    pass  # bytes after the end belong to no reply
        except asyncio.CancelledError:  # the gateway is closing
            response.close()
            raise
        except Exception:  # noqa: BLE001 - a timeout, or the connection failing: either way it is not reused
            response.close()
        else:
            response.release()

    async def close(self) -> None:
        """The bodies still being read are closed, not reused."""
        reading = list(self._reading)
        for task in reading:
            task.cancel()
        if reading:
            await asyncio.wait(reading)

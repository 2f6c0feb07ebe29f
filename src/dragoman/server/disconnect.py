"""Noticing a client that hangs up, so the upstream request is closed at once.

The ASGI server reports a hang-up only to whoever awaits `receive()`. A watcher
task does that and cancels the task serving the request, which closes the
upstream request on the way out. For a short request the watcher is never even
started: it is scheduled with `call_later` and cancelled when the request ends.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive

WATCH_AFTER = 0.05  # seconds: requests that finish sooner cost a timer, not a task


class ClientLeft(Exception):
    """The client hung up before its reply was ready."""


class DisconnectWatch:
    __slots__ = ("_handle", "_loop", "_receive", "_target", "_task", "left")

    def __init__(self, receive: Receive, *, after: float = WATCH_AFTER) -> None:
        self._receive = receive
        self._loop = loop = asyncio.get_running_loop()  # once: each lookup is a getpid() system call
        self._target = asyncio.current_task(loop)
        self._task: asyncio.Task[None] | None = None
        self.left = False
        self._handle: asyncio.Handle | None = loop.call_later(after, self._start) if after > 0 else None
        if after <= 0:
            self._start()

    def _start(self) -> None:
        self._handle = None
        self._task = self._loop.create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.left = True
        if self._target is not None:
            self._target.cancel()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def absorb(self) -> None:
        """Turn the cancellation this watch caused into ClientLeft; call it from an
        `except CancelledError` block. Any other cancellation goes on."""
        if not self.left:
            return
        if self._target is not None:
            self._target.uncancel()
        raise ClientLeft

"""A gateway's life in a serving process: started, swapped for another on SIGHUP, drained, closed.

    SIGHUP ─▶ configuration read (in a thread) ─▶ a new Gateway built and started
           ─▶ swapped in (the listening socket never closes) ─▶ the old one drained, then closed

A request is served whole by the gateway it began on: its upstreams, keys and limits. Requests
that began before the swap finish on the old gateway, which is closed once the last of them
has ended; new ones get the new. A configuration that fails to load or build is refused: its
errors are logged and the old one serves on.

What outlives a configuration is handed over: the in-process limit buckets and concurrency
slots (a spent budget stays spent; with Redis they live there anyway) and the held
conversations of message threads. The batches being run are let go and taken over by the new
gateway's keeper, as a dead process's are (a request in flight in them runs again). Metrics
start again from zero, as after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Protocol

from dragoman.assembly.gateway import Gateway
from dragoman.core.config import Config, ConfigError
from dragoman.limits.slots import Concurrency
from dragoman.limits.store import LocalStore
from dragoman.server.lifecycle import Running

log = logging.getLogger("dragoman")

_FIXED = ("host", "port", "max_connections", "shutdown_grace", "log_level")  # the server's, read once at start
CLOSE_WAIT = 5.0  # seconds a shutdown waits for old gateways to close on their own


class Swappable(Protocol):
    """What the reloader swaps a gateway into (`server.app.App`)."""

    gateway: Gateway
    in_flight: InFlight

    def swap(self, gateway: Gateway) -> Gateway: ...


class InFlight:
    """Requests being served, counted by the gateway they began on (by identity)."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._ended: dict[int, asyncio.Event] = {}

    def begin(self, gateway: Gateway) -> None:
        key = id(gateway)  # alive while counted: the request holds it
        self._counts[key] = self._counts.get(key, 0) + 1

    def end(self, gateway: Gateway) -> None:
        key = id(gateway)
        left = self._counts[key] - 1
        if left:
            self._counts[key] = left
            return
        del self._counts[key]
        ended = self._ended.pop(key, None)
        if ended is not None:
            ended.set()

    async def drained(self, gateway: Gateway) -> None:
        """Once no request that began on `gateway` is still being served."""
        if id(gateway) in self._counts:
            await self._ended.setdefault(id(gateway), asyncio.Event()).wait()


def hand_over(old: Gateway, new: Gateway) -> bool:
    """The new gateway takes the old one's in-process state (see the module's docstring);
    True when it took the limits' buckets (then they need no seeding)."""
    new.threads = old.threads
    new.pipeline._threads = old.threads  # noqa: SLF001 - the pipeline was built with the gateway's store
    if old.limits is None or new.limits is None:
        return False
    if not (isinstance(old.limits.store, LocalStore) and isinstance(new.limits.store, LocalStore)):
        return False
    new.limits.store, new.limits.concurrency = old.limits.store, old.limits.concurrency  # shared till the old closes
    return True


def _let_go(old: Gateway) -> None:
    """Before closing a gateway that handed its state over: closing must not clear what the new
    one now uses."""
    if old.limits is not None and isinstance(old.limits.store, LocalStore):
        old.limits.store, old.limits.concurrency = LocalStore(), Concurrency()


class Reloader:
    """Reloads on SIGHUP (`install`, on the serving loop); a SIGHUP during a reload reloads again after it."""

    def __init__(self, app: Swappable, running: Running, load: Callable[[], Config]) -> None:
        self._app = app
        self._load = load
        self.running = running
        self._retiring: dict[asyncio.Task[None], Running] = {}  # old gateways, draining then closing
        self._draining: set[Running] = set()
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def install(self) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.request)

    def request(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.create_task(self._reload_while_asked(), name="reload")

    async def _reload_while_asked(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            await self.reload()

    async def reload(self) -> bool:
        """The configuration read again and swapped in; False (logged) when it was refused."""
        log.info("SIGHUP: reading the configuration again")
        try:
            config = await asyncio.to_thread(self._load)
            new = Gateway(config)  # resolved first: every problem (variables, files, the owners' salt) in one error
        except ConfigError as error:
            log.error("SIGHUP: the new configuration is refused; the old one serves on. %s", error)
            return False
        except Exception:  # a bug, or the disk: the old configuration serves on all the same
            log.exception("SIGHUP: the new configuration could not be built; the old one serves on")
            return False
        old = self.running
        for key in _FIXED:
            if getattr(old.gateway.config.server, key) != getattr(config.server, key):
                log.warning("SIGHUP: server.%s changed; it takes effect at the next restart", key)
        await old.gateway.batches.close()  # let its batches go: the new keeper takes them over
        handed = hand_over(old.gateway, new)
        started = Running(new)
        try:
            await started.start(seed=not handed)
        except Exception:  # the disk, say: the old one serves on, its batches left for the next start
            log.exception("SIGHUP: the new configuration could not start; the old one serves on")
            _let_go(new)
            await started.close()
            return False
        self.running = started
        self._app.swap(new)
        retiring = asyncio.create_task(self._retire(old), name="retire a gateway")
        self._retiring[retiring] = old
        self._draining.add(old)
        retiring.add_done_callback(self._retiring.pop)
        log.info("SIGHUP: the new configuration serves new requests; the old one finishes what it began")
        return True

    async def _retire(self, old: Running) -> None:
        await self._app.in_flight.drained(old.gateway)
        self._draining.discard(old)
        _let_go(old.gateway)
        await old.close()

    async def close(self) -> None:
        """At shutdown, after the server's own drain: a reload under way stopped, every old gateway closed."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._retiring:  # their requests have ended or been cancelled by now: they close on their own
            await asyncio.wait(list(self._retiring), timeout=CLOSE_WAIT)
        for task, old in list(self._retiring.items()):
            if old in self._draining:  # a request that did not end: close it anyway
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await old.close()

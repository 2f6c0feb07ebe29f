"""The keeper: which batches this process starts, found by sweeping the directory.

It sweeps at start, every `timings.adopt_every` seconds, and whenever woken (this process has room for
another batch, or a batch was created or canceled). It starts the oldest batches no process
runs, as many as there is room for (a canceled or expired one always: it ends at once), so a
batch whose process died is taken over, running only the requests without a result (one in
flight at the crash runs again). A sweep reads the disk: it runs in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import msgspec

from dragoman.batches.catalog import Catalog
from dragoman.batches.runs import Run, Runner
from dragoman.batches.store import BatchDir, Record

log = logging.getLogger("dragoman.batches")


class Keeper:
    def __init__(self, catalog: Catalog, runner: Runner) -> None:
        self._catalog = catalog
        self._runner = runner
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._sweeping: asyncio.Future[float] | None = None
        self._closing = threading.Event()  # read by the sweep thread

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """(On the serving loop.)"""
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._keep(), name="batch keeper")

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def close(self) -> None:
        self._closing.set()  # a sweep in its thread now starts nothing
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._sweeping is not None:
            await asyncio.gather(self._sweeping, return_exceptions=True)  # the thread cannot be cancelled: wait for it

    async def _keep(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            pause = self._runner.timings.adopt_every
            try:
                self._sweeping = loop.run_in_executor(None, self.sweep, loop)
                pause = min(pause, await asyncio.shield(self._sweeping))
            except asyncio.CancelledError:
                raise
            except Exception:  # a bad directory must not stop the keeper
                log.exception("looking for batches to run failed")
            try:
                await asyncio.wait_for(self._wake.wait(), max(pause, 0.0))
            except TimeoutError:
                pass

    def sweep(self, loop: asyncio.AbstractEventLoop) -> float:
        """(In a thread.) Start the oldest batches no process runs, as many as there is room
        for, and any canceled or expired one; remove what retention and crashes left. The
        seconds until a batch left waiting expires (the next sweep ends it then)."""
        catalog = self._catalog
        catalog.store.clear_debris()
        now = time.time()
        cutoff = now - catalog.retain_for
        waiting: list[tuple[BatchDir, Record]] = []
        known = list(catalog.records)  # before the listing: a batch created since is not taken for gone
        on_disk = catalog.store.batches()
        catalog.forget(set(known).difference(where.id for where in on_disk))
        for where in on_disk:
            if self._runner.holds(where.id) or self._runner.resting.get(where.id, 0.0) > now:
                continue
            record = catalog.load(where)
            if (
                record is not None
                and not catalog.expired(where, record, cutoff)
                and catalog.ended_of(where, record) is None
            ):
                waiting.append((where, record))
        waiting.sort(key=lambda item: (item[1].created, item[1].id))
        next_expiry = float("inf")
        for where, record in waiting:
            if self._closing.is_set():
                break
            try:
                next_expiry = min(next_expiry, self._consider(where, record, now, loop))
            except OSError as error:  # this batch cannot be read or locked: the others still can
                if where.path.exists():  # else deleted since the listing: nothing to run, nothing wrong
                    log.error("batch %s cannot be run: %s", record.id, error)
        return next_expiry - time.time()

    def _consider(self, where: BatchDir, record: Record, now: float, loop: asyncio.AbstractEventLoop) -> float:
        """(In the sweep thread.) Start a waiting batch if there is room, or end it if it is
        canceled or expired (that takes no turn); the time it expires if it is left waiting."""
        canceled = where.canceled_at() is not None
        stopped = canceled or record.expires <= now
        if not stopped and self._runner.room() <= 0:
            return record.expires
        run = self._runner.claim(where, record)
        if run is None:
            return float("inf")  # a live process holds it
        try:
            if self._catalog.ended_of(where, record) is not None:  # it ended between the two looks
                self._runner.let_go(run)
                return float("inf")
            requests: list | None
            try:
                requests = where.requests()
            except FileNotFoundError:  # ended, but its outcome file was lost: the results stand for the requests
                requests = None
            if stopped:  # here, in this thread: no worker, and one batch's files open at a time
                self._runner.finish_stopped(run, requests or [], "canceled" if canceled else "expired")
                return float("inf")
            run.open(requests or [])
            if requests is None and sum(msgspec.structs.astuple(run.counts)) < record.total:
                raise OSError("its requests file is gone and its results are incomplete")
        except (OSError, msgspec.DecodeError) as error:
            self._runner.let_go(run)
            log.error("batch %s cannot be run: %s", record.id, error)
            return float("inf")
        if run.todo and len(run.todo) < record.total:
            log.info("taking over batch %s: %d of %d requests left to run", record.id, len(run.todo), record.total)
        try:
            loop.call_soon_threadsafe(self._begin, run)
        except RuntimeError:  # the loop has closed
            self._runner.let_go(run)
        return float("inf")

    def _begin(self, run: Run) -> None:
        if self._closing.is_set():
            self._runner.let_go(run)
            return
        self._runner.start(run)

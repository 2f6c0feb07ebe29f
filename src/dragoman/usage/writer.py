"""The buffered writer: a finished request's record is appended to a list (no I/O on the
request path), written to the local journal within `APPEND_EVERY` (in a thread; fsynced at
most once every `JOURNAL_EVERY`) and, every `interval` seconds, written to the store; the
journal's segment goes once the store committed it. A write that fails keeps its records, in
memory and on disk: neither an outage nor a shutdown during one costs a record; a process's
crash costs at most the last `APPEND_EVERY`'s, the machine's the last `JOURNAL_EVERY`'s.
Streams in flight are journaled every `JOURNAL_EVERY` as the records they would leave."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

from msgspec.structs import replace

from dragoman.calls.types import Outcome
from dragoman.usage.journal import CRASHED, Journal
from dragoman.usage.outage import Outage, ReadGuard
from dragoman.usage.records import UsageRecord, UsageStore, record_of

log = logging.getLogger("dragoman.usage")

MAX_HELD = 1_000_000  # records kept while the store is down (a few hundred MB at most); the oldest go first
PRUNE_EVERY = 3600.0  # seconds between deletions of records past `retain_days`
JOURNAL_EVERY = 1.0  # seconds between fsyncs of the journal and rewrites of its open streams
APPEND_EVERY = 0.2  # seconds between writes of finished records to the journal (the kernel keeps them)
CLOSE_TIMEOUT = 3.0  # seconds a shutdown keeps trying to write what is held (then it stays in the journal)


class UsageWriter:
    def __init__(self, store: UsageStore, interval: float = 1.0, retain_days: int | None = None,
                 journal: Journal | None = None, read_timeout: float = 10.0) -> None:  # fmt: skip
        self.store = store
        self.outage = Outage()  # shared with the keyring when the keys live in the same database
        self.guard = ReadGuard(
            read_timeout, outage=lambda: self.outage
        )  # the report's reads: 503 within the timeout while the store is out
        self.journal = journal
        self._unjournaled: list[UsageRecord] = []  # noted since the last tick
        self._streams: dict[str, Outcome] = {}  # open streams, by request id
        self._interval = interval
        self._retain = None if retain_days is None else retain_days * 86400.0
        self._pruned_at = -math.inf  # monotonic time of the last prune
        self._held: list[UsageRecord] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._flushing = asyncio.Lock()
        self._journaling = asyncio.Lock()  # one journal step at a time, from the flush or the appender
        self._failing = False  # logged once per outage
        self._journal_failing = False
        self._journaled_at = -math.inf  # monotonic time of the last full journal step
        self._sealed_at = -math.inf
        self._opened = False
        self.dropped = 0

    def note(self, outcome: Outcome, duration: float) -> None:
        """Called once a request is finished (`observe.Metrics.record`): no I/O here."""
        record = record_of(outcome, duration)
        self._held.append(record)
        if self.journal is not None:
            self._unjournaled.append(record)
            self._streams.pop(outcome.request_id, None)
        if len(self._held) > MAX_HELD:
            excess = len(self._held) - MAX_HELD
            del self._held[:excess]
            self.dropped += excess

    def opened(self, outcome: Outcome) -> None:
        """A request began: while it is a stream that has relayed tokens, journaled each tick until it ends."""
        if self.journal is not None:
            self._streams[outcome.request_id] = outcome

    def _in_flight(self) -> list[UsageRecord]:
        """What each open stream would leave if the process died now: what it relayed so far."""
        now = time.perf_counter()
        records = []
        for outcome in self._streams.values():
            if outcome.first_byte is None:
                continue  # not a stream, or none of its tokens relayed yet: nothing a client got to record
            record = record_of(outcome, now - outcome.started)
            relayed = outcome.progress() if outcome.progress is not None else None
            # A translated stream learns its input at its end: until then, the upstream's or an estimate.
            read = record.input_tokens or (outcome.input_so_far() if outcome.input_so_far is not None else 0)
            records.append(replace(record, error_type=CRASHED, disconnected=True, input_tokens=read,
                                   output_tokens=max(record.output_tokens, relayed or 0)))  # fmt: skip
        return records

    def _journal_step(self, pending: list[UsageRecord], streams: list[UsageRecord] | None,
                      seal: bool) -> list[UsageRecord]:  # fmt: skip
        """(In a thread.) The records noted since on disk; with `streams` (a full step) also the
        streams' state, dead owners' records adopted and an fsync; with `seal`,
        what is on disk now is what the coming write ships."""
        assert self.journal is not None
        self.journal.append(pending)
        adopted = []
        if streams is not None:
            self.journal.streams(streams)
            adopted = self.journal.adopt()
            self.journal.sync()
        if seal:
            self.journal.seal()  # (nothing if no segment is open)
        return adopted

    async def _journal(self, seal: bool = False, force: bool = False) -> bool:
        """A journal step; a full one every JOURNAL_EVERY (or `force`). False (logged once) if
        the disk refused: the records stay in memory."""
        if self.journal is None:
            return True
        async with self._journaling:
            full = force or time.monotonic() - self._journaled_at >= JOURNAL_EVERY
            seal = seal and time.monotonic() - self._sealed_at >= JOURNAL_EVERY  # a segment a second at most
            if not (full or seal or self._unjournaled):
                return True
            if full:
                self._journaled_at = time.monotonic()
            pending, self._unjournaled = self._unjournaled, []
            streams = self._in_flight() if full else None
            step = asyncio.ensure_future(asyncio.to_thread(self._journal_step, pending, streams, seal))
            try:
                adopted = await asyncio.shield(step)
            except asyncio.CancelledError:  # the step ends all the same: what it adopted must not be lost
                with contextlib.suppress(OSError):
                    self._held += await step
                raise
            except OSError as error:
                self._unjournaled[:0] = pending
                if not self._journal_failing:
                    log.error("the usage journal cannot be written (%s); records are held in memory", error)
                self._journal_failing = True
                return False
            if seal:
                self._sealed_at = time.monotonic()
            self._journal_failing = False
            self._held += adopted
            return True

    async def _append(self) -> None:
        """Every APPEND_EVERY, the records noted since go to the journal, whatever the store does."""
        while True:
            await asyncio.sleep(APPEND_EVERY)
            await self._journal()

    @property
    def held(self) -> int:
        return len(self._held)

    def start(self) -> None:
        """Start writing: the store is opened (its schema created or migrated) at once, in
        the background, so that a database that is down or slow delays no start-up; one
        that cannot be opened is tried again every interval, and records are held meanwhile.
        A journal that cannot be opened is logged and done without (records in memory only)."""
        if self.journal is not None:
            try:
                self.journal.open()
            except OSError as error:
                log.error("the usage journal cannot be opened in %s (%s); records are held in memory only",
                          self.journal.dir, error)  # fmt: skip
                self.journal = None
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name="usage writer")]
        if self.journal is not None:
            self._tasks.append(loop.create_task(self._append(), name="usage journal"))

    async def _open(self) -> bool:
        if not self._opened:
            try:
                await self.store.open()
            except Exception as error:  # noqa: BLE001 - unreachable, refused: tried again
                if not self._failing and self.outage.failed("usage"):
                    log.error("the usage store cannot be opened (%s: %s); records are held and it is tried again",
                              type(error).__name__, error)  # fmt: skip
                self._failing = True
                return False
            self._opened = True
        return True

    async def _run(self) -> None:
        async with self._flushing:
            await self._open()
        await self.flush()  # what stopped processes left in the journal
        while True:
            await self._prune_if_due()
            await asyncio.sleep(self._interval)
            await self.flush()

    async def _prune_if_due(self) -> None:
        """With `retain_days`: delete what is older, at start and then hourly (every
        process does; a delete is the same from any of them)."""
        if self._retain is None or not self._opened or time.monotonic() - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = time.monotonic()
        try:
            gone = await self.store.prune(time.time() - self._retain)
        except Exception as error:  # noqa: BLE001 - the store down: tried again in an hour
            log.warning("old usage records could not be deleted (%s: %s)", type(error).__name__, error)
            return
        if gone:
            log.info("%d usage records older than %g days deleted", gone, self._retain / 86400)

    async def flush(self) -> bool:
        """Write what is held; False if the store refused (the records stay held)."""
        async with self._flushing:
            await self._journal(seal=True)
            if not self._held:
                if self.journal is not None:
                    self.journal.shipped()  # what was sealed is all written: adopted records, say
                return True
            if not await self._open():
                return False
            batch, self._held = self._held, []
            try:
                await self.store.write(batch)
            except BaseException as error:  # any driver's failure: kept and tried again
                self._held[:0] = batch  # (written twice, a record counts once: see schema.insert_sql)
                if not isinstance(error, Exception):
                    raise  # cancelled
                if not self._failing and self.outage.failed("usage"):
                    log.warning("usage records could not be written (%s: %s); %d kept, retrying every %g s",
                                type(error).__name__, error, len(self._held), self._interval)  # fmt: skip
                self._failing = True
                return False
            if self._unjournaled:  # those noted before the write are committed: no need to journal them
                written = {id(record) for record in batch}
                self._unjournaled = [r for r in self._unjournaled if id(r) not in written]
            if self.journal is not None:
                self.journal.shipped()  # every sealed segment's records were in `batch`, or written before
            if self._failing:
                if self.outage.answered("usage"):
                    log.info("usage records are written again (%d written)", len(batch))
                self._failing = False
            return True

    async def current(self) -> bool:
        """(For a reader.) The store opened, even before the background task got to it, and
        what is held written; False if either cannot be done now."""
        async with self._flushing:
            if not await self._open():
                return False
        return await self.flush()

    async def close(self) -> None:
        """Stop the background task and write what is held, trying for CLOSE_TIMEOUT."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                while not await self.flush():
                    await asyncio.sleep(min(self._interval, 0.5))
        if self.journal is not None:
            await self._journal(force=True)  # what the last tick did not journal (a failed journal kept it)
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self.journal.close, not self._held)
            if self._held:
                log.warning("%d usage records could not be written before shutdown; they stay in the journal "
                            "in %s, and the next gateway process to start ships them", len(self._held),
                            self.journal.dir)  # fmt: skip
        elif self._held:
            log.error("%d usage records could not be written before shutdown", len(self._held))
        if self._opened:
            await self.store.close()

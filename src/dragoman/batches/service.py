"""Message Batches: many Messages requests submitted at once, run in the background.

A batch's requests go through the same routing, backends and per-upstream limits as
`POST /v1/messages` (`dragoman.batches.runs`). As on Anthropic, each request's params are
validated when it runs (a bad one is an `errored` result, not a refused batch), results
come in completion order with their `custom_id`, the counts by outcome are reported once
the batch has ended, and a batch not done within `expire_after` has its remaining
requests `expired`.

Batches are kept on disk (`dragoman.batches.store`), so every process sees every batch and
a restart loses none. A keeper in each process sweeps the directory: at start, every
ADOPT_EVERY seconds, and whenever this process has room for another batch. It starts the
oldest batches no process runs, as many as there is room for (a canceled or expired one
always: it ends at once), so a batch whose process died is taken over, running only the
requests without a result (one in flight at the crash runs again).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Literal

import msgspec

from dragoman.batches.quota import Usage, check_room
from dragoman.batches.runs import Run, Runner
from dragoman.batches.store import PREFIX, BatchDir, BatchStore, Ended, Record
from dragoman.core import ids
from dragoman.core.config import BatchesConfig, data_dir
from dragoman.core.errors import GatewayError, InvalidRequest, NotFound
from dragoman.core.observe import Metrics
from dragoman.core.owners import Owners
from dragoman.core.paging import page_of, remember_deleted
from dragoman.core.pipeline import Pipeline
from dragoman.core.validation import decode_request
from dragoman.protocol.anthropic import forwarded_headers, timestamp
from dragoman.protocol.batches import (
    BATCH_CREATE,
    DeletedBatch,
    MessageBatch,
    RequestCounts,
)

log = logging.getLogger("dragoman.batches")

Status = Literal["in_progress", "canceling", "ended"]
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
ADOPT_EVERY = 30.0  # seconds between sweeps when nothing else prompts one


def _kept_headers(headers: Mapping[str, str], traceparent: str | None) -> dict[str, str]:
    """What a batch keeps of its creating request's headers: those sent on with each of its
    requests, and the `traceparent` of the creating request's span, which its requests'
    traces link to (tracing on)."""
    kept = forwarded_headers(headers)
    if traceparent:
        kept["traceparent"] = traceparent[:55]  # version-traceid-spanid-flags
    return kept


class Batches:
    def __init__(
        self, pipeline: Pipeline, metrics: Metrics, config: BatchesConfig, owners: Owners | None = None
    ) -> None:
        self._config = config
        self._owners = owners  # reads owners that earlier versions recorded (see `core.owners`)
        self._store = BatchStore(Path(config.dir).expanduser() if config.dir else data_dir("batches"))
        self._records: dict[
            str, Record
        ] = {}  # never change once written; of batches on disk (the sweep drops the others)
        self._ended: dict[str, Ended] = {}  # nor do these
        self._deleted: dict[str, Record] = {}  # the latest deleted here, so that a cursor naming one still places
        self._runner = Runner(pipeline, metrics, config, self._ended.__setitem__, self._wake_keeper)
        self._keeper: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._sweeping: asyncio.Future[float] | None = None
        self._closing = threading.Event()  # read by the sweep thread

    @property
    def root(self) -> Path:
        """The directory batches are kept in."""
        return self._store.root

    # -- the API --------------------------------------------------------------------------

    async def create(self, body: bytes, headers: Mapping[str, str], base_url: str, owner: str, *,
                     key_id: str | None = None, tenant: str | None = None,
                     traceparent: str | None = None) -> MessageBatch:  # fmt: skip
        create = decode_request(body, BATCH_CREATE)
        if not create.requests:
            raise InvalidRequest("requests: at least one request is needed")
        if len(create.requests) > self._config.max_requests:
            raise InvalidRequest(
                f"requests: at most {self._config.max_requests} requests per batch, got {len(create.requests)}"
            )
        seen: set[str] = set()
        for index, request in enumerate(create.requests):
            if not CUSTOM_ID.fullmatch(request.custom_id):
                raise InvalidRequest(
                    f"requests.{index}.custom_id: 1 to 64 letters, digits, '-' or '_', got {request.custom_id!r}"
                )
            if request.custom_id in seen:
                raise InvalidRequest(
                    f"requests.{index}.custom_id: {request.custom_id!r} is used by an earlier request; each must be unique"
                )
            seen.add(request.custom_id)
        try:
            usage = await asyncio.to_thread(self._usage, owner)
        except OSError as error:
            raise GatewayError(f"could not store the batch: {error.strerror or error}") from None
        check_room(self._config, usage, len(create.requests), len(body))
        now = time.time()
        record = Record(
            id=ids.new_id(PREFIX + "01"), owner=owner, created=now, expires=now + self._config.expire_after,
            total=len(create.requests), headers=_kept_headers(headers, traceparent), key_id=key_id, tenant=tenant,
        )  # fmt: skip
        try:
            where = await asyncio.to_thread(self._store.create, record, body)
        except OSError as error:
            raise GatewayError(f"could not store the batch: {error.strerror or error}") from None
        self._records[record.id] = record
        if self._keeper is None:  # served without a lifespan (it starts the keeper otherwise)
            await self.start()
        self._wake_keeper()  # it starts the batch if this process has room, else it waits its turn
        return self._view(where, record, base_url)

    def retrieve(self, batch_id: str, owner: str, base_url: str) -> MessageBatch:
        where, record = self._find(batch_id, owner)
        return self._view(where, record, base_url)

    async def page(self, query: Mapping[str, str], owner: str, base_url: str) -> dict[str, object]:
        """Newest first, as Anthropic lists them (read in a thread: one file per batch)."""
        try:
            return await asyncio.to_thread(self._page, query, owner, base_url)
        except OSError as error:
            raise GatewayError(f"could not read the batches: {error.strerror or error}") from None

    def _page(self, query: Mapping[str, str], owner: str, base_url: str) -> dict[str, object]:
        cutoff = time.time() - self._config.retain_for
        loaded = ((where, self._load(where)) for where in self._store.batches(owner))
        listed = sorted(
            ((where, record) for where, record in loaded
             if record is not None and record.owner == owner and not self._expired(where, record, cutoff)),
            key=lambda item: (item[1].created, item[1].id), reverse=True,
        )  # fmt: skip
        views = {record.id: (where, record) for where, record in listed}

        def position(gone: str) -> int | None:  # a deleted batch of this key: after every newer one
            record = self._records.get(gone) or self._deleted.get(gone)
            if record is None or record.owner != owner:
                return None  # another key's batch is not told apart from no batch
            return sum(1 for _, r in listed if (r.created, r.id) > (record.created, record.id))

        def describe(batch_id: str) -> object:
            return msgspec.to_builtins(self._view(*views[batch_id], base_url))

        return page_of(list(views), query, describe, "batch", position)

    async def cancel(self, batch_id: str, owner: str, base_url: str) -> MessageBatch:
        where, record = self._find(batch_id, owner)
        if self._ended_of(where, record) is None:
            try:  # synced to disk: in a thread, not holding up the event loop
                at = await asyncio.to_thread(
                    where.cancel, time.time()
                )  # requests not yet started end as `canceled`; running ones finish
            except OSError as error:
                raise GatewayError(f"could not store the cancel: {error.strerror or error}") from None
            run = self._runner.runs.get(batch_id)
            if run is not None:
                run.canceling_since = at
                run.stopping.set()
            else:
                self._wake_keeper()  # a batch waiting its turn ends now, without taking a turn
        return self._view(where, record, base_url)

    async def delete(self, batch_id: str, owner: str) -> DeletedBatch:
        where, record = self._find(batch_id, owner)
        if self._ended_of(where, record) is None:
            raise InvalidRequest(
                f"message_batch_id: batch {batch_id} is still processing; cancel it and wait for it to end first"
            )
        gone = self._store.hide(where)
        self._ended.pop(batch_id, None)
        self._records.pop(batch_id, None)
        remember_deleted(self._deleted, batch_id, record)  # a cursor naming the batch still places
        if gone is not None:
            await asyncio.to_thread(shutil.rmtree, gone, True)
        return DeletedBatch(id=batch_id)

    def results(self, batch_id: str, owner: str) -> IO[bytes]:
        """The results file, open (a delete from now on does not cut the reply short)."""
        where, record = self._find(batch_id, owner)
        if self._ended_of(where, record) is None:
            raise InvalidRequest(
                f"message_batch_id: batch {batch_id} has not ended; its results are ready once processing_status is ended"
            )
        try:
            return open(where.results_path(), "rb")
        except FileNotFoundError:
            raise NotFound(f"message_batch_id: no batch {batch_id!r}") from None

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="batch keeper")

    async def close(self) -> None:
        self._closing.set()  # a sweep in its thread now starts nothing
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self._sweeping is not None:
            await asyncio.gather(self._sweeping, return_exceptions=True)  # the thread cannot be cancelled: wait for it
        await self._runner.close()

    def _usage(self, owner: str) -> Usage:
        """(In a thread.) What the owner's batches hold: it reads the owner's directory only."""
        usage = Usage()
        cutoff = time.time() - self._config.retain_for
        for where in self._store.batches(owner):
            record = self._load(where)
            if record is None or record.owner != owner or self._expired(where, record, cutoff):
                continue
            usage.batches += 1
            usage.stored_bytes += where.stored_bytes()
            if self._ended_of(where, record) is None:
                usage.queued += record.total
        return usage

    # -- finding -----------------------------------------------------------------------------

    def _load(self, where: BatchDir) -> Record | None:
        record = self._records.get(where.id)
        if record is None:
            try:
                record = where.record()
            except (OSError, msgspec.DecodeError):  # being deleted, or not one of ours
                return None
            if self._owners is not None and record.owner:  # as this gateway names it: its runs name files so too
                record = msgspec.structs.replace(record, owner=self._owners.canonical(record.owner))
            self._records[where.id] = record
        return record

    def _find(self, batch_id: str, owner: str) -> tuple[BatchDir, Record]:
        missing = NotFound(f"message_batch_id: no batch {batch_id!r}")
        where = self._store.batch(batch_id, owner)
        if where is None:
            raise missing
        record = self._load(where)
        if (
            record is None
            or record.owner != owner
            or self._expired(where, record, time.time() - self._config.retain_for)
        ):
            raise missing  # another key's batch is not told apart from no batch
        return where, record

    def _ended_of(self, where: BatchDir, record: Record) -> Ended | None:
        ended = self._ended.get(record.id)
        # Read from disk even for a batch running here: once its outcome is written every other
        # process says `ended`, and so must this one, before the run's own `on_end` catches up.
        if ended is None:
            try:
                ended = where.ended()
            except OSError:
                return None
            if ended is not None:
                self._ended[record.id] = ended
        return ended

    def _expired(self, where: BatchDir, record: Record, cutoff: float) -> bool:
        """Ended longer ago than `retain_for`: its results are gone (removed here if not yet)."""
        ended = self._ended_of(where, record)
        if ended is None or ended.at >= cutoff:
            return False
        self._store.hide(where)  # its files are removed by the next sweep, off the event loop
        self._ended.pop(record.id, None)
        self._records.pop(record.id, None)
        return True

    def _view(self, where: BatchDir, record: Record, base_url: str) -> MessageBatch:
        """As the SDK sees it; `base_url` is the gateway as the asking client reached it (a
        results URL is never one another client's Host header chose)."""
        ended = self._ended_of(where, record)
        run = self._runner.runs.get(record.id)
        canceled = run.canceling_since if run is not None else None
        if canceled is None:  # canceled through another process: the run sees it at its next look
            canceled = where.canceled_at()
        if canceled is not None and ended is not None and canceled > ended.at:
            canceled = None  # a cancel that raced the batch's end came after it: nothing was canceled
        counts = (
            ended.counts if ended is not None else RequestCounts(processing=record.total)
        )  # outcomes only at the end
        status: Status = "ended" if ended is not None else "canceling" if canceled is not None else "in_progress"
        return MessageBatch(
            id=record.id, created_at=timestamp(record.created), expires_at=timestamp(record.expires), request_counts=counts,
            processing_status=status, ended_at=timestamp(ended.at) if ended is not None else None,
            cancel_initiated_at=timestamp(canceled) if canceled is not None else None,
            results_url=f"{base_url}/v1/messages/batches/{record.id}/results" if ended is not None else None,
        )  # fmt: skip

    # -- the keeper ----------------------------------------------------------------------------

    def _wake_keeper(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _keep(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            pause = ADOPT_EVERY
            try:
                self._sweeping = loop.run_in_executor(None, self._sweep, loop)
                pause = min(pause, await asyncio.shield(self._sweeping))
            except asyncio.CancelledError:
                raise
            except Exception:  # a bad directory must not stop the keeper
                log.exception("looking for batches to run failed")
            try:
                await asyncio.wait_for(self._wake.wait(), max(pause, 0.0))
            except TimeoutError:
                pass

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> float:
        """(In a thread.) Start the oldest batches no process runs, as many as there is room
        for, and any canceled or expired one; remove what retention and crashes left. The
        seconds until a batch left waiting expires (the next sweep ends it then)."""
        self._store.clear_debris()
        now = time.time()
        cutoff = now - self._config.retain_for
        waiting: list[tuple[BatchDir, Record]] = []
        known = list(self._records)  # before the listing: a batch created since is not taken for gone
        on_disk = self._store.batches()
        self._forget(set(known).difference(where.id for where in on_disk))
        for where in on_disk:
            if self._runner.holds(where.id) or self._runner.resting.get(where.id, 0.0) > now:
                continue
            record = self._load(where)
            if (
                record is not None
                and not self._expired(where, record, cutoff)
                and self._ended_of(where, record) is None
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

    def _forget(self, gone: set[str]) -> None:
        """(In the sweep thread.) Drop what is kept of batches no longer on disk (another
        process deleted them): kept, a process's memory grew with every delete elsewhere."""
        for batch_id in gone:
            self._records.pop(batch_id, None)
            self._ended.pop(batch_id, None)

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
            if self._ended_of(where, record) is not None:  # it ended between the two looks
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

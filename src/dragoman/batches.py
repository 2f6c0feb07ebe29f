"""Message Batches: many Messages requests submitted at once, run in the background.

A batch's requests go through the same routing, backends and per-upstream limits as
`POST /v1/messages`, at most `batches.max_concurrent` at a time across all batches of a
process, so a large batch cannot crowd out interactive traffic by more than that. As on
Anthropic, each request's params are validated when it runs (a bad one is an `errored`
result, not a refused batch), results come in completion order with their `custom_id`,
the counts by outcome are reported once the batch has ended, and a batch not done within
`expire_after` has its remaining requests `expired`.

Batches are kept on disk (`dragoman.batch_store`): every process sees every batch, a
cancel reaches the process running it, and a batch whose process stopped or died is
taken over by another (or by the next start), which runs only the requests without a
result: a request in flight at the crash runs again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

import msgspec

from dragoman import ids
from dragoman.batch_runs import Run, Runner
from dragoman.batch_store import PREFIX, BatchDir, BatchStore, Ended, Record
from dragoman.config import BatchesConfig, data_dir
from dragoman.errors import GatewayError, InvalidRequest, NotFound
from dragoman.paging import page_of
from dragoman.protocol.batches import (
    BATCH_CREATE,
    DeletedBatch,
    MessageBatch,
    RequestCounts,
)
from dragoman.validation import decode_request

if TYPE_CHECKING:
    from dragoman.gateway import Gateway

log = logging.getLogger("dragoman.batches")

Status = Literal["in_progress", "canceling", "ended"]
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
ADOPT_EVERY = 30.0  # seconds between looks for batches whose process is gone (and for expired results)


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Batches:
    def __init__(self, gateway: Gateway, config: BatchesConfig) -> None:
        self._gateway = gateway
        self._config = config
        self._store = BatchStore(Path(config.dir).expanduser() if config.dir else data_dir("batches"))
        self._records: dict[str, Record] = {}  # never change once written
        self._ended: dict[str, Ended] = {}  # nor do these
        self._runner = Runner(gateway, config, self._ended.__setitem__)
        self._keeper: asyncio.Task[None] | None = None

    # -- the API --------------------------------------------------------------------------

    async def create(self, body: bytes, headers: Mapping[str, str], base_url: str, owner: str) -> MessageBatch:
        create = decode_request(body, BATCH_CREATE)
        if not create.requests:
            raise InvalidRequest("requests: at least one request is needed")
        if len(create.requests) > self._config.max_requests:
            raise InvalidRequest(f"requests: at most {self._config.max_requests} requests per batch, got {len(create.requests)}")
        seen: set[str] = set()
        for index, request in enumerate(create.requests):
            if not CUSTOM_ID.fullmatch(request.custom_id):
                raise InvalidRequest(f"requests.{index}.custom_id: 1 to 64 letters, digits, '-' or '_', got {request.custom_id!r}")
            if request.custom_id in seen:
                raise InvalidRequest(
                    f"requests.{index}.custom_id: {request.custom_id!r} is used by an earlier request; each must be unique"
                )
            seen.add(request.custom_id)
        now = time.time()
        record = Record(
            id=ids.new_id(PREFIX + "01"), owner=owner, created=now, expires=now + self._config.expire_after,
            total=len(create.requests), headers={k: headers[k] for k in FORWARDED_HEADERS if k in headers},
        )  # fmt: skip
        try:
            where, lock = await asyncio.to_thread(self._store.create, record, body)
        except OSError as error:
            raise GatewayError(f"could not store the batch: {error.strerror}") from None
        self._records[record.id] = record
        self._runner.start(Run(where, record, lock), create.requests)
        return self._view(where, record, base_url)

    def retrieve(self, batch_id: str, owner: str, base_url: str) -> MessageBatch:
        where, record = self._find(batch_id, owner)
        return self._view(where, record, base_url)

    def page(self, query: Mapping[str, str], owner: str, base_url: str) -> dict[str, object]:
        """Newest first, as Anthropic lists them."""
        listed = sorted(
            ((where, record) for where, record in map(self._load, self._store.ids()) if record is not None and record.owner == owner),
            key=lambda item: (item[1].created, item[1].id), reverse=True,
        )  # fmt: skip
        cutoff = time.time() - self._config.retain_for
        listed = [(w, r) for w, r in listed if not self._expired(w, r, cutoff)]
        views = {record.id: (where, record) for where, record in listed}
        newest_first = [record.id for _, record in listed]

        def position(
            gone: str,
        ) -> int | None:  # a deleted (or purged) batch: after every newer one
            record = self._records.get(gone)
            return None if record is None else sum(1 for _, r in listed if (r.created, r.id) > (record.created, record.id))

        describe = lambda batch_id: msgspec.to_builtins(self._view(*views[batch_id], base_url))
        return page_of(newest_first, query, describe, "batch", position)

    def cancel(self, batch_id: str, owner: str, base_url: str) -> MessageBatch:
        where, record = self._find(batch_id, owner)
        if self._ended_of(where, record) is None:
            at = where.cancel(time.time())  # requests not yet started end as `canceled`; running ones finish
            run = self._runner.runs.get(batch_id)
            if run is not None:
                run.canceling_since = at
                run.stopping.set()
        return self._view(where, record, base_url)

    def delete(self, batch_id: str, owner: str) -> DeletedBatch:
        where, record = self._find(batch_id, owner)
        if self._ended_of(where, record) is None:
            raise InvalidRequest(f"message_batch_id: batch {batch_id} is still processing; cancel it and wait for it to end first")
        self._store.remove(batch_id)
        self._ended.pop(batch_id, None)  # the record stays: a cursor naming the batch still places
        return DeletedBatch(id=batch_id)

    def results(self, batch_id: str, owner: str) -> IO[bytes]:
        """The results file, open (a delete from now on does not cut the reply short)."""
        where, record = self._find(batch_id, owner)
        if self._ended_of(where, record) is None:
            raise InvalidRequest(f"message_batch_id: batch {batch_id} has not ended; its results are ready once processing_status is ended")
        try:
            return open(where.results_path(), "rb")
        except FileNotFoundError:
            raise NotFound(f"message_batch_id: no batch {batch_id!r}") from None

    async def start(self) -> None:
        """Take over batches no process is running, now and every ADOPT_EVERY seconds."""
        self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="batch keeper")

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        await self._runner.close()

    # -- finding -----------------------------------------------------------------------------

    def _load(self, batch_id: str) -> tuple[BatchDir, Record | None]:
        where = BatchDir(self._store.root / batch_id)
        record = self._records.get(batch_id)
        if record is None:
            try:
                record = self._records[batch_id] = where.record()
            except (OSError, msgspec.DecodeError):  # being deleted, or not one of ours
                return where, None
        return where, record

    def _find(self, batch_id: str, owner: str) -> tuple[BatchDir, Record]:
        missing = NotFound(f"message_batch_id: no batch {batch_id!r}")
        where = self._store.batch(batch_id)
        if where is None:
            raise missing
        where, record = self._load(batch_id)
        if record is None or record.owner != owner or self._expired(where, record, time.time() - self._config.retain_for):
            raise missing  # another key's batch is not told apart from no batch
        return where, record

    def _ended_of(self, where: BatchDir, record: Record) -> Ended | None:
        ended = self._ended.get(record.id)
        if ended is None and record.id not in self._runner.runs:  # a batch running here has not ended
            try:
                ended = where.ended()
            except (OSError, msgspec.DecodeError):
                return None
            if ended is not None:
                self._ended[record.id] = ended
        return ended

    def _expired(self, where: BatchDir, record: Record, cutoff: float) -> bool:
        """Ended longer ago than `retain_for`: its results are gone (removed here if not yet)."""
        ended = self._ended_of(where, record)
        if ended is None or ended.at >= cutoff:
            return False
        self._store.remove(record.id)
        self._ended.pop(record.id, None)
        return True

    def _view(self, where: BatchDir, record: Record, base_url: str) -> MessageBatch:
        """As the SDK sees it; `base_url` is the gateway as the asking client reached it (a
        results URL is never one another client's Host header chose)."""
        ended = self._ended_of(where, record)
        run = self._runner.runs.get(record.id)
        canceled = run.canceling_since if run is not None else None
        if canceled is None:  # canceled through another process: the run sees it at its next look
            canceled = where.canceled_at()
        counts = ended.counts if ended is not None else RequestCounts(processing=record.total)  # outcomes only at the end
        status: Status = "ended" if ended is not None else "canceling" if canceled is not None else "in_progress"
        return MessageBatch(
            id=record.id, created_at=_stamp(record.created), expires_at=_stamp(record.expires), request_counts=counts,
            processing_status=status, ended_at=_stamp(ended.at) if ended is not None else None,
            cancel_initiated_at=_stamp(canceled) if canceled is not None else None,
            results_url=f"{base_url}/v1/messages/batches/{record.id}/results" if ended is not None else None,
        )  # fmt: skip

    # -- running ---------------------------------------------------------------------------

    async def _keep(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self._sweep, asyncio.get_running_loop())
            except Exception:  # a bad directory must not stop the keeper
                log.exception("looking for batches to take over failed")
            await asyncio.sleep(ADOPT_EVERY)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """(In a thread.) Start the batches no live process runs; forget expired results."""
        cutoff = time.time() - self._config.retain_for
        for batch_id in self._store.ids():
            if batch_id in self._runner.runs:
                continue
            where, record = self._load(batch_id)
            if record is None or self._expired(where, record, cutoff) or self._ended_of(where, record) is not None:
                continue
            lock = where.try_lock()
            if lock is None:
                continue  # a live process runs it
            if self._ended_of(where, record) is not None:  # it ended between the two looks
                os.close(lock)
                continue
            try:
                run = Run(where, record, lock)
            except OSError as error:
                os.close(lock)
                log.error("batch %s cannot be taken over: %s", batch_id, error)
                continue
            try:
                todo = run.resume(where.requests())
            except (OSError, msgspec.DecodeError) as error:
                run.release()
                log.error("batch %s cannot be taken over: %s", batch_id, error)
                continue
            log.info("taking over batch %s: %d of %d requests to run", batch_id, len(todo), record.total)
            loop.call_soon_threadsafe(self._runner.start, run, todo)

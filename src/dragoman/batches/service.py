"""Message Batches: many Messages requests submitted at once, run in the background.

A batch's requests go through the same routing, backends and per-upstream limits as
`POST /v1/messages` (`dragoman.batches.runs`). As on Anthropic, each request's params are
validated when it runs (a bad one is an `errored` result, not a refused batch), results
come in completion order with their `custom_id`, the counts by outcome are reported once
the batch has ended, and a batch not done within `expire_after` has its remaining
requests `expired`.

Batches are kept on disk (`dragoman.batches.store`), so every process sees every batch and
a restart loses none; a keeper in each process (`dragoman.batches.keeper`) starts them, and
takes over those whose process died.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Literal

import msgspec

from dragoman.batches.catalog import Catalog
from dragoman.batches.keeper import Keeper
from dragoman.batches.quota import Usage, check_room
from dragoman.batches.requests import Recorder, RequestPath
from dragoman.batches.runs import BatchTimings, Runner
from dragoman.batches.store import PREFIX, BatchDir, BatchStore, Record
from dragoman.core import ids
from dragoman.core.config import BatchesConfig, data_dir
from dragoman.core.errors import GatewayError, InvalidRequest, NotFound
from dragoman.core.owners import Owners
from dragoman.core.paging import DELETED_KEPT, page_of, remember_deleted
from dragoman.core.validation import decode_request
from dragoman.protocol.anthropic import forwarded_headers, timestamp
from dragoman.protocol.batches import (
    BATCH_CREATE,
    DeletedBatch,
    MessageBatch,
    RequestCounts,
)

Status = Literal["in_progress", "canceling", "ended"]
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")


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
        self,
        pipeline: RequestPath,
        metrics: Recorder,
        config: BatchesConfig,
        owners: Owners | None = None,
        store: BatchStore | None = None,  # another store over the same directory layout (tests' races)
        timings: BatchTimings | None = None,
        deleted_kept: int = DELETED_KEPT,  # how many deleted ids a cursor may still name (the latest)
    ) -> None:
        self._config = config
        self._deleted_kept = deleted_kept
        self._store = store or BatchStore(Path(config.dir).expanduser() if config.dir else data_dir("batches"))
        self._catalog = Catalog(self._store, config.retain_for, owners)
        self._deleted: dict[str, Record] = {}  # the latest deleted here, so that a cursor naming one still places
        self._runner = Runner(pipeline, metrics, config, self._catalog.ended.__setitem__, self._wake_keeper, timings)
        self._keeper = Keeper(self._catalog, self._runner)

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
        self._catalog.records[record.id] = record
        if not self._keeper.started:  # served without a lifespan (it starts the keeper otherwise)
            await self.start()
        self._wake_keeper()  # it starts the batch if this process has room, else it waits its turn
        return self._view(where, record, base_url)

    def retrieve(self, batch_id: str, owner: str, base_url: str) -> MessageBatch:
        where, record = self._catalog.find(batch_id, owner)
        return self._view(where, record, base_url)

    async def page(self, query: Mapping[str, str], owner: str, base_url: str) -> dict[str, object]:
        """Newest first, as Anthropic lists them (read in a thread: one file per batch)."""
        try:
            return await asyncio.to_thread(self._page, query, owner, base_url)
        except OSError as error:
            raise GatewayError(f"could not read the batches: {error.strerror or error}") from None

    def _page(self, query: Mapping[str, str], owner: str, base_url: str) -> dict[str, object]:
        cutoff = time.time() - self._config.retain_for
        loaded = ((where, self._catalog.load(where)) for where in self._store.batches(owner))
        listed = sorted(
            ((where, record) for where, record in loaded
             if record is not None and record.owner == owner and not self._catalog.expired(where, record, cutoff)),
            key=lambda item: (item[1].created, item[1].id), reverse=True,
        )  # fmt: skip
        views = {record.id: (where, record) for where, record in listed}

        def position(gone: str) -> int | None:  # a deleted batch of this key: after every newer one
            record = self._catalog.records.get(gone) or self._deleted.get(gone)
            if record is None or record.owner != owner:
                return None  # another key's batch is not told apart from no batch
            return sum(1 for _, r in listed if (r.created, r.id) > (record.created, record.id))

        def describe(batch_id: str) -> object:
            return msgspec.to_builtins(self._view(*views[batch_id], base_url))

        return page_of(list(views), query, describe, "batch", position)

    async def cancel(self, batch_id: str, owner: str, base_url: str) -> MessageBatch:
        where, record = self._catalog.find(batch_id, owner)
        if self._catalog.ended_of(where, record) is None:
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
        where, record = self._catalog.find(batch_id, owner)
        if self._catalog.ended_of(where, record) is None:
            raise InvalidRequest(
                f"message_batch_id: batch {batch_id} is still processing; cancel it and wait for it to end first"
            )
        gone = self._store.hide(where)
        self._catalog.forget((batch_id,))
        remember_deleted(self._deleted, batch_id, record, self._deleted_kept)  # a cursor naming the batch still places
        if gone is not None:
            await asyncio.to_thread(shutil.rmtree, gone, True)
        return DeletedBatch(id=batch_id)

    def results(self, batch_id: str, owner: str) -> IO[bytes]:
        """The results file, open (a delete from now on does not cut the reply short)."""
        where, record = self._catalog.find(batch_id, owner)
        if self._catalog.ended_of(where, record) is None:
            raise InvalidRequest(
                f"message_batch_id: batch {batch_id} has not ended; its results are ready once processing_status is ended"
            )
        try:
            return open(where.results_path(), "rb")
        except FileNotFoundError:
            raise NotFound(f"message_batch_id: no batch {batch_id!r}") from None

    async def start(self) -> None:
        self._keeper.start()

    async def close(self) -> None:
        await self._keeper.close()
        await self._runner.close()

    def _usage(self, owner: str) -> Usage:
        """(In a thread.) What the owner's batches hold: it reads the owner's directory only."""
        usage = Usage()
        cutoff = time.time() - self._config.retain_for
        for where in self._store.batches(owner):
            record = self._catalog.load(where)
            if record is None or record.owner != owner or self._catalog.expired(where, record, cutoff):
                continue
            usage.batches += 1
            usage.stored_bytes += where.stored_bytes()
            if self._catalog.ended_of(where, record) is None:
                usage.queued += record.total
        return usage

    def _view(self, where: BatchDir, record: Record, base_url: str) -> MessageBatch:
        """As the SDK sees it; `base_url` is the gateway as the asking client reached it (a
        results URL is never one another client's Host header chose)."""
        ended = self._catalog.ended_of(where, record)
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

    def _wake_keeper(self) -> None:
        self._keeper.wake()

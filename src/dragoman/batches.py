"""Message Batches: many Messages requests submitted at once, run in the background.

A batch's requests go through the same routing, backends and per-upstream limits as
`POST /v1/messages`, at most `batches.max_concurrent` at a time across all batches, so
a large batch cannot crowd out interactive traffic by more than that. As on Anthropic,
each request's params are validated when it runs (a bad one is an `errored` result,
not a refused batch), results come in completion order with their `custom_id`, the
counts by outcome are reported once the batch has ended, and a batch not done within
`expire_after` has its remaining requests `expired`. Batches live in the process's
memory: a restart loses them (and each `--workers` process has its own).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import msgspec

from dragoman import ids
from dragoman.backends.base import Call, Completed
from dragoman.config import BatchesConfig
from dragoman.errors import GatewayError, InvalidRequest, NotFound, UpstreamError
from dragoman.files import names_a_file
from dragoman.observe import Outcome
from dragoman.paging import page_of
from dragoman.protocol import anthropic
from dragoman.protocol.batches import (
    BATCH_CREATE,
    BatchRequest,
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


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(eq=False)
class Batch:
    id: str
    requests: list[BatchRequest]  # emptied once the batch ends: its params hold the whole create body
    headers: dict[str, str]
    total: int = 0
    created: float = field(default_factory=time.time)
    expires: float = 0.0
    lines: list[bytes] = field(default_factory=list)  # one JSONL line per finished request
    counts: RequestCounts = field(default_factory=RequestCounts)
    canceling_since: float | None = None
    ended: float | None = None
    task: asyncio.Task[None] | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # canceled or expired: start nothing more

    def view(self, base_url: str) -> MessageBatch:
        """As the SDK sees it; `base_url` is the gateway as the asking client reached it (a
        results URL is never one another client's Host header chose)."""
        ended = self.ended is not None
        counts = self.counts if ended else RequestCounts(processing=self.total)  # outcomes only at the end
        status: Status = "ended" if ended else "canceling" if self.canceling_since is not None else "in_progress"
        return MessageBatch(
            id=self.id, created_at=_stamp(self.created), expires_at=_stamp(self.expires), request_counts=counts,
            processing_status=status, ended_at=_stamp(self.ended) if self.ended is not None else None,
            cancel_initiated_at=_stamp(self.canceling_since) if self.canceling_since is not None else None,
            results_url=f"{base_url}/v1/messages/batches/{self.id}/results" if ended else None,
        )  # fmt: skip


def _line(custom_id: str, result: bytes) -> bytes:
    return b'{"custom_id":' + msgspec.json.encode(custom_id) + b',"result":' + result + b"}"


class Batches:
    def __init__(self, gateway: Gateway, config: BatchesConfig) -> None:
        self._gateway = gateway
        self._config = config
        self._batches: dict[str, Batch] = {}  # in creation order
        self._created: dict[str, float] = {}  # every batch ever made here, deleted ones too: where a cursor falls
        self._slots: asyncio.Semaphore | None = None  # made in the serving loop

    # -- the API --------------------------------------------------------------------------

    def create(self, body: bytes, headers: Mapping[str, str], base_url: str) -> MessageBatch:
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
                raise InvalidRequest(f"requests.{index}.custom_id: {request.custom_id!r} is used by an earlier request; each must be unique")
            seen.add(request.custom_id)
        self._purge()
        batch_id = ids.new_id("msgbatch_01")
        batch = Batch(
            id=batch_id, requests=create.requests,
            headers={k: headers[k] for k in FORWARDED_HEADERS if k in headers},
        )  # fmt: skip
        batch.expires = batch.created + self._config.expire_after
        batch.total = len(create.requests)
        self._batches[batch_id] = batch
        self._created[batch_id] = batch.created
        batch.task = asyncio.get_running_loop().create_task(self._run(batch), name=f"batch {batch_id}")
        return batch.view(base_url)

    def get(self, batch_id: str) -> Batch:
        self._purge()
        batch = self._batches.get(batch_id)
        if batch is None:
            raise NotFound(f"message_batch_id: no batch {batch_id!r} (unknown, deleted, or made by another process)")
        return batch

    def retrieve(self, batch_id: str, base_url: str) -> MessageBatch:
        return self.get(batch_id).view(base_url)

    def page(self, query: Mapping[str, str], base_url: str) -> dict[str, object]:
        """Newest first, as Anthropic lists them."""
        self._purge()
        newest_first = list(reversed(self._batches))

        def position(gone: str) -> int | None:  # a deleted (or purged) batch: after every newer one
            created = self._created.get(gone)
            return None if created is None else sum(1 for b in newest_first if self._batches[b].created > created)

        describe = lambda batch_id: msgspec.to_builtins(self._batches[batch_id].view(base_url))
        return page_of(newest_first, query, describe, "batch", position)

    def cancel(self, batch_id: str, base_url: str) -> MessageBatch:
        batch = self.get(batch_id)
        if batch.ended is None and batch.canceling_since is None:
            batch.canceling_since = time.time()  # requests not yet started end as `canceled`; running ones finish
            batch.stopping.set()
        return batch.view(base_url)

    def delete(self, batch_id: str) -> DeletedBatch:
        batch = self.get(batch_id)
        if batch.ended is None:
            raise InvalidRequest(f"message_batch_id: batch {batch_id} is still processing; cancel it and wait for it to end first")
        del self._batches[batch_id]
        return DeletedBatch(id=batch_id)

    def results(self, batch_id: str) -> bytes:
        batch = self.get(batch_id)
        if batch.ended is None:
            raise InvalidRequest(f"message_batch_id: batch {batch_id} has not ended; its results are ready once processing_status is ended")
        return b"".join(line + b"\n" for line in batch.lines)

    async def close(self) -> None:
        tasks = [b.task for b in self._batches.values() if b.task is not None and not b.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- running ---------------------------------------------------------------------------

    def _purge(self) -> None:
        """Forget batches that ended longer ago than `retain_for` (their results expire)."""
        cutoff = time.time() - self._config.retain_for
        for batch_id in [b.id for b in self._batches.values() if b.ended is not None and b.ended < cutoff]:
            del self._batches[batch_id]

    async def _run(self, batch: Batch) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._config.max_concurrent)
        expiry = asyncio.get_running_loop().call_later(max(0.0, batch.expires - time.time()), batch.stopping.set)
        todo = iter(batch.requests)

        async def worker() -> None:
            for request in todo:  # shared: each request is taken by one worker
                await self._settle(batch, request)

        workers = min(self._config.max_concurrent, len(batch.requests))
        try:
            await asyncio.gather(*(worker() for _ in range(workers)))
        except asyncio.CancelledError:  # the gateway is shutting down: the batch is lost with the process
            log.warning("batch %s interrupted by shutdown with %d of %d requests settled", batch.id, len(batch.lines), batch.total)
            raise
        else:
            log.info("batch %s ended: %s", batch.id, msgspec.json.encode(batch.counts).decode())
        finally:
            expiry.cancel()
            batch.ended = time.time()
            batch.requests = []

    async def _settle(self, batch: Batch, request: BatchRequest) -> None:
        if not await self._slot(batch):  # canceled or expired before it could start
            if batch.canceling_since is not None:
                batch.counts.canceled += 1
                batch.lines.append(_line(request.custom_id, b'{"type":"canceled"}'))
            else:
                batch.counts.expired += 1
                batch.lines.append(_line(request.custom_id, b'{"type":"expired"}'))
            return
        assert self._slots is not None
        try:
            succeeded, payload = await self._message(batch, request)
        except Exception:  # a bug: that request errors, the batch goes on
            log.exception("batch %s, request %s failed", batch.id, request.custom_id)
            succeeded, payload = False, UpstreamError("internal error while running the request").body(None)
        finally:
            self._slots.release()
        if succeeded:
            batch.counts.succeeded += 1
            batch.lines.append(_line(request.custom_id, b'{"type":"succeeded","message":' + payload + b"}"))
        else:
            batch.counts.errored += 1
            batch.lines.append(_line(request.custom_id, b'{"type":"errored","error":' + payload + b"}"))

    async def _slot(self, batch: Batch) -> bool:
        """Wait for a free slot (True, then it is held), or until the batch is canceled or
        expires (False): a stopped batch does not wait behind other batches' requests."""
        assert self._slots is not None
        if batch.stopping.is_set():
            return False
        if not self._slots.locked():
            await self._slots.acquire()  # free now: no race to set up
            return True
        slot = asyncio.ensure_future(self._slots.acquire())
        stop = asyncio.ensure_future(batch.stopping.wait())
        try:
            await asyncio.wait((slot, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not slot.done():
                slot.cancel()
        if slot.done() and not slot.cancelled():
            if batch.stopping.is_set():
                self._slots.release()  # got it as the batch stopped: give it back
                return False
            return True
        return False

    async def _message(self, batch: Batch, item: BatchRequest) -> tuple[bool, bytes]:
        """One request, run as POST /v1/messages would run it: (True, the message's JSON)
        or (False, the error's JSON, Anthropic's envelope)."""
        gateway = self._gateway
        body = bytes(item.params)
        outcome = Outcome(request_id=ids.request_id(), endpoint="batch")
        try:
            if gateway.files.in_use() and names_a_file(body):
                body = await gateway.files.resolve(body, gateway.config.server.max_request_bytes)
            try:
                request = decode_request(body, anthropic.MESSAGES_REQUEST)
            except InvalidRequest as error:  # named from the batch request: its `params`
                raise InvalidRequest("params" + ("." if ":" in error.message.split(" ", 1)[0] else ": ") + error.message) from None
            outcome.model = request.model
            if request.stream:
                raise InvalidRequest("params.stream: streaming is not available in a batch")
            route = await gateway.route(request.model)
            outcome.upstream, outcome.served_model, outcome.path = route.upstream, route.upstream_model, route.path
            limiter = gateway.limiters.get(route.upstream)
            if limiter is not None:
                await limiter.acquire(queue=False)  # never a 529: the batch waits its turn
                outcome.release = limiter.release
            call = Call(body, request.model, route.upstream_model, batch.headers, outcome.request_id, False, outcome, request)
            reply = await route.backend.messages(call, route)
            if not isinstance(reply, Completed):  # not asked for; never expected
                raise UpstreamError("the backend answered a batch request with a stream")
            outcome.status = reply.status
            if reply.status == 200:
                return True, reply.body
            if _is_json(reply.body):  # a passthrough upstream's own error envelope, as it sent it
                return False, reply.body
            raise UpstreamError(f"the upstream answered {reply.status}")
        except GatewayError as error:
            outcome.status, outcome.error_type, outcome.upstream_failed = error.status, error.type, error.is_upstream
            return False, error.body(outcome.request_id)
        finally:
            outcome.finish()
            gateway.metrics.record(outcome)


def _is_json(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return True

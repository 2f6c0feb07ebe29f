"""Running batches: each request of a batch as POST /v1/messages would run it.

One `Runner` per process runs the batches it created or took over, at most
`batches.max_concurrent` requests at a time across all of them, and appends each
result to the batch's results file as it settles (`dragoman.batch_store`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import msgspec

from dragoman import ids
from dragoman.backends.base import Call, Completed
from dragoman.batch_store import BatchDir, Ended, Record
from dragoman.config import BatchesConfig
from dragoman.errors import GatewayError, InvalidRequest, UpstreamError
from dragoman.files import names_a_file
from dragoman.observe import Outcome
from dragoman.protocol import anthropic
from dragoman.protocol.batches import BatchRequest, RequestCounts
from dragoman.validation import decode_request

if TYPE_CHECKING:
    from dragoman.gateway import Gateway

log = logging.getLogger("dragoman.batches")

CANCEL_POLL = 0.5  # seconds between looks for a cancel made by another process


def _line(custom_id: str, result: bytes) -> bytes:
    return b'{"custom_id":' + msgspec.json.encode(custom_id) + b',"result":' + result + b"}\n"


class _Outcome(msgspec.Struct):
    type: Literal["succeeded", "errored", "canceled", "expired"]


class _Settled(msgspec.Struct):
    custom_id: str
    result: _Outcome


_SETTLED = msgspec.json.Decoder(_Settled)


class Run:
    """A batch this process is running: it holds the batch's lock and appends its results."""

    def __init__(self, where: BatchDir, record: Record, lock: int) -> None:
        self.dir = where
        self.record = record
        self.lock = lock
        self.results = where.open_results()
        self.counts = RequestCounts()
        self.canceling_since = where.canceled_at()
        self.stopping = asyncio.Event()  # canceled or expired: start nothing more
        self.task: asyncio.Task[None] | None = None
        if self.canceling_since is not None:
            self.stopping.set()

    def resume(self, requests: list[BatchRequest]) -> list[BatchRequest]:
        """Taking the batch over: the requests without a result (the others are counted)."""
        done: set[str] = set()
        for line in self.dir.settled():
            settled = _SETTLED.decode(line)
            done.add(settled.custom_id)
            self._count(settled.result.type)
        return [r for r in requests if r.custom_id not in done]

    def settle(self, custom_id: str, outcome: str, result: bytes) -> None:
        os.write(self.results, _line(custom_id, result))  # one append: whole or absent after a crash
        self._count(outcome)

    def _count(self, outcome: str) -> None:
        setattr(self.counts, outcome, getattr(self.counts, outcome) + 1)

    def release(self) -> None:
        os.close(self.results)
        os.close(self.lock)  # another process may take the batch over from here


def _stopped(run: Run) -> bool:
    """Whether the batch may start no more requests: canceled (through any process) or expired.
    Looked up on disk before each start, so a cancel elsewhere stops the next start at once."""
    if run.stopping.is_set():
        return True
    at = run.dir.canceled_at()
    if at is None:
        return False
    run.canceling_since = at
    run.stopping.set()
    return True


class Runner:
    def __init__(self, gateway: Gateway, config: BatchesConfig, on_end: Callable[[str, Ended], None]) -> None:
        self._gateway = gateway
        self._config = config
        self._on_end = on_end
        self.runs: dict[str, Run] = {}
        self._slots: asyncio.Semaphore | None = None  # made in the serving loop

    def start(self, run: Run, todo: list[BatchRequest]) -> None:
        self.runs[run.record.id] = run
        run.task = asyncio.get_running_loop().create_task(self._run(run, todo), name=f"batch {run.record.id}")

    async def _run(self, run: Run, todo: list[BatchRequest]) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._config.max_concurrent)
        loop = asyncio.get_running_loop()
        expiry = loop.call_later(max(0.0, run.record.expires - time.time()), run.stopping.set)
        watch = loop.create_task(self._watch_cancel(run))
        pending = iter(todo)

        async def worker() -> None:
            for request in pending:  # shared: each request is taken by one worker
                await self._settle(run, request)

        workers = min(self._config.max_concurrent, len(todo))
        try:
            await asyncio.gather(*(worker() for _ in range(workers)))
            end = Ended(at=time.time(), counts=run.counts)
            await asyncio.to_thread(run.dir.end, end)
            self._on_end(run.record.id, end)
            log.info(
                "batch %s ended: %s",
                run.record.id,
                msgspec.json.encode(run.counts).decode(),
            )
        except asyncio.CancelledError:  # shutting down: another process, or the next start, goes on with it
            log.warning(
                "batch %s interrupted by shutdown; it resumes where it stopped",
                run.record.id,
            )
            raise
        except OSError as error:
            log.error(
                "batch %s could not be stored (%s); it resumes at the next start",
                run.record.id,
                error,
            )
        finally:
            expiry.cancel()
            watch.cancel()
            del self.runs[run.record.id]
            run.release()

    async def _watch_cancel(self, run: Run) -> None:
        """A cancel made through another process wakes this run's waiting requests within CANCEL_POLL."""
        while run.canceling_since is None:
            await asyncio.sleep(CANCEL_POLL)
            at = run.dir.canceled_at()
            if at is not None and run.canceling_since is None:
                run.canceling_since = at
                run.stopping.set()

    async def _settle(self, run: Run, request: BatchRequest) -> None:
        if not await self._slot(run):  # canceled or expired before it could start
            if run.canceling_since is not None:
                run.settle(request.custom_id, "canceled", b'{"type":"canceled"}')
            else:
                run.settle(request.custom_id, "expired", b'{"type":"expired"}')
            return
        assert self._slots is not None
        try:
            succeeded, payload = await self._message(run.record, request)
        except Exception:  # a bug: that request errors, the batch goes on
            log.exception("batch %s, request %s failed", run.record.id, request.custom_id)
            succeeded, payload = (
                False,
                UpstreamError("internal error while running the request").body(None),
            )
        finally:
            self._slots.release()
        if succeeded:
            run.settle(
                request.custom_id,
                "succeeded",
                b'{"type":"succeeded","message":' + payload + b"}",
            )
        else:
            run.settle(
                request.custom_id,
                "errored",
                b'{"type":"errored","error":' + payload + b"}",
            )

    async def _slot(self, run: Run) -> bool:
        """Wait for a free slot (True, then it is held), or until the batch is canceled or
        expires (False): a stopped batch does not wait behind other batches' requests."""
        assert self._slots is not None
        if _stopped(run):
            return False
        if not self._slots.locked():
            await self._slots.acquire()  # free now: no race to set up
            return True
        slot = asyncio.ensure_future(self._slots.acquire())
        stop = asyncio.ensure_future(run.stopping.wait())
        try:
            await asyncio.wait((slot, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not slot.done():
                slot.cancel()
        if slot.done() and not slot.cancelled():
            if _stopped(run):
                self._slots.release()  # got it as the batch stopped: give it back
                return False
            return True
        return False

    async def _message(self, record: Record, item: BatchRequest) -> tuple[bool, bytes]:
        """One request, run as POST /v1/messages would run it: (True, the message's JSON)
        or (False, the error's JSON, Anthropic's envelope)."""
        gateway = self._gateway
        body = bytes(item.params)
        outcome = Outcome(request_id=ids.request_id(), endpoint="batch")
        try:
            if gateway.files.in_use() and names_a_file(body):
                body = await gateway.files.resolve(body, gateway.config.server.max_request_bytes, owner=record.owner)
            try:
                request = decode_request(body, anthropic.MESSAGES_REQUEST)
            except InvalidRequest as error:  # named from the batch request: its `params`
                raise InvalidRequest("params" + ("." if ":" in error.message.split(" ", 1)[0] else ": ") + error.message) from None
            outcome.model = request.model
            if request.stream:
                raise InvalidRequest("params.stream: streaming is not available in a batch")
            route = await gateway.route(request.model)
            outcome.upstream, outcome.served_model, outcome.path = (
                route.upstream,
                route.upstream_model,
                route.path,
            )
            limiter = gateway.limiters.get(route.upstream)
            if limiter is not None:
                await limiter.acquire(queue=False)  # never a 529: the batch waits its turn
                outcome.release = limiter.release
            call = Call(
                body,
                request.model,
                route.upstream_model,
                record.headers,
                outcome.request_id,
                False,
                outcome,
                request,
            )
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
            outcome.status, outcome.error_type, outcome.upstream_failed = (
                error.status,
                error.type,
                error.is_upstream,
            )
            return False, error.body(outcome.request_id)
        finally:
            outcome.finish()
            gateway.metrics.record(outcome)

    async def close(self) -> None:
        tasks = [run.task for run in self.runs.values() if run.task is not None and not run.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _is_json(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return True

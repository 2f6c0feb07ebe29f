"""Running batches: each request of a batch as POST /v1/messages would run it.

One `Runner` per process runs at most `batches.max_concurrent` batches at a time (a
batch waiting its turn holds nothing: no lock, no descriptor), and at most
`batches.max_concurrent` of their requests at once. Each result is appended to the
batch's results file as it settles (`dragoman.batches.store`). A run that cannot store a
result stops all its requests before it lets the batch go, so no request outlives the
lock that makes it the only run of its batch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import msgspec

from dragoman.batches.requests import Recorder, RequestPath
from dragoman.batches.store import BatchDir, Ended, Record
from dragoman.calls.types import Caller, Completed, Outcome
from dragoman.core import ids
from dragoman.core.config import BatchesConfig
from dragoman.core.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    RequestTooLarge,
    UpstreamError,
)
from dragoman.core.validation import within
from dragoman.protocol.batches import BatchRequest, RequestCounts

log = logging.getLogger("dragoman.batches")

CANCEL_POLL = 0.5  # seconds between looks for a cancel made by another process
REST_AFTER_FAILURE = 30.0  # seconds before this process runs again a batch whose results it could not store
ADOPT_EVERY = 30.0  # seconds between the keeper's sweeps when nothing else prompts one


@dataclass(slots=True)
class BatchTimings:
    """How often a gateway looks for batches to run, and how long one that failed rests; the
    gateway's (`Gateway.timings.batches`), which a test sets instead of patching the module."""

    adopt_every: float = ADOPT_EVERY
    rest_after_failure: float = REST_AFTER_FAILURE


# What the gateway finds wrong with a request's params (not its upstream's answer, not a limit):
# the message names the field as the batch request holds it, `requests.3.params.<field>`.
ABOUT_THE_PARAMS = (InvalidRequest, NotFound, RequestTooLarge)


def _line(custom_id: str, result: bytes) -> bytes:
    return b'{"custom_id":' + msgspec.json.encode(custom_id) + b',"result":' + result + b"}\n"


def one_line(result: bytes) -> bytes:
    """`result` (JSON) on one line: an upstream's reply comes as it sent it, pretty-printed
    perhaps, and `results.jsonl` holds one result per line. Raises msgspec.DecodeError for
    bytes that are not JSON."""
    if b"\n" not in result and b"\r" not in result:
        return result  # a JSON string holds no raw line break: this is one line already
    return msgspec.json.format(result, indent=0)


class _Outcome(msgspec.Struct):
    type: Literal["succeeded", "errored", "canceled", "expired"]


class _Settled(msgspec.Struct):
    custom_id: str
    result: _Outcome


_SETTLED = msgspec.json.Decoder(_Settled)


def _settled(line: bytes) -> _Settled | None:
    try:
        return _SETTLED.decode(line)
    except msgspec.DecodeError:
        return None


class Run:
    """A batch this process holds: its lock, its results file, what is left to run."""

    def __init__(self, where: BatchDir, record: Record, lock: int) -> None:
        self.dir = where
        self.record = record
        self.lock = lock
        self.counts = RequestCounts()
        self.canceling_since: float | None = None  # read by `open` (no I/O here: a claim must not fail half-way)
        self.stopping = asyncio.Event()  # canceled or expired: start nothing more
        self.task: asyncio.Task[None] | None = None
        self.todo: list[tuple[int, BatchRequest]] = []  # (its index in the batch's requests, the request)
        self._results = -1
        self._size = 0

    def open(self, requests: list[BatchRequest]) -> None:
        """Count the results already written (by an earlier run) and open the file for more;
        what has no result yet is `todo`."""
        self.canceling_since = self.dir.canceled_at()
        if not all(_settled(line) for line in self.dir.settled()):  # an earlier version's, or a bug's
            dropped = self.dir.keep_results(lambda line: _settled(line) is not None)
            log.warning("batch %s: %d result lines that do not parse were dropped; their requests run again",
                        self.record.id, dropped)  # fmt: skip
        done: set[str] = set()
        for line in self.dir.settled():
            settled = _SETTLED.decode(line)
            if settled.custom_id not in done:
                done.add(settled.custom_id)
                self._count(settled.result.type)
        self.todo = [(index, r) for index, r in enumerate(requests) if r.custom_id not in done]
        self._results = self.dir.open_results()
        self._size = os.fstat(self._results).st_size

    def settle(self, custom_id: str, outcome: str, result: bytes) -> None:
        """Append one result line: whole, or not at all (a short write is undone and raised)."""
        if self._results < 0:
            raise RuntimeError(f"batch {self.record.id} is no longer held by this run")
        line = _line(custom_id, result)
        written = os.write(self._results, line)
        if written != len(line):
            os.ftruncate(self._results, self._size)
            raise OSError(f"only {written} of {len(line)} bytes of a result could be written")
        self._size += written
        self._count(outcome)

    def settle_unrun(self, custom_id: str, outcome: str) -> None:
        """A request the batch ended before it ran: `canceled` or `expired`."""
        self.settle(custom_id, outcome, b'{"type":"%s"}' % outcome.encode())

    def _count(self, outcome: str) -> None:
        setattr(self.counts, outcome, getattr(self.counts, outcome) + 1)

    def stopped(self) -> bool:
        """Whether no more requests may start: canceled (through any process) or expired.
        Looked up before each start, so a cancel elsewhere stops the next start at once."""
        if self.stopping.is_set():
            return True
        if self.canceling_since is None:
            self.canceling_since = self.dir.canceled_at()
        if self.canceling_since is not None or time.time() >= self.record.expires:
            self.stopping.set()
            return True
        return False

    def release(self) -> None:
        if self._results >= 0:
            os.close(self._results)
            self._results = -1
        if self.lock >= 0:
            os.close(self.lock)  # another process may take the batch over from here
            self.lock = -1


class Runner:
    def __init__(self, pipeline: RequestPath, metrics: Recorder, config: BatchesConfig, on_end: Callable[[str, Ended], None],
                 on_free: Callable[[], None], timings: BatchTimings | None = None) -> None:  # fmt: skip
        self._pipeline = pipeline
        self.timings = timings or BatchTimings()
        self._metrics = metrics
        self._config = config
        self._on_end = on_end
        self._on_free = on_free  # a batch stopped running here: room for another
        self.runs: dict[str, Run] = {}
        self._held: set[str] = set()  # claimed (locked) here, running or about to
        self.resting: dict[str, float] = {}  # batch -> when this process may run it again (after a storage failure)
        self._claiming = threading.Lock()  # claims come from the sweep thread
        self._slots: asyncio.Semaphore | None = None  # made in the serving loop

    # -- claiming (any thread) ---------------------------------------------------------------

    def holds(self, batch_id: str) -> bool:
        return batch_id in self._held

    def room(self) -> int:
        return self._config.max_concurrent - len(self._held)

    def claim(self, where: BatchDir, record: Record) -> Run | None:
        """Lock a batch for this process unless some process (this one included) holds it."""
        with self._claiming:
            if record.id in self._held:
                return None  # never a second descriptor on a lock held here (NFS drops the lock on close)
            lock = where.try_lock()
            if lock is None:
                return None
            self._held.add(record.id)
        return Run(where, record, lock)

    def let_go(self, run: Run) -> None:
        run.release()
        with self._claiming:
            self._held.discard(run.record.id)

    def finish_stopped(self, run: Run, requests: list[BatchRequest], outcome: str) -> Ended:
        """(In the sweep thread.) End a claimed batch that is canceled or expired: every request
        without a result gets `outcome`; no worker, no event loop. The batch is let go."""
        try:
            run.open(requests)
            for _, request in run.todo:
                run.settle_unrun(request.custom_id, outcome)
            end = Ended(at=time.time(), counts=run.counts)
            run.dir.end(end)
            self._on_end(run.record.id, end)
            return end
        finally:
            self.let_go(run)

    # -- running (the serving loop) ------------------------------------------------------------

    def start(self, run: Run) -> None:
        self.runs[run.record.id] = run
        run.task = asyncio.get_running_loop().create_task(self._run(run), name=f"batch {run.record.id}")

    async def _run(self, run: Run) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._config.max_concurrent)
        loop = asyncio.get_running_loop()
        expiry = loop.call_later(max(0.0, run.record.expires - time.time()), run.stopping.set)
        watch = loop.create_task(self._watch_cancel(run))
        pending = iter(run.todo)

        async def worker() -> None:
            for index, request in pending:  # shared: each request is taken by one worker
                await self._settle(run, index, request)

        workers = [loop.create_task(worker()) for _ in range(min(self._config.max_concurrent, len(run.todo)))]
        try:
            if workers:
                await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
                for task in workers:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            end = Ended(at=time.time(), counts=run.counts)
            await asyncio.to_thread(run.dir.end, end)
            self._on_end(run.record.id, end)
            log.info("batch %s ended: %s", run.record.id, msgspec.json.encode(run.counts).decode())
        except asyncio.CancelledError:  # shutting down: another process, or the next start, goes on with it
            log.warning("batch %s interrupted by shutdown; it resumes where it stopped", run.record.id)
            raise
        except OSError as error:  # no tight loop of upstream calls on a full disk: the batch rests first
            self.resting[run.record.id] = time.time() + self.timings.rest_after_failure
            log.error("batch %s could not store a result (%s); it resumes where it stopped", run.record.id, error)
        except Exception:  # a bug: the same rest, and a traceback to find it by
            self.resting[run.record.id] = time.time() + self.timings.rest_after_failure
            log.exception("batch %s failed; it resumes where it stopped", run.record.id)
        finally:
            expiry.cancel()
            watch.cancel()
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)  # none outlives the lock
            del self.runs[run.record.id]
            self.let_go(run)
            self._on_free()

    async def _watch_cancel(self, run: Run) -> None:
        """A cancel made through another process wakes this run's waiting requests within CANCEL_POLL."""
        while not run.stopped():
            await asyncio.sleep(CANCEL_POLL)

    async def _settle(self, run: Run, index: int, request: BatchRequest) -> None:
        if not await self._slot(run):  # canceled or expired before it could start
            run.settle_unrun(request.custom_id, "canceled" if run.canceling_since is not None else "expired")
            return
        assert self._slots is not None
        try:
            succeeded, payload = await self._message(run.record, index, request)
        except Exception:  # a bug: that request errors, the batch goes on
            log.exception("batch %s, request %s failed", run.record.id, request.custom_id)
            succeeded, payload = False, UpstreamError("internal error while running the request").body(None)
        finally:
            self._slots.release()
        try:
            payload = one_line(payload)
        except msgspec.DecodeError:
            succeeded, payload = False, UpstreamError("the upstream's reply is not JSON").body(None)
        if succeeded:
            run.settle(request.custom_id, "succeeded", b'{"type":"succeeded","message":' + payload + b"}")
        else:
            run.settle(request.custom_id, "errored", b'{"type":"errored","error":' + payload + b"}")

    async def _slot(self, run: Run) -> bool:
        """Wait for a free slot (True, then it is held), or until the batch is canceled or
        expires (False): a stopped batch does not wait behind other batches' requests."""
        assert self._slots is not None
        if run.stopped():
            return False
        if not self._slots.locked():
            await self._slots.acquire()  # free now: no race to set up
            return True
        slot = asyncio.ensure_future(self._slots.acquire())
        stop = asyncio.ensure_future(run.stopping.wait())
        try:
            await asyncio.wait((slot, stop), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (the run is stopping): a slot got meanwhile goes back
            if slot.done() and not slot.cancelled() and slot.exception() is None:
                self._slots.release()
            raise
        finally:
            stop.cancel()
            if not slot.done():
                slot.cancel()
        if slot.done() and not slot.cancelled():
            if run.stopped():
                self._slots.release()  # got it as the batch stopped: give it back
                return False
            return True
        return False

    async def close(self) -> None:
        tasks = [run.task for run in self.runs.values() if run.task is not None and not run.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _message(self, record: Record, index: int, item: BatchRequest) -> tuple[bool, bytes]:
        """One request, run as POST /v1/messages would run it: (True, the message's JSON)
        or (False, the error's JSON, Anthropic's envelope). `index`: its place in the batch."""
        outcome = self._metrics.outcome(ids.request_id(), "batch")
        tracing = self._pipeline.tracing
        if tracing is not None:  # a trace of its own, linked to the request that created the batch
            outcome.trace = tracing.batch_request(record.id, item.custom_id, record.headers.get("traceparent"))
        with outcome.finish:
            return await self._answer(outcome, index, item, record)

    async def _answer(self, outcome: Outcome, index: int, item: BatchRequest, record: Record) -> tuple[bool, bytes]:
        try:
            prepared = await self._pipeline.prepare(bytes(item.params), endpoint="batch", headers=record.headers,
                                                    caller=Caller(record.owner, record.key_id, record.tenant), outcome=outcome)  # fmt: skip
            reply = await self._pipeline.send(prepared, endpoint="batch")
            if not isinstance(reply, Completed):  # not asked for; never expected
                raise UpstreamError("the backend answered a batch request with a stream")
            outcome.status = reply.status
            if reply.status == 200:
                return True, reply.body
            if _is_json(reply.body):  # a passthrough upstream's own error envelope, as it sent it
                return False, reply.body
            raise UpstreamError(f"the upstream answered {reply.status}")
        except GatewayError as error:
            if isinstance(error, ABOUT_THE_PARAMS) and not error.is_upstream:  # the one place item errors are named
                error.message = within(f"requests.{index}.params", error.message)
            outcome.failed(error)
            return False, error.body(outcome.request_id)


def _is_json(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return True

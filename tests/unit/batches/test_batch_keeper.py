"""The batch runner and keeper: a run stopped by a storage failure gives back every request
slot; a batch whose lock or cancel marker cannot be read is neither stuck nor stops the
sweep; batches that expired while no process ran them end in the sweep; a sweep still
running at shutdown starts nothing; what is kept of deleted batches stays within a bound."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dragoman.batches.catalog import Catalog
from dragoman.batches.keeper import Keeper
from dragoman.batches.runs import BatchTimings, Run, Runner
from dragoman.batches.service import Batches
from dragoman.batches.store import BatchDir, BatchStore, Record
from dragoman.calls.types import Caller, Completed, Outcome, Reply
from dragoman.core.config import BatchesConfig
from dragoman.core.errors import InvalidRequest
from tests.support.helpers import batch_path
from tests.support.waiting import eventually_async


def _batch(
    root: Path, name: str, n: int, created: float | None = None, expires_in: float = 3600
) -> tuple[Path, Record]:
    body = json.dumps(
        {
            "requests": [
                {
                    "custom_id": f"r{i}",
                    "params": {"model": "m", "max_tokens": 8, "messages": [], "metadata": {"user_id": f"r{i}"}},
                }
                for i in range(n)
            ]
        }
    ).encode()
    now = time.time() if created is None else created
    batch_id = "msgbatch_01" + name
    record = Record(
        id=batch_id, owner="", created=now, expires=now + expires_in, total=n, headers={"x-batch": batch_id}
    )
    return BatchStore(root).create(record, body).path, record


def _claim(runner: Runner, root: Path, record: Record, kind: type[BatchDir] = BatchDir) -> Run:
    where = kind(batch_path(root, record.id))
    run = runner.claim(where, record)
    assert run is not None
    run.open(where.requests())
    return run


class _FullDisk(BatchDir):
    """A batch whose results go to a full disk: every write fails with ENOSPC (/dev/full)."""

    def open_results(self) -> int:
        return os.open("/dev/full", os.O_WRONLY)


def test_a_storage_failure_does_not_leak_a_request_slot_of_the_process(tmp_path: Path) -> None:
    """Batch X holds both slots; batch A's two requests wait for one. X's first request ends:
    A's r0 takes the slot, is answered at once, gives the slot to A's r1, and its result
    cannot be stored. The run cancels r1, which had just been handed the slot: the slot comes
    back (a slot lost so would be lost for the life of the process)."""
    root = tmp_path / "b"
    _, x_record = _batch(root, "x", 2)
    _, a_record = _batch(root, "a", 2)
    config = BatchesConfig(max_concurrent=2, dir=str(root))

    async def main() -> tuple[Runner, int]:
        path = _GatedPath({(x_record.id, "r0"): asyncio.Event(), (x_record.id, "r1"): asyncio.Event()})
        runner = Runner(path, _NoRecorder(), config, lambda *_: None, lambda: None,
                        BatchTimings(rest_after_failure=0.0))  # fmt: skip
        x = _claim(runner, root, x_record)
        runner.start(x)
        await eventually_async(lambda: len(path.asked) == 2, "X's two requests hold both slots")
        a = _claim(runner, root, a_record, _FullDisk)
        runner.start(a)
        slots = runner._slots
        assert slots is not None
        await eventually_async(lambda: len(slots._waiters or ()) == 2, "A's two requests wait for a slot")
        path.events[(x_record.id, "r0")].set()
        await asyncio.wait_for(a.task, 5)  # type: ignore[arg-type]
        path.events[(x_record.id, "r1")].set()
        await asyncio.wait_for(x.task, 5)  # type: ignore[arg-type]
        return runner, slots._value

    runner, free = asyncio.run(main())
    assert a_record.id in runner.resting, "the storage failure was not reached"  # the run rests after it
    assert free == 2, f"after every run ended, {free} of 2 request slots are free: {2 - free} leaked"


class _Vanishing(BatchDir):
    """A batch another process deletes after the sweep read its record, as the sweep looks at it."""

    def canceled_at(self) -> float | None:
        if self.path.exists():
            shutil.rmtree(self.path)
        return super().canceled_at()


class _Listed(BatchStore):
    """A batch directory listed in a given order (scandir's is arbitrary); `vanishing` names a
    batch deleted by another process between the sweep's listing and its claim."""

    def __init__(self, root: Path, ids: list[str], vanishing: str | None = None) -> None:
        super().__init__(root)
        self.ids, self.vanishing = ids, vanishing

    def batches(self, owner: str | None = None) -> list[BatchDir]:
        kind = {self.vanishing: _Vanishing}
        return [kind.get(i, BatchDir)(batch_path(self.root, i)) for i in self.ids]


class _GatedPath:
    """The request path a batch's requests take (batches.requests.RequestPath): each request
    whose (batch, custom_id) has an event waits for it, then succeeds with `{}`."""

    tracing = None

    def __init__(self, events: dict[tuple[str, str], asyncio.Event]) -> None:
        self.events = events
        self.asked: list[tuple[str, str]] = []  # (batch, custom_id) of each request sent, in turn

    async def prepare(self, body: bytes, *, endpoint: str, headers: Any, caller: Caller, outcome: Outcome) -> Any:
        return headers["x-batch"], json.loads(body)["metadata"]["user_id"]  # (batch, custom_id): see _batch

    async def send(self, prepared: Any, *, endpoint: str) -> Reply:
        self.asked.append(prepared)
        event = self.events.get(prepared)
        if event is not None:
            await event.wait()
        return Completed(b"{}")


class _NoRecorder:
    """Records nothing: each request's outcome ends unrecorded (`batches.requests.Recorder`)."""

    def outcome(self, request_id: str, endpoint: str) -> Outcome:
        return Outcome(request_id=request_id, endpoint=endpoint)


class _Loop:
    """Stands in for the serving loop: records what a sweep would start."""

    def __init__(self) -> None:
        self.started: list[Run] = []

    def call_soon_threadsafe(self, start, run: Run) -> None:
        self.started.append(run)


def _swept(batches: Batches) -> list[Run]:
    """The runs one sweep would start (released again: no test leaves a lock held)."""
    loop = _Loop()
    try:
        batches._keeper.sweep(loop)  # type: ignore[arg-type]
    finally:
        for run in loop.started:
            run.release()
    return loop.started


def _batches(root: Path, **config: Any) -> Batches:
    return Batches(None, None, BatchesConfig(dir=str(root), **config))  # type: ignore[arg-type]


def test_a_claim_that_fails_after_locking_does_not_keep_the_batch_forever(tmp_path: Path) -> None:
    """An expired batch whose cancel marker cannot be read (EIO, ESTALE, EACCES; here: a
    directory) is not left locked and held by this process: it ends, or stays free for another
    process to take."""
    root = tmp_path / "b"
    path, record = _batch(root, "stuck", 2, created=time.time() - 7200, expires_in=3600)  # expired an hour ago
    (path / "canceled").mkdir()
    batches = _batches(root, max_concurrent=2)
    started = _swept(batches)
    other = BatchDir(path).try_lock()  # what another process's sweep would do
    if other is not None:
        os.close(other)
    assert started or not batches._runner.holds(record.id), (
        f"not started, yet held by this process (room now {batches._runner.room()} of 2); another process can lock it: {other is not None}"
    )


def test_one_unreadable_cancel_marker_does_not_stop_younger_batches_from_starting(tmp_path: Path) -> None:
    """A cancel marker that cannot be read (here a directory; EIO/ESTALE/EACCES alike) does
    not stop the sweep: younger batches still start."""
    root = tmp_path / "b"
    bad_path, _ = _batch(root, "old", 1, created=time.time() - 10)
    _, young = _batch(root, "young", 1)
    (bad_path / "canceled").mkdir()
    batches = _batches(root, max_concurrent=2)
    try:
        started = _swept(batches)
    except OSError as error:
        raise AssertionError(f"the whole sweep failed on one batch: {error!r}") from None
    assert young.id in [run.record.id for run in started]


def test_stopped_batches_end_in_the_sweep_one_at_a_time(tmp_path: Path) -> None:
    """40 batches that expired while no process ran them: the sweep ends each one itself
    (every request `expired`), holding one batch's files at a time, and starts none."""
    root = tmp_path / "b"
    for i in range(40):
        _batch(root, f"late{i:02d}", 3, created=time.time() - 7200 + i, expires_in=3600)  # all expired
    batches = _batches(root, max_concurrent=2)
    loop = _Loop()

    def open_under_root() -> list[str]:  # not a count of all descriptors: other tests' threads open and close theirs
        targets = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                targets.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return [t for t in targets if t.startswith(str(root))]

    batches._keeper.sweep(loop)  # type: ignore[arg-type]
    assert open_under_root() == []  # nothing left open
    assert loop.started == []
    for path in (root / "shared").iterdir():
        ended = json.loads((path / "ended.json").read_bytes())
        assert ended["counts"]["expired"] == 3 and ended["counts"]["processing"] == 0
        assert (
            sorted(json.loads(line)["result"]["type"] for line in (path / "results.jsonl").read_bytes().splitlines())
            == ["expired"] * 3
        )
    assert batches._runner.room() == 2  # no batch slot taken


def test_one_batch_whose_lock_cannot_be_opened_does_not_stop_the_others_being_taken_over(
    tmp_path: Path,
) -> None:
    """A batch whose lock cannot be opened is skipped; the sweep takes over the others."""
    root = tmp_path / "batches"
    good, bad = _batch(root, "good", 2)[1].id, _batch(root, "bad", 2)[1].id
    (batch_path(root, bad) / "lock").mkdir()  # os.open(..., O_RDWR) fails on it
    store = _Listed(root, [bad, good])  # the order scandir happened to give
    batches = Batches(None, None, BatchesConfig(dir=str(root)), store=store)  # type: ignore[arg-type]  # a sweep never touches the gateway
    assert [run.record.id for run in _swept(batches)] == [good]


class _SlowListing(BatchStore):
    """A directory whose listing takes until `go` (a large directory): a sweep still in its
    thread, `listing` once it has begun."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listing, self.go = threading.Event(), threading.Event()

    def batches(self, owner: str | None = None) -> list[BatchDir]:
        self.listing.set()
        self.go.wait(5)
        return super().batches(owner)


def test_a_sweep_still_running_at_shutdown_starts_no_batch(tmp_path: Path) -> None:
    """A sweep still in its thread when the keeper closes starts no batch (nor leaks one)."""
    root = tmp_path / "batches"
    batch_id = _batch(root, "orphan", 2)[1].id
    store = _SlowListing(root)
    path = _GatedPath({})

    async def main() -> tuple[list[str], bool]:
        runner = Runner(path, _NoRecorder(), BatchesConfig(dir=str(root)), lambda *_: None, lambda: None)
        keeper = Keeper(Catalog(store, 3600.0), runner)
        keeper.start()
        await asyncio.to_thread(store.listing.wait, 5)
        closing = asyncio.ensure_future(keeper.close())  # what the gateway's close does at shutdown
        await asyncio.sleep(0)  # one turn of the loop: the close's first step marks the keeper closing
        store.go.set()
        await asyncio.wait_for(closing, 10)  # it waits for the sweep's thread
        started = list(runner.runs)
        await runner.close()
        return started, runner.holds(batch_id)

    started, held = asyncio.run(main())
    results = batch_path(root, batch_id) / "results.jsonl"
    written = results.read_bytes() if results.exists() else b""
    assert started == [] and not held and path.asked == [], f"started after shutdown: {started}, asked {path.asked}"
    assert written == b"", f"results written after shutdown: {written[:300]!r}"


def test_deleted_batches_are_kept_within_a_bound_and_a_cursor_naming_a_recent_one_still_places(
    tmp_path: Path,
) -> None:
    """Each deleted batch's record stayed in memory for the life of the process (a cursor
    naming it must still place): a cleanup loop's deletes grew it for weeks. Only the
    latest `deleted_kept` are remembered now."""
    root = tmp_path / "b"
    made = [_batch(root, f"x{i}", 1, created=time.time() - 7200 + i, expires_in=3600)[1].id for i in range(5)]
    batches = Batches(None, None, BatchesConfig(dir=str(root), max_concurrent=1), deleted_kept=2)  # type: ignore[arg-type]
    batches._keeper.sweep(_Loop())  # type: ignore[arg-type]  # each expired: ended in the sweep

    async def main() -> dict:
        for batch_id in made[:4]:
            await batches.delete(batch_id, "")
        return await batches.page({"after_id": made[3]}, "", "http://gw")

    assert asyncio.run(main())["data"] == []  # the latest deleted still places (after the one batch left)
    assert list(batches._catalog.records) == [made[4]]
    assert list(batches._deleted) == made[2:4]
    with pytest.raises(InvalidRequest):  # forgotten: an unknown id, as after a restart
        asyncio.run(batches.page({"after_id": made[0]}, "", "http://gw"))


def test_a_sweep_drops_what_it_kept_of_batches_another_process_deleted(tmp_path: Path) -> None:
    root = tmp_path / "b"
    kept, deleted = _batch(root, "kept", 1)[1].id, _batch(root, "gone", 1)[1].id
    batches = _batches(root, max_concurrent=0)
    _swept(batches)
    assert sorted(batches._catalog.records) == sorted([kept, deleted])
    BatchStore(root).hide(BatchDir(batch_path(root, deleted)))  # as another process's delete does
    _swept(batches)
    assert list(batches._catalog.records) == [kept]


def test_a_batch_deleted_while_the_sweep_looks_at_it_is_passed_by_without_an_error(tmp_path: Path, caplog) -> None:
    """Deleted between the sweep's listing and its claim: nothing to run and nothing wrong,
    so no ERROR line (one that cannot be locked while it exists still gets one)."""
    import logging

    root = tmp_path / "batches"
    gone, good, bad = (_batch(root, name, 1)[1].id for name in ("gone", "good", "bad"))
    (batch_path(root, bad) / "lock").mkdir()  # os.open(..., O_RDWR) fails on it
    store = _Listed(root, [gone, bad, good], vanishing=gone)
    batches = Batches(None, None, BatchesConfig(dir=str(root)), store=store)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="dragoman.batches"):
        assert [run.record.id for run in _swept(batches)] == [good]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and bad in errors[0]

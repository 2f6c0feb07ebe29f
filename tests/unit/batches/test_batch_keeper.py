"""The batch runner and keeper: a run stopped by a storage failure gives back every request
slot; a batch whose lock or cancel marker cannot be read is neither stuck nor stops the
sweep; batches that expired while no process ran them end in the sweep; a sweep still
running at shutdown starts nothing; what is kept of deleted batches stays within a bound."""

from __future__ import annotations

import asyncio
import errno
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dragoman.assembly.gateway import Gateway
from dragoman.batches.runs import BatchTimings, Run, Runner
from dragoman.batches.service import Batches
from dragoman.batches.store import BatchDir, BatchStore, Record
from dragoman.calls.types import Caller, Completed, Outcome, Reply
from dragoman.core import paging
from dragoman.core.config import BatchesConfig
from dragoman.core.config_load import from_dict
from dragoman.core.errors import InvalidRequest
from tests.support.helpers import batch_path


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


def _claim(runner: Runner, root: Path, record: Record) -> Run:
    from dragoman.batches.store import BatchDir

    where = BatchDir(batch_path(root, record.id))
    run = runner.claim(where, record)
    assert run is not None
    run.open(where.requests())
    return run


def test_a_storage_failure_does_not_leak_a_request_slot_of_the_process(tmp_path: Path, monkeypatch) -> None:
    """Batch X holds both slots; batch A's two requests wait for one. X's first request ends:
    A's r0 takes the slot, is answered at once, gives the slot to A's r1, and its result
    cannot be stored. The run cancels r1, which had just been handed the slot: the slot comes
    back (a slot lost so would be lost for the life of the process)."""
    root = tmp_path / "b"
    _, x_record = _batch(root, "x", 2)
    _, a_record = _batch(root, "a", 2)
    config = BatchesConfig(max_concurrent=2, dir=str(root))
    gates = {("msgbatch_01x", "r0"): asyncio.Event, ("msgbatch_01x", "r1"): asyncio.Event}
    failed: list[str] = []
    real_settle = Run.settle

    def settle(self: Run, custom_id: str, outcome: str, result: bytes) -> None:
        if self.record.id == a_record.id and not failed:
            failed.append(custom_id)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_settle(self, custom_id, outcome, result)

    monkeypatch.setattr(Run, "settle", settle)

    async def main() -> int:
        events = {key: make() for key, make in gates.items()}
        runner = Runner(_GatedPath(events), _NoRecorder(), config, lambda *_: None, lambda: None,
                        BatchTimings(rest_after_failure=0.0))  # fmt: skip
        x = _claim(runner, root, x_record)
        runner.start(x)
        await asyncio.sleep(0.05)  # X's two requests hold both slots
        a = _claim(runner, root, a_record)
        runner.start(a)
        await asyncio.sleep(0.05)  # A's two requests wait for a slot
        events[("msgbatch_01x", "r0")].set()
        await asyncio.wait_for(a.task, 5)  # type: ignore[arg-type]
        events[("msgbatch_01x", "r1")].set()
        await asyncio.wait_for(x.task, 5)  # type: ignore[arg-type]
        assert runner._slots is not None
        return runner._slots._value

    free = asyncio.run(main())
    assert failed, "the storage failure was not reached"
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

    async def prepare(self, body: bytes, *, endpoint: str, headers: Any, caller: Caller, outcome: Outcome) -> Any:
        return headers["x-batch"], json.loads(body)["metadata"]["user_id"]  # (batch, custom_id): see _batch

    async def send(self, prepared: Any, *, endpoint: str) -> Reply:
        event = self.events.get(prepared)
        if event is not None:
            await event.wait()
        return Completed(b"{}")


class _NoRecorder:
    def record(self, outcome: Outcome) -> None:
        pass


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
    from dragoman.batches.store import BatchDir

    other = BatchDir(path).try_lock()  # what another process's sweep would do
    if other is not None:
        import os

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
    import os

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


def test_a_sweep_still_running_at_shutdown_starts_no_batch(tmp_path: Path) -> None:
    """A sweep still in its thread when the gateway closes starts no batch (nor leaks one)."""
    root = tmp_path / "batches"
    batch_id = _batch(root, "orphan", 2)[1].id
    config = from_dict(
        {
            "server": {"registry_cache": ""},
            "batches": {"dir": str(root)},
            "upstreams": {"default": {"url": "http://127.0.0.1:9", "max_retries": 0}},
        }
    )

    async def main() -> list[str]:
        gateway = Gateway(config)
        batches = gateway.batches
        entered, go = threading.Event(), threading.Event()
        real_batches = batches._store.batches

        def slow_batches(owner: str | None = None) -> list[BatchDir]:  # a sweep that takes a while (a large directory)
            entered.set()
            go.wait(5)
            return real_batches(owner)

        batches._store.batches = slow_batches  # type: ignore[method-assign]
        await batches.start()
        await asyncio.to_thread(entered.wait, 5)
        await gateway.close()  # what the lifespan does at shutdown
        go.set()
        await asyncio.sleep(0.5)
        started = list(batches._runner.runs)
        await batches._runner.close()
        return started

    started = asyncio.run(main())
    results = batch_path(root, batch_id) / "results.jsonl"
    written = results.read_bytes() if results.exists() else b""
    assert started == [] and written == b"", f"started after shutdown: {started}; results written: {written[:300]!r}"


def test_deleted_batches_are_kept_within_a_bound_and_a_cursor_naming_a_recent_one_still_places(
    tmp_path: Path, monkeypatch
) -> None:
    """Each deleted batch's record stayed in memory for the life of the process (a cursor
    naming it must still place): a cleanup loop's deletes grew it for weeks. Only the
    latest DELETED_KEPT are remembered now."""
    monkeypatch.setattr(paging, "DELETED_KEPT", 2)
    root = tmp_path / "b"
    made = [_batch(root, f"x{i}", 1, created=time.time() - 7200 + i, expires_in=3600)[1].id for i in range(5)]
    batches = _batches(root, max_concurrent=1)
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

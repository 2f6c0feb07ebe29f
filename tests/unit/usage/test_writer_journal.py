"""The writer's journal timing (issue 34): a finished record reaches the journal's file within
APPEND_EVERY even while the store's write hangs (a frozen database), so a process's crash
loses nothing older; fsyncs stay batched to one per JOURNAL_EVERY however often it writes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from dragoman.calls.types import Outcome
from dragoman.usage import journal as journal_module
from dragoman.usage.journal import Journal
from dragoman.usage.records import UsageRecord
from dragoman.usage.writer import APPEND_EVERY, JOURNAL_EVERY, UsageWriter
from tests.support.usage import usage_record
from tests.support.waiting import eventually_async


class Store:
    """A store whose writes hang until `release` is set (a database frozen mid-write)."""

    def __init__(self, hang: bool) -> None:
        self.writing = asyncio.Event()
        self.release = asyncio.Event()
        self.written: list[UsageRecord] = []
        if not hang:
            self.release.set()

    async def open(self) -> None:
        pass

    async def write(self, records: list[UsageRecord]) -> None:
        self.writing.set()
        await self.release.wait()
        self.written += records

    async def close(self) -> None:
        pass


def _segments(directory: Path) -> str:
    return "".join(path.read_text() for path in directory.glob("*.jsonl"))


def _finish(writer: UsageWriter, request_id: str) -> None:
    writer.note(Outcome(request_id=request_id, endpoint="messages", model="m"), 0.01)


def test_a_record_is_journaled_while_the_stores_write_hangs(tmp_path: Path) -> None:
    asyncio.run(_journaled_during_a_hang(tmp_path))


async def _journaled_during_a_hang(tmp_path: Path) -> None:
    store = Store(hang=True)
    writer = UsageWriter(store, interval=0.05, journal=Journal(tmp_path))  # type: ignore[arg-type]
    writer.start()
    try:
        _finish(writer, "req_before")
        await asyncio.wait_for(store.writing.wait(), 10)  # the write of req_before hangs from now on
        _finish(writer, "req_during")
        await eventually_async(lambda: "req_during" in _segments(tmp_path), "journaled during the hang", timeout=10)
    finally:
        store.release.set()
        await writer.close()
    assert sorted(r.request_id for r in store.written) == ["req_before", "req_during"]
    assert list(tmp_path.glob("*.jsonl")) == []  # shipped, then removed


def test_fsyncs_are_batched_however_often_it_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[float] = []
    real = os.fsync

    def counting(fd: Any) -> None:
        synced.append(time.monotonic())
        real(fd)

    monkeypatch.setattr(journal_module.os, "fsync", counting)
    asyncio.run(_often(tmp_path, synced))


async def _often(tmp_path: Path, synced: list[float]) -> None:
    store = Store(hang=False)
    writer = UsageWriter(store, interval=0.05, journal=Journal(tmp_path))  # type: ignore[arg-type]
    writer.start()
    started = time.monotonic()
    for n in range(120):  # a record every 20 ms for about 2.4 s, flushed every 50 ms
        _finish(writer, f"req_{n}")
        await asyncio.sleep(0.02)
    elapsed = time.monotonic() - started
    await writer.close()
    assert len(store.written) == 120
    assert synced, "the journal was fsynced"
    rounds = elapsed / JOURNAL_EVERY + 2  # (+ the close's; a slow machine only has fewer)
    assert len(synced) <= 2 * rounds  # each round: the open segment and at most one sealed since
    assert APPEND_EVERY < JOURNAL_EVERY


def test_a_dead_owners_records_leave_the_journal_once_written(tmp_path: Path) -> None:
    dead = Journal(tmp_path)
    dead.open()
    dead.append([usage_record("req_left", 1.0)])
    dead.close(everything_shipped=False)  # a shutdown with the database down
    asyncio.run(_adopted(tmp_path))


async def _adopted(tmp_path: Path) -> None:
    store = Store(hang=False)
    writer = UsageWriter(store, interval=0.05, journal=Journal(tmp_path))  # type: ignore[arg-type]
    writer.start()
    try:
        await eventually_async(lambda: [r.request_id for r in store.written] == ["req_left"], "shipped", timeout=10)
        await eventually_async(lambda: not list(tmp_path.glob("*.jsonl")), "the journal emptied", timeout=10)
    finally:
        await writer.close()

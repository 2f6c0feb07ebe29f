"""The batch keeper's sweep: one batch whose lock cannot be opened does not stop the others
being taken over, and a sweep still running at shutdown starts nothing."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from dragoman.batch_runs import Run
from dragoman.batch_store import BatchStore, Record
from dragoman.batches import Batches
from dragoman.config import BatchesConfig, from_dict
from dragoman.gateway import Gateway


def _orphan(root: Path, name: str, n: int = 2) -> str:
    """A batch as a process that died left it: nothing settled, its lock free."""
    body = json.dumps(
        {
            "requests": [
                {
                    "custom_id": f"r{i}",
                    "params": {
                        "model": "m",
                        "max_tokens": 8,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                }
                for i in range(n)
            ]
        }
    ).encode()
    now = time.time()
    record = Record(
        id="msgbatch_01" + name,
        owner="",
        created=now,
        expires=now + 3600,
        total=n,
        headers={},
    )
    BatchStore(root).create(record, body)
    return record.id


class _Loop:
    """Stands in for the serving loop: records what a sweep would start."""

    def __init__(self) -> None:
        self.started: list[Run] = []

    def call_soon_threadsafe(self, start: Any, run: Run) -> None:
        self.started.append(run)


def test_one_batch_whose_lock_cannot_be_opened_does_not_stop_the_others_being_taken_over(
    tmp_path: Path,
) -> None:
    """A batch whose lock cannot be opened is skipped; the sweep takes over the others."""
    root = tmp_path / "batches"
    good, bad = _orphan(root, "good"), _orphan(root, "bad")
    (root / bad / "lock").mkdir()  # os.open(..., O_RDWR) fails on it
    batches = Batches(None, BatchesConfig(dir=str(root)))  # type: ignore[arg-type]  # a sweep never touches the gateway
    batches._store.ids = lambda: [bad, good]  # type: ignore[method-assign]  # the order scandir happened to give
    loop = _Loop()
    try:
        batches._sweep(loop)  # type: ignore[arg-type]
    finally:
        for run in loop.started:
            run.release()
    assert [run.record.id for run in loop.started] == [good]


def test_a_sweep_still_running_at_shutdown_starts_no_batch(tmp_path: Path) -> None:
    """A sweep still in its thread when the gateway closes starts no batch (nor leaks one)."""
    root = tmp_path / "batches"
    batch_id = _orphan(root, "orphan")
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
        real_ids = batches._store.ids

        def slow_ids() -> list[str]:  # a sweep that takes a while (a large directory)
            entered.set()
            go.wait(5)
            return real_ids()

        batches._store.ids = slow_ids  # type: ignore[method-assign]
        await batches.start()
        await asyncio.to_thread(entered.wait, 5)
        await gateway.close()  # what the lifespan does at shutdown
        go.set()
        await asyncio.sleep(0.5)
        started = list(batches._runner.runs)
        await batches._runner.close()
        return started

    started = asyncio.run(main())
    results = root / batch_id / "results.jsonl"
    written = results.read_bytes() if results.exists() else b""
    assert started == [] and written == b"", (
        f"started after shutdown: {started}; results written: {written[:300]!r}"
    )

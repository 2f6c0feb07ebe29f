"""Message Batches when storage or timing goes wrong, over real sockets: a result that
cannot be stored stops the whole run before the batch is let go (no request outlives its
lock; no result line is written twice or half), a batch taken over after its expiry runs
nothing, a lost outcome file is rebuilt from complete results, batches waiting their turn
hold no descriptors, a failed create leaves nothing behind, and ids and cursors tell one
key nothing about another key's batches."""

from __future__ import annotations

import errno
import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import uvicorn.config

from dragoman.batches import runs as batch_runs
from dragoman.batches import store as batch_store
from dragoman.batches.runs import BatchTimings
from dragoman.batches.store import BatchStore, Record
from tests.support.batches import (
    KEYS,
    answer_per_marker,
    counts,
    keeping_start,
    marker_of,
    params,
    sdk,
    wait_ended,
)
from tests.support.fakes import FakeUpstream, Reply, completion
from tests.support.helpers import batch_path
from tests.support.waiting import eventually

EPOCH_STAMP = "1970-01-01T00:00:00.000000Z"
start = keeping_start  # the fixture: a gateway keeping its batches in the test's directory


# -- a storage error while settling: the run lets go of the batch with requests still running ----


def test_a_storage_error_on_one_result_stops_the_other_requests_before_the_batch_is_released(
    start, upstream, monkeypatch, tmp_path
):
    """The disk fills while r0's result is stored: the run stops r1 (in flight) before it lets
    the batch go, so nothing is written through a closed or reused descriptor, and the batch,
    taken over again, ends with each result once."""
    timings = BatchTimings(adopt_every=0.05, rest_after_failure=0.05)
    released: set[int] = set()
    late: list[str] = []
    failed_once = threading.Event()
    real_settle, real_release = batch_runs.Run.settle, batch_runs.Run.release

    def settle(self: batch_runs.Run, custom_id: str, outcome: str, result: bytes) -> None:
        if id(self) in released:
            late.append(custom_id)
        if not failed_once.is_set():
            failed_once.set()
            raise OSError(errno.ENOSPC, "No space left on device")  # the disk filled up
        real_settle(self, custom_id, outcome, result)

    def release(self: batch_runs.Run) -> None:
        released.add(id(self))
        real_release(self)

    monkeypatch.setattr(batch_runs.Run, "settle", settle)
    monkeypatch.setattr(batch_runs.Run, "release", release)

    def respond(
        body: dict,
    ) -> Reply:  # r0 settles at once (and fails to be stored); r1 is in flight for 0.5 s
        marker = marker_of(body)
        return Reply(body=completion(f"answer to {marker}"), hang=0.5 if marker == "m1" else 0.0)

    upstream.responder = respond
    client = sdk(start(batches={"max_concurrent": 2}, timings=timings))
    created = client.messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(2)]
    )
    eventually(lambda: failed_once.is_set() and released)
    time.sleep(1.5)  # pacing: past r1's 0.5 s in flight, so a stray settle would have landed by now
    wait_ended(client, created.id)
    lines = [
        json.loads(line)["custom_id"]
        for line in (batch_path(tmp_path / "batches", created.id) / "results.jsonl").read_bytes().splitlines()
    ]
    assert late == [], f"settled after the run released the batch: {late}"
    assert sorted(lines) == [
        "r0",
        "r1",
    ]  # seen: ['r0', 'r1', 'r1'] when the stray write lands on the adopter's descriptor


def test_a_batch_whose_results_cannot_be_stored_rests_before_it_runs_again(start, upstream, monkeypatch):
    """A disk that stays full: each run stops at its first result, and the batch rests
    REST_AFTER_FAILURE before this process runs it again: no tight loop of upstream calls."""
    timings = BatchTimings(adopt_every=0.02, rest_after_failure=0.5)

    def settle(self: batch_runs.Run, custom_id: str, outcome: str, result: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(batch_runs.Run, "settle", settle)
    answer_per_marker(upstream)
    answer = upstream.responder
    assert answer is not None
    arrivals: list[float] = []
    upstream.responder = lambda body: (arrivals.append(time.monotonic()), answer(body))[1]
    client = sdk(start(batches={"max_concurrent": 1}, timings=timings))
    created = client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    eventually(lambda: len(arrivals) >= 3, timeout=10)  # one run, then one per rest
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert all(gap >= 0.5 - 0.01 for gap in gaps), gaps  # each run after a whole rest: not one per sweep (0.02 s)
    assert client.messages.batches.retrieve(created.id).processing_status == "in_progress"


# -- a short write of a result line is not noticed ------------------------------------------------


class _ShortFirstWrite:
    """`os` as batch_runs sees it, except the first write stores only half its bytes (as a
    write to a disk that fills up does) and says so by its return value."""

    def __init__(self) -> None:
        self.short = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        if not self.short:
            self.short = True
            return os.write(fd, data[: len(data) // 2])
        return os.write(fd, data)


def test_a_result_line_written_short_does_not_corrupt_the_results(start, upstream, monkeypatch, tmp_path):
    monkeypatch.setattr(batch_runs, "os", _ShortFirstWrite())
    timings = BatchTimings(adopt_every=0.05, rest_after_failure=0.05)
    answer_per_marker(upstream)
    client = sdk(start(batches={"max_concurrent": 1}, timings=timings))
    created = client.messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(3)]
    )
    wait_ended(client, created.id)
    lines = (batch_path(tmp_path / "batches", created.id) / "results.jsonl").read_bytes().splitlines()
    for line in lines:
        json.loads(line)  # every line of the results is one whole JSON object
    assert len(lines) == 3


# -- taken over after it expired: the first requests still run ------------------------------------


def _write_batch(root: Path, *, expires: float, n: int = 3, owner: str = "") -> str:
    """A batch on disk as a process that died left it: created, nothing settled, unlocked."""
    body = json.dumps({"requests": [{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(n)]}).encode()
    now = time.time()
    record = Record(id="msgbatch_01review" + str(int(now * 1000)), owner=owner, created=now - 100, expires=expires, total=n,
                    headers={"anthropic-version": "2023-06-01"})  # fmt: skip
    BatchStore(root).create(record, body)
    return record.id


def test_a_batch_taken_over_after_it_expired_runs_none_of_its_requests(start, upstream, tmp_path, monkeypatch):
    """On asyncio's own loop too (where a 0 s timer fires after the workers' first steps), a
    batch past its expiry when taken over sends nothing upstream."""
    monkeypatch.setitem(uvicorn.config.LOOP_FACTORIES, "auto", uvicorn.config.LOOP_FACTORIES["asyncio"])
    answer_per_marker(upstream)
    batch_id = _write_batch(tmp_path / "batches", expires=time.time() - 3600)  # expired an hour ago
    client = sdk(start(batches={"max_concurrent": 4}))
    ended = wait_ended(client, batch_id)
    assert counts(ended) == {
        "processing": 0,
        "succeeded": 0,
        "errored": 0,
        "canceled": 0,
        "expired": 3,
    }
    assert upstream.requests == []


def test_a_results_file_that_does_not_parse_does_not_wedge_the_batch(start, upstream, tmp_path):
    """Result lines an earlier version wrote pretty-printed: the process that takes the batch
    over drops them and runs those requests again; the batch ends and can be deleted."""
    answer_per_marker(upstream)
    root = tmp_path / "batches"
    batch_id = _write_batch(root, expires=time.time() + 3600)
    good = json.dumps({"custom_id": "r0", "result": {"type": "canceled"}})
    broken = json.dumps({"custom_id": "r1", "result": {"type": "errored", "error": {"type": "error"}}}, indent=2)
    (batch_path(root, batch_id) / "results.jsonl").write_text(good + "\n" + broken + "\n")
    client = sdk(start())
    ended = wait_ended(client, batch_id)
    assert counts(ended) == {"processing": 0, "succeeded": 2, "errored": 0, "canceled": 1, "expired": 0}
    assert sorted(marker_of(body) for body in upstream.requests) == ["m1", "m2"]
    for line in (batch_path(root, batch_id) / "results.jsonl").read_bytes().splitlines():
        json.loads(line)
    client.messages.batches.delete(batch_id)


def test_a_batch_kept_flat_by_an_earlier_version_is_still_run_listed_and_deleted(start, upstream, tmp_path):
    answer_per_marker(upstream)
    root = tmp_path / "batches"
    batch_id = _write_batch(root, expires=time.time() + 3600)
    os.rename(root / "shared" / batch_id, root / batch_id)  # where earlier versions kept every batch
    client = sdk(start())
    assert counts(wait_ended(client, batch_id))["succeeded"] == 3
    assert [batch.id for batch in client.messages.batches.list().data] == [batch_id]
    client.messages.batches.delete(batch_id)
    assert client.messages.batches.list().data == []


# -- another key's batch id as a list cursor ---------------------------------------------------------


def test_another_keys_batch_id_as_a_list_cursor_is_an_unknown_id(start, upstream):
    """Another key's batch id as a list cursor gets the answer of an id that does not exist."""
    answer_per_marker(upstream)
    gateway = start(server={"api_keys": KEYS})
    mine, theirs = sdk(gateway, "key-a"), sdk(gateway, "key-b")
    created = mine.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    with pytest.raises(anthropic.BadRequestError):
        theirs.messages.batches.list(after_id="msgbatch_01doesnotexist")
    with pytest.raises(anthropic.BadRequestError):  # the same answer as for an id that does not exist
        theirs.messages.batches.list(after_id=created.id)


# -- an ended.json that did not reach the disk whole ---------------------------------------------------


def test_an_unreadable_ended_file_does_not_leave_the_batch_in_progress_forever(start, upstream, tmp_path, monkeypatch):
    """An outcome file left empty (a power loss) with every result stored: the next process
    rebuilds the outcome from the results; the batch does not stay in progress forever."""
    timings = BatchTimings(adopt_every=0.05)
    answer_per_marker(upstream)
    first = start(timings=timings)
    created = sdk(first).messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(2)]
    )
    wait_ended(sdk(first), created.id)
    first.stop()
    (batch_path(tmp_path / "batches", created.id) / "ended.json").write_bytes(b"")  # its data never reached the disk

    client = sdk(start(timings=timings))
    ended = wait_ended(client, created.id, timeout=3)
    assert counts(ended)["succeeded"] == 2


# -- every batch waiting for a slot holds descriptors ----------------------------------------------------


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_batches_waiting_for_a_slot_hold_no_file_descriptors(start, upstream: FakeUpstream):
    """40 batches waiting behind a running one hold no descriptors (no lock, no results file):
    a long queue cannot exhaust the process's descriptor limit."""
    answer_per_marker(upstream, hang=5.0)
    client = sdk(start(batches={"max_concurrent": 1}))
    client.messages.batches.create(requests=[{"custom_id": "first", "params": params("m")}])
    eventually(lambda: len(upstream.requests) == 1)
    before = _open_descriptors()
    for _ in range(40):  # all waiting behind the first
        client.messages.batches.create(requests=[{"custom_id": "a", "params": params("m")}])
    grown = _open_descriptors() - before
    assert grown < 20, f"{grown} descriptors held by 40 waiting batches"


# -- a batch id too long for a file name --------------------------------------------------------------


@pytest.mark.parametrize(
    "method,suffix",
    [("GET", ""), ("POST", "/cancel"), ("DELETE", ""), ("GET", "/results")],
)
def test_an_overlong_batch_id_is_a_404_not_a_500(start, upstream, method, suffix):
    """An id too long for a file name is a 404 on every batch route, not a 500."""
    answer_per_marker(upstream)
    gateway = start()
    sdk(gateway).messages.batches.create(
        requests=[{"custom_id": "a", "params": params()}]
    )  # the store's directory exists
    response = httpx.request(
        method,
        f"{gateway.url}/v1/messages/batches/msgbatch_{'a' * 300}{suffix}",
        headers={"x-api-key": "k"},
    )
    status, error_type = response.status_code, response.json()["error"]["type"]
    time.sleep(
        0.3
    )  # let the server log its traceback first (3.11.7 formats tracebacks with a non-thread-safe ast.parse)
    assert (status, error_type) == (404, "not_found_error")


# -- a create that fails after the batch is stored ---------------------------------------------------------


def test_a_create_that_fails_after_storing_the_batch_leaves_no_batch_that_never_runs(start, upstream, monkeypatch):
    """The results file cannot be opened when the batch first runs (EMFILE under load): the
    create still answers, and the batch runs once the keeper tries again."""
    timings = BatchTimings(adopt_every=0.05)
    answer_per_marker(upstream)
    real_open = batch_store.BatchDir.open_results
    failed: list[bool] = []

    def open_results(self: batch_store.BatchDir) -> int:
        if not failed:
            failed.append(True)
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(self)

    monkeypatch.setattr(batch_store.BatchDir, "open_results", open_results)
    client = sdk(start(timings=timings))
    created = client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    assert [b.id for b in client.messages.batches.list().data] == [created.id]
    assert counts(wait_ended(client, created.id, timeout=3))["succeeded"] == 1
    assert failed == [True]  # the first try did fail

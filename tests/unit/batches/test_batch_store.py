"""The on-disk layout of batches: ids never name a path outside the store, a new batch
appears whole, one run lock per batch, the first cancel wins (and is never seen empty), a
result line cut short is dropped, and what crashes leave behind is cleared."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from dragoman.batches.store import BatchStore, Ended, Record
from dragoman.protocol.batches import RequestCounts

BODY = json.dumps(
    {"requests": [{"custom_id": "a", "params": {"model": "m"}}, {"custom_id": "b", "params": {"model": "m"}}]}
).encode()


def record(batch_id: str = "msgbatch_01abc") -> Record:
    return Record(id=batch_id, owner="", created=1.0, expires=2.0, total=2, headers={"anthropic-version": "2023-06-01"})


def test_a_created_batch_is_whole_private_and_has_one_run_lock(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b")
    where = store.create(record(), BODY)
    assert where.record() == record()
    assert [r.custom_id for r in where.requests()] == ["a", "b"]
    assert [b.id for b in store.batches("")] == ["msgbatch_01abc"]  # no staging directory left behind
    assert where.path == tmp_path / "b" / "shared" / "msgbatch_01abc"  # the owner ""'s directory
    assert stat.S_IMODE(os.stat(tmp_path / "b").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(where.path / "batch.json").st_mode) == 0o600
    lock = where.try_lock()
    assert lock is not None
    try:
        assert where.try_lock() is None  # a second run is refused while the first holds it
    finally:
        os.close(lock)
    again = where.try_lock()
    assert again is not None  # freed with the holder's descriptor, as when its process dies
    os.close(again)


@pytest.mark.parametrize("bad", ["../etc", "msgbatch_../../x", "msgbatch_a/b", "other_01abc", "msgbatch_", ".msgbatch_01abc.new", "msgbatch_é",
                                 "msgbatch_" + "a" * 300])  # fmt: skip
def test_ids_that_could_name_another_path_are_unknown(tmp_path: Path, bad: str) -> None:
    store = BatchStore(tmp_path)
    store.create(record(), BODY)
    assert store.batch(bad, "") is None


def test_the_first_cancel_wins(tmp_path: Path) -> None:
    where = BatchStore(tmp_path).create(record(), BODY)
    assert where.canceled_at() is None
    assert where.cancel(5.0) == 5.0
    assert where.cancel(9.0) == 5.0
    assert where.canceled_at() == 5.0
    assert sorted(p.name for p in where.path.iterdir()) == [
        "batch.json",
        "canceled",
        "requests.json",
    ]  # no temporary file left


def test_an_empty_cancel_marker_is_no_cancel(tmp_path: Path) -> None:
    where = BatchStore(tmp_path).create(record(), BODY)
    (where.path / "canceled").write_text("")  # as a cancel of an older build could leave it
    assert where.canceled_at() is None


def test_ending_keeps_the_counts_and_drops_the_requests(tmp_path: Path) -> None:
    where = BatchStore(tmp_path).create(record(), BODY)
    assert where.ended() is None
    where.end(Ended(at=3.0, counts=RequestCounts(succeeded=2)))
    assert where.ended() == Ended(at=3.0, counts=RequestCounts(succeeded=2))
    assert not (where.path / "requests.json").exists()


def test_a_result_line_cut_short_is_dropped_and_the_file_repaired(tmp_path: Path) -> None:
    where = BatchStore(tmp_path).create(record(), BODY)
    fd = where.open_results()
    os.write(fd, b'{"custom_id":"a","result":{"type":"expired"}}\n{"custom_id":"b","res')
    os.close(fd)
    assert list(where.settled()) == [b'{"custom_id":"a","result":{"type":"expired"}}']
    assert where.results_path().read_bytes().endswith(b"}\n")  # the next append starts a whole line


def test_removing_makes_the_batch_unknown_at_once(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    store.create(record(), BODY)
    where = store.batch("msgbatch_01abc", "")
    assert where is not None and store.hide(where) is not None
    assert store.batch("msgbatch_01abc", "") is None and store.batches() == []
    store.clear_debris()  # what a sweep does with hidden batches
    assert list((tmp_path / "shared").iterdir()) == []
    assert store.hide(where) is None  # a second remove (another process) is no error


def test_an_unreadable_outcome_file_reads_as_no_outcome(tmp_path: Path) -> None:
    where = BatchStore(tmp_path).create(record(), BODY)
    (where.path / "ended.json").write_bytes(b"")  # as a power loss before the sync could leave it
    assert where.ended() is None


def test_debris_of_crashes_is_cleared(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    store.create(record(), BODY)
    for place in (tmp_path, tmp_path / "shared"):  # the flat layout of earlier versions, and an owner's
        (place / ".msgbatch_01gone.1.gone").mkdir()  # removed, but not yet deleted
        fresh, stale = place / ".msgbatch_01new.new", place / ".msgbatch_01old.new"
        fresh.mkdir()
        stale.mkdir()
        os.utime(stale, (time.time() - 7200, time.time() - 7200))  # a create that never finished
    store.clear_debris()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".msgbatch_01new.new", "shared"]
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == [
        ".msgbatch_01new.new",
        "msgbatch_01abc",
    ]  # a create may be under way

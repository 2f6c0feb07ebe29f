"""The on-disk layout of batches: ids never name a path outside the store, a new batch is
locked before anyone can see it, one run lock per batch, the first cancel wins, and a
result line cut short is dropped."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dragoman.batch_store import BatchStore, Ended, Record
from dragoman.protocol.batches import RequestCounts

BODY = json.dumps({"requests": [{"custom_id": "a", "params": {"model": "m"}}, {"custom_id": "b", "params": {"model": "m"}}]}).encode()


def record(batch_id: str = "msgbatch_01abc") -> Record:
    return Record(id=batch_id, owner="", created=1.0, expires=2.0, total=2, headers={"anthropic-version": "2023-06-01"})


def test_a_created_batch_is_whole_private_and_locked_by_its_creator(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b")
    where, lock = store.create(record(), BODY)
    try:
        assert where.record() == record()
        assert [r.custom_id for r in where.requests()] == ["a", "b"]
        assert store.ids() == ["msgbatch_01abc"]  # no staging directory left behind
        assert where.try_lock() is None  # a second run is refused while the creator lives
        assert stat.S_IMODE(os.stat(tmp_path / "b").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(where.path / "batch.json").st_mode) == 0o600
    finally:
        os.close(lock)
    again = where.try_lock()
    assert again is not None  # freed with the creator's descriptor, as when its process dies
    os.close(again)


@pytest.mark.parametrize("bad", ["../etc", "msgbatch_../../x", "msgbatch_a/b", "other_01abc", "msgbatch_", ".msgbatch_01abc.new", "msgbatch_é"])
def test_ids_that_could_name_another_path_are_unknown(tmp_path: Path, bad: str) -> None:
    store = BatchStore(tmp_path)
    store.create(record(), BODY)
    assert store.batch(bad) is None


def test_the_first_cancel_wins(tmp_path: Path) -> None:
    where, lock = BatchStore(tmp_path).create(record(), BODY)
    os.close(lock)
    assert where.canceled_at() is None
    assert where.cancel(5.0) == 5.0
    assert where.cancel(9.0) == 5.0
    assert where.canceled_at() == 5.0


def test_ending_keeps_the_counts_and_drops_the_requests(tmp_path: Path) -> None:
    where, lock = BatchStore(tmp_path).create(record(), BODY)
    os.close(lock)
    assert where.ended() is None
    where.end(Ended(at=3.0, counts=RequestCounts(succeeded=2)))
    assert where.ended() == Ended(at=3.0, counts=RequestCounts(succeeded=2))
    assert not (where.path / "requests.json").exists()


def test_a_result_line_cut_short_is_dropped_and_the_file_repaired(tmp_path: Path) -> None:
    where, lock = BatchStore(tmp_path).create(record(), BODY)
    os.close(lock)
    fd = where.open_results()
    os.write(fd, b'{"custom_id":"a","result":{"type":"expired"}}\n{"custom_id":"b","res')
    os.close(fd)
    assert where.settled() == [b'{"custom_id":"a","result":{"type":"expired"}}']
    assert where.results_path().read_bytes().endswith(b"}\n")  # the next append starts a whole line


def test_removing_makes_the_batch_unknown_at_once(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    where, lock = store.create(record(), BODY)
    os.close(lock)
    store.remove("msgbatch_01abc")
    assert store.batch("msgbatch_01abc") is None and store.ids() == []
    assert list(tmp_path.iterdir()) == []
    store.remove("msgbatch_01abc")  # a second remove (another process) is no error

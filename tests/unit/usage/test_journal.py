"""The usage journal's files: a dead owner's records adopted once (its streams as crashed
ones, unless finished), a line cut short by a crash skipped, a live owner's left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from msgspec.structs import replace

from dragoman.usage.journal import CRASHED, Journal
from tests.support.usage import usage_record


def test_a_dead_owners_records_are_adopted_once(tmp_path: Path) -> None:
    dead = Journal(tmp_path)
    dead.open()
    dead.append([usage_record("req_1", 1.0), usage_record("req_2", 2.0)])
    streams = [replace(usage_record(i, 3.0), error_type=CRASHED, output_tokens=7) for i in ("req_2", "req_3")]
    dead.streams(streams)  # req_2 finished after the last snapshot: its own record wins
    os.write(dead._segment or -1, b'[1.0,"req_cut')  # a crash in the middle of a line
    live = Journal(tmp_path)
    live.open()
    assert live.adopt() == []  # its owner still holds its lock
    os.close(dead._lock_fd or -1)  # the owner dies
    adopted = live.adopt()
    assert [(r.request_id, r.error_type, r.output_tokens) for r in adopted] == [
        ("req_1", None, 1),
        ("req_2", None, 1),
        ("req_3", CRASHED, 7),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{live.owner}-1.jsonl", f"{live.owner}.lock"]
    assert Journal(tmp_path).adopt() == []  # nobody adopts them twice
    live.seal()
    live.shipped()
    live.close(everything_shipped=True)
    assert list(tmp_path.iterdir()) == []


def test_a_clean_shutdown_with_records_unshipped_leaves_them(tmp_path: Path) -> None:
    first = Journal(tmp_path)
    first.open()
    first.append([usage_record("req_1", 1.0)])
    first.close(everything_shipped=False)
    second = Journal(tmp_path)
    second.open()
    assert [r.request_id for r in second.adopt()] == ["req_1"]


def test_an_owner_killed_leaves_its_lock_free(tmp_path: Path) -> None:
    """The lock is the process's: SIGKILL frees it (the kernel closes the descriptor)."""
    code = f"from pathlib import Path; from dragoman.usage.journal import Journal; j = Journal(Path({str(tmp_path)!r})); j.open(); print(j.owner, flush=True); input()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    owner = child.stdout.readline().strip()
    assert Journal(tmp_path).adopt() == [] and (tmp_path / f"{owner}.lock").exists()
    child.kill()
    child.wait(10)
    Journal(tmp_path).adopt()
    assert not (tmp_path / f"{owner}.lock").exists()

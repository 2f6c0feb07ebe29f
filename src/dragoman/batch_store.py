"""Message Batches on disk: one directory per batch, shared by every process.

Each process of a gateway (`--workers`, or replicas sharing the directory) sees every
batch, and a restart loses none: the batch that a process was running when it died is
taken over by the next process that looks (see `try_lock`). Layout of `<dir>/<id>/`:

- `batch.json`    the record (who made it, when, its forwarded headers); never changes
- `requests.json` the create request's body as sent, kept until the batch ends
- `results.jsonl` one line per settled request, appended as each one settles
- `canceled`      made by the first cancel, from any process; holds its time
- `ended.json`    written once, by the process that ran the batch, when it ended
- `lock`          held (flock) by the process running the batch; the kernel frees it
                  when that process dies, so a live run is never taken over

A batch appears whole: it is written under a temporary name, locked by its creator,
then renamed into place. A deleted batch is renamed away before it is removed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

import msgspec

from dragoman.protocol.batches import BATCH_CREATE, BatchRequest, RequestCounts

PREFIX = "msgbatch_"


class Record(msgspec.Struct, frozen=True):
    id: str
    owner: str  # a digest of the key that made it ("" when keys are shared or unset)
    created: float
    expires: float
    total: int
    headers: dict[str, str]


class Ended(msgspec.Struct, frozen=True):
    at: float
    counts: RequestCounts


_RECORD = msgspec.json.Decoder(Record)
_ENDED = msgspec.json.Decoder(Ended)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


class BatchDir:
    """The files of one batch."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self) -> Record:
        return _RECORD.decode((self.path / "batch.json").read_bytes())

    def requests(self) -> list[BatchRequest]:
        return BATCH_CREATE.decode((self.path / "requests.json").read_bytes()).requests

    def ended(self) -> Ended | None:
        try:
            return _ENDED.decode((self.path / "ended.json").read_bytes())
        except FileNotFoundError:
            return None

    def canceled_at(self) -> float | None:
        try:
            return float((self.path / "canceled").read_text() or "0")
        except (FileNotFoundError, ValueError):
            return None

    def cancel(self, at: float) -> float:
        """Mark the batch canceled (the first cancel's time wins); the time it was."""
        try:
            fd = os.open(self.path / "canceled", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self.canceled_at() or at
        with os.fdopen(fd, "w") as out:
            out.write(repr(at))
        return at

    def end(self, ended: Ended) -> None:
        _write_atomically(self.path / "ended.json", msgspec.json.encode(ended))
        (self.path / "requests.json").unlink(missing_ok=True)  # the results now stand for them

    def results_path(self) -> Path:
        return self.path / "results.jsonl"

    def settled(self) -> list[bytes]:
        """The result lines written so far; a line cut short by a crash is dropped (its
        request runs again)."""
        try:
            data = self.results_path().read_bytes()
        except FileNotFoundError:
            return []
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) != len(data):
            with open(self.results_path(), "r+b") as out:
                out.truncate(len(whole))
        return whole.splitlines()

    def open_results(self) -> int:
        """A descriptor that appends result lines (one write each, so a line is whole or absent)."""
        return os.open(self.results_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def try_lock(self) -> int | None:
        """The run lock, if no live process holds it: a descriptor to keep open while running."""
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd


class BatchStore:
    """All batches in one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def batch(self, batch_id: str) -> BatchDir | None:
        if not batch_id.startswith(PREFIX) or not batch_id.isascii() or not batch_id.replace("_", "").isalnum():
            return None  # never a path outside the store
        path = self.root / batch_id
        return BatchDir(path) if (path / "batch.json").exists() else None

    def ids(self) -> list[str]:
        try:
            return [e.name for e in os.scandir(self.root) if e.name.startswith(PREFIX)]
        except FileNotFoundError:
            return []

    def create(self, record: Record, body: bytes) -> tuple[BatchDir, int]:
        """Write a new batch and take its run lock before any other process can see it."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self.root / f".{record.id}.new"
        staging.mkdir(mode=0o700)
        try:
            _write_atomically(staging / "requests.json", body)
            _write_atomically(staging / "batch.json", msgspec.json.encode(record))
            fd = BatchDir(staging).try_lock()
            assert fd is not None  # nobody else knows this directory yet
            try:
                os.rename(staging, self.root / record.id)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return BatchDir(self.root / record.id), fd

    def remove(self, batch_id: str) -> None:
        """Delete a batch: gone for every reader at once, its files removed after."""
        gone = self.root / f".{batch_id}.{time.time_ns()}.gone"
        try:
            os.rename(self.root / batch_id, gone)
        except FileNotFoundError:
            return  # another process removed it first
        shutil.rmtree(gone, ignore_errors=True)

"""The local journal under the usage ledger: every record goes first to an append-only file
on local disk, is shipped from there to the database, and its file is removed once the
database has committed it. What a shutdown could not ship stays on disk; the next process to
look at the directory ships it. A record written survives the process's crash (the kernel
holds it); an fsync, batched by the writer, makes it survive the machine's.

Layout of the directory (any number of processes may share it):
- `<owner>.lock`: held (flock) by the live process `owner` for as long as it runs;
- `<owner>-<n>.jsonl`: its segments, one record (a JSON array) a line;
- `<owner>.streams`: its streams in flight, rewritten each tick, as the records they would
  leave if the process died now (`error_type: gateway_crashed`).
A lock nobody holds is a dead owner's: a live process adopts its files (one at a time, under
that lock). Shipping twice is harmless: a request id is the table's primary key."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
from pathlib import Path

import msgspec

from dragoman.usage.records import UsageRecord

log = logging.getLogger("dragoman.usage")

_encoder = msgspec.json.Encoder()
_encode, _encode_lines = _encoder.encode, _encoder.encode_lines
_decode_one = msgspec.json.Decoder(UsageRecord).decode
_decode_list = msgspec.json.Decoder(list[UsageRecord]).decode
CRASHED = "gateway_crashed"


class Journal:
    """One process's journal in `directory`. Methods do blocking file I/O: call them from
    a thread (the writer does), never on the event loop's request path."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.owner = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._lock_fd: int | None = None
        self._segment: int | None = None  # the open segment's fd
        self._seq = 0
        self._sealed: list[Path] = []  # segments whose records all wait in the writer's batch
        self._current: Path | None = None
        self._streams_written = False
        self._dirty = False  # the open segment has writes not yet fsynced
        self._unsynced: list[int] = []  # sealed segments' fds, written since the last fsync

    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / f"{self.owner}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh name: nobody else holds it
        self._lock_fd = fd

    def append(self, records: list[UsageRecord]) -> None:
        """Write `records` to the open segment: once this returns, they survive the process's
        crash; once `sync` has run too, the machine's."""
        if not records:
            return
        if self._segment is None:
            self._seq += 1
            self._current = self.dir / f"{self.owner}-{self._seq}.jsonl"
            self._segment = os.open(self._current, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        os.write(self._segment, _encode_lines(records))  # each record's JSON and a newline
        self._dirty = True

    @property
    def writing(self) -> bool:
        """A segment is open: there is something to seal."""
        return self._segment is not None

    def sync(self) -> None:
        """fsync what was written since the last fsync, sealed segments too (the writer calls
        it once every JOURNAL_EVERY: the batching)."""
        if not self._dirty:
            return
        for fd in self._unsynced:
            os.fsync(fd)
            os.close(fd)
        self._unsynced.clear()
        if self._segment is not None:
            os.fsync(self._segment)
        self._dirty = False

    def seal(self) -> None:
        """The records appended so far are about to be shipped: later ones go to a new segment
        (this one is fsynced by the next `sync` if it needs one)."""
        if self._segment is not None and self._current is not None:
            if self._dirty:
                self._unsynced.append(self._segment)
            else:
                os.close(self._segment)
            self._sealed.append(self._current)
            self._segment, self._current = None, None

    def shipped(self) -> None:
        """Every sealed segment's records are committed: the segments go."""
        for path in self._sealed:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._sealed.clear()

    def streams(self, open_streams: list[UsageRecord]) -> None:
        """The records open streams would leave if the process died now (rewritten whole, atomically)."""
        path = self.dir / f"{self.owner}.streams"
        if not open_streams:
            if self._streams_written:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                self._streams_written = False
            return
        temporary = path.with_suffix(".tmp")
        with open(temporary, "wb") as file:
            file.write(_encode(open_streams))
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(path)
        self._streams_written = True

    def adopt(self) -> list[UsageRecord]:
        """The records dead owners left (their streams as crashed ones, unless a finished
        record of the same request is there), appended to this journal before their files go."""
        adopted: list[UsageRecord] = []
        for lock in self.dir.glob("*.lock"):
            owner = lock.stem
            if owner == self.owner:
                continue
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue  # adopted by another meanwhile
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # alive
                adopted += self._take(owner, lock)
            finally:
                os.close(fd)
        return adopted

    def _take(self, owner: str, lock: Path) -> list[UsageRecord]:
        segments = sorted(self.dir.glob(f"{owner}-*.jsonl"))
        records = [r for path in segments for r in _read_segment(path)]
        seen = {r.request_id for r in records}
        streams = self.dir / f"{owner}.streams"
        with contextlib.suppress(FileNotFoundError, msgspec.DecodeError):
            records += [r for r in _decode_list(streams.read_bytes()) if r.request_id not in seen]
        self.append(records)  # ours now, on disk, before theirs go
        self.sync()
        for path in (*segments, streams, streams.with_suffix(".tmp"), lock):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if records:
            log.info("%d usage records left by a stopped gateway process (%s) are shipped", len(records), owner)
        return records

    def close(self, everything_shipped: bool) -> None:
        """At a clean shutdown: the files go if nothing is left to ship, else they stay for
        the next process; the lock is released either way."""
        self.sync()
        if self._segment is not None:
            os.close(self._segment)
            self._segment = None
        self.streams([])
        if everything_shipped and self._current is not None:
            self._sealed.append(self._current)
        if everything_shipped:
            self.shipped()
        if self._lock_fd is not None:
            if everything_shipped:
                with contextlib.suppress(FileNotFoundError):
                    (self.dir / f"{self.owner}.lock").unlink()
            os.close(self._lock_fd)
            self._lock_fd = None


def _read_segment(path: Path) -> list[UsageRecord]:
    """A segment's records; a line cut short by a crash (the last one) or unreadable is skipped."""
    records = []
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    for line in data.splitlines():
        try:
            records.append(_decode_one(line))
        except msgspec.DecodeError:
            log.warning("an unreadable line in the usage journal %s was skipped", path.name)
    return records

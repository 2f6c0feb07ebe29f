"""Message Batches on disk: one directory per batch, shared by every process.

Each process of a gateway (`--workers`, or replicas sharing the directory) sees every
batch, and a restart loses none: a batch is run by whichever process locks it first (see
`try_lock`), and one whose process died is taken by the next that looks.

Each owner's batches are in a directory of their own, `<dir>/<owner>/<id>/` (`<owner>` its
digest, `shared` for the owner ""), so that a list or a create reads the caller's batches,
never every owner's. Batches that earlier versions kept flat, `<dir>/<id>/`, are still
found where they are (their record names their owner) until they are removed. Layout of
a batch's directory:

- `batch.json`    the record (who made it, when, its forwarded headers); never changes
- `requests.json` the create request's body as sent, kept until the batch ends
- `results.jsonl` one line per settled request, appended as each one settles
- `canceled`      made whole by the first cancel, from any process; holds its time
- `ended.json`    written once, by the process that ran the batch, when it ended
- `lock`          held (flock) by the process running the batch; the kernel frees it
                  when that process dies

A batch appears whole (written under a temporary name, then renamed into place) and goes
at once (renamed away, then removed). Records and outcomes are synced to disk before they
count, so a power loss leaves a batch as it was or as it became, never half-written;
result lines are not synced one by one: a request whose line is lost runs again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from dragoman.core.storage import owner_dir, sync_dir, write_atomically, write_synced
from dragoman.protocol.batches import BATCH_CREATE, BatchRequest, RequestCounts

PREFIX = "msgbatch_"
MAX_ID = 100  # longer is no id of ours (and could pass the file system's name limit)
DEBRIS_AFTER = 3600.0  # seconds after which a crashed create's staging directory is removed


class Record(msgspec.Struct, frozen=True):
    id: str
    owner: str  # a digest of the key that made it ("" when keys are shared or unset)
    created: float
    expires: float
    total: int
    headers: dict[str, str]
    key_id: str | None = None  # its requests' usage and [limits] are the creating key's (`Caller.key_id`) and tenant's
    tenant: str | None = None


class Ended(msgspec.Struct, frozen=True):
    at: float
    counts: RequestCounts


_RECORD = msgspec.json.Decoder(Record)
_ENDED = msgspec.json.Decoder(Ended)


class BatchDir:
    """The files of one batch."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def id(self) -> str:
        return self.path.name

    def record(self) -> Record:
        return _RECORD.decode((self.path / "batch.json").read_bytes())

    def requests(self) -> list[BatchRequest]:
        return BATCH_CREATE.decode((self.path / "requests.json").read_bytes()).requests

    def ended(self) -> Ended | None:
        """The outcome, or None while running (an unreadable outcome file counts as none)."""
        try:
            return _ENDED.decode((self.path / "ended.json").read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def canceled_at(self) -> float | None:
        """When the batch was canceled, or None (also for a marker that cannot be read)."""
        try:
            return float((self.path / "canceled").read_text())
        except (OSError, ValueError):
            return None

    def cancel(self, at: float) -> float:
        """Mark the batch canceled; the time of the first cancel (made whole: a link to a
        written file, so no reader sees an empty marker)."""
        tmp = self.path / f".canceled.{os.getpid()}.{time.time_ns()}"
        write_synced(tmp, repr(at).encode())
        try:
            os.link(tmp, self.path / "canceled")
        except FileExistsError:
            return self.canceled_at() or at
        finally:
            tmp.unlink(missing_ok=True)
        sync_dir(self.path)  # an acknowledged cancel survives a power loss
        return at

    def end(self, ended: Ended) -> None:
        write_atomically(self.path / "ended.json", msgspec.json.encode(ended))
        (self.path / "requests.json").unlink(missing_ok=True)  # the results now stand for them

    def stored_bytes(self) -> int:
        """What the batch takes on disk: its requests (until it ends) and its results."""
        size = 0
        for name in ("requests.json", "results.jsonl"):
            with contextlib.suppress(FileNotFoundError):
                size += (self.path / name).stat().st_size
        return size

    def results_path(self) -> Path:
        return self.path / "results.jsonl"

    def settled(self) -> Iterator[bytes]:
        """The result lines written so far, read a line at a time; a last line cut short by
        a crash is cut off the file (its request runs again)."""
        try:
            results = open(self.results_path(), "r+b")
        except FileNotFoundError:
            return
        with results:
            whole = 0
            for line in results:
                if not line.endswith(b"\n"):
                    results.truncate(whole)
                    return
                whole += len(line)
                yield line[:-1]

    def keep_results(self, keep: Callable[[bytes], bool]) -> int:
        """Write the results file again with only the lines `keep` accepts (under the run lock,
        replaced whole by a rename); the number of lines dropped."""
        kept, dropped = self.path / f".results.{os.getpid()}.{time.time_ns()}", 0
        try:
            with open(os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                for line in self.settled():
                    if keep(line):
                        out.write(line + b"\n")
                    else:
                        dropped += 1
                out.flush()
                os.fsync(out.fileno())
            os.replace(kept, self.results_path())
        finally:
            kept.unlink(missing_ok=True)
        sync_dir(self.path)
        return dropped

    def open_results(self) -> int:
        """A descriptor that appends result lines."""
        return os.open(self.results_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def try_lock(self) -> int | None:
        """The run lock, if no live process holds it: a descriptor to keep open while running.
        A process must not open the lock of a batch it holds (on NFS, closing any descriptor
        of the file drops the process's lock): `Runner.claim` sees to that."""
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd


class BatchStore:
    """All batches in one directory, a subdirectory per owner."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def batch(self, batch_id: str, owner: str) -> BatchDir | None:
        """The batch, if it is in `owner`'s directory or the flat layout (whose record the
        caller checks); None for any other id, never a path outside the store."""
        if not (
            batch_id.startswith(PREFIX)
            and len(batch_id) <= MAX_ID
            and batch_id.isascii()
            and batch_id.replace("_", "").isalnum()
        ):
            return None
        for path in (owner_dir(self.root, owner) / batch_id, self.root / batch_id):
            try:
                if (path / "batch.json").exists():
                    return BatchDir(path)
            except OSError:
                return None
        return None

    def batches(self, owner: str | None = None) -> list[BatchDir]:
        """`owner`'s batches and any left in the flat layout (the caller checks their
        owner); every owner's with no owner given (the keeper's sweep)."""
        if owner is not None:
            places = [owner_dir(self.root, owner), self.root]
        else:
            places = [self.root, *self._owner_dirs()]
        found = []
        for place in places:
            try:
                found += [BatchDir(Path(e.path)) for e in os.scandir(place) if e.name.startswith(PREFIX)]
            except FileNotFoundError:
                continue
        return found

    def _owner_dirs(self) -> list[Path]:
        try:
            return [Path(e.path) for e in os.scandir(self.root)
                    if e.is_dir() and not e.name.startswith((".", PREFIX))]  # fmt: skip
        except FileNotFoundError:
            return []

    def create(self, record: Record, body: bytes) -> BatchDir:
        """Write a new batch, in its owner's directory; it appears whole, to every process at once."""
        home = owner_dir(self.root, record.owner)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        home.mkdir(exist_ok=True, mode=0o700)
        staging = home / f".{record.id}.new"
        staging.mkdir(mode=0o700)
        try:
            write_synced(staging / "requests.json", body)
            write_synced(staging / "batch.json", msgspec.json.encode(record))
            sync_dir(staging)
            os.rename(staging, home / record.id)
            sync_dir(home)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return BatchDir(home / record.id)

    def hide(self, where: BatchDir) -> Path | None:
        """Take a batch away from every reader at once; the path left to remove (`rmtree`
        it, or leave it to `clear_debris`)."""
        gone = where.path.parent / f".{where.id}.{time.time_ns()}.gone"
        try:
            os.rename(where.path, gone)
        except FileNotFoundError:
            return None  # another process removed it first
        return gone

    def clear_debris(self) -> None:
        """Remove what crashes left: removed batches not yet deleted, creates never finished."""
        now = time.time()
        for place in (self.root, *self._owner_dirs()):
            try:
                entries = list(os.scandir(place))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name.startswith(".") and (entry.name.endswith(".gone") or entry.name.endswith(".new")):
                    with contextlib.suppress(OSError):
                        if entry.name.endswith(".gone") or now - entry.stat().st_mtime > DEBRIS_AFTER:
                            shutil.rmtree(entry.path, ignore_errors=True)

"""The batches on disk as this process knows them, shared by the API and the keeper.

A batch's record never changes once written, nor does its outcome once the batch has ended,
so each is read from disk once and kept. A batch ended longer ago than `retain_for` is
dropped on sight; one another process deleted is forgotten at the next sweep.
"""

from __future__ import annotations

import time

import msgspec

from dragoman.batches.store import BatchDir, BatchStore, Ended, Record
from dragoman.core.errors import NotFound
from dragoman.core.owners import Owners


class Catalog:
    def __init__(self, store: BatchStore, retain_for: float, owners: Owners | None = None) -> None:
        self.store = store
        self.retain_for = retain_for
        self._owners = owners  # reads owners that earlier versions recorded (see `core.owners`)
        self.records: dict[
            str, Record
        ] = {}  # never change once written; of batches on disk (the sweep drops the others)
        self.ended: dict[str, Ended] = {}  # nor do these

    def load(self, where: BatchDir) -> Record | None:
        record = self.records.get(where.id)
        if record is None:
            try:
                record = where.record()
            except (OSError, msgspec.DecodeError):  # being deleted, or not one of ours
                return None
            if self._owners is not None and record.owner:  # as this gateway names it: its runs name files so too
                record = msgspec.structs.replace(record, owner=self._owners.canonical(record.owner))
            self.records[where.id] = record
        return record

    def find(self, batch_id: str, owner: str) -> tuple[BatchDir, Record]:
        missing = NotFound(f"message_batch_id: no batch {batch_id!r}")
        where = self.store.batch(batch_id, owner)
        if where is None:
            raise missing
        record = self.load(where)
        if record is None or record.owner != owner or self.expired(where, record, time.time() - self.retain_for):
            raise missing  # another key's batch is not told apart from no batch
        return where, record

    def ended_of(self, where: BatchDir, record: Record) -> Ended | None:
        ended = self.ended.get(record.id)
        # Read from disk even for a batch running here: once its outcome is written every other
        # process says `ended`, and so must this one, before the run's own `on_end` catches up.
        if ended is None:
            try:
                ended = where.ended()
            except OSError:
                return None
            if ended is not None:
                self.ended[record.id] = ended
        return ended

    def expired(self, where: BatchDir, record: Record, cutoff: float) -> bool:
        """Ended longer ago than `retain_for`: its results are gone (removed here if not yet)."""
        ended = self.ended_of(where, record)
        if ended is None or ended.at >= cutoff:
            return False
        self.store.hide(where)  # its files are removed by the next sweep, off the event loop
        self.forget((record.id,))
        return True

    def forget(self, gone: set[str] | tuple[str, ...]) -> None:
        """Drop what is kept of batches no longer on disk (deleted here, or by another process:
        kept, a process's memory grew with every delete elsewhere)."""
        for batch_id in gone:
            self.records.pop(batch_id, None)
            self.ended.pop(batch_id, None)

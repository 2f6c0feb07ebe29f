"""Usage records in SQLite: the embedded default, one file in the data directory that
every `--workers` process of one host shares (WAL mode; writers take turns)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec.structs import astuple

from dragoman.usage import reading, rollups
from dragoman.usage.background import Background
from dragoman.usage.records import Query, Sums, UsageRecord
from dragoman.usage.schema import CREATE_VERSIONS, LATEST, MIGRATIONS, VERSIONS_TABLE, insert_sql, sums_of

FILE = "usage.sqlite3"
BUSY_TIMEOUT = 10.0  # seconds a writer waits for another process's transaction


def _while_locked(step: Callable[[], object]) -> None:
    """Run `step`, again while another process holds the lock: switching a new file to WAL,
    as every worker does at once at start-up, fails at once with "database is locked"
    rather than waiting out the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class SqliteStore:
    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection, used from worker threads one at a time
        self._writes = Background("dragoman-usage-store")  # below the loop's priority: see usage.background

    async def open(self) -> None:
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        _while_locked(lambda: db.execute("PRAGMA journal_mode=WAL"))
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: a power loss may lose the last commits, never corrupt
        _while_locked(lambda: migrate(db))
        self._db = db

    async def write(self, records: list[UsageRecord]) -> None:
        if records:
            await self._writes(self._write, records)

    def _write(self, records: list[UsageRecord]) -> None:
        with self._lock:
            db = self._connection()
            db.execute("BEGIN IMMEDIATE")
            try:  # the rollups count only what this transaction stored: a record written twice counts once
                insert = insert_sql("sqlite")
                added = [r for r in records if db.execute(insert, astuple(r)).rowcount == 1]
                db.executemany(rollups.upsert_sql("sqlite"), rollups.deltas(added, "sqlite"))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    async def sums(self, query: Query) -> list[Sums]:
        return await asyncio.to_thread(self._sums, query)

    def _sums(self, query: Query) -> list[Sums]:
        with self._lock:
            db = self._connection()
            parts = [sums_of(db.execute(sql, args).fetchall(), query) for sql, args in reading.plan(query, "sqlite")]
        return reading.combine(parts)

    async def rows(self, query: Query, counters: tuple[str, ...]) -> list[tuple[Any, ...]]:
        def read() -> list[tuple[Any, ...]]:
            with self._lock:
                db = self._connection()
                parts = [db.execute(sql, args).fetchall() for sql, args in reading.plan(query, "sqlite", counters)]
            return reading.combine_rows(parts, bool(query.width) + len(query.group_by), bool(query.width))

        return await asyncio.to_thread(read)

    async def recent(self, limit: int, failures: bool | None = None, key_id: str | None = None) -> list[UsageRecord]:
        sql, args = reading.recent_sql("sqlite", limit, failures, key_id)

        def read() -> list[UsageRecord]:
            with self._lock:
                return reading.records_of(self._connection().execute(sql, args).fetchall())

        return await asyncio.to_thread(read)

    async def prune(self, before: float) -> int:
        return await self._writes(self._prune, before)

    def _prune(self, before: float) -> int:
        with self._lock:
            db = self._connection()
            db.execute("DELETE FROM usage_rollups WHERE width = 60 AND bucket + 60 <= ?", (before,))
            return db.execute("DELETE FROM usage_records WHERE at < ?", (before,)).rowcount

    async def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
        self._writes.close()

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the usage store is not open")
        return self._db


def migrate(db: sqlite3.Connection) -> None:
    """Bring the schema to LATEST. BEGIN IMMEDIATE takes the database's write lock, so
    processes starting together apply each migration once, one after the other."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(CREATE_VERSIONS.format(time="REAL"))
        current = db.execute(f"SELECT coalesce(max(version), 0) FROM {VERSIONS_TABLE}").fetchone()[0]
        if current > LATEST:
            raise RuntimeError(f"the usage database has schema version {current}; this dragoman knows up to {LATEST}")
        for version, steps in MIGRATIONS:
            if version > current:
                for statement in steps["sqlite"]:
                    db.execute(statement)
                db.execute(f"INSERT INTO {VERSIONS_TABLE} (version, applied_at) VALUES (?, ?)", (version, time.time()))
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")

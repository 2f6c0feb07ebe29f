"""One small async interface over SQLite and PostgreSQL for the key store: `?` placeholders
(renumbered as `$n` for PostgreSQL), a transaction that holds the database's write lock
(SQLite's BEGIN IMMEDIATE; PostgreSQL's row lock on the version counter), rows as tuples.

With PostgreSQL every statement is bounded twice: by the server's `statement_timeout` (a
locked table: the statement fails, its transaction rolls back) and, a second later, by the
client (a server that does not answer at all, frozen or cut off without a reset), so that
neither the Admin API nor the keyring's poll waits on a database that is not there."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from dragoman.usage.postgres import close_pool

BUSY_TIMEOUT = 10.0  # seconds a writer waits for another process's transaction
CONNECT_TIMEOUT = 10.0
POOL_SIZE = 2


class Conn(Protocol):
    async def fetch(self, sql: str, *args: object) -> list[tuple[Any, ...]]: ...

    async def execute(self, sql: str, *args: object) -> None: ...


class Database(Protocol):
    dialect: str

    async def open(self) -> None: ...

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Conn]: ...

    def reading(self) -> contextlib.AbstractAsyncContextManager[Conn]: ...

    async def listen(self, channel: str, woken: Callable[[], None]) -> None:
        """Call `woken` whenever a change is announced on `channel` (PostgreSQL); SQLite: never."""
        ...

    async def close(self) -> None: ...


class _SqliteConn:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    async def fetch(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        return await asyncio.to_thread(lambda: self._db.execute(sql, args).fetchall())

    async def execute(self, sql: str, *args: object) -> None:
        await asyncio.to_thread(self._db.execute, sql, args)


class Sqlite:
    """One connection per process to the usage ledger's file; its calls run in threads."""

    dialect = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        def connect() -> sqlite3.Connection:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
            deadline = time.monotonic() + BUSY_TIMEOUT
            while True:  # every worker switches a new file to WAL at once: "locked" at once, not after a wait
                try:
                    db.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as error:
                    if "locked" not in str(error) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            return db

        self._db = await asyncio.to_thread(connect)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        async with self._lock:
            conn = _SqliteConn(self._connection())
            await conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                await asyncio.shield(conn.execute("ROLLBACK"))
                raise
            await conn.execute("COMMIT")

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[Conn]:
        async with self._lock:
            yield _SqliteConn(self._connection())

    async def listen(self, channel: str, woken: Callable[[], None]) -> None:
        pass  # SQLite has no notifications: the poll alone finds changes

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the key store is not open")
        return self._db

    async def close(self) -> None:
        async with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


_PLACEHOLDER = re.compile(r"\?")


def numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1, $2, ...` (no `?` appears in our SQL otherwise)."""
    count = iter(range(1, 1000))
    return _PLACEHOLDER.sub(lambda _: f"${next(count)}", sql)


class _PgConn:
    def __init__(self, connection: Any) -> None:
        self._c = connection

    async def fetch(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self._c.fetch(numbered(sql), *args)]

    async def execute(self, sql: str, *args: object) -> None:
        await self._c.execute(numbered(sql), *args)


class Postgres:
    dialect = "postgres"

    def __init__(self, url: str, statement_timeout: float = 10.0) -> None:
        self._url = url
        self._pool: Any = None
        self._listener: Any = None  # a connection of its own, LISTENing
        self.statement_timeout = statement_timeout  # `[usage] statement_timeout`, shared with the usage store

    async def open(self) -> None:
        import asyncpg

        logging.getLogger("asyncpg").setLevel(logging.ERROR)  # the keyring logs one line per outage
        settings = {"statement_timeout": str(max(1, int(self.statement_timeout * 1000)))}  # milliseconds
        pool = await asyncpg.create_pool(self._url, min_size=1, max_size=POOL_SIZE, timeout=CONNECT_TIMEOUT,
                                         command_timeout=self.statement_timeout + 1.0,
                                         server_settings=settings)  # fmt: skip
        if self._pool is not None:  # opened again after a failed start: the old pool goes
            self._pool.terminate()
        self._pool = pool

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        async with self._acquired() as connection, connection.transaction():
            yield _PgConn(connection)

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[Conn]:
        async with self._acquired() as connection:
            yield _PgConn(connection)

    def _acquired(self) -> Any:
        """A pooled connection, waited for no longer than a statement (both in use by a stalled poll)."""
        if self._pool is None:
            raise ConnectionError("the key store has not been reached yet")
        return self._pool.acquire(timeout=self.statement_timeout + 1.0)

    async def listen(self, channel: str, woken: Callable[[], None]) -> None:
        """A connection of its own that LISTENs; if it is lost, the poll still finds every change."""
        import asyncpg

        if self._listener is not None and not self._listener.is_closed():
            return
        self._listener = await asyncpg.connect(self._url, timeout=CONNECT_TIMEOUT)
        await self._listener.add_listener(channel, lambda *_: woken())

    async def close(self) -> None:
        if self._listener is not None:
            listener, self._listener = self._listener, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.close(), CONNECT_TIMEOUT)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await close_pool(pool)

"""Usage records in PostgreSQL, shared by every worker and replica of a team's gateway.
The schema is created and migrated at start-up under an advisory lock, so any number
of processes may start at once."""

from __future__ import annotations

import asyncio
import datetime
import logging
import zlib
from typing import Any

from msgspec.structs import astuple

from dragoman.usage.records import Query, Sums, UsageRecord
from dragoman.usage.schema import CREATE_VERSIONS, LATEST, MIGRATIONS, VERSIONS_TABLE, insert_sql, sums_of, sums_sql

log = logging.getLogger("dragoman.usage")

# One lock for every dragoman migrating a database (pg_advisory_xact_lock takes a bigint).
MIGRATION_LOCK = zlib.crc32(b"dragoman usage migrations")
CONNECT_TIMEOUT = 10.0
POOL_SIZE = 4


class PostgresStore:
    def __init__(self, url: str, statement_timeout: float = 10.0) -> None:
        self._url = url
        self._pool: Any = None
        self.statement_timeout = statement_timeout  # a locked table fails a statement, not holds it

    async def open(self) -> None:
        import asyncpg  # only a gateway configured with a database needs the driver loaded

        # The driver's own warnings (a traceback each time the pool fails to reconnect) are
        # quieted: the writer logs one warning per outage.
        logging.getLogger("asyncpg").setLevel(logging.ERROR)
        settings = {"statement_timeout": str(max(1, int(self.statement_timeout * 1000)))}  # milliseconds
        # The client's bound, a second past the server's: a server that answers nothing (frozen,
        # or cut off without a reset) fails a write too, so the writer journals and retries.
        pool = await asyncpg.create_pool(self._url, min_size=1, max_size=POOL_SIZE, timeout=CONNECT_TIMEOUT,
                                         command_timeout=self.statement_timeout + 1.0,
                                         server_settings=settings)  # fmt: skip
        try:
            async with pool.acquire() as connection:
                await migrate(connection)
        except BaseException:
            pool.terminate()
            raise
        self._pool = pool

    async def write(self, records: list[UsageRecord]) -> None:
        """All of them in one transaction. A record the database refuses as data (not a
        lost connection: that is retried whole) is dropped and logged, one by one, so
        that it holds back no other."""
        import asyncpg

        if not records:
            return
        async with self._pool.acquire(timeout=self.statement_timeout + 1.0) as connection:
            try:
                async with connection.transaction():
                    await connection.executemany(insert_sql("postgres"), [astuple(r) for r in records])
            except asyncpg.DataError:
                for record in records:
                    try:
                        await connection.execute(insert_sql("postgres"), *astuple(record))
                    except asyncpg.DataError as error:
                        log.error("usage record %s refused by the database, dropped: %s", record.request_id, error)

    async def sums(self, query: Query) -> list[Sums]:
        sql, args = sums_sql(query, "postgres")
        if self._pool is None:
            raise ConnectionError("the usage database has not been reached yet")
        async with self._pool.acquire(timeout=self.statement_timeout) as connection:
            rows = await connection.fetch(sql, *args)
        return sums_of([tuple(row) for row in rows], query)

    async def prune(self, before: float) -> int:
        async with self._pool.acquire() as connection:
            status = await connection.execute("DELETE FROM usage_records WHERE at < to_timestamp($1)", float(before))
        return int(status.split()[-1])  # "DELETE 42"

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await close_pool(pool)


async def close_pool(pool: Any) -> None:
    """An asyncpg pool closed, or terminated when its connections do not let go in time."""
    try:
        await asyncio.wait_for(pool.close(), CONNECT_TIMEOUT)
    except (TimeoutError, OSError):
        pool.terminate()


async def migrate(connection: Any) -> None:
    """Bring the schema (of the connection's search_path) to LATEST, one process at a time:
    the advisory lock is held until the transaction that applies the migrations ends."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await connection.execute(CREATE_VERSIONS.format(time="TIMESTAMPTZ"))
        current = await connection.fetchval(f"SELECT coalesce(max(version), 0) FROM {VERSIONS_TABLE}")
        if current > LATEST:
            raise RuntimeError(f"the usage database has schema version {current}; this dragoman knows up to {LATEST}")
        for version, steps in MIGRATIONS:
            if version > current:
                for statement in steps["postgres"]:
                    await connection.execute(statement)
                await connection.execute(
                    f"INSERT INTO {VERSIONS_TABLE} (version, applied_at) VALUES ($1, $2)",
                    version,
                    datetime.datetime.now(datetime.UTC),
                )

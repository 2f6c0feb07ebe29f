"""Usage records in PostgreSQL, shared by every worker and replica of a team's gateway.
The schema is created and migrated at start-up under an advisory lock, so any number
of processes may start at once."""

from __future__ import annotations

import asyncio
import datetime
import logging
import zlib
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import msgspec
from msgspec.structs import astuple

from dragoman.usage import reading, rollups
from dragoman.usage.records import Query, Sums, UsageRecord
from dragoman.usage.schema import COLUMNS, CREATE_VERSIONS, LATEST, MIGRATIONS, VERSIONS_TABLE, insert_sql, sums_of

log = logging.getLogger("dragoman.usage")
T = TypeVar("T")

# One lock for every dragoman migrating a database (pg_advisory_xact_lock takes a bigint).
MIGRATION_LOCK = zlib.crc32(b"dragoman usage migrations")
CONNECT_TIMEOUT = 10.0
MIGRATION_TIMEOUT = 3600.0  # seconds a migration's statement may take (rollups filled from a large ledger)
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
        settings = {"statement_timeout": str(max(1, int(self.statement_timeout * 1000))),  # milliseconds
                    # A report's sums: compiling them (JIT) took longer than summing them, and a
                    # plan made for any range (asyncpg's prepared statements, after five runs)
                    # read every rollup of a grain: 5 times as slow as one made for its range.
                    "jit": "off", "plan_cache_mode": "force_custom_plan"}  # fmt: skip
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
        """All of them in one transaction, with the rollups of those the database did not
        hold yet (the insert names those it held). A record the database refuses as data (not a
        lost connection: that is retried whole) is dropped and logged, one by one, so
        that it holds back no other."""
        import asyncpg

        if not records:
            return
        records = list({r.request_id: r for r in reversed(records)}.values())[::-1]  # the first of each id
        async with self._pool.acquire(timeout=self.statement_timeout + 1.0) as connection:
            try:
                async with connection.transaction():
                    stored = {row[0] for row in await connection.fetch(BULK_INSERT, msgspec.json.encode(records))}
                    await _roll_up(
                        connection, [r for r in records if r.request_id not in stored] if stored else records
                    )
            except asyncpg.DataError:
                for record in records:
                    try:
                        async with connection.transaction():
                            if await connection.fetchval(
                                insert_sql("postgres") + " RETURNING request_id", *astuple(record)
                            ):
                                await _roll_up(connection, [record])
                    except asyncpg.DataError as error:
                        log.error("usage record %s refused by the database, dropped: %s", record.request_id, error)

    async def sums(self, query: Query) -> list[Sums]:
        if self._pool is None:
            raise ConnectionError("the usage database has not been reached yet")
        parts = []
        async with self._pool.acquire(timeout=self.statement_timeout) as connection:
            for sql, args in reading.plan(query, "postgres"):
                parts.append(sums_of([tuple(row) for row in await connection.fetch(sql, *args)], query))
        return reading.combine(parts)

    async def rows(self, query: Query, counters: tuple[str, ...]) -> list[tuple[Any, ...]]:
        if self._pool is None:
            raise ConnectionError("the usage database has not been reached yet")
        async with self._pool.acquire(timeout=self.statement_timeout) as connection:
            parts = [[tuple(row) for row in await connection.fetch(sql, *args)]
                     for sql, args in reading.plan(query, "postgres", counters)]  # fmt: skip
        return reading.combine_rows(parts, bool(query.width) + len(query.group_by), bool(query.width))

    async def recent(self, limit: int, failures: bool | None = None, key_id: str | None = None) -> list[UsageRecord]:
        if self._pool is None:
            raise ConnectionError("the usage database has not been reached yet")
        sql, args = reading.recent_sql("postgres", limit, failures, key_id)
        async with self._pool.acquire(timeout=self.statement_timeout) as connection:
            return reading.records_of([tuple(row) for row in await connection.fetch(sql, *args)])

    async def prune(self, before: float) -> int:
        async with self._pool.acquire() as connection:
            await connection.execute(
                "DELETE FROM usage_rollups WHERE width = 60 AND bucket + 60 <= $1::float8", float(before)
            )
            status = await connection.execute("DELETE FROM usage_records WHERE at < to_timestamp($1)", float(before))
        return int(status.split()[-1])  # "DELETE 42"

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await close_pool(pool)


# One INSERT of a whole batch (one round trip), the records sent as one JSON array of arrays
# (`UsageRecord` is array_like) that the server takes apart; it answers with the request ids it
# held already (mostly none), so the rollups count the others. msgspec encodes a record in about
# 0.3 µs; asyncpg's encoder took 7-9 µs a record for the same batch as arrays, one per column,
# and decoding a RETURNING of every id another 1-2 ms a flush, all of it on the event loop.
_TYPES = {"at": "float8", "disconnected": "bool", "status": "int4", "duration": "float8", "ttft": "float8"}
_FIELDS = [f"(r->>{i})::{_TYPES.get(c, 'int8' if c.endswith(('_tokens', '_requests')) else 'text')}"
           for i, c in enumerate(COLUMNS)]  # fmt: skip
_FIELDS = [f"to_timestamp({_FIELDS[0]}) AS at", *(f"{f} AS {c}" for f, c in zip(_FIELDS[1:], COLUMNS[1:], strict=True))]
BULK_INSERT = (f"WITH given AS (SELECT {', '.join(_FIELDS)} "
               f"FROM jsonb_array_elements(convert_from($1::bytea, 'UTF8')::jsonb) AS r), "
               f"added AS (INSERT INTO usage_records ({', '.join(COLUMNS)}) SELECT * FROM given "
               f"ON CONFLICT (request_id) DO NOTHING RETURNING request_id) "
               f"SELECT request_id FROM given EXCEPT SELECT request_id FROM added")  # fmt: skip


UPSERT = rollups.upsert_sql("postgres")
# Records summed for their rollups at a time (about 50 µs), with a pause between: with only a
# turn of the loop between parts of 250, they all ran in the awaits of the one or two requests
# in flight (1-2 ms more for each, at concurrency 1 in the slowest 1 %); paused, no request
# meets more than one. The pauses of a flush take SUM_PAUSES at most.
SUM_AT_ONCE = 50
SUM_PAUSE = 0.002
SUM_PAUSES = 0.1
AT_ONCE = 1000  # rollup rows named or encoded between two turns of the event loop (about 1 ms)


async def _roll_up(connection: Any, records: list[UsageRecord]) -> None:
    """(In the transaction that stored them.) The records added to their rollups. A batch of many
    keys makes many rows (2,500 records of as many keys: 15,000, 100 ms of work), so the sums go
    `SUM_AT_ONCE` records at a time with a pause between, the other steps `AT_ONCE` items at a
    time with a turn of the event loop between."""
    sums: rollups.Sums = {}
    pause = min(SUM_PAUSE, SUM_PAUSES * SUM_AT_ONCE / max(len(records), 1))
    async for part in _parts(records, SUM_AT_ONCE, pause):
        rollups.by_minute(part, "postgres", sums)
    rows: rollups.Rows = {}  # one row per key: a statement never updates a row twice
    async for items in _parts(list(sums.items()), AT_ONCE // 40):  # each sum makes up to 18 rows
        rollups.spread_into(rows, items)
    named: list[tuple[str, tuple[object, ...]]] = []
    async for keys in _parts(list(rows), AT_ONCE):
        named += [(str(key), key) for key in keys]
    if not named:
        return
    encoded = []
    keys = rollups.ordered(named)
    async for chunk in _parts(keys, AT_ONCE):
        encoded.append(msgspec.json.encode([(*key, *rows[key]) for key in chunk])[1:-1])  # a JSON array's items
    await connection.execute(UPSERT, b"[" + b",".join(encoded) + b"]")


async def _parts(items: list[T], size: int, pause: float = 0.0) -> AsyncIterator[list[T]]:
    """`items`, `size` at a time, with a turn of the event loop (or `pause`) before each part after the first."""
    for start in range(0, len(items), size):
        if start:
            await asyncio.sleep(pause)
        yield items[start : start + size]


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
        # Neither the server's statement timeout nor the pool's command timeout here: a migration
        # may fill a table from every record stored (rollups, version 6), and the others wait
        # for it rather than fail and start over.
        await connection.execute("SET LOCAL statement_timeout = 0")
        await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK, timeout=MIGRATION_TIMEOUT)
        await connection.execute(CREATE_VERSIONS.format(time="TIMESTAMPTZ"))
        current = await connection.fetchval(f"SELECT coalesce(max(version), 0) FROM {VERSIONS_TABLE}")
        if current > LATEST:
            raise RuntimeError(f"the usage database has schema version {current}; this dragoman knows up to {LATEST}")
        for version, steps in MIGRATIONS:
            if version > current:
                for statement in steps["postgres"]:
                    await connection.execute(statement, timeout=MIGRATION_TIMEOUT)
                await connection.execute(
                    f"INSERT INTO {VERSIONS_TABLE} (version, applied_at) VALUES ($1, $2)",
                    version,
                    datetime.datetime.now(datetime.UTC),
                )

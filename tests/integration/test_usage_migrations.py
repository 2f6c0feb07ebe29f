"""A database made by an earlier dragoman keeps its records when a newer one migrates it:
a usage table at schema version 1 (before prompt-cache writes were recorded) is opened by
this gateway, brought to the latest version, and its old records (no cache writes) are
summed beside new ones that have some. SQLite, and a real PostgreSQL (a schema of the
test's own)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import asyncpg
import msgspec

from dragoman.usage.postgres import PostgresStore
from dragoman.usage.records import Query, Sums, UsageStore
from dragoman.usage.schema import CREATE_VERSIONS, MIGRATIONS, VERSIONS_TABLE
from dragoman.usage.sqlite import FILE, SqliteStore
from tests.support.postgres import pg_url  # noqa: F401 (fixture)
from tests.support.usage import usage_record

V1 = MIGRATIONS[0]
V1_COLUMNS = ("at", "request_id", "endpoint", "key_id", "tenant", "model", "upstream_model", "upstream", "replica",
              "input_tokens", "cache_read_tokens", "output_tokens", "status", "error_type", "disconnected",
              "duration", "ttft")  # fmt: skip
NOW = time.time()
OLD = (
    NOW - 60,
    "req_old",
    "messages",
    "key_x",
    None,
    "old-model",
    "m",
    "u",
    "r",
    11,
    3,
    5,
    200,
    None,
    False,
    0.5,
    None,
)


def _sums_after_a_new_record(store: UsageStore) -> list[Sums]:
    """Open (migrate) the store, write a record with cache writes, and sum by model."""
    new = msgspec.structs.replace(usage_record("req_new", NOW - 30), model="new-model", cache_creation_tokens=30,
                                  cache_creation_1h_tokens=10, web_search_requests=2)  # fmt: skip

    async def run() -> list[Sums]:
        await store.open()
        try:
            await store.write([new])
            return await store.sums(Query(NOW - 3600, NOW + 60, 0, ("model",)))
        finally:
            await store.close()

    return asyncio.run(run())


def _check(sums: list[Sums]) -> None:
    by_model = {s.groups[0]: s for s in sums}
    old, new = by_model["old-model"], by_model["new-model"]
    assert (old.requests, old.input_tokens, old.cache_read_tokens, old.output_tokens) == (1, 11, 3, 5)
    assert (old.cache_creation_tokens, old.cache_creation_1h_tokens) == (0, 0)
    assert (new.cache_creation_tokens, new.cache_creation_1h_tokens) == (30, 10)
    assert (old.web_search_requests, new.web_search_requests) == (0, 2)


def test_a_version_1_sqlite_file_is_migrated_with_its_records(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / FILE) as db:
        db.execute(CREATE_VERSIONS.format(time="REAL"))
        for statement in V1[1]["sqlite"]:
            db.execute(statement)
        db.execute(f"INSERT INTO {VERSIONS_TABLE} VALUES (1, ?)", (NOW,))
        db.execute(f"INSERT INTO usage_records ({', '.join(V1_COLUMNS)}) VALUES ({', '.join('?' * len(OLD))})", OLD)
    _check(_sums_after_a_new_record(SqliteStore(tmp_path)))
    with sqlite3.connect(tmp_path / FILE) as db:
        assert db.execute(f"SELECT version FROM {VERSIONS_TABLE} ORDER BY 1").fetchall() == [
            (v,) for v, _ in MIGRATIONS
        ]


def test_a_version_1_postgresql_schema_is_migrated_with_its_records(pg_url: str) -> None:  # noqa: F811
    async def make_v1() -> None:
        connection = await asyncpg.connect(pg_url)
        try:
            await connection.execute(CREATE_VERSIONS.format(time="TIMESTAMPTZ"))
            for statement in V1[1]["postgres"]:
                await connection.execute(statement)
            await connection.execute(f"INSERT INTO {VERSIONS_TABLE} VALUES (1, now())")
            values = ", ".join("to_timestamp($1)" if i == 1 else f"${i}" for i in range(1, len(OLD) + 1))
            await connection.execute(f"INSERT INTO usage_records ({', '.join(V1_COLUMNS)}) VALUES ({values})", *OLD)
        finally:
            await connection.close()

    async def versions() -> list[int]:
        connection = await asyncpg.connect(pg_url)
        try:
            return [r[0] for r in await connection.fetch(f"SELECT version FROM {VERSIONS_TABLE} ORDER BY 1")]
        finally:
            await connection.close()

    asyncio.run(make_v1())
    _check(_sums_after_a_new_record(PostgresStore(pg_url)))
    assert asyncio.run(versions()) == [v for v, _ in MIGRATIONS]

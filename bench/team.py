"""The `team` target of bench/run.py: the translating path with every team feature on at once
(issue 36), against the same fake upstream as the other cells.

- keys made at run time, read from PostgreSQL: `KEYS` (100,000) rows seeded straight into a
  private database (COPY, a few seconds) before the gateway starts; one of them is presented;
- usage records in that database (`[usage] database_url`), journaled locally as always;
- every key with a money budget (never reached), the model priced;
- `[limits]` in Redis (never reached) under a key prefix of this run's own;
- cache-aware routing over two replicas: the fake, and a second fake started here.

The database is created and dropped by the bench (PostgreSQL at `$DRAGOMAN_BENCH_PG`, else
postgresql://postgres@127.0.0.1:5432/postgres, trust auth), the Redis keys under the prefix
deleted, once the gateway has stopped (`run.Processes.stop_all` runs `Team.cleanup`). Without
PostgreSQL or Redis the target is left out.

    python bench/run.py --targets direct-openai,translating,team --shapes tiny --modes json --rounds 6 --duration 12
    python bench/ab.py --base ../main/src --paths team --cases tiny:json:1
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import time
import urllib.parse
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from dragoman.keys.connections import Postgres
from dragoman.keys.records import Budget, KeyRow, digest, hint, key_id
from dragoman.keys.store import COLUMNS, KeyStore

TEAM = "team"
KEYS = 100_000  # keys in the database (issue 36)
SETUP_TIMEOUT = 120.0  # seconds the database's creation and seeding may take
BUDGET = Budget(amount="100000000", period="month")  # $1M a month, cents: never reached
PRICE = "{ input = 0.20, output = 0.80 }"  # USD per million tokens
ADMIN_KEY = "sk-dm-admin-bench-0123456789abcdefghij"


def presented_key(n: int) -> str:
    return f"sk-dm-bench-{n:08d}-abcdefghijklmnopqrstuvwxyz0123456789"


def postgres_url() -> str:
    return os.environ.get("DRAGOMAN_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _in_a_thread(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run `coroutine` to its end on a loop of its own (the bench's loop is busy calling us)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result(SETUP_TIMEOUT)


async def _admin(sql: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(postgres_url(), timeout=5)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


async def _seed(url: str, count: int) -> None:
    """The key tables made by the gateway's own migration, then `count` rows in one COPY and the
    version counter moved past them, as if each had been made through the Admin API."""
    import asyncpg

    store = KeyStore(Postgres(url))
    await store.open()
    salt = store.salt
    await store.close()
    now = time.time()
    budget = msgspec.json.encode(BUDGET).decode()
    records = []
    for n in range(count):
        secret = presented_key(n)
        row = KeyRow(id=key_id(secret), digest=digest(salt, secret), hint=hint(secret), name=f"dev-{n}",
                     created_at=now, updated_at=now, version=n + 1)  # fmt: skip
        records.append(tuple(budget if c == "budget" else getattr(row, c) for c in COLUMNS))
    connection = await asyncpg.connect(url, timeout=5)
    try:
        await connection.copy_records_to_table("dragoman_keys", records=records, columns=list(COLUMNS))
        await connection.execute("UPDATE dragoman_keys_state SET version = $1 WHERE id = 1", count)
    finally:
        await connection.close()


def _forget_redis(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        for batch in _batches(client.scan_iter(match=prefix + "*", count=1000), 500):
            client.delete(*batch)
    finally:
        client.close()


def _batches(items: Any, size: int) -> Any:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class Unavailable(Exception):
    """PostgreSQL does not answer: the target is left out."""


@dataclass
class Team:
    """One gateway's private database and Redis prefix; `cleanup` once it has stopped."""

    name: str
    url: str  # the private database
    database: str
    redis_url: str
    prefix: str
    key: str  # the key presented, one of those seeded

    @property
    def headers(self) -> dict[str, str]:
        return {"x-api-key": self.key, "anthropic-version": "2023-06-01"}

    def cleanup(self) -> None:
        _in_a_thread(_admin(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)"))
        _forget_redis(self.redis_url, self.prefix)

    def config(self, workdir: Path, upstream: str, replica: str, models: Iterable[str]) -> str:
        """The gateway's configuration: `upstream` and `replica` routed cache-aware (the default with replicas)."""
        priced = "".join(f'[[models]]\nname = "{m}"\nupstream = "default"\nprice = {PRICE}\n\n' for m in models)
        return (f'[server]\nlog_level = "warning"\n\n[admin]\nkeys = ["{ADMIN_KEY}"]\n\n'
                f'[usage]\ndatabase_url = "{self.url}"\ndir = "{workdir / ("usage-" + self.name)}"\n\n'
                "[limits]\nrequests_per_minute = 1000000000\ninput_tokens_per_minute = 1000000000000\n"
                f'output_tokens_per_minute = 1000000000000\nredis_url = "{self.redis_url}"\nredis_prefix = "{self.prefix}"\n\n'
                f'[upstreams.default]\nurl = "{upstream}"\nreplicas = ["{replica}"]\n\n' + priced)  # fmt: skip


def setup(name: str, keys: int, redis_url: str) -> Team:
    """A private database holding `keys` keys, and a Redis prefix of this process's own."""
    database = re.sub(r"\W", "_", f"dragoman_bench_{os.getpid()}_{name}").lower()
    try:
        _in_a_thread(_admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        _in_a_thread(_admin(f"CREATE DATABASE {database}"))
    except Exception as error:  # noqa: BLE001 - refused, no such role, not allowed: the target is left out
        raise Unavailable(f"no PostgreSQL answers at {postgres_url()} ({error}); set DRAGOMAN_BENCH_PG") from None
    url = urllib.parse.urlsplit(postgres_url())._replace(path="/" + database).geturl()
    made = Team(name, url, database, redis_url, f"dragoman-bench:{os.getpid()}:{name}:", presented_key(keys // 2))
    try:
        _in_a_thread(_seed(url, keys))
    except BaseException:
        made.cleanup()
        raise
    return made

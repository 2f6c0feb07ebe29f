"""Server time of the console's data functions (`dragoman.console.data`) over a ledger of
1,000,000 usage records: SQLite, and PostgreSQL when one answers. Issue 32's target: each
under 300 ms.

    python bench/console.py [--rows 1000000] [--runs 20] [--postgres URL | --no-postgres]

The ledger spans the last 7 days (200 keys, 10 tenants, 5 models, 2 upstreams of 3 replicas).
It is filled in bulk (one transaction, or COPY), then its rollups are made as a migration
makes them for an older database; then each function is called `--runs` times (after one
call to warm up) and its median and slowest wall time printed. A 1,000-record write, the
writer's tick under load, is timed as well: rollups are kept as records are written.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from msgspec.structs import astuple, replace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dragoman.assembly.gateway import Gateway  # noqa: E402
from dragoman.console import data  # noqa: E402
from dragoman.core.config_load import from_dict  # noqa: E402
from dragoman.keys.records import key_id  # noqa: E402
from dragoman.usage import rollups, schema  # noqa: E402
from dragoman.usage.records import UsageRecord  # noqa: E402

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CLIENT = "sk-bench-console-client-key"
UPSTREAMS = {name: [f"http://10.0.{u}.{r}:8000" for r in range(3)] for u, name in enumerate(("a", "b"))}


def records(count: int, now: float, seed: int = 7) -> list[UsageRecord]:
    rnd = random.Random(seed)
    keys = [key_id(CLIENT)] + [f"key_{i:03d}" for i in range(199)]
    models = [f"model-{i}" for i in range(5)]
    span = 7 * 86400
    out = []
    for i in range(count):
        upstream = rnd.choice(("a", "b"))
        key = rnd.choice(keys)
        failed = rnd.random() < 0.03
        out.append(UsageRecord(
            at=now - span + (i + rnd.random()) * span / count, request_id=f"req_{seed}_{i:08d}", endpoint="messages",
            key_id=key, tenant=f"team-{hash(key) % 10}", model=rnd.choice(models), upstream_model="served",
            upstream=upstream, replica=rnd.choice(UPSTREAMS[upstream]), input_tokens=rnd.randrange(2000),
            cache_read_tokens=rnd.randrange(8000), output_tokens=rnd.randrange(800), status=500 if failed else 200,
            error_type="api_error" if failed else None, disconnected=False, duration=rnd.random() * 20,
            ttft=rnd.lognormvariate(-1.5, 1.0) if rnd.random() < 0.8 else None,
        ))  # fmt: skip
    return out


def _backfill(dialect: rollups.Dialect) -> list[str]:
    return rollups.create_statements(dialect)[1:]  # the table exists: its rows, as a migration makes them


def fill_sqlite(path: Path, rows: list[UsageRecord]) -> None:
    import sqlite3

    from dragoman.usage.sqlite import migrate

    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    migrate(db)
    db.execute("BEGIN")
    db.executemany(schema.insert_sql("sqlite"), (astuple(r) for r in rows))
    for statement in _backfill("sqlite"):
        db.execute(statement)
    db.execute("COMMIT")
    db.execute("ANALYZE")
    db.close()


async def fill_postgres(url: str, rows: list[UsageRecord]) -> None:
    import asyncpg

    from dragoman.usage.postgres import migrate

    connection = await asyncpg.connect(url)
    try:
        await migrate(connection)
        utc = datetime.UTC
        await connection.copy_records_to_table(
            "usage_records", columns=list(schema.COLUMNS),
            records=[(datetime.datetime.fromtimestamp(r.at, utc), *astuple(r)[1:]) for r in rows],
        )  # fmt: skip
        for statement in _backfill("postgres"):
            await connection.execute(statement)
        await connection.execute("ANALYZE")
    finally:
        await connection.close()


def gateway_for(usage: dict[str, Any], directory: Path) -> Gateway:
    config = from_dict({
        "server": {"registry_cache": "", "api_keys": [CLIENT]},
        "usage": {"admin_keys": ["sk-bench-console-admin"], **usage},
        "files": {"dir": str(directory / "files")}, "batches": {"dir": str(directory / "batches")},
        "upstreams": {name: {"url": roots[0] + "/v1", "replicas": [r + "/v1" for r in roots[1:]]}
                      for name, roots in UPSTREAMS.items()},
    })  # fmt: skip
    return Gateway(config)


def cases(gateway: Gateway, now: float) -> dict[str, Callable[[], Awaitable[Any]]]:
    week = now - 7 * 86400
    return {
        "overview hour": lambda: data.overview(gateway, "hour"),
        "overview day": lambda: data.overview(gateway, "day"),
        "overview week": lambda: data.overview(gateway, "week"),
        "usage week, 1h by key": lambda: data.usage(gateway, week, now, "1h", "key"),
        "usage week, 1d by model": lambda: data.usage(gateway, week, now, "1d", "model"),
        "usage day, 1m by tenant": lambda: data.usage(gateway, now - 86400, now, "1m", "tenant"),
        "usage CSV week, 1h by key": lambda: data.usage_csv(gateway, week, now, "1h", "key"),
        "replicas": lambda: data.replicas(gateway),
        "requests 50": lambda: data.requests(gateway, 50),
        "requests 50, failures first": lambda: data.requests(gateway, 50, failures_first=True),
        "me": lambda: data.me(gateway, key_id(CLIENT)),
    }


async def measure(gateway: Gateway, runs: int, now: float) -> list[tuple[str, float, float]]:
    results = []
    for name, call in cases(gateway, now).items():
        await call()  # warm: the store opened, pages cached
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            await call()
            times.append((time.perf_counter() - started) * 1000)
        results.append((name, statistics.median(times), max(times)))
    batch = [replace(r, at=time.time() - random.random()) for r in records(1000, now, seed=8)]  # one busy second
    assert gateway.usage is not None
    started = time.perf_counter()
    await gateway.usage.store.write(batch)
    results.append(("write 1,000 records (with rollups)", (time.perf_counter() - started) * 1000, float("nan")))
    return results


def report(store: str, rows: int, filled: float, results: list[tuple[str, float, float]]) -> None:
    print(f"\n{store}: {rows:,} records, filled and rolled up in {filled:.0f} s")
    print("| call | median ms | slowest ms |\n| --- | --- | --- |")
    for name, median, slowest in results:
        print(f"| {name} | {median:.1f} | {'' if slowest != slowest else f'{slowest:.1f}'} |")


async def run_store(name: str, usage: dict[str, Any], fill: Callable[[], Awaitable[None]], args: Any,
                    now: float) -> None:  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        await fill()
        filled = time.perf_counter() - started
        gateway = gateway_for(usage, Path(directory))
        try:
            results = await measure(gateway, args.runs, now)
        finally:
            await gateway.close()
        report(name, args.rows, filled, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--postgres", default=PG_URL, help="a server where a database is made and dropped")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--sqlite-dir", type=Path, help="keep the SQLite ledger here, and reuse it when it is there")
    args = parser.parse_args()
    now = time.time()
    reused = args.sqlite_dir is not None and (args.sqlite_dir / "now").exists()
    if reused:
        now = float((args.sqlite_dir / "now").read_text())
    rows = [] if reused and args.no_postgres else records(args.rows, now)

    with tempfile.TemporaryDirectory() as directory:
        path = args.sqlite_dir or Path(directory)
        path.mkdir(parents=True, exist_ok=True)

        async def fill() -> None:
            if not reused:
                await asyncio.to_thread(fill_sqlite, path / "usage.sqlite3", rows)
                (path / "now").write_text(repr(now))

        asyncio.run(run_store("SQLite", {"dir": str(path)}, fill, args, now))
    if not args.no_postgres:
        asyncio.run(_postgres(args, rows, now))


async def _postgres(args: Any, rows: list[UsageRecord], now: float) -> None:
    import asyncpg

    name = f"bench_console_{int(time.time())}"
    try:
        admin = await asyncpg.connect(args.postgres, timeout=5)
    except (OSError, asyncpg.PostgresError) as error:
        print(f"\nPostgreSQL: not reached at {args.postgres} ({error}); skipped")
        return
    await admin.execute(f"CREATE DATABASE {name}")
    url = args.postgres.rsplit("/", 1)[0] + f"/{name}"
    try:
        await run_store("PostgreSQL", {"database_url": url}, lambda: fill_postgres(url, rows), args, now)
    finally:
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


if __name__ == "__main__":
    main()

"""The PostgreSQL store under the conditions a team's deployment meets: the database
restarted while requests go on, and several gateway processes migrating it at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import anthropic
import asyncpg
import pytest

from tests.support.fakes import FakeUpstream, completion, text_stream
from tests.support.postgres import (  # noqa: F401 (fixtures)
    PrivatePostgres,
    count_records,
    pg_url,
    private_postgres,
    schema_url,
)
from tests.support.usage import KEYS, team_config, wait_recorded, write_records
from tests.support.waiting import eventually


@pytest.mark.heavy
def test_a_database_restart_loses_no_record(
    upstream: FakeUpstream,
    private_postgres: PrivatePostgres,  # noqa: F811
    gateway_from: Any,
) -> None:
    """Records written while the database is down are held and written once it is back:
    every request the SDK finished is in the table, once."""
    server = gateway_from(team_config(upstream.url, {"database_url": private_postgres.url}))
    client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-a"], max_retries=0)
    ask = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}]}
    sent = 0

    def some(n: int) -> None:
        nonlocal sent
        for i in range(n):
            if i % 2:
                upstream.stream_reply(text_stream("a", "b"))
                with client.messages.stream(**ask) as stream:
                    stream.get_final_message()
            else:
                upstream.json_reply(completion("x"))
                client.messages.create(**ask)
            sent += 1

    some(6)
    wait_recorded(server, sent)
    writer = server.app.state.gateway.usage
    eventually(
        lambda: count_records(private_postgres.url) == 6, "6 records in PostgreSQL", timeout=20
    )  # the first records are in
    private_postgres.stop()  # the pool's connections die with it
    some(6)
    wait_recorded(server, sent)
    assert not asyncio.run(_flush_in(server))  # a write now fails, and keeps its records
    assert writer.held == 6
    private_postgres.start()
    some(6)
    wait_recorded(server, sent)
    eventually(
        lambda: count_records(private_postgres.url) == 18, "18 records in PostgreSQL", timeout=20
    )  # written once, the held ones too
    assert sent == 18 and writer.held == 0


async def _flush_in(server: Any) -> bool:
    """The gateway's own flush, run on its event loop (the server's thread)."""
    gateway = server.app.state.gateway
    loop = gateway.usage._tasks[0].get_loop()
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(gateway.usage.flush(), loop))


MIGRATE = """
import asyncio, sys, time
from dragoman.usage.postgres import PostgresStore

async def main():
    while time.time() < float(sys.argv[2]):  # start together
        await asyncio.sleep(0.001)
    store = PostgresStore(sys.argv[1])
    await store.open()
    await store.close()

asyncio.run(main())
"""


def test_migrations_from_several_processes_at_once(pg_url: str) -> None:  # noqa: F811
    """Gateways starting together on a new database: each migration applied once, no
    process fails on a table another one is creating."""
    at = time.time() + 2.0  # once every process has imported what it needs
    processes = [subprocess.Popen([sys.executable, "-c", MIGRATE, pg_url, str(at)], stderr=subprocess.PIPE)
                 for _ in range(4)]  # fmt: skip
    errors = [p.communicate(timeout=60)[1].decode() for p in processes]
    assert [p.returncode for p in processes] == [0] * 4, errors

    async def versions() -> list[int]:
        connection = await asyncpg.connect(pg_url)
        try:
            await connection.fetch("SELECT * FROM usage_records")  # the table is there
            return [r[0] for r in await connection.fetch("SELECT version FROM dragoman_usage_schema ORDER BY 1")]
        finally:
            await connection.close()

    from dragoman.usage.schema import MIGRATIONS

    assert asyncio.run(versions()) == [v for v, _ in MIGRATIONS]


def test_the_report_pages_by_bucket(pg_url: str) -> None:  # noqa: F811
    """Anthropic's pagination: `limit` buckets a page, `next_page` until the range ends."""
    import msgspec

    from dragoman.usage.postgres import PostgresStore
    from dragoman.usage.records import UsageRecord
    from dragoman.usage.report import ReportQuery, report

    base = 1_780_000_000 // 3600 * 3600  # an hour's start
    records = [UsageRecord(at=base + h * 3600 + 5, request_id=f"req_{h}", endpoint="messages", key_id="key_x",
                           tenant=None, model="m", upstream_model="m", upstream="u", replica="r", input_tokens=h,
                           cache_read_tokens=0, output_tokens=1, status=200, error_type=None, disconnected=False,
                           duration=0.1, ttft=None) for h in range(5)]  # fmt: skip

    async def pages() -> list[dict[str, Any]]:
        store = PostgresStore(pg_url)
        await store.open()
        await store.write(records)
        await store.write(records[:2])  # written twice (a lost commit answer): counted once
        out, page = [], None
        try:
            while True:
                params = {"starting_at": [msgspec.json.encode(base).decode()], "bucket_width": ["1h"], "limit": ["2"]}
                params["starting_at"] = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base + 1800))]
                params["ending_at"] = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base + 5 * 3600))]
                if page:
                    params["page"] = [page]
                body = await report(store, ReportQuery(params))
                out.append(body)
                page = body["next_page"]
                if not body["has_more"]:
                    return out
        finally:
            await store.close()

    bodies = asyncio.run(pages())
    assert [len(b["data"]) for b in bodies] == [2, 2, 1]
    inputs = [[r["uncached_input_tokens"] for r in d["results"]] for b in bodies for d in b["data"]]
    assert inputs == [[0], [1], [2], [3], [4]]  # the start snapped to its hour
    assert bodies[0]["data"][0]["starting_at"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base))


def test_a_record_the_database_refuses_holds_back_no_other(pg_url: str) -> None:  # noqa: F811
    from dragoman.usage.postgres import PostgresStore
    from dragoman.usage.records import UsageRecord

    def record(request_id: str, model: str) -> UsageRecord:
        return UsageRecord(at=time.time(), request_id=request_id, endpoint="messages", key_id=None, tenant=None,
                           model=model, upstream_model="m", upstream="u", replica="r", input_tokens=1,
                           cache_read_tokens=0, output_tokens=1, status=200, error_type=None, disconnected=False,
                           duration=0.1, ttft=None)  # fmt: skip

    write_records(PostgresStore(pg_url), [record("req_1", "a"), record("req_2", "bad\x00"), record("req_3", "c")])
    assert count_records(pg_url) == 2


def test_the_usage_command_reads_postgresql(pg_url: str, tmp_path: Any) -> None:  # noqa: F811
    from click.testing import CliRunner

    from dragoman.cli import main
    from dragoman.usage.postgres import PostgresStore
    from dragoman.usage.records import UsageRecord

    now = time.time()
    records = [UsageRecord(at=now - 60 * i, request_id=f"req_{i}", endpoint="messages", key_id=f"key_{i % 2}",
                           tenant="team-a" if i % 2 else None, model="m", upstream_model="m", upstream="u",
                           replica="r", input_tokens=10, cache_read_tokens=1, output_tokens=i, status=200,
                           error_type="api_error" if i == 3 else None, disconnected=False, duration=0.1, ttft=None,
                           cache_creation_tokens=5 * i)
               for i in range(4)]  # fmt: skip

    write_records(PostgresStore(pg_url), records)
    config = tmp_path / "team.toml"
    config.write_text(f'[usage]\ndatabase_url = "{pg_url}"\n')
    result = CliRunner().invoke(main, ["usage", "--config", str(config), "--by", "key,tenant", "--csv"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "key,tenant,requests,errors,input_tokens,cache_read_tokens,cache_creation_tokens,output_tokens",
        "key_0,,2,0,20,2,10,2",
        "key_1,team-a,2,1,20,2,20,4",
    ]


def test_prune_deletes_only_what_is_older(pg_url: str) -> None:  # noqa: F811
    from dragoman.usage.postgres import PostgresStore
    from tests.support.usage import usage_record as _record

    async def run() -> int:
        store = PostgresStore(pg_url)
        await store.open()
        try:
            await store.write([_record("req_old", time.time() - 3 * 86400), _record("req_new", time.time() - 3600)])
            return await store.prune(time.time() - 2 * 86400)
        finally:
            await store.close()

    assert asyncio.run(run()) == 1 and count_records(pg_url) == 1

"""The embedded default: usage in SQLite in the data directory, written at a clean
shutdown, read back by `dragoman usage`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import anthropic
from click.testing import CliRunner

from dragoman.calls.types import Outcome
from dragoman.cli import main
from dragoman.usage.records import Query
from dragoman.usage.schema import MIGRATIONS
from dragoman.usage.sqlite import SqliteStore
from dragoman.usage.writer import UsageWriter
from tests.support.fakes import FakeUpstream, completion
from tests.support.usage import KEYS, team_config, write_records
from tests.support.usage import usage_record as _record


def test_a_clean_shutdown_writes_every_record(upstream: FakeUpstream, gateway_from: Any, tmp_path: Path) -> None:
    server = gateway_from(team_config(upstream.url, {"flush_interval": 1.0}))
    for tenant, key in KEYS.items():
        client = anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)
        for n in range(3 if tenant == "team-a" else 1):
            upstream.json_reply(completion("x", prompt=10 + n, completion_tokens=2))
            client.messages.create(model="test-model", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    server.stop()
    usage_file = Path(os.environ["XDG_DATA_HOME"]) / "dragoman" / "usage" / "usage.sqlite3"
    assert usage_file.exists()
    result = CliRunner().invoke(main, ["usage", "--csv", "--since", "2026-01-01"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "tenant,model,requests,errors,input_tokens,cache_read_tokens,cache_creation_tokens,output_tokens",
        "team-a,test-model,3,0,33,0,0,6",  # (OpenAI-compatible servers tell no cache writes)
        "team-b,test-model,1,0,10,0,0,2",
    ]
    table = CliRunner().invoke(main, ["usage", "--by", "tenant", "--since", "2026-01-01"])
    assert table.exit_code == 0 and table.stdout.split("\n")[-2].split() == ["total", "4", "0", "43", "0", "0", "8"]


def test_usage_command_names_a_bad_option(tmp_path: Path) -> None:
    for args, named in ((["--by", "colour"], "--by"), (["--since", "soon"], "--since")):
        result = CliRunner().invoke(main, ["usage", *args])
        assert result.exit_code == 2 and named in result.output


def test_closing_the_writer_writes_what_it_holds(tmp_path: Path) -> None:
    """The background write is every second; a shutdown sooner than that still writes."""
    store = SqliteStore(tmp_path)

    async def run() -> int:
        writer = UsageWriter(store, interval=1.0)
        writer.start()
        for n in range(5):
            outcome = Outcome(request_id=f"req_{n}", endpoint="messages", model="m", status=200, output_tokens=n)
            writer.note(outcome, 0.01)
        await writer.close()
        reader = SqliteStore(tmp_path)
        await reader.open()
        try:
            sums = await reader.sums(Query(0, 4e9))
        finally:
            await reader.close()
        return sums[0].output_tokens if sums else -1

    assert asyncio.run(run()) == 10


def test_a_batch_request_is_the_creating_key_s_usage(upstream: FakeUpstream, gateway_from: Any) -> None:
    from dragoman.server.auth import key_id
    from tests.support.batches import wait_ended
    from tests.support.usage import report

    server = gateway_from(team_config(upstream.url, {}))
    client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-b"], max_retries=0)
    upstream.json_reply(completion("x", prompt=21, completion_tokens=9))
    params = {"model": "test-model", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    batch = client.messages.batches.create(requests=[{"custom_id": "one", "params": params}])  # type: ignore[list-item]
    wait_ended(client, batch.id)
    (result,) = client.messages.batches.results(batch.id)
    assert result.result.type == "succeeded"
    body = report(server.url, group_by=["api_key_id"])
    results = [r for b in body["data"] for r in b["results"]]
    assert [(r["api_key_id"], r["uncached_input_tokens"], r["output_tokens"]) for r in results] == [
        (key_id(KEYS["team-b"]), result.result.message.usage.input_tokens, result.result.message.usage.output_tokens)
    ]


SQLITE_MIGRATE = """
import asyncio, sys, time
from pathlib import Path
from dragoman.usage.sqlite import SqliteStore

async def main():
    while time.time() < float(sys.argv[2]):  # start together
        await asyncio.sleep(0.001)
    store = SqliteStore(Path(sys.argv[1]))
    await store.open()
    await store.close()

asyncio.run(main())
"""


def test_workers_migrate_one_sqlite_file_at_once(tmp_path: Path) -> None:
    import sqlite3
    import subprocess
    import sys
    import time

    at = time.time() + 2.0
    processes = [subprocess.Popen([sys.executable, "-c", SQLITE_MIGRATE, str(tmp_path), str(at)], stderr=subprocess.PIPE)
                 for _ in range(4)]  # fmt: skip
    errors = [p.communicate(timeout=60)[1].decode() for p in processes]
    assert [p.returncode for p in processes] == [0] * 4, errors
    with sqlite3.connect(tmp_path / "usage.sqlite3") as db:
        assert db.execute("SELECT version FROM dragoman_usage_schema").fetchall() == [(v,) for v, _ in MIGRATIONS]


def test_records_past_retain_days_are_deleted_at_start(tmp_path: Path) -> None:
    import time

    async def run() -> list[str]:
        store = SqliteStore(tmp_path)
        await store.open()
        await store.write([_record("req_old", time.time() - 3 * 86400), _record("req_new", time.time() - 3600)])
        await store.close()
        writer = UsageWriter(SqliteStore(tmp_path), interval=0.05, retain_days=2)
        writer.start()
        try:
            for _ in range(200):  # until the writer's first round has pruned (bounded)
                sums = await writer.store.sums(Query(0, 4e9)) if writer._opened else []
                if sums and sums[0].requests == 1:
                    break
                await asyncio.sleep(0.05)
        finally:
            await writer.close()
        reader = SqliteStore(tmp_path)
        await reader.open()
        try:
            rows = reader._connection().execute("SELECT request_id FROM usage_records").fetchall()
        finally:
            await reader.close()
        return [r[0] for r in rows]

    assert asyncio.run(run()) == ["req_new"]


def _write_default_store(records: list[Any]) -> None:
    """Records in the store `dragoman usage` reads without --config (the test's own data home)."""
    write_records(SqliteStore(Path(os.environ["XDG_DATA_HOME"]) / "dragoman" / "usage"), records)


def test_usage_counts_key_refusals_apart_and_says_which_store_it_read() -> None:
    import json
    import time

    import msgspec

    now = time.time()
    served = msgspec.structs.replace(_record("req_ok", now - 5), tenant="team-a", input_tokens=3, cache_read_tokens=40)
    refused = [msgspec.structs.replace(_record(f"req_{n}", now - 5), status=status, error_type=kind, input_tokens=0,
                                       output_tokens=0)
               for n, (status, kind) in enumerate(((401, "authentication_error"), (403, "permission_error")))]  # fmt: skip
    _write_default_store([served, *refused])
    result = CliRunner().invoke(main, ["usage", "--since", "today", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    store = str(Path(os.environ["XDG_DATA_HOME"]) / "dragoman" / "usage" / "usage.sqlite3")
    assert report["store"] == f"SQLite {store}"
    assert report["rows"] == [{"tenant": "team-a", "model": "m", "requests": 1, "errors": 0, "input_tokens": 3,
                               "cache_read_tokens": 40, "cache_creation_tokens": 0, "output_tokens": 1}]  # fmt: skip
    assert report["refused_requests"] == 2 and report["total"]["requests"] == 1
    assert f"reading SQLite {store} (the default store" in result.stderr
    table = CliRunner().invoke(main, ["usage", "--since", "7d"]).stdout.splitlines()
    assert (
        table[0].split()[2:5] == ["requests", "errors", "input_tokens"] and table[0].split()[5] == "cache_read_tokens"
    )
    assert [row.split()[0] for row in table[1:3]] == ["team-a", "total"]  # no unnamed row for the refusals
    assert table[3] == "refused (401/403, counted in no row above): 2 requests"


def test_usage_takes_relative_times() -> None:
    import time

    _write_default_store([_record("req_old", time.time() - 3 * 86400), _record("req_new", time.time() - 60)])
    counts = {}
    for since in ("today", "yesterday", "7d", "2h", "90m", "1w", "2026-01-01"):
        result = CliRunner().invoke(main, ["usage", "--since", since, "--by", "model", "--csv"])
        assert result.exit_code == 0, result.output
        counts[since] = result.stdout.splitlines()[1].split(",")[1]
    assert counts == {"today": "1", "yesterday": "1", "7d": "2", "2h": "1", "90m": "1", "1w": "2", "2026-01-01": "2"}
    until = CliRunner().invoke(main, ["usage", "--since", "7d", "--until", "yesterday", "--by", "model", "--csv"])
    assert until.stdout.splitlines()[1].split(",")[1] == "1"

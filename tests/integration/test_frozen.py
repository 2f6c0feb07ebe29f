"""Frozen, not dead (issue 34): a `dragoman serve` process stopped with SIGSTOP and then
continued, and a database that answers nothing for a while (a TCP proxy that relays nothing,
as a server stopped with SIGSTOP). Two processes share the journal directory and the session's
PostgreSQL (a schema of the test's own). Nothing is lost, nothing is counted twice, the other
process serves throughout, and no writer waits on the database past its statement timeout."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import asyncpg
import msgspec
import pytest

from tests.support.fakes import FakeUpstream, chunk
from tests.support.postgres import pg_url  # noqa: F401 (fixture)
from tests.support.serve_process import _start
from tests.support.tcp_proxy import TcpProxy, pg_proxy  # noqa: F401 (fixture)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.heavy, pytest.mark.faults]  # several processes: the full suite runs it, --fast leaves it out

ASK: dict[str, Any] = {"model": "test-model", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}
TIMEOUT = 1.0  # [usage] statement_timeout, seconds


def _gateways(upstream: FakeUpstream, database: str, tmp_path: Path, stop_later: Any) -> list[tuple[Any, str]]:
    config = tmp_path / "dragoman.toml"
    config.write_text(f"[usage]\ndatabase_url = {json.dumps(database)}\nstatement_timeout = {TIMEOUT}\n"
                      f"journal_dir = {json.dumps(str(tmp_path / 'journal'))}\n")  # fmt: skip
    started = []
    for _ in range(2):
        process, url = _start(upstream.url, "--config", str(config))
        stop_later(process)
        started.append((process, url))
    return started


def _counts(url: str) -> tuple[dict[str, int], int]:
    """(request id -> how many records it has, the requests the per-minute rollups count)."""

    async def read() -> tuple[dict[str, int], int]:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            rows = await connection.fetch("SELECT request_id, count(*) FROM usage_records GROUP BY request_id")
            rolled = await connection.fetchval(
                "SELECT coalesce(sum(requests), 0) FROM usage_rollups WHERE grain = 'all' AND width = 60"
            )
        finally:
            await connection.close()
        return {r[0]: r[1] for r in rows}, int(rolled)

    try:
        return asyncio.run(read())
    except (OSError, asyncpg.PostgresError):
        return {}, 0  # the tables are not there yet


def _ask(url: str, answered: list[str]) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="any", max_retries=0, timeout=30)
    answered.append(client.messages.create(**ASK)._request_id or "")
    client.close()


def _journaled(directory: Path) -> set[str]:
    """The request ids of the finished records in the journal's segments."""
    found: set[str] = set()
    for path in directory.rglob("*.jsonl"):
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                found.add(msgspec.json.decode(line)[1])
            except (msgspec.DecodeError, IndexError):
                continue  # a line being written
    return found


def _once_each(url: str, answered: list[str]) -> Callable[[], bool]:
    """Each answered request has one record, and the rollups count each once."""
    return lambda: _counts(url) == (dict.fromkeys(answered, 1), len(answered))


def test_a_gateway_frozen_with_sigstop_loses_and_doubles_nothing(
    upstream: FakeUpstream,
    pg_url: str,  # noqa: F811
    tmp_path: Path,
    stop_later: Any,
) -> None:
    (frozen, one), (_, other) = _gateways(upstream, pg_url, tmp_path, stop_later)
    answered: list[str] = []
    for _ in range(3):
        _ask(one, answered)
    release = threading.Event()
    upstream.stream_reply([chunk({"role": "assistant", "content": ""}), chunk({"content": "a"}), ("wait", release),
                           chunk({"content": "b"}), chunk({}, "stop")])  # fmt: skip
    client = anthropic.Anthropic(base_url=one, api_key="any", max_retries=0, timeout=30)
    stream = client.messages.stream(**ASK).__enter__()
    next(e for e in stream if e.type == "text")  # a stream in flight on the process frozen next
    frozen.send_signal(signal.SIGSTOP)
    try:
        for _ in range(6):
            _ask(other, answered)  # the other process serves meanwhile
        eventually(lambda: set(answered[3:]) <= set(_counts(pg_url)[0]), "the other's records written", timeout=15)
    finally:
        frozen.send_signal(signal.SIGCONT)
    release.set()
    assert stream.get_final_message().content[0].text == "ab"  # type: ignore[union-attr]
    answered.append(stream.request_id or "")
    stream.close()
    client.close()
    _ask(one, answered)
    eventually(_once_each(pg_url, answered), "one record for each answered request", timeout=15, every=0.2)
    assert len(set(answered)) == 11 and all(answered)


def test_a_frozen_database_holds_no_writer_and_each_record_lands_once(
    upstream: FakeUpstream,
    pg_url: str,  # noqa: F811
    pg_proxy: tuple[TcpProxy, str],  # noqa: F811
    tmp_path: Path,
    stop_later: Any,
) -> None:
    proxy, proxied = pg_proxy
    gateways = _gateways(upstream, proxied, tmp_path, stop_later)
    answered: list[str] = []
    for n in range(4):
        _ask(gateways[n % 2][1], answered)
    eventually(_once_each(pg_url, answered), "the records before the freeze written", timeout=15, every=0.2)
    proxy.freeze()
    try:
        for batch in range(2):  # the first batch's flush then waits on the database; the second's must not
            during: list[str] = []
            for n in range(6):
                _ask(gateways[n % 2][1], during)
            answered += during
            # Journaled while the database still answers nothing: no writer is stuck on it.
            eventually(
                lambda ids=set(during): ids <= _journaled(tmp_path / "journal"), f"batch {batch} journaled", timeout=15
            )  # type: ignore[misc]
    finally:
        proxy.restore()
    for n in range(2):
        _ask(gateways[n % 2][1], answered)
    eventually(_once_each(pg_url, answered), "one record for each answered request", timeout=20, every=0.2)
    assert all(process.poll() is None for process, _ in gateways)

"""The usage journal under real faults: two `dragoman serve` processes sharing a journal
directory and a PostgreSQL server of the test's own, which the test stops. SIGTERM with the
database down leaves the records on disk, and a later start ships each once; SIGKILL mid-stream
leaves each stream's state, and a later start records it as ended by a crash."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import asyncpg
import pytest

from tests.support.fakes import FakeUpstream, Reply, chunk, completion, text_stream
from tests.support.postgres import PrivatePostgres, private_postgres  # noqa: F401 (fixture)
from tests.support.serve_process import _kill, _start
from tests.support.waiting import eventually

pytestmark = [pytest.mark.heavy, pytest.mark.faults]  # several processes: the full suite runs it, --fast leaves it out

ASK: dict[str, Any] = {"model": "test-model", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}


def _gateway(upstream: FakeUpstream, config: Path, stop_later: Any) -> tuple[subprocess.Popen[bytes], str]:
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    return process, url


def _config(tmp_path: Path, database_url: str) -> Path:
    path = tmp_path / "dragoman.toml"
    path.write_text(f'[usage]\ndatabase_url = "{database_url}"\njournal_dir = "{tmp_path / "journal"}"\n')
    return path


def _records(url: str) -> dict[str, tuple[int, str | None, int]]:
    """Every record in the table: request id -> (output tokens, error type, input tokens)."""

    async def read() -> dict[str, tuple[int, str | None, int]]:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            rows = await connection.fetch(
                "SELECT request_id, output_tokens, error_type, input_tokens FROM usage_records"
            )
        finally:
            await connection.close()
        return {r["request_id"]: (r["output_tokens"], r["error_type"], r["input_tokens"]) for r in rows}

    try:
        return asyncio.run(read())
    except (OSError, asyncpg.PostgresError):
        return {}  # the table is not there yet


def test_sigterm_with_the_database_down_loses_nothing(
    upstream: FakeUpstream,
    private_postgres: PrivatePostgres,  # noqa: F811
    tmp_path: Path,
    stop_later: Any,
) -> None:
    config = _config(tmp_path, private_postgres.url)
    gateways = [_gateway(upstream, config, stop_later) for _ in range(2)]
    eventually(lambda: _table_exists(private_postgres.url), "the schema made", timeout=20, every=0.2)
    private_postgres.stop()
    answered: list[str] = []
    for n in range(20):  # bounded: 10 replies and 10 streams, across both processes
        client = anthropic.Anthropic(base_url=gateways[n % 2][1], api_key="any", max_retries=0)
        if n % 4 < 2:
            upstream.json_reply(completion("x", completion_tokens=3))
            answered.append(client.messages.create(**ASK)._request_id or "")
        else:
            upstream.stream_reply(text_stream("a", "b", "c"))
            with client.messages.stream(**ASK) as stream:
                stream.get_final_message()
                answered.append(stream.request_id or "")
        client.close()
    for process, _ in gateways:
        process.send_signal(signal.SIGTERM)
    for process, _ in gateways:
        _, stderr = process.communicate(timeout=30)
        assert process.returncode in (0, -signal.SIGTERM), stderr.decode()  # uvicorn re-raises the signal
        lines = stderr.decode()
        assert "stay in the journal" in lines
        # One warning for the outage, one for what the shutdown left: the driver's own are quieted.
        assert lines.count("WARNING dragoman.usage") == 2 and "Traceback" not in lines, lines
    assert list((tmp_path / "journal").rglob("*.jsonl")), "the records are on disk"
    private_postgres.start()
    _gateway(upstream, config, stop_later)
    eventually(
        lambda: set(_records(private_postgres.url)) == set(answered), "every record shipped", timeout=30, every=0.2
    )
    assert len(answered) == 20 and all(answered)
    eventually(lambda: not list((tmp_path / "journal").rglob("*.jsonl")), "the journal emptied once shipped")


def _table_exists(url: str) -> bool:
    async def check() -> bool:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            return bool(await connection.fetchval("SELECT to_regclass('usage_records') IS NOT NULL"))
        finally:
            await connection.close()

    return asyncio.run(check())


def test_sigkill_mid_stream_records_what_each_stream_relayed(
    upstream: FakeUpstream,
    private_postgres: PrivatePostgres,  # noqa: F811
    tmp_path: Path,
    stop_later: Any,
) -> None:
    """The database down throughout, so the journal alone keeps what the kill spares: the open
    streams (with what they relayed, and their input estimated) and every finished reply
    finished more than a second before the kill (journaled every APPEND_EVERY, fsynced or not)."""
    config = _config(tmp_path, private_postgres.url)
    gateways = [_gateway(upstream, config, stop_later) for _ in range(2)]
    eventually(lambda: _table_exists(private_postgres.url), "the schema made", timeout=20, every=0.2)
    private_postgres.stop()
    never, done = threading.Event(), threading.Event()  # the streams stay open until the gateways die
    opening = [chunk({"role": "assistant", "content": ""}), *(chunk({"content": p}) for p in "abc"), ("wait", never)]
    upstream.responder = lambda body: Reply(chunks=opening) if body.get("stream") else None  # else a completion
    clients, streams, ids = [], [], []  # (the streams held: one collected would hang up)
    finished: dict[str, float] = {}  # reply request id -> when it was answered (monotonic)
    replies = threading.Thread(target=_replies, args=([url for _, url in gateways], finished, done), daemon=True)
    replies.start()  # finished replies, through both, until the kill
    try:
        for n in range(4):  # two open streams in each process, each 3 tokens in
            client = anthropic.Anthropic(base_url=gateways[n % 2][1], api_key="any", max_retries=0, timeout=30)
            stream = client.messages.stream(**ASK).__enter__()
            text = ""
            for event in stream:
                if event.type == "text":
                    text += event.text
                if text == "abc":
                    break
            clients.append(client)
            streams.append(stream)
            ids.append(stream.request_id)
        eventually(lambda: _journaled(tmp_path / "journal") >= set(ids), "the open streams journaled", timeout=10)
        eventually(lambda: _older(finished, SPARED) >= 5, "replies finished before the last tick", timeout=20)
        killed_at = time.monotonic()
        for process, _ in gateways:
            _kill(process)  # SIGKILL, the process group
    finally:
        done.set()
        never.set()
        for client in clients:
            client.close()
    replies.join(30)
    private_postgres.start()
    _gateway(upstream, config, stop_later)
    eventually(lambda: set(_records(private_postgres.url)) >= set(ids), "every stream recorded", timeout=30, every=0.2)
    records = _records(private_postgres.url)
    assert [records[i][:2] for i in ids] == [(3, "gateway_crashed")] * 4
    assert all(records[i][2] > 0 for i in ids), "a translated stream's input, estimated"
    spared = {i for i, at in finished.items() if killed_at - at > SPARED}
    assert spared and not spared - set(records), "a reply finished over a second before the kill is missing"


SPARED = 1.0  # issue 34: a finished reply this old is in the journal (written every APPEND_EVERY) at the kill


def _replies(urls: list[str], finished: dict[str, float], done: threading.Event) -> None:
    """Short replies through each gateway in turn, paced, until `done` or a gateway dies."""
    clients = [anthropic.Anthropic(base_url=url, api_key="any", max_retries=0, timeout=10) for url in urls]
    n = 0
    while not done.is_set() and n < 200:  # bounded
        try:
            reply = clients[n % len(clients)].messages.create(**ASK)
        except anthropic.APIError:
            return  # killed
        finished[reply._request_id or ""] = time.monotonic()
        n += 1
        done.wait(0.05)  # pacing the load, not waiting for a condition


def _older(finished: dict[str, float], seconds: float) -> int:
    now = time.monotonic()
    return sum(now - at > seconds for at in list(finished.values()))


def _journaled(directory: Path) -> set[str]:
    """The request ids in the journal's stream files."""
    import msgspec

    found: set[str] = set()
    for path in directory.rglob("*.streams"):
        try:
            found |= {row[1] for row in msgspec.json.decode(path.read_bytes())}
        except (FileNotFoundError, msgspec.DecodeError):
            continue
    return found

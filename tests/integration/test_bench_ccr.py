"""claude-code-router as the benchmark runs it (bench/ccr.py, start_ccr in
bench/run.py), driven with the official SDK over real sockets. It needs CCR in the
benchmark's cache (`python bench/run.py --smoke --ccr` installs it once, in minutes,
from the npm registry): skipped when it is not there."""

from __future__ import annotations

import os

import anthropic
import pytest

from tests.support.bench import bench_module

run = bench_module("run")
ccr = bench_module("ccr")
load = bench_module("load")

pytestmark = pytest.mark.skipif(
    ccr.installed(run.cache_dir()) is None, reason="claude-code-router is not installed in the benchmark's cache"
)
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def procs(tmp_path):
    procs = run.Processes(tmp_path, None, None)
    yield procs
    procs.stop_all()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ccr_relays_the_fake_from_a_fresh_home_and_writes_no_trace(procs, tmp_path):
    fake = run.start_fake(procs, slow_delay_ms=5000)
    server = run.start_ccr(procs, fake)
    direct = anthropic.Anthropic(base_url=fake.url.removesuffix("/v1"), api_key="bench", max_retries=0)
    client = anthropic.Anthropic(base_url=server.url.removesuffix("/v1/messages"), api_key=ccr.CCR_KEY, max_retries=0)

    reply = client.messages.create(model=run.MODEL, max_tokens=5, messages=HELLO)
    expected = direct.messages.create(model=run.MODEL, max_tokens=5, messages=HELLO)
    assert reply.stop_reason == "end_turn" and expected.content[0].text.startswith(" ")
    # Two of the differences the benchmark counts: a non-streamed reply's text loses its
    # leading space (load.TEXT), and no response has a request-id (load.REQUEST_ID).
    assert reply.content[0].text == expected.content[0].text.lstrip()
    assert reply._request_id is None
    with client.messages.stream(model=run.PACED_MODEL, max_tokens=20, messages=HELLO) as stream:
        streamed = stream.get_final_message()
    with direct.messages.stream(model=run.PACED_MODEL, max_tokens=20, messages=HELLO) as stream:
        assert streamed.content[0].text == stream.get_final_message().content[0].text

    home = tmp_path / "ccr-home" / ".claude-code-router"
    assert (home / "config.sqlite").exists() and not (home / "config.json").exists()  # imported once, then archived
    written = [p.name for p in (home / "app-data").rglob("*") if p.is_file()]
    assert written == []  # CCR_RAW_TRACE_ENABLED=0: no request trace, with the bodies, on disk

    tree = load.process_tree(server.pid)
    assert len(tree) >= 2  # the management service and the gateway it started
    procs.stop_all()
    assert [pid for pid in tree if alive(pid)] == []

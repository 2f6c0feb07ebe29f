"""`dragoman serve --workers 2` with the embedded store: both workers write one SQLite
file, and SIGTERM writes what each holds before it exits."""

from __future__ import annotations

import signal

import anthropic
import pytest
from click.testing import CliRunner

from dragoman.cli import main
from tests.support.fakes import FakeUpstream, completion
from tests.support.serve_process import _start

pytestmark = pytest.mark.heavy  # several processes: the full suite runs it, --fast leaves it out


def test_sigterm_loses_no_record_of_either_worker(upstream: FakeUpstream, stop_later) -> None:
    process, url = _start(upstream.url, "--workers", "2")
    stop_later(process)
    for n in range(10):
        upstream.json_reply(completion("x", prompt=10, completion_tokens=n))
        client = anthropic.Anthropic(base_url=url, api_key="any", max_retries=0)  # a new connection: either worker
        client.messages.create(model="test-model", max_tokens=20, messages=[{"role": "user", "content": "Hi"}])
        client.close()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()
    result = CliRunner().invoke(main, ["usage", "--by", "model", "--csv", "--since", "2026-01-01"])
    assert result.stdout.splitlines()[1:] == ["test-model,10,0,100,0,0,45"], result.output

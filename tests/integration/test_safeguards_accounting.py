"""What operators see of auto mode's classifier calls: a usage record and metrics under the
caller's key, marked `classifier`; each verdict in the access log (tool and outcome, never
its input)."""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.server.auth import key_id
from tests.support.bench import ROOT
from tests.support.fakes import FakeUpstream
from tests.support.otlp import OtlpReceiver
from tests.support.safeguards import BASH, BETAS, SAFEGUARDS, is_classifier, model_calls, verdicts


def test_a_classifier_call_is_the_callers_and_marked_so(upstream: FakeUpstream, gateway_from: Any, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    server = gateway_from({"server": {"api_keys": ["key-a"]}, "usage": {"dir": str(tmp_path)},
                           "safeguards": {"model": "test-model"},
                           "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}})  # fmt: skip
    upstream.queue(model_calls(("call_ls", "ls secret-dir"), ("call_rm", "rm -rf ~")), verdicts(False, True))
    client = anthropic.Anthropic(base_url=server.url, api_key="key-a", max_retries=0)
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        client.messages.create(model="test-model", max_tokens=200, messages=[{"role": "user", "content": "tidy"}],
                               tools=[BASH], extra_body={"safeguards": SAFEGUARDS},
                               extra_headers={"anthropic-beta": BETAS})  # fmt: skip
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"]
    classifier = next(line for line in lines if line["endpoint"] == "classifier")
    messages = next(line for line in lines if line["endpoint"] == "messages")
    assert classifier["key_id"] == messages["key_id"] == key_id("key-a")
    assert classifier["input_tokens"] == 900 and classifier["output_tokens"] == 30
    assert messages["safeguards"] == ["Bash=not_flagged", "Bash=flagged"]
    assert not any("secret-dir" in r.getMessage() or "rm -rf" in r.getMessage() for r in caplog.records)
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'dragoman_requests_total{endpoint="classifier",model="test-model"' in metrics
    server.stop()  # the usage writer's last flush
    with sqlite3.connect(tmp_path / "usage.sqlite3") as db:
        rows = db.execute("SELECT endpoint, key_id, input_tokens, output_tokens FROM usage_records").fetchall()
    assert sorted(rows) == sorted([("classifier", key_id("key-a"), 900, 30), ("messages", key_id("key-a"), 10, 5)])


def test_the_verdicts_are_on_the_requests_span(upstream: FakeUpstream, gateway_from: Any) -> None:
    receiver = OtlpReceiver().start()
    try:
        server = gateway_from({"safeguards": {"model": "test-model"}, "tracing": {"enabled": True, "endpoint": receiver.url},
                               "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}})  # fmt: skip
        upstream.queue(model_calls(("call_rm", "rm -rf ~")), verdicts(True))
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        client.messages.create(model="test-model", max_tokens=200, messages=[{"role": "user", "content": "tidy"}],
                               tools=[BASH], extra_body={"safeguards": SAFEGUARDS})  # fmt: skip
        server.stop()  # its shutdown exports the spans
        (span,) = [span for span in receiver.spans() if span.kind == 2]  # the server span
    finally:
        receiver.stop()
    assert span.attributes["dragoman.safeguards"] == ["Bash=flagged"]
    assert not any("rm -rf" in str(value) for value in span.attributes.values())


def test_the_cost_bench_runs_through_a_gateway(upstream: FakeUpstream, gateway_from: Any) -> None:
    """bench/safeguards_cost.py, so it never rots (no timing asserted)."""
    server = gateway_from({"upstreams": {"default": {"url": upstream.url, "max_retries": 0}}})
    upstream.queue(verdicts(False), verdicts(False))
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "safeguards_cost.py"), "--gateway", server.url,
                             "--model", "test-model", "--runs", "2"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "~360000 tokens per action" in result.stdout and "answers read: 2/2" in result.stdout
    assert is_classifier(upstream.requests[0])

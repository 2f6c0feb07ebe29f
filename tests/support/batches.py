"""Helpers for the Message Batches tests: requests that carry a marker (`<<name>>`) so
the fake upstream answers each by it, waits bounded in time, and a gateway that keeps
its batches in the test's directory (`keeping_start`)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest

from dragoman.assembly.gateway import Timings
from dragoman.batches.runs import BatchTimings
from tests.support.fakes import FakeUpstream, Reply, completion
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually

MARKER = re.compile(r"<<(\w+)>>")  # the marker a request's text carries, so the fake can answer per request


def params(marker: str = "plain", **over: Any) -> dict[str, Any]:
    return {
        "model": "test-model",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": f"say <<{marker}>>"}],
        **over,
    }


def marker_of(body: dict) -> str:
    found = MARKER.search(json.dumps(body.get("messages")))
    assert found, body
    return found.group(1)


def answer_per_marker(
    upstream: FakeUpstream, *, hang: float = 0.0, fail: tuple[str, ...] = (), hold: threading.Event | None = None
) -> None:
    """Answer each request with `answer to <marker>` (after `hang` seconds, and not before
    `hold` is set), or a 500 for markers in `fail`. A test that needs a request still in
    flight while it does something holds it: a `hang` is only a bet on how fast it is."""

    def respond(body: dict) -> Reply:
        marker = marker_of(body)
        if marker in fail:
            return Reply(
                status=500,
                body={"error": {"message": f"boom for {marker}", "type": "server_error"}},
                hang=hang,
                hold=hold,
            )
        return Reply(body=completion(f"answer to {marker}", prompt=11, completion_tokens=4), hang=hang, hold=hold)

    upstream.responder = respond


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 10.0) -> Any:
    def ended() -> Any:
        batch = client.messages.batches.retrieve(batch_id)
        return batch if batch.processing_status == "ended" else None

    return eventually(ended, f"batch {batch_id} ended", timeout)


def results_of(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    lines = list(client.messages.batches.results(batch_id))
    by_id = {line.custom_id: line.result for line in lines}
    assert len(by_id) == len(lines), "one result line per request"
    return by_id


def counts(batch: Any) -> dict[str, int]:
    return batch.request_counts.model_dump()


KEY = "test-key"  # the gateway's API key in most batch tests
KEYS = ["key-a", "key-b"]


@pytest.fixture
def keeping_start(
    upstream: FakeUpstream, tmp_path: Path, gateway_from: Callable[[dict], GatewayServer]
) -> Callable[..., GatewayServer]:
    """`start(batches=..., server=..., timings=...)`: a gateway keeping its batches in this test's
    directory (`timings`: how often it sweeps for batches, how long a failed one rests)."""

    def run(
        *, batches: dict | None = None, server: dict | None = None, timings: BatchTimings | None = None
    ) -> GatewayServer:
        return gateway_from({
            "server": server or {},
            "batches": {"dir": str(tmp_path / "batches"), **(batches or {})},
            "upstreams": {"default": {"url": upstream.url, "max_retries": 0}},
        }, timings=Timings(batches=timings) if timings else None)  # fmt: skip

    return run


def sdk(gateway: GatewayServer, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=5)

"""Routing weighs each replica's own load, read from its /metrics (docs/routing.md): the
official SDK over a real socket, scripted replicas that publish vLLM's figures, or none."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from tests.support.backend_metrics import vllm
from tests.support.fakes import FakeUpstream
from tests.support.waiting import eventually

INTERVAL = 0.05  # load_metrics_interval here: readings come quickly


@pytest.fixture
def second() -> Iterator[FakeUpstream]:
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


def ask(client: anthropic.Anthropic, name: str) -> None:
    client.messages.create(model="test-model", max_tokens=20, system="You are a coding agent. " * 100,
                           messages=[{"role": "user", "content": f"{name}: fix the bug " * 100}],
                           extra_headers={"x-claude-code-session-id": name})  # fmt: skip


def wait_for_gauges(url: str, replicas: list[str], timeout: float = 5.0) -> str:
    """The gateway's /metrics once it shows every replica's reading."""

    def shown() -> str | None:
        metrics = httpx.get(url + "/metrics").text
        return (
            metrics if all(f'dragoman_replica_requests_waiting{{replica="{r}"' in metrics for r in replicas) else None
        )

    return eventually(shown, f"every replica's reading of {replicas}", timeout=timeout, every=INTERVAL)


@pytest.mark.parametrize("protocol", ["openai", "auto"])  # auto: two clients share the replicas and their readings
def test_requests_go_to_the_replica_whose_own_metrics_show_no_queue(make_gateway, upstream, second, protocol):
    upstream.metrics = vllm(running=16, waiting=30, kv_usage=0.97)  # other gateways' requests queue there
    second.metrics = vllm(running=2, waiting=0, kv_usage=0.2)
    gateway = make_gateway(upstream={"replicas": [second.url], "load_metrics_interval": INTERVAL, "protocol": protocol},
                           server={"default_model": "test-model"})  # fmt: skip
    busy, idle = upstream.url.removesuffix("/v1"), second.url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as client:
        ask(client, "warm-up")  # reading starts with the first request
        metrics = wait_for_gauges(gateway.url, [busy, idle])
        upstream.requests.clear()
        second.requests.clear()
        for index in range(8):
            ask(client, f"conversation-{index}")
    assert f'dragoman_replica_requests_waiting{{replica="{busy}",upstream="default"}} 30.0' in metrics
    assert f'dragoman_replica_kv_cache_usage{{replica="{idle}",upstream="default"}} 0.2' in metrics
    assert len(second.requests) == 8 and not upstream.requests


def test_the_access_log_says_the_load_routing_counted(make_gateway, upstream, second, caplog):
    upstream.metrics = second.metrics = vllm(running=5, waiting=1)
    gateway = make_gateway(upstream={"replicas": [second.url], "load_metrics_interval": INTERVAL},
                           server={"default_model": "test-model"})  # fmt: skip
    with anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as client:
        ask(client, "warm-up")
        wait_for_gauges(gateway.url, [upstream.url.removesuffix("/v1"), second.url.removesuffix("/v1")])
        with caplog.at_level(logging.INFO, logger="dragoman.access"):
            ask(client, "counted")
    line = next(r.getMessage() for r in caplog.records if r.name == "dragoman.access")
    assert '"replica_load":6.0' in line  # the replica's 5 running and 1 waiting


def test_replicas_without_metrics_cost_no_error_and_one_log_line_each(make_gateway, upstream, second, caplog):
    """The fakes answer /metrics 404 (as a server without it); asked less and less often; the
    reading ends with the gateway, nothing left pending."""
    with caplog.at_level(logging.INFO):
        gateway = make_gateway(upstream={"replicas": [second.url], "load_metrics_interval": INTERVAL},
                               server={"default_model": "test-model"})  # fmt: skip
        with anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as client:
            for index in range(4):
                ask(client, f"conversation-{index}")
            time.sleep(0.6)  # 12 intervals
            ask(client, "after")
        metrics = httpx.get(gateway.url + "/metrics").text
        gateway.stop()
    noted = [r.getMessage() for r in caplog.records if "publishes no load" in r.getMessage()]
    assert len(noted) == 2 and all("status 404" in line for line in noted), noted
    assert len(upstream.requests) + len(second.requests) == 5  # every request answered (the SDK raised none)
    assert 1 <= upstream.metrics_requests <= 6 and 1 <= second.metrics_requests <= 6  # backing off, not 12+
    assert "dragoman_replica_requests_running{" not in metrics
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("settings", [{"load_metrics": False}, {"routing": "round_robin"}])
def test_nothing_is_read_when_turned_off_or_routed_round_robin(make_gateway, upstream, second, settings):
    upstream.metrics = second.metrics = vllm(running=1, waiting=0)
    gateway = make_gateway(upstream={"replicas": [second.url], "load_metrics_interval": INTERVAL, **settings},
                           server={"default_model": "test-model"})  # fmt: skip
    with anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as client:
        for index in range(3):
            ask(client, f"conversation-{index}")
        time.sleep(4 * INTERVAL)
    assert upstream.metrics_requests == second.metrics_requests == 0


def test_one_replica_reads_nothing(make_gateway, upstream):
    upstream.metrics = vllm(running=1, waiting=0)
    gateway = make_gateway(upstream={"routing": "least_loaded", "load_metrics_interval": INTERVAL},
                           server={"default_model": "test-model"})  # fmt: skip
    with anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as client:
        ask(client, "alone")
        time.sleep(4 * INTERVAL)
    assert upstream.metrics_requests == 0

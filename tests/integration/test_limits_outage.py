"""Limits while Redis is out, under fail_open: two gateways sharing a Redis of the test's
own, which the test stops for 10 s. Each serves on its share of the rate, from the level
Redis last reported, so a 30-per-minute key gets at most 1.5x its rate across both; one
warning per outage per process, redis-py's own lines quieted; the requests so decided counted."""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

import anthropic
import pytest

from dragoman.core.config_load import from_dict
from dragoman.limits.credit import CREDIT_TTL
from tests.support.fakes import FakeUpstream
from tests.support.redis_server import RedisProcess
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually

pytestmark = [pytest.mark.heavy, pytest.mark.faults]  # several processes: the full suite runs it, --fast leaves it out

RPM = 30
OUTAGE = 10.0  # seconds Redis is stopped


def _status(client: anthropic.Anthropic) -> int:
    try:
        client.messages.create(model="test-model", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    except anthropic.APIStatusError as error:
        return error.status_code
    return 200


def _outage_count(server: GatewayServer, decision: str) -> float:
    registry = server.app.state.gateway.metrics.registry
    value = registry.get_sample_value(
        "dragoman_store_outage_requests_total", {"store": "redis", "policy": "fail_open", "decision": decision}
    )
    return value or 0.0


def test_a_redis_outage_holds_the_rate_across_two_gateways(upstream: FakeUpstream, caplog: Any) -> None:
    own = RedisProcess().start()
    config = from_dict({"server": {"api_keys": ["sk-shared"]},
                        "limits": {"requests_per_minute": RPM, "redis_url": own.url, "on_redis_error": "fail_open"},
                        "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}})  # fmt: skip
    gateways = [GatewayServer(config).start() for _ in range(2)]
    clients = [anthropic.Anthropic(base_url=g.url, api_key="sk-shared", max_retries=0) for g in gateways]
    try:
        statuses = [_status(clients[n % 2]) for n in range(RPM + 2)]  # the bucket drained, through both
        assert statuses.count(429) >= 1 and set(statuses) == {200, 429}
        drained = time.monotonic()
        shares = [g.app.state.gateway.limits.store.share for g in gateways]
        eventually(lambda: all(s.processes == 2 for s in shares), "both processes seen alive", timeout=10)
        caplog.set_level(logging.DEBUG)
        caplog.clear()
        own.kill()
        admitted, n = 0, 0
        while time.monotonic() - drained < OUTAGE:  # bounded: one request per 0.2 s, alternating
            status = _status(clients[n % 2])
            assert status in (200, 429)  # fail_open: a refusal is the limit's, never the outage's
            admitted += status == 200
            n += 1
            time.sleep(0.2)  # pacing the load, not waiting for a condition
        elapsed = time.monotonic() - drained
        assert 1 <= admitted <= 1.5 * (RPM / 60) * elapsed, (admitted, elapsed)
        assert sum(_outage_count(g, "admitted") for g in gateways) == admitted
        assert sum(_outage_count(g, "refused") for g in gateways) == n - admitted
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.name for r in warnings] == ["dragoman.limits"] * 2, [r.getMessage() for r in warnings]
    finally:
        for gateway in gateways:
            gateway.stop()
        own.stop()


def test_a_frozen_redis_holds_no_request(upstream: FakeUpstream) -> None:
    """Redis stopped with SIGSTOP (connections open, nothing answered): each request waits at
    most `redis_timeout`, is decided under fail_open, and Redis is used again once continued."""
    own = RedisProcess().start()
    config = from_dict({"server": {"api_keys": ["sk-shared"]},
                        "limits": {"requests_per_minute": 1000, "redis_url": own.url, "on_redis_error": "fail_open"},
                        "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}})  # fmt: skip
    gateways = [GatewayServer(config).start() for _ in range(2)]
    clients = [anthropic.Anthropic(base_url=g.url, api_key="sk-shared", max_retries=0, timeout=10) for g in gateways]
    try:
        assert [_status(c) for c in clients] == [200, 200]
        time.sleep(CREDIT_TTL + 0.3)  # their credit (limits/credit.py) ended and went back: each asks Redis
        assert own.process is not None
        own.process.send_signal(signal.SIGSTOP)
        try:
            assert [_status(clients[n % 2]) for n in range(4)] == [200] * 4  # the SDK's timeout: no hang
            assert sum(_outage_count(g, "admitted") for g in gateways) == 4
        finally:
            own.process.send_signal(signal.SIGCONT)

        def on_redis_again() -> bool:
            before = sum(_outage_count(g, "admitted") for g in gateways)
            statuses = [_status(c) for c in clients]
            return statuses == [200, 200] and sum(_outage_count(g, "admitted") for g in gateways) == before

        eventually(on_redis_again, "both gateways on Redis again", timeout=15, every=0.2)
    finally:
        for gateway in gateways:
            gateway.stop()
        own.stop()

"""[limits] with redis_url: several gateway processes (and their --workers) enforce one
limit, and a Redis that goes away under fail_open fails no request."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import pytest

from dragoman.assembly.gateway import Timings
from dragoman.core.config_load import from_dict
from tests.support.fakes import FakeUpstream, Reply, completion
from tests.support.redis_server import RedisProcess
from tests.support.servers import GatewayServer, start_serving
from tests.support.waiting import eventually

RPM = 20
CLIENTS = 8
REQUESTS = 2 * RPM  # far more than the limit lets through, so that every process sees refusals


def _toml(value: Any) -> str:
    return json.dumps(value)  # the strings, numbers and lists used here are TOML as JSON writes them


def _serve(config: Path, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    def start(port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "dragoman", "serve", "--config", str(config), "--port", str(port),
             "--workers", str(workers)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "DRAGOMAN_CACHE_DIR": "/nonexistent"},
            start_new_session=True,
        )  # fmt: skip

    def output(process: subprocess.Popen[bytes]) -> str:
        return process.stderr.read().decode() if process.stderr else ""

    return start_serving(start, output, path="/health")


_clients = threading.local()


def _one(url: str) -> int:
    """One request from this thread's SDK client for `url` (a client per thread and gateway)."""
    clients = _clients.__dict__.setdefault("by_url", {})
    client = clients.get(url) or clients.setdefault(
        url, anthropic.Anthropic(base_url=url, api_key="sk-shared", max_retries=0)
    )
    try:
        client.messages.create(model="test-model", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
        return 200
    except anthropic.APIStatusError as error:
        return error.status_code


@pytest.mark.parametrize("workers", [1, 2])
def test_two_gateways_sharing_redis_enforce_one_limit(workers, tmp_path, redis_url, redis_prefix):
    upstream = FakeUpstream().start()
    config = tmp_path / "dragoman.toml"
    config.write_text(
        f'[server]\napi_keys = ["sk-shared"]\nregistry_cache = ""\n'
        f"[limits]\nrequests_per_minute = {RPM}\nredis_url = {_toml(redis_url)}\nredis_prefix = {_toml(redis_prefix)}\n"
        f"[upstreams.default]\nurl = {_toml(upstream.url)}\nmax_retries = 0\n"
    )
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            started = list(pool.map(lambda _: _serve(config, workers), range(2)))
        processes = [process for process, _ in started]
        urls = [url for _, url in started]
        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            statuses = list(pool.map(_one, [urls[i % 2] for i in range(REQUESTS)]))
        elapsed = time.monotonic() - began
    finally:
        for process in processes:
            os.killpg(process.pid, 9)
            process.wait(5)
        upstream.stop()
    assert set(statuses) <= {200, 429}, statuses
    # The bucket holds RPM and refills RPM a minute: exact is RPM plus what came back while the load ran.
    exact = RPM + int(elapsed * RPM / 60)
    assert exact - 1 <= statuses.count(200) <= exact + 1, (statuses.count(200), exact)
    assert len(upstream.requests) == statuses.count(200)  # a refusal never reached the backend


def test_redis_killed_mid_test_fails_no_request_under_fail_open(upstream):
    own = RedisProcess().start()
    config = from_dict({"server": {"api_keys": ["sk-shared"]},
                        "limits": {"requests_per_minute": 6, "redis_url": own.url, "on_redis_error": "fail_open"},
                        "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}})  # fmt: skip
    again_at_once = Timings(redis_retry_after=0.0)  # ask Redis again at the next request
    gateway = GatewayServer(config, timings=again_at_once).start()
    client = anthropic.Anthropic(base_url=gateway.url, api_key="sk-shared", max_retries=0)

    def ask() -> Any:
        return client.messages.with_raw_response.create(
            model="test-model", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
        )

    try:
        for _ in range(2):
            ask()
        own.kill()
        for _ in range(4):  # served on this process's own bucket meanwhile
            assert ask().http_response.status_code == 200
        own.start()  # back, empty: its bucket is full again
        remaining = [int(ask().headers["anthropic-ratelimit-requests-remaining"]) for _ in range(6)]
        assert remaining[-1] == 0
        with pytest.raises(anthropic.RateLimitError):
            ask()
    finally:
        gateway.stop()
        own.stop()


def _shared_gateways(upstream: FakeUpstream, redis_url: str, prefix: str, **limits: Any) -> list[GatewayServer]:
    config = from_dict({"server": {"api_keys": ["sk-shared"]},
                        "limits": {"redis_url": redis_url, "redis_prefix": prefix, **limits},
                        "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}})  # fmt: skip
    return [GatewayServer(config).start() for _ in range(2)]


def _held(upstream: FakeUpstream) -> threading.Event:
    release = threading.Event()
    upstream.queue(Reply(body=completion(), hold=release))
    return release


def test_max_concurrent_is_shared_through_redis(upstream, redis_url, redis_prefix):
    gateways = _shared_gateways(upstream, redis_url, redis_prefix, max_concurrent=1, queue_timeout=30)
    release = _held(upstream)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            held = pool.submit(_one, gateways[0].url)
            eventually(lambda: len(upstream.requests) == 1, "the first request reached the upstream")
            queued = pool.submit(_one, gateways[1].url)  # the other gateway: the same slot
            time.sleep(0.5)  # (it asks Redis again every 50 to 500 ms meanwhile)
            assert len(upstream.requests) == 1 and not queued.done()
            release.set()
            assert held.result(10) == 200 and queued.result(10) == 200
    finally:
        release.set()
        for gateway in gateways:
            gateway.stop()


def test_a_full_shared_queue_answers_429_naming_max_concurrent(upstream, redis_url, redis_prefix):
    gateways = _shared_gateways(upstream, redis_url, redis_prefix, max_concurrent=1, queue_timeout=0.3)
    release = _held(upstream)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(_one, gateways[0].url)
            eventually(lambda: len(upstream.requests) == 1, "the first request reached the upstream")
            client = anthropic.Anthropic(base_url=gateways[1].url, api_key="sk-shared", max_retries=0)
            with pytest.raises(anthropic.RateLimitError) as caught:
                client.messages.create(model="test-model", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
            assert "limits.max_concurrent" in caught.value.body["error"]["message"]
            release.set()
            assert held.result(10) == 200
        assert _one(gateways[1].url) == 200  # given back: free again
    finally:
        release.set()
        for gateway in gateways:
            gateway.stop()

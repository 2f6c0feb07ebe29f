"""The replicas' own load read from a real llama-server: one started with `--metrics`
publishes its slots processing and requests deferred, which the gateway reads and shows;
one without answers /metrics 501, and is left to the requests in flight, quietly."""

from __future__ import annotations

import logging
import tempfile
import urllib.request

import anthropic
import httpx
import pytest

from dragoman.core.config_load import from_dict
from dragoman.upstream.gauges import parse
from dragoman_local.localmodel import DEFAULT_LOCAL_MODEL, LlamaServer
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually


def test_the_gateway_reads_a_real_llama_servers_load_and_passes_over_one_without_metrics(
    llama_server: LlamaServer, llama_server_small_ctx: LlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    with urllib.request.urlopen(llama_server.base_url + "/metrics", timeout=10) as response:
        reading = parse(response.read().decode())
    assert reading is not None and reading.kv_usage is None  # this llama.cpp publishes no KV-cache figure
    metered, plain = llama_server.base_url, llama_server_small_ctx.base_url
    config = from_dict({
        "server": {"default_model": "served"},
        "files": {"dir": tempfile.mkdtemp(prefix="dragoman-e2e-files-")},
        "upstreams": {"llama": {"url": metered + "/v1", "replicas": [plain + "/v1"], "load_metrics_interval": 0.2}},
        "models": [{"name": "served", "upstream": "llama", "upstream_model": DEFAULT_LOCAL_MODEL}],
    })  # fmt: skip
    with caplog.at_level(logging.INFO, logger="dragoman.upstream"):
        gateway = GatewayServer(config).start()
        try:
            with anthropic.Anthropic(base_url=gateway.url, api_key="any", max_retries=0, timeout=120) as client:
                client.messages.create(model="served", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
            running = f'dragoman_replica_requests_running{{replica="{metered}"'

            def read() -> str | None:
                text = httpx.get(gateway.url + "/metrics").text
                return text if running in text else None

            metrics = eventually(read, running, timeout=30, every=0.2)
        finally:
            gateway.stop()
    shown = [line for line in metrics.splitlines() if line.startswith("dragoman_replica_requests_")]
    assert f'dragoman_replica_requests_waiting{{replica="{metered}",upstream="llama"}}' in metrics
    assert not [line for line in shown if plain in line], shown
    noted = [r.getMessage() for r in caplog.records if "publishes no load" in r.getMessage()]
    assert len(noted) == 1 and plain in noted[0] and "status 501" in noted[0], noted

"""Fixtures of the tests in this directory; their helpers: tests/support/thinking_scaffold.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from dragoman.assembly.gateway import Timings
from tests.support.fakes import FakeUpstream
from tests.support.servers import GatewayServer, make_config
from tests.support.thinking_scaffold import MODELS

UNREACHABLE = "http://127.0.0.1:9/api.json"  # where each gateway here looks for models.dev


@pytest.fixture(scope="module")
def _shared(tmp_path_factory) -> Iterator[tuple[FakeUpstream, dict]]:
    with pytest.MonkeyPatch.context() as patch:
        # No real models.dev cache or fetch: an empty cache dir and an unreachable URL (`UNREACHABLE`).
        patch.setenv("DRAGOMAN_CACHE_DIR", str(tmp_path_factory.mktemp("registry")))
        fake = FakeUpstream().start()
        gateways: dict = {}
        try:
            yield fake, gateways
        finally:
            for server in gateways.values():
                server.stop()
            fake.stop()


@pytest.fixture
def fake(_shared) -> FakeUpstream:
    """The module's upstream, emptied for this test."""
    upstream = _shared[0]
    upstream.replies.clear()
    upstream.requests.clear()
    upstream.headers.clear()
    upstream.responder = None
    return upstream


@pytest.fixture
def gw(_shared, fake) -> Callable[..., anthropic.Anthropic]:
    """gw(flavor="vllm", **server) -> an SDK client for a gateway serving MODELS."""
    gateways = _shared[1]

    def client(flavor: str = "vllm", **server: Any) -> anthropic.Anthropic:
        key = (flavor, json.dumps(server, sort_keys=True))
        if key not in gateways:
            models = [{"upstream": "default", **m} for m in MODELS]
            gateways[key] = GatewayServer(
                make_config(fake.url, server=server, upstream={"flavor": flavor}, models=models),
                timings=Timings(registry_url=UNREACHABLE),
            ).start()
        return anthropic.Anthropic(base_url=gateways[key].url, api_key="test-key", max_retries=0)

    return client

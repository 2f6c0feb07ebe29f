from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from tests.fakes import FakeUpstream
from tests.servers import GatewayServer, config_for


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


@pytest.fixture
def gateway(upstream: FakeUpstream) -> Iterator[GatewayServer]:
    server = GatewayServer(config_for(upstream.url)).start()
    yield server
    server.stop()


@pytest.fixture
def client(gateway: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="test-key", max_retries=0)

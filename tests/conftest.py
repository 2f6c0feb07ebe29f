from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from tests.fakes import FakeUpstream
from tests.servers import GatewayServer, config_for, make_config


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


@pytest.fixture
def make_gateway(upstream: FakeUpstream) -> Iterator[Callable[..., GatewayServer]]:
    """Start a gateway with a custom config: `make_gateway(server={...}, upstream={...},
    models=[...], url=...)`; `url` defaults to the fake upstream's. Stopped at teardown."""
    started: list[GatewayServer] = []

    def start(*, url: str | None = None, **config: Any) -> GatewayServer:
        server = GatewayServer(make_config(url or upstream.url, **config)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()

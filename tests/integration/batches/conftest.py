"""Fixtures of the Message Batches tests; their helpers: tests/support/batches.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.fakes import FakeUpstream
from tests.support.servers import GatewayServer


@pytest.fixture
def start(upstream: FakeUpstream, gateway_from: Callable[[dict], GatewayServer]) -> Callable[..., GatewayServer]:
    """`start(batches={...}, server={...}, upstreams=..., models=...)`: a gateway in front of the fake upstream."""

    def run(
        *,
        batches: dict | None = None,
        server: dict | None = None,
        upstreams: dict | None = None,
        models: list | None = None,
    ) -> GatewayServer:
        data: dict[str, Any] = {
            "server": server or {},
            "batches": batches or {},
            "upstreams": upstreams or {"default": {"url": upstream.url, "max_retries": 0}},
        }
        if models:
            data["models"] = models
        return gateway_from(data)

    return run

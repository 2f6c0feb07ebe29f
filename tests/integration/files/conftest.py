"""Fixtures of the tests in this directory; their helpers: tests/support/files_scaffold.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fakes import FakeUpstream
from tests.support.files_scaffold import MODEL, NATIVE_UPSTREAM
from tests.support.servers import GatewayServer


@pytest.fixture
def files_dir(tmp_path: Path) -> Path:
    return tmp_path / "files"


@pytest.fixture
def start(
    upstream: FakeUpstream, files_dir: Path, gateway_from: Callable[[dict], GatewayServer]
) -> Callable[..., GatewayServer]:
    """`start(files={...}, server={...}, native=FakeAnthropic, directory=...)`: a gateway whose
    files are kept under tmp_path, in front of the fake upstream (model `eyes`, with vision) or,
    given `native`, of the fake Anthropic upstream (model `claude-test`)."""

    def run(*, files: dict | None = None, server: dict | None = None, native: FakeAnthropic | None = None,
            directory: Path | None = None) -> GatewayServer:  # fmt: skip
        data: dict[str, Any] = {"server": server or {}, "files": {"dir": str(directory or files_dir), **(files or {})}}
        if native is None:
            data["upstreams"] = {"default": {"url": upstream.url, "max_retries": 0}}
            data["models"] = [{"name": MODEL, "upstream": "default", "upstream_model": "test-model", "vision": True}]
        else:
            data["upstreams"] = {"native": {**NATIVE_UPSTREAM, "url": native.url + "/v1"}}
            data["models"] = [{"name": "claude-test", "upstream": "native", "upstream_model": "native-model"}]
        assert data["files"]["dir"], "never the real home directory"
        return gateway_from(data)

    return run

"""A model whose chat template has no place for tools (SmolLM2's): the server takes the
request and the model never sees its tools. dragoman finds it out at discovery, by
counting a prompt with and without a tool where the server counts (vLLM here; llama.cpp's
own report is in tests/e2e/test_tools_dropped.py), and says so: a warning at start-up,
`dragoman check` and `dragoman models`, and the `x-tools-dropped` header and
`tools_dropped` log field on each request whose tools were dropped."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import anthropic

from tests.support.fakes import FakeUpstream
from tests.support.servers import GatewayServer, make_config, wait_tool_support

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _cli(tmp_path: Path, command: str, upstream: FakeUpstream) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_")} | {"DRAGOMAN_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "dragoman", command, "--upstream", upstream.url],
                            capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_template_that_drops_tools_is_said_everywhere(upstream: FakeUpstream, caplog, tmp_path: Path) -> None:
    upstream.template_drops_tools = True
    with caplog.at_level(logging.INFO, logger="dragoman"):
        gateway = GatewayServer(make_config(upstream.url)).start()
        try:
            wait_tool_support(gateway, "default")
            with anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as client:
                with_tools = client.messages.with_raw_response.create(
                    model="test-model", max_tokens=5, messages=USER, tools=[TOOL]
                )  # type: ignore[list-item]
                without = client.messages.with_raw_response.create(model="test-model", max_tokens=5, messages=USER)  # type: ignore[arg-type]
        finally:
            gateway.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warnings if "'test-model' renders no tools" in w], warnings
    assert with_tools.headers.get("x-tools-dropped") == "chat-template"
    assert "x-tools-dropped" not in without.headers
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"]
    assert [e.get("tools_dropped") for e in logged if e["endpoint"] == "messages"] == [True, None]

    assert "test-model (? tokens, tools dropped: its chat template renders none)" in _cli(tmp_path, "check", upstream)
    assert "\ttools dropped: its chat template renders none" in _cli(tmp_path, "models", upstream)


def test_a_template_that_renders_tools_is_not_reported(upstream: FakeUpstream, tmp_path: Path) -> None:
    gateway = GatewayServer(make_config(upstream.url)).start()
    try:
        wait_tool_support(gateway, "default")
        with anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as client:
            raw = client.messages.with_raw_response.create(
                model="test-model", max_tokens=5, messages=USER, tools=[TOOL]
            )  # type: ignore[list-item]
    finally:
        gateway.stop()
    assert "x-tools-dropped" not in raw.headers
    assert "tools dropped" not in _cli(tmp_path, "check", upstream)


def test_a_server_that_cannot_count_is_not_judged(tmp_path: Path) -> None:
    """Without a way to count (a generic server), nothing is claimed either way."""
    upstream = FakeUpstream([{"id": "m", "object": "model", "owned_by": "some-server"}]).start()
    upstream.template_drops_tools = True
    try:
        assert "tools dropped" not in _cli(tmp_path, "check", upstream)
        assert upstream.tokenize_requests == []
    finally:
        upstream.stop()

"""The local demo's model, SmolLM2, has a chat template without tools: llama-server says so
in `GET /props`, and dragoman passes it on (tests/integration/test_tools_dropped.py has the
counting fallback and every place it is said)."""

from __future__ import annotations

import logging

import anthropic
import httpx
import pytest

from dragoman.core.config_load import from_dict
from dragoman.notices.tools_dropped import NOTE
from dragoman_local.localmodel import DEFAULT_LOCAL_MODEL, LlamaServer
from tests.support.servers import GatewayServer, wait_tool_support

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.mark.parametrize("protocol", ["openai", "anthropic"], ids=["translate", "passthrough"])
def test_llama_server_reports_smollm2s_template_has_no_tools(llama_server: LlamaServer, caplog, protocol: str) -> None:
    """On either path: llama-server's own /v1/messages renders with the same template."""
    caps = httpx.get(llama_server.base_url + "/props", timeout=10).json()["chat_template_caps"]
    assert caps["supports_tools"] is False  # what dragoman reads
    url = llama_server.base_url + ("/v1" if protocol == "openai" else "")
    config = from_dict({"upstreams": {"local": {"url": url, "protocol": protocol}},
                        "server": {"default_model": DEFAULT_LOCAL_MODEL}})  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="dragoman"):
        gateway = GatewayServer(config).start()
        try:
            wait_tool_support(gateway, "local")
            with anthropic.Anthropic(base_url=gateway.url, api_key="any", max_retries=0, timeout=120,
                                     default_headers={"user-agent": "claude-cli/2.1.332 (external, cli)"}) as client:  # fmt: skip
                raw = client.messages.with_raw_response.create(
                    model="claude-sonnet-4-6",
                    max_tokens=8,
                    messages=USER,
                    tools=[TOOL],  # type: ignore[arg-type,list-item]
                )
        finally:
            gateway.stop()
    assert raw.headers.get("x-tools-dropped") == "chat-template"
    assert raw.parse().content[-1].text == NOTE  # type: ignore[union-attr]  # what Claude Code shows
    assert [r for r in caplog.records if f"{DEFAULT_LOCAL_MODEL!r} renders no tools" in r.getMessage()]

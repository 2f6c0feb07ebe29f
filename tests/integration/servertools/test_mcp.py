"""The MCP connector: a request's `mcp_servers` served by the gateway as an MCP client, against a
real MCP server (the `mcp` SDK) on loopback, over Streamable HTTP and SSE, with the official
Anthropic SDK's beta client."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from dragoman.core.config_load import from_dict
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream, tool_call_stream
from tests.support.mcp_server import DEFINITIONS, McpTestServer
from tests.support.servers import GatewayServer

TOKEN = "mcp-secret-token-1234"
BETA = "mcp-client-2025-11-20"


@pytest.fixture
def client(upstream: FakeUpstream) -> Iterator[Callable[..., anthropic.Anthropic]]:
    started: list[GatewayServer] = []

    def start(allow_private: bool = True) -> anthropic.Anthropic:
        data: dict[str, Any] = {"server": {"fetch_allow_private": allow_private}, "mcp": {"timeout": 10},
                                "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}}  # fmt: skip
        server = GatewayServer(from_dict(data)).start()
        started.append(server)
        return anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)

    yield start
    for server in started:
        server.stop()


def _ask(client: anthropic.Anthropic, mcp: McpTestServer, stream: bool = False, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "model": "test-model", "max_tokens": 99, "betas": [BETA],
        "messages": [{"role": "user", "content": "What does dragoman mean?"}],
        "mcp_servers": [{"type": "url", "url": mcp.url, "name": "dictionary", "authorization_token": TOKEN}],
        "tools": [{"type": "mcp_toolset", "mcp_server_name": "dictionary"}], **kw,
    }  # fmt: skip
    if stream:
        with client.beta.messages.stream(**args) as events:
            return events.get_final_message()
    return client.beta.messages.create(**args)


@pytest.mark.parametrize("transport,stream", [("streamable-http", False), ("streamable-http", True), ("sse", False)])
def test_the_model_calls_an_mcp_tool_and_answers_with_its_output(client, upstream, transport, stream, caplog):
    caplog.set_level(logging.DEBUG)
    mcp = McpTestServer(transport, token=TOKEN).start()
    try:
        upstream.queue(Reply(chunks=tool_call_stream("define", {"word": "dragoman"})),
                       Reply(chunks=text_stream("It means ", "an interpreter.")))  # fmt: skip
        message = _ask(client(), mcp, stream=stream)
    finally:
        mcp.stop()
    use, result, text = message.content
    assert use.type == "mcp_tool_use" and use.id.startswith("mcptoolu_")
    assert (use.name, use.server_name, use.input) == ("define", "dictionary", {"word": "dragoman"})
    assert result.type == "mcp_tool_result" and result.tool_use_id == use.id and result.is_error is False
    assert [b.text for b in result.content] == [DEFINITIONS["dragoman"]]
    assert text.text == "It means an interpreter."
    offered = upstream.requests[0]["tools"]
    assert [t["function"]["name"] for t in offered] == ["define"]
    assert offered[0]["function"]["parameters"]["properties"]["word"]["type"] == "string"
    assert DEFINITIONS["dragoman"] in [m["content"] for m in upstream.requests[1]["messages"] if m["role"] == "tool"][0]
    assert set(mcp.authorizations) == {f"Bearer {TOKEN}"}
    # nothing the gateway or its MCP client logged holds the token (the test's own SDK client logs its request)
    assert [r.name for r in caplog.records if TOKEN in r.getMessage() and not r.name.startswith("anthropic")] == []


def test_disabled_tools_are_not_offered_and_the_older_beta_shape_works(client, upstream):
    mcp = McpTestServer().start()
    try:
        gateway = client()
        upstream.queue(Reply(body=completion("No tools.")))  # no tool to run: the ordinary path
        _ask(gateway, mcp, tools=[{"type": "mcp_toolset", "mcp_server_name": "dictionary",
                                   "default_config": {"enabled": False}}])  # fmt: skip
        assert "tools" not in upstream.requests[-1]
        upstream.queue(Reply(chunks=text_stream("One tool.")))
        old = {"type": "url", "url": mcp.url, "name": "dictionary", "tool_configuration": {"allowed_tools": ["define"]}}
        gateway.beta.messages.create(model="test-model", max_tokens=9, betas=["mcp-client-2025-04-04"],
                                     messages=[{"role": "user", "content": "hi"}], mcp_servers=[old])  # fmt: skip
        assert [t["function"]["name"] for t in upstream.requests[-1]["tools"]] == ["define"]
    finally:
        mcp.stop()


def test_an_mcp_server_on_a_private_address_is_refused_unless_allowed(client, upstream):
    mcp = McpTestServer().start()
    try:
        with pytest.raises(anthropic.BadRequestError, match="private, loopback or reserved"):
            _ask(client(allow_private=False), mcp)
    finally:
        mcp.stop()
    assert mcp.authorizations == [] and upstream.requests == []


def test_a_toolset_naming_no_server_or_an_unreachable_server_is_a_400(client, upstream, dead_port):
    gateway = client()
    down = McpTestServer()  # not started: nothing listens on its port
    with pytest.raises(anthropic.BadRequestError, match=r"tools\.0\.mcp_server_name"):
        _ask(gateway, down, tools=[{"type": "mcp_toolset", "mcp_server_name": "other"}])
    down.port = dead_port
    with pytest.raises(anthropic.BadRequestError, match=r"mcp_servers\.0: could not list the tools") as refused:
        _ask(gateway, down)
    assert TOKEN not in refused.value.message and upstream.requests == []


def test_a_token_count_leaves_mcp_servers_alone(client, upstream):
    counted = client().beta.messages.count_tokens(
        model="test-model", betas=[BETA], messages=[{"role": "user", "content": "hi"}],
        mcp_servers=[{"type": "url", "url": "http://127.0.0.1:9/mcp", "name": "dictionary"}],
        tools=[{"type": "mcp_toolset", "mcp_server_name": "dictionary"}],
    )  # fmt: skip
    assert counted.input_tokens > 0

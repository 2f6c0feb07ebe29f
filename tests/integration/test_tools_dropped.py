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
import pytest

from dragoman.notices.tools_dropped import MARK, NOTE
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
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


# -- the note in the reply (dragoman.notices.tools_dropped) ----------------------------

CLAUDE_CODE_AGENT = {"user-agent": "claude-cli/2.1.332 (external, cli)"}


def _answer(body: dict) -> Reply:
    return (
        Reply(chunks=text_stream("It says ", "hello."))
        if body.get("stream")
        else Reply(body=completion("It says hello."))
    )


def _noting_gateway(upstream: FakeUpstream, **server: str) -> GatewayServer:
    upstream.template_drops_tools = True
    upstream.responder = _answer
    gateway = GatewayServer(make_config(upstream.url, server=server)).start()
    wait_tool_support(gateway, "default")
    return gateway


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_claude_codes_first_reply_says_the_tools_were_dropped_and_the_model_never_reads_it(
    upstream: FakeUpstream, stream: bool
) -> None:
    gateway = _noting_gateway(upstream)
    try:
        with anthropic.Anthropic(
            base_url=gateway.url, api_key="k", max_retries=0, default_headers=CLAUDE_CODE_AGENT
        ) as client:

            def ask(messages: list) -> anthropic.types.Message:
                if stream:
                    with client.messages.stream(
                        model="test-model", max_tokens=50, messages=messages, tools=[TOOL]
                    ) as s:  # type: ignore[list-item]
                        return s.get_final_message()
                return client.messages.create(model="test-model", max_tokens=50, messages=messages, tools=[TOOL])  # type: ignore[list-item]

            first = ask(USER)
            history = [*USER, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                       {"role": "user", "content": "And in London?"}]  # fmt: skip
            second = ask(history)
    finally:
        gateway.stop()
    assert [b.type for b in first.content] == ["text", "text"]
    assert first.content[0].text == "It says hello." and first.content[1].text == NOTE  # type: ignore[union-attr]
    assert [b.text for b in second.content] == ["It says hello."]  # type: ignore[union-attr]  # once per conversation
    sent = json.dumps(upstream.requests)
    assert MARK not in sent  # the model never saw it, though the client sent it back
    assert upstream.requests[-1]["messages"][-2] == {"role": "assistant", "content": "It says hello."}


@pytest.mark.parametrize(
    ("notice", "agent", "noted"),
    [
        ("claude-code", "Anthropic/Python", False),
        ("all", "Anthropic/Python", True),
        ("off", "claude-cli/2.1.332", False),
    ],
)
def test_the_note_goes_to_the_clients_configured(upstream: FakeUpstream, notice: str, agent: str, noted: bool) -> None:
    gateway = _noting_gateway(upstream, tools_dropped_notice=notice)
    try:
        with anthropic.Anthropic(
            base_url=gateway.url, api_key="k", max_retries=0, default_headers={"user-agent": agent}
        ) as client:
            reply = client.messages.create(model="test-model", max_tokens=50, messages=USER, tools=[TOOL])  # type: ignore[list-item]
            plain = client.messages.create(model="test-model", max_tokens=50, messages=USER)  # type: ignore[arg-type]
    finally:
        gateway.stop()
    assert (reply.content[-1].text == NOTE) is noted  # type: ignore[union-attr]
    assert len(reply.content) == 1 + noted and len(plain.content) == 1  # no tools, nothing dropped: no note

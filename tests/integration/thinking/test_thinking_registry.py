"""Extended thinking across turns and models: reasoning replayed to the upstream,
the models.dev registry fetched at run time, `dragoman models`, and Anthropic's checks of
thinking.budget_tokens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx
import pytest

from dragoman.assembly.gateway import Timings
from tests.support.fakes import completion
from tests.support.thinking_scaffold import (
    ANSWER,
    REASONING,
    THINK,
    TOOL_STREAMS,
    USER,
    WEATHER_TOOL,
    _error,
    _stream,
    vllm_new,
    vllm_old,
)
from tests.support.waiting import eventually

REPLAY_FIELD = {
    "generic": "reasoning_content",
    "llamacpp": "reasoning_content",
    "sglang": "reasoning_content",
    "vllm": "reasoning",
    "ollama": "reasoning",
}


OTHER_FIELD = {"reasoning": "reasoning_content", "reasoning_content": "reasoning"}


def _assistant_messages(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] == "assistant"]


@pytest.mark.parametrize("flavor", list(REPLAY_FIELD))
def test_replay_sends_echoed_thinking_back_in_the_profiles_field(gw, fake, flavor):
    client = gw(flavor)
    field = REPLAY_FIELD[flavor]
    fake.json_reply(completion(ANSWER))
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "First thought.", "signature": "dragoman-unsigned"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Hello!"},
        ]},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Plain answer, no thinking."}]},
        {"role": "user", "content": "Thanks"},
    ]  # fmt: skip
    client.messages.create(
        model="thinker-replay", max_tokens=8000, messages=messages, thinking=THINK, tools=[WEATHER_TOOL]
    )

    first, with_call, plain_turn = _assistant_messages(fake.requests[-1])
    assert first[field] == "First thought." and first["content"] == "Hello!"
    # A turn with tool calls always carries the field, empty when nothing was thought.
    assert with_call[field] == "" and with_call["tool_calls"][0]["id"] == "call_1"
    # A turn without thinking or tool calls does not.
    assert field not in plain_turn
    for message in (first, with_call, plain_turn):
        assert OTHER_FIELD[field] not in message
    assert "opaque" not in json.dumps(fake.requests[-1])  # redacted thinking cannot be replayed


@pytest.mark.parametrize("flavor", ["generic", "vllm"])
def test_without_replay_echoed_thinking_is_dropped(gw, fake, flavor):
    client = gw(flavor)
    fake.json_reply(completion(ANSWER))
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Secret thought.", "signature": "dragoman-unsigned"},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
    ]  # fmt: skip
    client.messages.create(model="thinker", max_tokens=8000, messages=messages, thinking=THINK, tools=[WEATHER_TOOL])
    sent = fake.requests[-1]
    (assistant,) = _assistant_messages(sent)
    assert "reasoning" not in assistant and "reasoning_content" not in assistant
    assert "Secret thought." not in json.dumps(sent)


@pytest.mark.parametrize(("flavor", "variant"), [("generic", "reasoning_content"), ("ollama", "ollama")])
def test_tool_loop_with_replay_round_trips_the_sdks_own_blocks(gw, fake, flavor, variant):
    """DeepSeek-style interleaving: the SDK's message content is echoed back as is, and
    the reasoning reaches the backend in its field on the tool-call turn."""
    client = gw(flavor)
    field = REPLAY_FIELD[flavor]
    fake.stream_reply(TOOL_STREAMS[variant]())
    fake.stream_reply(vllm_old() if field == "reasoning_content" else vllm_new())

    _, first = _stream(client, model="thinker-replay", thinking=THINK, tools=[WEATHER_TOOL])
    assert first.stop_reason == "tool_use"
    tool = first.content[1]
    history = [
        *USER,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "sunny"}]},
    ]
    _, second = _stream(client, model="thinker-replay", thinking=THINK, tools=[WEATHER_TOOL], messages=history)

    (assistant,) = _assistant_messages(fake.requests[-1])
    assert assistant[field] == "I need the weather. Calling the tool."
    assert assistant["tool_calls"][0]["id"] == tool.id
    assert [m["role"] for m in fake.requests[-1]["messages"]] == ["user", "assistant", "tool"]
    assert [b.type for b in second.content] == ["thinking", "text"]


class _RegistryServer:
    """models.dev on loopback (stdlib HTTP server): every GET gets `body`."""

    def __init__(self, body: dict) -> None:
        payload = json.dumps(body).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api.json"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_a_model_the_fetched_registry_lists_as_reasoning_gets_reasoning_controls(
    make_gateway, upstream, monkeypatch, tmp_path
):
    """No cache yet: the gateway fetches the registry after startup, and a discovered
    model it lists as reasoning (a name no family rule knows) is then treated as one."""
    registry = _RegistryServer({"acme": {"models": {"acme/house-model": {"reasoning": True}}}})
    try:
        monkeypatch.setenv("DRAGOMAN_CACHE_DIR", str(tmp_path / "fresh"))
        upstream.models = [{"id": "house-model", "object": "model", "owned_by": "vllm"}]
        gateway = make_gateway(upstream={"flavor": "vllm"}, timings=Timings(registry_url=registry.url))
        gateway.wait_discovered()
        router = gateway.app.state.gateway.router
        eventually(lambda: router.registry.lookup("house-model") is True, "the fetched registry is read")
        assert json.loads((tmp_path / "fresh" / "models.dev.json").read_text())["acme"]
    finally:
        registry.close()

    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    upstream.json_reply(completion(ANSWER, reasoning=REASONING))
    raw = client.messages.with_raw_response.create(model="house-model", max_tokens=8000, messages=USER, thinking=THINK)
    message = raw.parse()
    assert upstream.requests[-1]["reasoning_effort"] == "medium"
    assert raw.headers.get("x-reasoning-effort") == "medium"
    assert [b.type for b in message.content] == ["thinking", "text"]


def test_an_unanswering_registry_does_not_slow_requests(make_gateway, upstream, monkeypatch, tmp_path):
    """The registry fetch hangs (a socket that accepts and never answers): requests
    are served at once, by the name rules."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        monkeypatch.setenv("DRAGOMAN_CACHE_DIR", str(tmp_path / "empty"))
        hanging = Timings(registry_url=f"http://127.0.0.1:{silent.getsockname()[1]}/api.json",
                          registry_timeout=60.0)  # a request that waited for it would fail  # fmt: skip
        upstream.models = [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]
        gateway = make_gateway(upstream={"flavor": "vllm"}, timings=hanging)
        gateway.wait_discovered()
        client = anthropic.Anthropic(
            base_url=gateway.url, api_key="k", max_retries=0, timeout=10.0
        )  # the fetch gives up only at 60 s
        upstream.json_reply(completion(ANSWER))
        client.messages.create(
            model="Qwen/Qwen3-8B", max_tokens=2000, messages=USER, thinking={"type": "enabled", "budget_tokens": 1024}
        )
        assert upstream.requests[-1]["reasoning_effort"] == "low"  # Qwen3: reasoning by name
        assert not (tmp_path / "empty" / "models.dev.json").exists()
    finally:
        silent.close()


def _models_cli(tmp_path: Path, *args: str, registry: dict | None = None) -> dict[str, str]:
    """Run `dragoman models ARGS` with a fresh, private registry cache (so nothing is
    fetched); {model name: its line}."""
    cache = tmp_path / "cli-cache"
    cache.mkdir(exist_ok=True)
    (cache / "models.dev.json").write_text(json.dumps(registry or {}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_")}
    env["DRAGOMAN_CACHE_DIR"] = str(cache)
    result = subprocess.run(
        [sys.executable, "-m", "dragoman", "models", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return {line.split("\t", 1)[0]: line for line in lines}


def test_models_command_says_which_upstream_models_reason_and_why(tmp_path, upstream):
    upstream.models = [
        {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"},
        {"id": "llama-3.1-8b", "object": "model", "owned_by": "vllm"},
        {"id": "house-model", "object": "model", "owned_by": "vllm"},
    ]
    registry = {"acme": {"models": {"house-model": {"reasoning": True}}}}
    lines = _models_cli(tmp_path, "--upstream", upstream.url, registry=registry)

    assert set(lines) == {"Qwen/Qwen3-8B", "llama-3.1-8b", "house-model"}
    assert "\treasoning (name matches a known reasoning family)" in lines["Qwen/Qwen3-8B"]
    assert "not reasoning (unknown model: not reasoning)" in lines["llama-3.1-8b"]
    assert "\treasoning (listed in the models.dev registry)" in lines["house-model"]
    assert "upstream=default" in lines["Qwen/Qwen3-8B"] and "model=Qwen/Qwen3-8B" in lines["Qwen/Qwen3-8B"]


def test_models_command_says_when_the_registry_was_out_of_reach(tmp_path, upstream):
    """Offline (here: the proxy every fetch goes through refuses connections), `models` says where
    its reasoning decisions came from instead; the lines themselves are as before."""
    upstream.models = [{"id": "llama-3.1-8b", "object": "model", "owned_by": "vllm"}]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_")}
        env |= {"DRAGOMAN_CACHE_DIR": str(tmp_path / "no-cache"), "HTTPS_PROXY": proxy, "NO_PROXY": "127.0.0.1"}
        result = subprocess.run([sys.executable, "-m", "dragoman", "models", "--upstream", upstream.url],
                                capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("llama-3.1-8b\t"), result.stdout
    assert "the models.dev registry could not be fetched (offline?)" in result.stderr, result.stderr
    assert "configuration and model names only" in result.stderr


def test_models_command_reports_configuration_decisions(tmp_path, upstream):
    upstream.models = [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]
    config = tmp_path / "dragoman.toml"
    config.write_text(
        f"""
[upstreams.configured]
url = "{upstream.url}"
[upstreams.discovered]
url = "{upstream.url}"

[[models]]
name = "my-llama"
upstream = "configured"
upstream_model = "llama-3.1-8b"
reasoning = true

[[models]]
name = "quiet-qwen"
upstream = "configured"
upstream_model = "Qwen/Qwen3-8B"
reasoning = false
"""
    )
    lines = _models_cli(tmp_path, "--config", str(config))
    assert "\treasoning (set in the configuration)" in lines["my-llama"]
    assert "model=llama-3.1-8b" in lines["my-llama"]
    assert "not reasoning (set in the configuration)" in lines["quiet-qwen"]
    # The upstream without configured models serves (and reports) what it lists.
    assert "upstream=discovered" in lines["Qwen/Qwen3-8B"]
    assert "\treasoning (name matches a known reasoning family)" in lines["Qwen/Qwen3-8B"]


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "json"])
def test_omitted_thinking_carries_its_reasoning_back_to_a_replay_model(gw, fake, streamed):
    """Claude Code asks for display "omitted" in `-p` runs and echoes the blocks back: a model
    that needs its reasoning replayed still gets it, carried in the block's signature."""
    client = gw("generic")
    omitted = {**THINK, "display": "omitted"}
    if streamed:
        fake.stream_reply(TOOL_STREAMS["reasoning_content"]())
        _, first = _stream(client, model="thinker-replay", thinking=omitted, tools=[WEATHER_TOOL])
    else:
        tool_call = {
            "id": "call_w",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        fake.json_reply(
            completion(
                None,
                finish="tool_calls",
                tool_calls=[tool_call],
                reasoning_content="I need the weather. Calling the tool.",
            )
        )
        first = client.messages.create(
            model="thinker-replay", max_tokens=8000, messages=USER, thinking=omitted, tools=[WEATHER_TOOL]
        )
    thinking, tool = first.content[0], first.content[1]
    assert thinking.type == "thinking" and thinking.thinking == ""  # not shown, as asked
    fake.stream_reply(vllm_old())
    history = [*USER, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "sunny"}]}]  # fmt: skip
    _stream(client, model="thinker-replay", thinking=omitted, tools=[WEATHER_TOOL], messages=history)
    (assistant,) = _assistant_messages(fake.requests[-1])
    assert assistant["reasoning_content"] == "I need the weather. Calling the tool."


INTERLEAVED = "interleaved-thinking-2025-05-14"


REFUSED_BUDGETS = pytest.mark.parametrize(
    ("max_tokens", "thinking", "extra", "message"),
    [
        (8000, {"type": "enabled", "budget_tokens": 1000}, {}, "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
        (4096, THINK, {}, "`max_tokens` must be greater than `thinking.budget_tokens`."),
        (8000, THINK, {"tools": [WEATHER_TOOL], "tool_choice": {"type": "any"}}, "Thinking may not be enabled when tool_choice forces tool use."),
    ],
    ids=["below-1024", "not-below-max-tokens", "forced-tool-use"],
)  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@REFUSED_BUDGETS
def test_a_thinking_budget_anthropic_refuses_is_a_400_before_the_upstream(
    gw, fake, stream, max_tokens, thinking, extra, message
):
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            _stream(client, model="thinker", max_tokens=max_tokens, thinking=thinking, **extra)
        else:
            client.messages.create(model="thinker", max_tokens=max_tokens, messages=USER, thinking=thinking, **extra)
    assert caught.value.status_code == 400
    assert _error(caught).startswith(message)
    assert fake.requests == []


@pytest.mark.parametrize("stream", [False, True])
@REFUSED_BUDGETS
def test_a_compaction_request_gets_the_same_thinking_checks(gw, fake, stream, max_tokens, thinking, extra, message):
    """The summary is asked for without thinking or tools, but the request as sent is checked
    as any other: Anthropic answers it the same 400."""
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.beta.messages.create(model="thinker", max_tokens=max_tokens, messages=USER, thinking=thinking,
                                    compaction={"type": "summarize"}, stream=stream, **extra)  # fmt: skip
    assert caught.value.status_code == 400
    assert _error(caught).startswith(message)
    assert fake.requests == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {
                "tools": [{"name": "read", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "write"},
            },
            "tool_choice.name: no tool named 'write' in tools",
        ),
        ({"tools": [{"name": "read", "input_schema": "not a schema"}]}, "tools.0.input_schema"),
    ],
)
def test_a_compaction_request_gets_every_check_of_an_ordinary_request(gw, fake, extra, message):
    """The summary's request has no tools, but the request as sent is checked as any other."""
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as ordinary:
        client.messages.create(model="thinker", max_tokens=2000, messages=USER, **extra)
    with pytest.raises(anthropic.BadRequestError) as compacting:
        client.beta.messages.create(
            model="thinker", max_tokens=2000, messages=USER, compaction={"type": "summarize"}, **extra
        )
    assert _error(ordinary).startswith(message)
    assert _error(compacting) == _error(ordinary)
    assert fake.requests == []


def test_a_compaction_request_with_the_interleaved_beta_may_pass_max_tokens(gw, fake):
    client = gw()
    fake.json_reply(completion("They said hello."))
    compacted = client.beta.messages.create(
        model="thinker", max_tokens=2000, messages=USER, thinking={"type": "enabled", "budget_tokens": 16000},
        compaction={"type": "summarize"}, betas=[INTERLEAVED],
    )  # fmt: skip
    assert compacted.stop_reason == "compaction" and compacted.content[0].content == "They said hello."
    assert len(fake.requests) == 1


def test_the_interleaved_thinking_beta_lets_the_budget_pass_max_tokens(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER))
    message = client.beta.messages.create(
        model="thinker", max_tokens=2000, messages=USER, thinking={"type": "enabled", "budget_tokens": 16000},
        betas=["claude-code-20250219", INTERLEAVED],  # sent comma-separated
    )  # fmt: skip
    assert message.content[-1].text == ANSWER
    assert fake.requests[-1]["max_tokens"] == 2000  # still the client's cap

    # The SDK joins betas into one header; clients may also repeat the header.
    body = {
        "model": "thinker",
        "max_tokens": 2000,
        "messages": USER,
        "thinking": {"type": "enabled", "budget_tokens": 16000},
    }
    base = str(client.base_url).rstrip("/")
    fake.json_reply(completion(ANSWER))
    headers = [("x-api-key", "test-key"), ("anthropic-version", "2023-06-01"), ("anthropic-beta", "claude-code-20250219"),
               ("anthropic-beta", INTERLEAVED)]  # fmt: skip
    repeated = httpx.post(f"{base}/v1/messages", json=body, headers=headers, timeout=10)
    assert repeated.status_code == 200, repeated.text
    fake.json_reply(completion(ANSWER))
    without = httpx.post(f"{base}/v1/messages", json=body, headers=headers[:3], timeout=10)
    assert without.status_code == 400 and without.json()["error"]["message"].startswith("`max_tokens` must be greater")


def test_what_claude_code_sends_for_thinking_still_passes(gw, fake):
    """Claude Code's legacy models: budget max_tokens - 1 (or MAX_THINKING_TOKENS), with the
    interleaved beta; its newer ones: adaptive; with thinking off: disabled."""
    client = gw()
    betas = ["claude-code-20250219", INTERLEAVED, "context-management-2025-06-27"]
    for thinking in ({"type": "enabled", "budget_tokens": 31999}, {"type": "enabled", "budget_tokens": 8000},
                     {"type": "adaptive"}, {"type": "adaptive", "display": "omitted"}, {"type": "disabled"}):  # fmt: skip
        fake.stream_reply(vllm_new())
        with client.beta.messages.stream(
            model="thinker", max_tokens=32000, messages=USER, thinking=thinking, betas=betas
        ) as stream:
            final = stream.get_final_message()
        assert final.content[-1].text == ANSWER, thinking
    assert len(fake.requests) == 5

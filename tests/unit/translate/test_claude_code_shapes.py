"""Claude Code's request shapes through the translator, on synthetic fixtures.

tests/fixtures/claude_code/ holds request bodies with the structure Claude Code 2.1.332
sends (see the README there; the texts are made up): a billing line as the first
system block, a `role: "system"` message inside `messages`, draft-2020-12 tool schemas,
adaptive thinking, per-message `output_config`, `cache_control` on blocks, a deferred
tool, an echoed thinking block with an empty signature, and the session-title request
with structured output and `tools: []`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from dragoman.core.capabilities import ModelCaps, ReasoningCaps
from dragoman.core.profiles import PROFILES
from dragoman.protocol import anthropic as a
from dragoman.translate.request import BILLING_PREFIX, to_chat_request
from tests.support.helpers import OPTIONS, wire

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "claude_code"
MAIN_LOOP = ["main_loop_turn1", "main_loop_turn2", "bare_turn2"]
ALL = [*MAIN_LOOP, "session_title"]
PROFILE_NAMES = ["vllm", "llamacpp"]
CAPS = {"plain": ModelCaps(), "reasoning": ModelCaps(reasoning=ReasoningCaps(reasoning=True))}
# Fields and block keys only Anthropic understands; none may reach an OpenAI-compatible backend.
ANTHROPIC_ONLY = (
    "cache_control",
    "defer_loading",
    "context_management",
    "output_config",
    "signature",
    "thinking",
    "metadata",
    "user_id",
)


@cache
def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def translate(name: str, profile: str, caps: str = "plain") -> dict[str, Any]:
    """The JSON body the backend gets for a fixture."""
    body = fixture(name)
    request = a.MESSAGES_REQUEST.decode(json.dumps(body).encode())
    translated = to_chat_request(
        request, upstream_model="served", profile=PROFILES[profile], caps=CAPS[caps], stream=body["stream"],
        options=OPTIONS,
    )  # fmt: skip
    return wire(translated.chat)


def blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def texts(message: dict[str, Any]) -> list[str]:
    return [b["text"] for b in blocks(message) if b["type"] == "text"]


def upstream_text(chat: dict[str, Any]) -> str:
    """Every piece of text the backend sees in the messages."""
    out = []
    for message in chat["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif content:
            out.extend(p.get("text", "") for p in content)
    return "\n".join(out)


def tool_uses(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for m in body["messages"] if m["role"] == "assistant" for b in blocks(m) if b["type"] == "tool_use"]


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for m in body["messages"] if m["role"] == "user" for b in blocks(m) if b["type"] == "tool_result"]


def keywords(schema: Any) -> set[str]:
    """Every key used anywhere in a JSON schema (property names included; harmless here)."""
    if isinstance(schema, dict):
        return set(schema) | {k for v in schema.values() for k in keywords(v)}
    if isinstance(schema, list):
        return {k for v in schema for k in keywords(v)}
    return set()


params = pytest.mark.parametrize("profile", PROFILE_NAMES)


# -- the fixtures themselves have the shapes the tests rely on ------------------------


def test_fixtures_have_claude_codes_shapes() -> None:
    for name in ALL:
        body = fixture(name)
        assert body["system"][0]["text"].startswith(BILLING_PREFIX) and "cc_version=" in body["system"][0]["text"], name
        assert len(body["system"]) == 3
        assert isinstance(json.loads(body["metadata"]["user_id"]), dict)
    for name in MAIN_LOOP:
        body = fixture(name)
        assert [m["role"] for m in body["messages"]][:2] == ["user", "system"], name
        assert body["thinking"]["type"] == "adaptive" and body["output_config"] == {"effort": "medium"}
        assert body["context_management"]["edits"]
        assert all(s.get("cache_control") == {"type": "ephemeral"} for s in body["system"][1:])
        assert blocks(body["messages"][-1])[-1].get("cache_control") == {"type": "ephemeral"}
    turn2 = fixture("main_loop_turn2")
    assert [b["type"] for b in blocks(turn2["messages"][2])] == ["thinking", "tool_use"]
    assert blocks(turn2["messages"][2])[0]["signature"] == ""
    assert tool_results(turn2)[0].get("cache_control") == {"type": "ephemeral"}
    used = keywords([t["input_schema"] for t in fixture("main_loop_turn1")["tools"]])
    assert {
        "$schema",
        "anyOf",
        "additionalProperties",
        "propertyNames",
        "const",
        "enum",
        "exclusiveMinimum",
        "format",
        "pattern",
    } <= used
    assert fixture("session_title")["tools"] == [] and "format" in fixture("session_title")["output_config"]


# -- translation -------------------------------------------------------------------


@params
@pytest.mark.parametrize("name", ALL)
def test_billing_line_is_dropped(name: str, profile: str) -> None:
    chat = translate(name, profile)
    assert BILLING_PREFIX not in upstream_text(chat)
    assert "cc_version=" not in upstream_text(chat)


def expected_system_prompt(body: dict[str, Any]) -> str:
    """System blocks after the billing line, then the system-role messages sent before
    the first assistant turn, without empty parts."""
    parts = [s["text"] for s in body["system"][1:]]
    for message in body["messages"]:
        if message["role"] == "assistant":
            break
        if message["role"] == "system":
            parts += texts(message)
    return "\n\n".join(p for p in parts if p)


@params
@pytest.mark.parametrize("name", ["main_loop_turn1", "main_loop_turn2", "session_title"])
def test_system_role_message_is_folded_into_the_system_prompt(name: str, profile: str) -> None:
    chat = translate(name, profile)
    assert [m["role"] for m in chat["messages"]].count("system") == 1
    assert chat["messages"][0] == {"role": "system", "content": expected_system_prompt(fixture(name))}
    assert "Primary working directory" not in upstream_text({"messages": chat["messages"][1:]})


@params
def test_an_empty_system_role_message_adds_nothing_to_the_system_prompt(profile: str) -> None:
    # claude --bare sends {"role": "system", "content": [], "output_config": {...}}
    chat = translate("bare_turn2", profile)
    assert [m["role"] for m in chat["messages"]].count("system") == 1
    assert chat["messages"][0] == {"role": "system", "content": expected_system_prompt(fixture("bare_turn2"))}


@params
@pytest.mark.parametrize("name", MAIN_LOOP)
def test_every_tool_survives_with_its_schema_intact(name: str, profile: str) -> None:
    """Every tool the model may see now goes upstream intact; deferred tools
    (`defer_loading: true`) stay hidden until a tool search loads them, as on Anthropic."""
    body = fixture(name)
    chat = translate(name, profile)
    sent = {t["function"]["name"]: t["function"] for t in chat["tools"]}
    visible = [t for t in body["tools"] if not t.get("defer_loading")]
    assert list(sent) == [t["name"] for t in visible]
    for tool in visible:
        assert sent[tool["name"]]["parameters"] == tool["input_schema"], tool["name"]
        assert sent[tool["name"]]["description"] == tool["description"]
    assert all(t["type"] == "function" for t in chat["tools"])


@params
@pytest.mark.parametrize("caps", list(CAPS))
@pytest.mark.parametrize("name", ["main_loop_turn2", "bare_turn2"])
def test_echoed_thinking_blocks_are_dropped(name: str, profile: str, caps: str) -> None:
    body = fixture(name)
    chat = translate(name, profile, caps)
    thoughts = [
        b["thinking"]
        for m in body["messages"]
        if m["role"] == "assistant"
        for b in blocks(m)
        if b["type"] == "thinking"
    ]
    assert thoughts
    for message in chat["messages"]:
        if message["role"] == "assistant":
            assert not {"reasoning", "reasoning_content"} & message.keys(), message
            assert message.get("content") in (None, "")
    assert not [t for t in thoughts if t and t in upstream_text(chat)]


@params
@pytest.mark.parametrize("name", ["main_loop_turn2", "bare_turn2"])
def test_tool_use_ids_and_result_pairing_are_preserved(name: str, profile: str) -> None:
    body = fixture(name)
    chat = translate(name, profile)
    uses, results = tool_uses(body), tool_results(body)
    roles = [m["role"] for m in chat["messages"]]
    assistant_at = roles.index("assistant")
    assistant = chat["messages"][assistant_at]
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]
    ] == [(u["id"], u["name"], u["input"]) for u in uses]
    answers = chat["messages"][assistant_at + 1 : assistant_at + 1 + len(results)]
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in answers] == [
        ("tool", r["tool_use_id"], r["content"]) for r in results
    ]
    assert roles[-1] == "tool"  # nothing after the tool results: the cache_control-only block adds no user turn


@params
def test_session_title_output_format_becomes_json_schema_response_format(profile: str) -> None:
    body = fixture("session_title")
    chat = translate("session_title", profile)
    assert chat["response_format"]["type"] == "json_schema"
    assert chat["response_format"]["json_schema"]["schema"] == body["output_config"]["format"]["schema"]
    assert chat["temperature"] == 1
    assert chat["max_tokens"] == body["max_tokens"]


@params
def test_empty_tools_list_sends_no_tools(profile: str) -> None:
    chat = translate("session_title", profile)
    assert "tools" not in chat and "tool_choice" not in chat and "parallel_tool_calls" not in chat


@params
@pytest.mark.parametrize("name", ALL)
def test_anthropic_only_fields_do_not_reach_the_backend(name: str, profile: str) -> None:
    chat = translate(name, profile, "reasoning")
    encoded = json.dumps(chat)
    assert [field for field in ANTHROPIC_ONLY if f'"{field}"' in encoded] == []
    assert set(chat) <= {"model", "messages", "max_tokens", "stream", "stream_options", "temperature", "tools", "tool_choice",
                         "response_format", "reasoning_effort", "chat_template_kwargs"}  # fmt: skip


@params
def test_adaptive_thinking_with_effort_asks_a_reasoning_model_for_that_effort(profile: str) -> None:
    assert translate("main_loop_turn1", profile, "reasoning").get("reasoning_effort") == "medium"
    assert "reasoning_effort" not in translate("main_loop_turn1", profile, "plain")


@params
def test_tool_search_result_with_a_tool_reference_translates(profile: str) -> None:
    """After ToolSearch, Claude Code answers with a `tool_reference` block naming the
    deferred tool it loaded (here WebFetch, offered with `defer_loading: true`)."""
    body = fixture("tool_search_turn2")
    chat = translate("tool_search_turn2", profile)
    (search,) = tool_uses(body)
    tool_message = next(m for m in chat["messages"] if m["role"] == "tool")
    assert tool_message["tool_call_id"] == search["id"]
    assert "WebFetch" in tool_message["content"]
    assert "WebFetch" in [t["function"]["name"] for t in chat["tools"]]

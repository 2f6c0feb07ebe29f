"""Requests Anthropic refuses that the translation would otherwise hide (translate.checks):
a 400 naming the field, not a conversation the model sees differently."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dragoman.core.capabilities import ModelCaps
from dragoman.core.errors import InvalidRequest
from dragoman.core.profiles import PROFILES
from dragoman.protocol import anthropic
from dragoman.translate.request import to_chat_request
from tests.support.helpers import OPTIONS

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
IMAGE_URL = "https://example.com/cat.png"


def _translate(**fields: Any) -> dict[str, Any]:
    """The Chat Completions body the request becomes, as plain JSON."""
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **fields}
    request = msgspec.json.decode(msgspec.json.encode(body), type=anthropic.MessagesRequest)
    translated = to_chat_request(
        request, upstream_model="m", profile=PROFILES["generic"], caps=ModelCaps(vision=True), stream=False,
        options=OPTIONS,
    )  # fmt: skip
    decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(translated.chat))
    return decoded


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tools": [{**TOOL, "name": ""}]}, "tools.0.name: must not be empty"),
        ({"tools": [TOOL, TOOL]}, "tools.1.name: 'get_weather' is the name of an earlier tool"),
        ({"tool_choice": {"type": "any"}}, "tool_choice: type 'any' needs tools"),
        ({"tool_choice": {"type": "tool", "name": "get_weather"}}, "tool_choice: type 'tool' needs tools"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [RESULT]}]},
         "messages.1.content.0: tool_result blocks are not allowed in assistant turns"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
            {"type": "text", "text": "see"}, {"type": "image", "source": {"type": "url", "url": IMAGE_URL}}]}]},
         "messages.1.content.1: image blocks are not allowed in assistant turns"),
        ({"tools": [TOOL], "messages": [{"role": "user", "content": [USE]}]}, "messages.0.content.0: tool_use blocks are not allowed in user turns"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}]}]},
         "messages.0.content.0.source.url: must be an http or https URL"),
    ],
)  # fmt: skip
def test_refused_with_the_field_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _translate(**fields)
    assert caught.value.message.startswith(message)


FUNCTION = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


def test_auto_tool_choice_offers_the_tools() -> None:
    chat = _translate(tools=[TOOL], tool_choice={"type": "auto"})
    assert chat["tools"] == [FUNCTION]
    assert chat["tool_choice"] == "auto"


def test_tool_choice_none_without_tools_sends_neither() -> None:
    chat = _translate(tool_choice={"type": "none"})
    assert "tools" not in chat and "tool_choice" not in chat
    assert chat["messages"] == [{"role": "user", "content": "hi"}]


def test_a_tool_call_and_its_result_become_a_call_and_a_tool_message() -> None:
    chat = _translate(
        tools=[TOOL],
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": [USE]},
                  {"role": "user", "content": [RESULT]}],
    )  # fmt: skip
    call = {"type": "function", "id": "toolu_1", "function": {"name": "get_weather", "arguments": "{}"}}
    assert chat["messages"][1:] == [
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
    ]


def test_an_image_url_in_a_user_turn_becomes_an_image_url_part() -> None:
    chat = _translate(
        messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": IMAGE_URL}}]}]
    )
    assert chat["messages"] == [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE_URL}}]}]


# -- extended thinking: Anthropic's checks, with its words ------------------------------------

INTERLEAVED = frozenset({"claude-code-20250219", "interleaved-thinking-2025-05-14"})


def _think(max_tokens: int, thinking: dict[str, Any], betas: frozenset[str] = frozenset(), **fields: Any) -> None:
    body = {
        "model": "m",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": thinking,
        **fields,
    }
    request = msgspec.json.decode(msgspec.json.encode(body), type=anthropic.MessagesRequest)
    to_chat_request(
        request, upstream_model="m", profile=PROFILES["generic"], stream=False, betas=betas, options=OPTIONS
    )


def _enabled(budget: int) -> dict[str, Any]:
    return {"type": "enabled", "budget_tokens": budget}


@pytest.mark.parametrize(
    ("max_tokens", "thinking", "betas", "fields", "message"),
    [
        (32000, _enabled(1023), frozenset(), {}, "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
        (32000, _enabled(0), INTERLEAVED, {}, "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
        (2000, _enabled(2000), frozenset(), {}, "`max_tokens` must be greater than `thinking.budget_tokens`."),
        (2000, _enabled(4000), frozenset({"other-beta"}), {}, "`max_tokens` must be greater than `thinking.budget_tokens`."),
        (0, _enabled(1024), frozenset(), {}, "`max_tokens` must be greater than `thinking.budget_tokens`."),
        (32000, _enabled(4096), frozenset(), {"tools": [TOOL], "tool_choice": {"type": "any"}},
         "Thinking may not be enabled when tool_choice forces tool use."),
        (32000, _enabled(4096), INTERLEAVED, {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "get_weather"}},
         "Thinking may not be enabled when tool_choice forces tool use."),
    ],
    ids=["below-1024", "below-1024-interleaved", "budget-equals-max", "budget-above-max-other-beta",
         "max-tokens-0", "forced-any", "forced-tool"],
)  # fmt: skip
def test_thinking_budget_refused_as_anthropic_does(
    max_tokens: int, thinking: dict[str, Any], betas: frozenset[str], fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _think(max_tokens, thinking, betas, **fields)
    assert caught.value.message.startswith(message)
    assert caught.value.status == 400 and caught.value.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("max_tokens", "thinking", "betas", "fields"),
    [
        (32000, _enabled(31999), INTERLEAVED, {}),  # what Claude Code sends for its older models
        (32000, _enabled(31999), frozenset(), {}),
        (32000, _enabled(8000), INTERLEAVED, {}),  # ... with MAX_THINKING_TOKENS=8000
        (1025, _enabled(1024), frozenset(), {}),
        (2000, _enabled(64000), INTERLEAVED, {}),  # interleaved: the budget spans the turn's thinking, past max_tokens
        (10, {"type": "adaptive"}, frozenset(), {}),
        (10, {"type": "enabled"}, frozenset(), {}),  # no budget: medium effort (test_thinking.py)
        (10, {"type": "adaptive", "display": "omitted"}, INTERLEAVED, {}),
        (10, {"type": "disabled"}, frozenset(), {}),
        (32000, _enabled(4096), frozenset(), {"tools": [TOOL], "tool_choice": {"type": "auto"}}),
        (32000, _enabled(4096), frozenset(), {"tools": [TOOL], "tool_choice": {"type": "none"}}),
        (10, {"type": "disabled"}, frozenset(), {"tools": [TOOL], "tool_choice": {"type": "any"}}),
    ],
    ids=["claude-code-legacy", "claude-code-legacy-no-beta", "claude-code-max-thinking-tokens", "just-below-max",
         "interleaved-past-max", "adaptive", "enabled-no-budget", "adaptive-omitted", "disabled", "enabled-auto", "enabled-none", "disabled-forced"],
)  # fmt: skip
def test_thinking_anthropic_accepts_passes(
    max_tokens: int, thinking: dict[str, Any], betas: frozenset[str], fields: dict[str, Any]
) -> None:
    _think(max_tokens, thinking, betas, **fields)


def test_betas_are_read_comma_separated_and_from_repeated_headers() -> None:
    from starlette.datastructures import Headers

    repeated = Headers(
        raw=[(b"anthropic-beta", b"a-beta, interleaved-thinking-2025-05-14"), (b"anthropic-beta", b"b-beta,")]
    )
    assert anthropic.betas(repeated) == {"a-beta", "interleaved-thinking-2025-05-14", "b-beta"}
    assert anthropic.betas({"anthropic-beta": "x ,y"}) == {"x", "y"}  # a batch's stored headers: a plain dict
    assert anthropic.betas({}) == frozenset()

"""Requests Anthropic refuses that the translation would otherwise hide (translate.checks):
a 400 naming the field, not a conversation the model sees differently."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dragoman.errors import InvalidRequest
from dragoman.profiles import PROFILES
from dragoman.protocol import anthropic
from dragoman.translate.request import ModelCaps, to_chat_request

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
IMAGE_URL = "https://example.com/cat.png"


def _translate(**fields: Any) -> None:
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **fields}
    request = msgspec.json.decode(msgspec.json.encode(body), type=anthropic.MessagesRequest)
    to_chat_request(request, upstream_model="m", profile=PROFILES["generic"], caps=ModelCaps(vision=True), stream=False)


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


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [TOOL], "tool_choice": {"type": "auto"}},
        {"tool_choice": {"type": "none"}},
        {"tools": [TOOL], "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [USE]},
                                       {"role": "user", "content": [RESULT]}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": IMAGE_URL}}]}]},
    ],
)  # fmt: skip
def test_well_placed_requests_pass(fields: dict[str, Any]) -> None:
    _translate(**fields)

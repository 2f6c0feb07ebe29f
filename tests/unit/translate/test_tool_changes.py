"""tool_addition and tool_removal blocks: the tools in force at the end of the conversation."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic
from dragoman.translate.tool_changes import tools_in_force

SCHEMA = {"type": "object", "properties": {}}


def _tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "input_schema": SCHEMA, **extra}


def _request(tools: list[dict[str, Any]], *changes: dict[str, Any]) -> anthropic.MessagesRequest:
    messages = [{"role": "user", "content": "go"}, *({"role": "system", "content": [change]} for change in changes)]
    body = {"model": "m", "max_tokens": 5, "tools": tools, "messages": messages}
    return msgspec.json.decode(msgspec.json.encode(body), type=anthropic.MessagesRequest)


def _add(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": tool}}


def _ref(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "tool": {"type": "tool_reference", "name": name}}


def test_changes_apply_in_order() -> None:
    request = _request(
        [_tool("a"), _tool("b")], _add(_tool("c")), _ref("tool_removal", "a"), _add(_tool("b", description="new"))
    )
    tools, referenced = tools_in_force(request)
    assert [(t.name, t.description) for t in tools] == [("c", None), ("b", "new")]  # a redefinition replaces
    assert referenced == set()


def test_an_addition_by_reference_loads_a_deferred_tool() -> None:
    tools, referenced = tools_in_force(_request([_tool("hidden", defer_loading=True)], _ref("tool_addition", "hidden")))
    assert [t.name for t in tools] == ["hidden"] and referenced == {"hidden"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_ref("tool_addition", "nope"), "messages.1.content.0.tool.name: no tool named 'nope'"),
        ({"type": "tool_removal", "tool": {"type": "mcp_tool_reference", "name": "x"}}, "messages.1.content.0.tool.type:"),
        ({"type": "tool_addition", "tool": {"type": "tool_definition", "definition": {"description": "no name"}}},
         "messages.1.content.0.tool.definition:"),
    ],
)  # fmt: skip
def test_changes_that_cannot_apply_are_refused_naming_the_block(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        tools_in_force(_request([_tool("a")], change))
    assert caught.value.message.startswith(message)

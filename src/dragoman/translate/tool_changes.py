"""Tools added and withdrawn mid-conversation (`tool_addition` and `tool_removal` blocks).

Chat Completions offers one tool list for the whole request, so the tools offered are
those in force at the end of the conversation: the request's `tools`, then each change
in the order the messages make it. The blocks themselves do not reach the model.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic

CHANGES = (anthropic.ToolAdditionBlock, anthropic.ToolRemovalBlock)


def tools_in_force(request: anthropic.MessagesRequest) -> tuple[list[anthropic.Tool], set[str]]:
    """The tools offered at the end of the conversation, and the names that additions
    by reference loaded (deferred tools they make visible)."""
    tools = list(request.tools or ())
    referenced: set[str] = set()
    for index, message in enumerate(request.messages):
        if isinstance(message.content, str):
            continue
        for at, block in enumerate(message.content):
            if not isinstance(block, CHANGES):
                continue
            where = f"messages.{index}.content.{at}.tool"
            if isinstance(block, anthropic.ToolAdditionBlock) and block.tool.get("type") == "tool_definition":
                tool = _definition(block.tool.get("definition"), where)
                tools = [t for t in tools if t.name != tool.name] + [tool]
                continue
            name = _reference(block.tool, where)
            if isinstance(block, anthropic.ToolAdditionBlock):
                if not any(t.name == name for t in tools):
                    raise InvalidRequest(f"{where}.name: no tool named {name!r} in tools to add")
                referenced.add(name)
            else:
                tools = [t for t in tools if t.name != name]
                referenced.discard(name)
    return tools, referenced


def _definition(definition: Any, where: str) -> anthropic.Tool:
    try:  # through JSON: a Tool keeps its schema as raw JSON text
        return msgspec.json.decode(msgspec.json.encode(definition), type=anthropic.Tool)
    except msgspec.ValidationError as error:
        raise InvalidRequest(f"{where}.definition: {error}") from None


def _reference(tool: dict[str, Any], where: str) -> str:
    if tool.get("type") != "tool_reference":
        raise InvalidRequest(
            f"{where}.type: {tool.get('type')!r} is not supported here; use tool_definition or tool_reference"
        )
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.name: Field required")
    return name

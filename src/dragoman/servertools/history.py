"""Server-tool blocks a client sends back, as the model saw them: each `server_tool_use` /
`mcp_tool_use` becomes the function call it was, and its result block a tool result (an
assistant turn split around it), so later turns show the model the results again. Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dragoman.protocol import anthropic as a

USES = (a.ServerToolUseBlock, a.McpToolUseBlock)
RESULTS = (a.WebSearchToolResultBlock, a.WebFetchToolResultBlock, a.McpToolResultBlock)
# A result block's text for the model, or None when that tool is not run here (its pair is dropped).
Replay = Callable[[Any, str], "str | None"]


def has_server_blocks(messages: list[a.MessageParam]) -> bool:
    return any(
        isinstance(block, USES + RESULTS)
        for message in messages
        if message.role == "assistant" and not isinstance(message.content, str)
        for block in message.content
    )


def rewritten(messages: list[a.MessageParam], replay: Replay) -> list[a.MessageParam]:
    out: list[a.MessageParam] = []
    for m, message in enumerate(messages):
        if message.role != "assistant" or isinstance(message.content, str):
            out.append(message)
            continue
        out.extend(_split(message.content, f"messages.{m}.content", replay))
    return out


def _split(blocks: list[Any], where: str, replay: Replay) -> list[a.MessageParam]:
    texts: dict[str, tuple[str, bool]] = {}
    for b, block in enumerate(blocks):
        if isinstance(block, RESULTS):
            text = replay(block, f"{where}.{b}")
            if text is not None:
                texts[block.tool_use_id] = (text, _is_error(block))
    out: list[a.MessageParam] = []
    turn: list[Any] = []
    for block in blocks:
        if isinstance(block, USES):
            if block.id in texts:
                turn.append(a.ToolUseBlock(id=block.id, name=block.name, input=block.input or {}))
        elif isinstance(block, RESULTS):
            if block.tool_use_id in texts and turn:
                text, error = texts[block.tool_use_id]
                out.append(a.MessageParam(role="assistant", content=turn))
                out.append(a.MessageParam(role="user", content=[a.ToolResultBlock(tool_use_id=block.tool_use_id,
                                                                                  content=text, is_error=error)]))  # fmt: skip
                turn = []
        else:
            turn.append(block)
    if turn:
        out.append(a.MessageParam(role="assistant", content=turn))
    return out


def _is_error(block: Any) -> bool:
    if isinstance(block, a.McpToolResultBlock):
        return block.is_error
    return isinstance(block.content, dict) and "error_code" in block.content

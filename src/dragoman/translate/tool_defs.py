"""The request's tools as chat functions, and how the model may call them (tool_choice).

Client tools keep their schema as the client's text unless the server needs keys stripped;
built-in client tools (bash, text editor, ...) get the schema Anthropic documents; Anthropic's
server tools cannot run here and are refused or dropped. Names longer than a backend takes
are shortened deterministically (the response side maps them back).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from dragoman.core.errors import InvalidRequest
from dragoman.core.profiles import Profile
from dragoman.protocol import anthropic, openai
from dragoman.translate.builtin_tools import (
    CLIENT_TOOL_FAMILIES,
    SERVER_TOOL_FAMILIES,
    builtin_schema,
    known_builtin_types,
)
from dragoman.translate.tool_changes import tools_in_force

MAX_TOOL_NAME = 64


def short_tool_name(name: str) -> str:
    """A reversible-by-table, deterministic name within the backend's 64-char limit."""
    if len(name) <= MAX_TOOL_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_TOOL_NAME - 9]}_{digest}"


def offered_tools(
    request: anthropic.MessagesRequest,
    turns: list[tuple[str, list[Any], int]],
    profile: Profile,
    drop_server_tools: bool,
) -> tuple[dict[str, str], list[openai.FunctionTool], Any, bool | None]:
    """(client name -> upstream name, the tools as functions, tool_choice, parallel_tool_calls).
    The names include those the history calls: it may name tools no longer offered."""
    names: dict[str, str] = {}
    offered, referenced = tools_in_force(request)
    tools = _functions(offered, profile, drop_server_tools, names, _loaded_tools(turns) | referenced) if offered else []
    for _, blocks, _ in turns:
        for block in blocks:
            if isinstance(block, anthropic.ToolUseBlock):
                names.setdefault(block.name, short_tool_name(block.name))
    # vLLM's default tool_choice is "none": say "auto" whenever tools are offered.
    tool_choice, parallel = _tool_choice(request.tool_choice, names) if tools else (None, None)
    if tools and tool_choice is None:
        tool_choice = "auto"
    return names, tools, tool_choice, parallel


def _strip_keys(schema: Any, keys: tuple[str, ...]) -> Any:
    if not keys:
        return schema
    if isinstance(schema, dict):
        return {k: _strip_keys(v, keys) for k, v in schema.items() if k not in keys}
    if isinstance(schema, list):
        return [_strip_keys(v, keys) for v in schema]
    return schema


def _input_schema(
    schema: msgspec.Raw | dict[str, Any] | None, index: int, profile: Profile
) -> msgspec.Raw | dict[str, Any]:
    """A client tool's schema: a JSON object, left as the client's text unless keys go."""
    if schema is None:
        raise InvalidRequest(f"tools.{index}.input_schema: Field required")
    if isinstance(schema, msgspec.Raw):
        text = memoryview(schema)
        if not text or text == b"null":
            raise InvalidRequest(f"tools.{index}.input_schema: Field required")
        if text[:1] != b"{":
            raise InvalidRequest(
                f"tools.{index}.input_schema: Expected `object`, got `{bytes(text[:20]).decode(errors='replace')}`"
            )
        if not profile.strip_schema_keys:
            return schema
        schema = msgspec.json.decode(schema)
    return _strip_keys(schema, profile.strip_schema_keys)


def _functions(
    tools: list[anthropic.Tool], profile: Profile, drop_server_tools: bool, names: dict[str, str], loaded: set[str]
) -> list[openai.FunctionTool]:
    result = []
    for index, tool in enumerate(tools):
        if tool.defer_loading and tool.name not in loaded:
            continue  # as on Anthropic: the model sees a deferred tool once a search loaded it
        kind = tool.type
        if kind in (None, "custom"):
            description, schema = tool.description, _input_schema(tool.input_schema, index, profile)
        elif kind.startswith(SERVER_TOOL_FAMILIES):
            if drop_server_tools:
                continue
            raise InvalidRequest(
                f"tools.{index}: server tool {kind!r} ({tool.name}) runs on Anthropic's servers and is not available "
                'through this gateway; remove it, or set server_tools = "drop" for the server or this model'
            )
        else:
            builtin = builtin_schema(tool)
            if builtin is None:
                family = next((f for f in CLIENT_TOOL_FAMILIES if kind.startswith(f)), None)
                known = f" Known versions: {', '.join(known_builtin_types(family))}." if family else ""
                raise InvalidRequest(f"tools.{index}.type: unknown tool type {kind!r}.{known}")
            description, schema = builtin[0], _strip_keys(builtin[1], profile.strip_schema_keys)
        upstream_name = names.setdefault(tool.name, short_tool_name(tool.name))
        result.append(
            openai.FunctionTool(
                function=openai.FunctionDef(
                    name=upstream_name,
                    description=description,
                    parameters=schema,
                    strict=tool.strict,
                )
            )
        )
    return result


def _loaded_tools(turns: list[tuple[str, list[Any], int]]) -> set[str]:
    """Names of deferred tools that tool searches in the conversation have loaded."""
    loaded: set[str] = set()
    for _, blocks, _ in turns:
        for block in blocks:
            if isinstance(block, anthropic.ToolResultBlock) and isinstance(block.content, list):
                loaded.update(b.tool_name for b in block.content if isinstance(b, anthropic.ToolReferenceBlock))
    return loaded


def _tool_choice(choice: anthropic.ToolChoice | None, names: dict[str, str]) -> tuple[Any, bool | None]:
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "auto":
        return "auto", parallel
    if choice.type == "any":
        return "required", parallel
    if choice.type == "none":
        return "none", None
    if not choice.name:
        raise InvalidRequest("tool_choice.name: Field required when tool_choice.type is 'tool'")
    if choice.name not in names:
        raise InvalidRequest(f"tool_choice.name: no tool named {choice.name!r} in tools")
    return {"type": "function", "function": {"name": names[choice.name]}}, parallel

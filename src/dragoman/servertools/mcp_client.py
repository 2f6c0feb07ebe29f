"""The MCP connector: a request's `mcp_servers` served by the gateway as an MCP client (the
official `mcp` SDK, Streamable HTTP or SSE). Each server's tools are listed, offered to the model
as functions (as its `mcp_toolset` or, in the older beta, its `tool_configuration` says), and
called when the model asks, as `mcp_tool_use` + `mcp_tool_result`. Servers on private addresses
are refused unless server.fetch_allow_private; authorization tokens go only to their server,
never into a log or an error message."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from dragoman.core import ids
from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic as a
from dragoman.servertools.runners import Result, Tally

log = logging.getLogger("dragoman.servertools")
# Refuses a URL the gateway must not connect to (backends.fetch: private addresses), with a 400.
CheckURL = Callable[[str, str], Awaitable[None]]


@contextlib.asynccontextmanager
async def session(server: a.McpServer, timeout: float) -> AsyncIterator[Any]:
    """An initialised MCP client session with `server`: SSE when its URL ends in /sse, else
    Streamable HTTP."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {server.authorization_token}"} if server.authorization_token else {}
    limits = httpx2.Timeout(timeout)
    async with contextlib.AsyncExitStack() as stack:
        if server.url.rstrip("/").endswith("/sse"):
            read, write = await stack.enter_async_context(sse_client(server.url, headers=headers, timeout=timeout,
                                                                     sse_read_timeout=timeout))  # fmt: skip
        else:
            client = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=limits))
            read, write, *_ = await stack.enter_async_context(streamable_http_client(server.url, http_client=client))
        mcp_session = await stack.enter_async_context(ClientSession(read, write, read_timeout_seconds=timeout))
        await mcp_session.initialize()
        yield mcp_session


def _failure(error: BaseException) -> str:
    """What went wrong, without anything a client sent (no URL, no header)."""
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return _failure(error.exceptions[0])
    return type(error).__name__


def enabled_tools(server: a.McpServer, toolset: a.Tool | None, names: list[str]) -> list[str]:
    """The server's tools the model may use: `mcp_toolset`'s configs over its default_config
    (mcp-client-2025-11-20), else the server's `tool_configuration` (mcp-client-2025-04-04)."""
    if toolset is not None:
        default = bool((toolset.default_config or {}).get("enabled", True))
        configs = toolset.configs or {}
        return [n for n in names if bool(configs.get(n, {}).get("enabled", default))]
    config = server.tool_configuration or {}
    if config.get("enabled") is False:
        return []
    allowed = config.get("allowed_tools")
    return [n for n in names if allowed is None or n in allowed]


class McpTool:
    """One tool of one MCP server, as a function the model is offered."""

    def __init__(self, server: a.McpServer, tool: Any, function_name: str, timeout: float, tally: Tally) -> None:
        self._server, self._name, self._timeout, self._tally = server, tool.name, timeout, tally
        schema = msgspec.json.encode(tool.input_schema or {"type": "object", "properties": {}})
        self.function = a.Tool(name=function_name, description=tool.description or "", input_schema=msgspec.Raw(schema))

    def new_id(self) -> str:
        return ids.new_id("mcptoolu_01")

    def use_block(self, call_id: str, arguments: Any) -> a.ContentBlock:
        return a.OutMcpToolUseBlock(id=call_id, name=self._name, server_name=self._server.name, input=arguments)

    async def run(self, call_id: str, arguments: Any) -> Result:
        try:
            async with asyncio.timeout(self._timeout), session(self._server, self._timeout) as mcp_session:
                answer = await mcp_session.call_tool(self._name, arguments if isinstance(arguments, dict) else {})
            texts = [getattr(c, "text", "") for c in answer.content if getattr(c, "type", "") == "text"]
            is_error = bool(answer.is_error)
        except Exception as error:  # the server's failure is the model's to read, never the request's
            log.info("MCP server %s: tool %s failed (%s)", self._server.name, self._name, _failure(error))
            texts, is_error = [f"The MCP server could not run the tool ({_failure(error)})."], True
        self._tally.runs.append(("mcp", "mcp", "error" if is_error else "ok"))
        block = a.OutMcpToolResultBlock(tool_use_id=call_id, is_error=is_error,
                                        content=[a.OutTextBlock(text=t) for t in texts])  # fmt: skip
        return Result(block, "\n".join(texts) or "(no output)", is_error)


async def mcp_runners(request: a.MessagesRequest, check: CheckURL, timeout: float, tally: Tally) -> dict[str, McpTool]:
    """The request's MCP tools by function name, each server's tools listed at once; a server
    that cannot be reached, or a toolset naming no server, is a 400."""
    servers = request.mcp_servers or []
    toolsets = {t.mcp_server_name: (i, t) for i, t in enumerate(request.tools or ()) if t.type == "mcp_toolset"}
    _check_names(servers, toolsets)
    listed = await asyncio.gather(*(_listed(n, s, check, timeout) for n, s in enumerate(servers)))
    runners: dict[str, McpTool] = {}
    taken = {t.name for t in request.tools or () if t.type != "mcp_toolset"}
    for server, tools in zip(servers, listed, strict=True):
        toolset = toolsets[server.name][1] if toolsets else None
        by_name = {tool.name: tool for tool in tools}
        for name in enabled_tools(server, toolset, list(by_name)):
            function = name if name not in taken and name not in runners else f"{server.name}__{name}"
            runners[function] = McpTool(server, by_name[name], function, timeout, tally)
    return runners


def _check_names(servers: list[a.McpServer], toolsets: dict[str | None, tuple[int, a.Tool]]) -> None:
    names = [s.name for s in servers]
    for n, name in enumerate(names):
        if name in names[:n]:
            raise InvalidRequest(f"mcp_servers.{n}.name: {name!r} is used by another server; names must be unique")
    for server_name, (index, _) in toolsets.items():
        if server_name not in names:
            raise InvalidRequest(f"tools.{index}.mcp_server_name: no server named {server_name!r} in mcp_servers")
    if toolsets:
        for n, name in enumerate(names):
            if name not in toolsets:
                raise InvalidRequest(f"mcp_servers.{n}: server {name!r} is not referenced by an mcp_toolset tool")


async def _listed(index: int, server: a.McpServer, check: CheckURL, timeout: float) -> list[Any]:
    where = f"mcp_servers.{index}"
    if not server.url.startswith(("http://", "https://")):
        raise InvalidRequest(f"{where}.url: an http or https URL is required")
    await check(server.url, "MCP server")
    try:
        async with asyncio.timeout(timeout), session(server, timeout) as mcp_session:
            return list((await mcp_session.list_tools()).tools)
    except Exception as error:
        raise InvalidRequest(
            f"{where}: could not list the tools of MCP server {server.name!r} ({_failure(error)})"
        ) from None

"""The loop: offer the model the request's server tools as functions, run the calls it makes,
hand the results back and ask again, until it answers (its stop reason), calls a client tool
(`tool_use`), or MAX_ITERATIONS model calls have run tools (`pause_turn`: the client sends the
turn back to continue, as on Anthropic)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from dragoman.calls.types import Outcome
from dragoman.core.config import Config
from dragoman.protocol import anthropic as a
from dragoman.servertools.history import has_server_blocks, rewritten
from dragoman.servertools.mcp_client import CheckURL, mcp_runners
from dragoman.servertools.runners import Result, Runner, Tally
from dragoman.servertools.sealing import Sealer
from dragoman.servertools.search import Provider
from dragoman.servertools.stream import Batch, Call, Interleaver
from dragoman.servertools.webfetch import Fetch, WebFetch, context_urls, urls_in
from dragoman.servertools.webfetch import replayed_text as fetched_text
from dragoman.servertools.websearch import WebSearch, replayed_text

MAX_ITERATIONS = 10  # model calls that ran tools in one request, as Anthropic's default
AUTO = a.ToolChoice(type="auto")

# One model call: the request, translated and sent upstream, read back as batches of events.
Ask = Callable[[a.MessagesRequest], Awaitable[AsyncIterator[Batch]]]


@dataclass(slots=True)
class Plan:
    """A request whose server tools the gateway runs: `request` is what the model is asked
    (functions for the tools, the history rewritten); `runners` by function name."""

    request: a.MessagesRequest
    runners: dict[str, Runner]
    tally: Tally
    seen: set[str]  # URLs in the conversation so far: what web fetch may fetch


class ServerTools:
    """The server tools configured for a backend; `plan` reads a request for them."""

    def __init__(self, config: Config, fetch: Fetch, check_url: CheckURL) -> None:
        search = config.web_search
        self._provider = Provider(search) if search is not None else None
        self._sealer = Sealer.shared(search.secret) if search is not None else None
        self._keepalive = config.server.keepalive_interval
        self._fetch = config.web_fetch
        self._fetch_page = fetch
        self._check_url = check_url
        self._mcp = config.mcp

    @staticmethod
    def configured(config: Config) -> bool:
        return config.web_search is not None or config.web_fetch is not None or config.mcp is not None

    def _kind(self, tool: a.Tool) -> str | None:
        kind = tool.type or ""
        if kind.startswith("web_search_") and self._provider is not None:
            return "search"
        if kind.startswith("web_fetch_") and self._fetch is not None:
            return "fetch"
        return None

    async def plan(self, request: a.MessagesRequest, connect: bool = True) -> Plan | None:
        """None when the request has nothing for the gateway to run or replay. Without `connect`
        (a token count), MCP servers are not asked for their tools: their toolsets count as none."""
        tools = request.tools or []
        kinds = [self._kind(tool) for tool in tools]
        uses_mcp = self._mcp is not None and (bool(request.mcp_servers) or any(t.type == "mcp_toolset" for t in tools))
        if not any(kinds) and not uses_mcp and not has_server_blocks(request.messages):
            return None
        tally = Tally()
        seen = context_urls(request.messages) if "fetch" in kinds else set()
        runners: dict[str, Runner] = {}
        offered: list[a.Tool] = []
        for index, (tool, kind) in enumerate(zip(tools, kinds, strict=True)):
            runner = self._runner(tool, kind, f"tools.{index}", seen, tally)
            if runner is not None:
                runners[tool.name] = runner
            if tool.type != "mcp_toolset" or self._mcp is None:
                offered.append(tool if runner is None else runner.function)
        if uses_mcp and connect:
            assert self._mcp is not None
            found = await mcp_runners(request, self._check_url, self._mcp.timeout, tally)
            runners.update(found)
            offered += [runner.function for runner in found.values()]
        messages = rewritten(request.messages, self._replay)
        changed = msgspec.structs.replace(
            request,
            messages=messages,
            tools=offered if request.tools is not None or offered else None,
            mcp_servers=None,
        )
        return Plan(changed, runners, tally, seen)

    def _runner(self, tool: a.Tool, kind: str | None, where: str, seen: set[str], tally: Tally) -> Runner | None:
        if kind == "search":
            assert self._provider is not None and self._sealer is not None
            return WebSearch(tool, where, self._provider, self._sealer, tally)
        if kind == "fetch":
            assert self._fetch is not None
            return WebFetch(tool, where, self._fetch_page, self._fetch.max_content_tokens, seen, tally)
        return None

    def _replay(self, block: Any, where: str) -> str | None:
        if isinstance(block, a.WebSearchToolResultBlock) and self._sealer is not None:
            return replayed_text(block, where, self._sealer)
        if isinstance(block, a.WebFetchToolResultBlock) and self._fetch is not None:
            return fetched_text(block)
        if isinstance(block, a.McpToolResultBlock) and self._mcp is not None:
            content = block.content
            return content if isinstance(content, str) else "\n".join(b.text for b in content or ())
        return None

    async def run(self, plan: Plan, ask: Ask, outcome: Outcome | None) -> AsyncGenerator[Batch, None]:
        """The client's message, as batches of events (pings while tools run)."""
        joined = Interleaver(plan.runners)
        request = plan.request
        stop: a.StopReason | None = None
        for iteration in range(MAX_ITERATIONS):
            async for batch in await ask(request):
                out = joined.model(batch)
                if out:
                    yield out
            blocks, calls, client_calls = joined.turn()
            stop = joined.stop_reason
            if not calls or stop != "tool_use":
                break
            results: list[Result] = []
            async for pings in self._running(calls, results):
                _count_pings(outcome, pings)
                yield pings
            yield joined.results([r.block for r in results])
            for result in results:  # what a search found may be fetched next
                plan.seen.update(urls_in(result.text))
            if client_calls:
                break
            answers: list[Any] = [a.ToolResultBlock(tool_use_id=c.id, content=r.text, is_error=r.is_error)
                       for c, r in zip(calls, results, strict=True)]  # fmt: skip
            request = msgspec.structs.replace(
                request,
                messages=[*request.messages, a.MessageParam(role="assistant", content=blocks),
                          a.MessageParam(role="user", content=answers)],
                tool_choice=AUTO if request.tool_choice is not None and request.tool_choice.type != "none" else request.tool_choice,
            )  # fmt: skip
            if iteration == MAX_ITERATIONS - 1:
                stop = "pause_turn"
        _note(outcome, joined, plan.tally)
        yield joined.end(stop, plan.tally.usage())

    async def _running(self, calls: list[Call], results: list[Result]) -> AsyncIterator[Batch]:
        """Runs the calls at once, filling `results` in order; yields a ping each keep-alive interval."""
        task = asyncio.ensure_future(asyncio.gather(*(c.runner.run(c.id, c.arguments) for c in calls)))
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=self._keepalive)
                if not done:
                    yield [a.Ping()]
            results.extend(task.result())
        finally:
            task.cancel()


def _count_pings(outcome: Outcome | None, pings: Batch) -> None:
    if outcome is not None:
        outcome.keepalives += len(pings)


def _note(outcome: Outcome | None, joined: Interleaver, tally: Tally) -> None:
    """The whole loop's usage in the outcome (each model call noted only its own)."""
    if outcome is None:
        return
    usage = joined.usage
    outcome.input_tokens, outcome.output_tokens = usage.input_tokens, usage.output_tokens
    outcome.cache_read_tokens = usage.cache_read_input_tokens
    outcome.web_search_requests += tally.web_search_requests
    outcome.web_fetch_requests += tally.web_fetch_requests
    outcome.server_tool_runs.extend(tally.runs)

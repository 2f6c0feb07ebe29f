"""The `web_search_*` tool: its definition checked as Anthropic checks it, each call run on the
configured provider, and its results as Anthropic's blocks (`encrypted_content` sealed)."""

from __future__ import annotations

from typing import Any

import msgspec

from dragoman.core import ids
from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic as a
from dragoman.servertools.runners import Result, Tally
from dragoman.servertools.sealing import Sealed, Sealer
from dragoman.servertools.search import Provider, Query, SearchFailed

MAX_QUERY = 500  # characters of a query; longer is `query_too_long`
SCHEMA = msgspec.Raw(
    b'{"type":"object","properties":{"query":{"type":"string","description":"The search query"}},"required":["query"]}'
)
DESCRIPTION = (
    "Search the web for current information. Returns result titles, URLs, ages and snippets. "
    "Use it when the answer depends on recent or specific facts; cite the URLs you use."
)
LOCATION_KEYS = ("city", "region", "country", "timezone")


def check_domains(tool: a.Tool, where: str) -> None:
    if tool.allowed_domains and tool.blocked_domains:
        raise InvalidRequest(f"{where}: allowed_domains and blocked_domains cannot be used together")
    for key in ("allowed_domains", "blocked_domains"):
        for n, domain in enumerate(getattr(tool, key) or ()):
            host = domain.partition("/")[0]
            if not domain or "://" in domain or "*" in host or " " in domain or "." not in host:
                raise InvalidRequest(f"{where}.{key}.{n}: {domain!r} is not a domain (no scheme; `*` only in the path)")
    if tool.max_uses is not None and tool.max_uses < 1:
        raise InvalidRequest(f"{where}.max_uses: must be at least 1, got {tool.max_uses}")


def results_text(items: list[Sealed]) -> str:
    """The results as the model reads them."""
    if not items:
        return "No results."
    return "\n\n".join(
        f"[{n}] {item.title}\nURL: {item.url}"
        + (f"\nAge: {item.page_age}" if item.page_age else "")
        + f"\n{item.snippet}"
        for n, item in enumerate(items, 1)
    )


def error_text(code: str) -> str:
    if code == "max_uses_exceeded":
        return "Error: max_uses_exceeded. No more searches can be run for this request; answer with what you have."
    return f"Error: {code}. The search failed."


class WebSearch:
    """One request's web search tool: the provider it searches, and the uses it has left."""

    def __init__(self, tool: a.Tool, where: str, provider: Provider, sealer: Sealer, tally: Tally) -> None:
        check_domains(tool, where)
        location = tool.user_location
        if location is not None and not any(location.get(k) for k in LOCATION_KEYS):
            raise InvalidRequest(f"{where}.user_location: give at least one of city, region, country or timezone")
        self._tool, self._provider, self._sealer, self._tally = tool, provider, sealer, tally
        self._used = 0
        self.function = a.Tool(name=tool.name, description=DESCRIPTION, input_schema=SCHEMA)

    def new_id(self) -> str:
        return ids.new_id("srvtoolu_01")

    def use_block(self, call_id: str, arguments: Any) -> a.ContentBlock:
        return a.OutServerToolUseBlock(id=call_id, name="web_search", input=arguments)

    async def run(self, call_id: str, arguments: Any) -> Result:
        query = arguments.get("query") if isinstance(arguments, dict) else None
        if not isinstance(query, str) or not query.strip():
            return self._error(call_id, "invalid_tool_input")
        if len(query) > MAX_QUERY:
            return self._error(call_id, "query_too_long")
        limit = self._tool.max_uses
        if limit is not None and self._used >= limit:
            return self._error(call_id, "max_uses_exceeded")
        self._used += 1
        tool, location = self._tool, self._tool.user_location or {}
        country = location.get("country") if isinstance(location.get("country"), str) else None
        try:
            hits = await self._provider.search(
                Query(query.strip(), tuple(tool.allowed_domains or ()), tuple(tool.blocked_domains or ()), country)
            )
        except SearchFailed as failed:
            return self._error(call_id, failed.code)
        self._tally.web_search_requests += 1
        self._tally.runs.append(("web_search", self._provider.name, "ok"))
        items = [Sealed(h.url, h.title, h.snippet, h.page_age) for h in hits]
        results = [
            a.WebSearchResult(url=i.url, title=i.title, encrypted_content=self._sealer.seal(i), page_age=i.page_age)
            for i in items
        ]
        return Result(a.OutWebSearchToolResultBlock(tool_use_id=call_id, content=results), results_text(items))

    def _error(self, call_id: str, code: str) -> Result:
        self._tally.runs.append(("web_search", self._provider.name, code))
        block = a.OutWebSearchToolResultBlock(tool_use_id=call_id, content=a.WebSearchToolResultError(error_code=code))
        return Result(block, error_text(code), is_error=True)


def replayed_text(block: a.WebSearchToolResultBlock, where: str, sealer: Sealer) -> str:
    """A replayed result block as the model reads it: each result's `encrypted_content` opened
    (an altered one is a 400)."""
    content = block.content
    if isinstance(content, dict):
        return error_text(str(content.get("error_code", "unavailable")))
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: a list of web_search_result blocks or an error")
    items = []
    for n, item in enumerate(content):
        sealed = item.get("encrypted_content") if isinstance(item, dict) else None
        if not isinstance(sealed, str):
            raise InvalidRequest(f"{where}.content.{n}.encrypted_content: Field required")
        items.append(sealer.open(sealed, f"{where}.content.{n}.encrypted_content"))
    return results_text(items)

"""Search providers, each through its documented JSON API: SearXNG (self-hosted, its JSON format
enabled), Brave and Tavily. A search gives `Hit`s or raises `SearchFailed` with Anthropic's
error code; the domain lists are applied where the provider can, and always filtered afterwards."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from dragoman.core.config import WebSearchConfig

log = logging.getLogger("dragoman.servertools")
BRAVE_URL = "https://api.search.brave.com"
TAVILY_URL = "https://api.tavily.com"


@dataclass(frozen=True, slots=True)
class Hit:
    url: str
    title: str
    snippet: str
    page_age: str | None = None


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    allowed: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    country: str | None = None  # ISO 3166-1 alpha-2, from user_location


class SearchFailed(Exception):
    """A search that gave no results: `code` is Anthropic's error code for it."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(why)
        self.code = code


def matches(url: str, domains: tuple[str, ...]) -> bool:
    """Whether `url` is on one of `domains`: subdomains included, a path (`example.com/blog`) a prefix."""
    parts = urlsplit(url)
    host, path = (parts.hostname or "").lower(), parts.path or "/"
    for domain in domains:
        name, _, prefix = domain.lower().partition("/")
        prefix = "/" + prefix.rstrip("*")
        if (host == name or host.endswith("." + name)) and path.startswith(prefix.rstrip("/") or "/"):
            return True
    return False


def filtered(hits: list[Hit], query: Query, limit: int) -> list[Hit]:
    kept = [h for h in hits if h.url.startswith(("http://", "https://"))]
    if query.allowed:
        kept = [h for h in kept if matches(h.url, query.allowed)]
    if query.blocked:
        kept = [h for h in kept if not matches(h.url, query.blocked)]
    return kept[:limit]


class Provider:
    """One configured search service."""

    def __init__(self, config: WebSearchConfig) -> None:
        self.name = config.provider
        self._config = config
        self._key = config.api_key or ""  # resolved from api_key_env by `assembly.settings`
        default = {"brave": BRAVE_URL, "tavily": TAVILY_URL}.get(config.provider, "")
        self._url = (config.url or default).rstrip("/")

    async def search(self, query: Query) -> list[Hit]:
        limit = self._config.max_results
        try:
            async with asyncio.timeout(self._config.timeout), aiohttp.ClientSession(trust_env=True) as session:
                if self.name == "brave":
                    hits = await self._brave(session, query, limit)
                elif self.name == "tavily":
                    hits = await self._tavily(session, query, limit)
                else:
                    hits = await self._searxng(session, query)
        except TimeoutError:
            raise SearchFailed("unavailable", f"{self.name} did not answer within {self._config.timeout:g}s") from None
        except (aiohttp.ClientError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise SearchFailed("unavailable", f"{self.name}: {type(error).__name__}") from None
        return filtered(hits, query, limit)

    async def _json(self, response: aiohttp.ClientResponse) -> Any:
        if response.status == 429:
            raise SearchFailed("too_many_requests", f"{self.name} answered 429")
        if response.status != 200:
            raise SearchFailed("unavailable", f"{self.name} answered {response.status}")
        return await response.json(content_type=None)

    async def _searxng(self, session: aiohttp.ClientSession, query: Query) -> list[Hit]:
        params = {"q": _with_sites(query), "format": "json"}
        async with session.get(f"{self._url}/search", params=params) as response:
            body = await self._json(response)
        return [Hit(r["url"], r.get("title") or r["url"], r.get("content") or "", r.get("publishedDate"))
                for r in body.get("results", [])]  # fmt: skip

    async def _brave(self, session: aiohttp.ClientSession, query: Query, limit: int) -> list[Hit]:
        params = {"q": _with_sites(query), "count": str(min(limit * 2, 20))}
        if query.country:
            params["country"] = query.country.lower()
        headers = {"Accept": "application/json", "X-Subscription-Token": self._key}
        async with session.get(f"{self._url}/res/v1/web/search", params=params, headers=headers) as response:
            body = await self._json(response)
        return [Hit(r["url"], r.get("title") or r["url"], r.get("description") or "", r.get("age") or r.get("page_age"))
                for r in (body.get("web") or {}).get("results", [])]  # fmt: skip

    async def _tavily(self, session: aiohttp.ClientSession, query: Query, limit: int) -> list[Hit]:
        payload: dict[str, Any] = {"query": query.text, "max_results": limit, "search_depth": "basic"}
        if query.allowed:
            payload["include_domains"] = list(query.allowed)
        if query.blocked:
            payload["exclude_domains"] = list(query.blocked)
        headers = {"Authorization": f"Bearer {self._key}"}
        async with session.post(f"{self._url}/search", json=payload, headers=headers) as response:
            body = await self._json(response)
        return [Hit(r["url"], r.get("title") or r["url"], r.get("content") or "", r.get("published_date"))
                for r in body.get("results", [])]  # fmt: skip


def _with_sites(query: Query) -> str:
    """The query with a `site:` operator for a one-domain allow-list (engines that know it narrow
    the search; the results are filtered afterwards anyway)."""
    if len(query.allowed) != 1:
        return query.text
    return f"{query.text} site:{query.allowed[0].partition('/')[0]}"

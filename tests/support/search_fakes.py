"""Search services on loopback sockets, in their documented JSON shapes: SearXNG
(`GET /search?q=..&format=json` → `results[].url/title/content/publishedDate`), Brave
(`GET /res/v1/web/search` with `X-Subscription-Token` → `web.results[].url/title/description/age`)
and Tavily (`POST /search {query, max_results, include_domains, exclude_domains}` →
`results[].url/title/content/published_date`). Tests set `results`, `status` or `hold`, and
read back the queries they were asked."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.support.threaded_site import ThreadedSite


@dataclass(frozen=True)
class Result:
    url: str
    title: str
    snippet: str
    date: str | None = None


DEFAULT_RESULTS = [
    Result(
        "https://dragoman.example.org/guide", "Dragoman guide", "Dragoman translates the Messages API.", "2026-11-02"
    ),
    Result("https://news.example.com/gateways", "Gateways compared", "Open-model gateways, compared side by side."),
]


class FakeSearch:
    """One provider's API (`kind`: searxng, brave, tavily)."""

    def __init__(self, kind: str = "searxng", results: list[Result] | None = None) -> None:
        self.kind = kind
        self.results = list(DEFAULT_RESULTS if results is None else results)
        self.status = 200  # else answered with no results: 429, 500...
        self.hold: threading.Event | None = None  # answer only once the test sets it
        self.held = threading.Event()  # set when a request is waiting on `hold`
        self.queries: list[dict[str, Any]] = []  # each request's parameters (query string or JSON body)
        self.headers: list[dict[str, str]] = []
        app = web.Application()
        if kind == "searxng":
            app.router.add_get("/search", self._searxng)
        elif kind == "brave":
            app.router.add_get("/res/v1/web/search", self._brave)
        else:
            app.router.add_post("/search", self._tavily)
        self._site = ThreadedSite(app)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeSearch:
        self.port = self._site.start()
        return self

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self._site.stop()

    async def _answer(self, request: web.Request, params: dict[str, Any], body: Any) -> web.Response:
        self.queries.append(params)
        self.headers.append(dict(request.headers))
        if self.hold is not None:
            self.held.set()
            while not self.hold.is_set():
                await asyncio.sleep(0.01)
        if self.status != 200:
            return web.json_response({"error": "scripted failure"}, status=self.status)
        return web.json_response(body)

    async def _searxng(self, request: web.Request) -> web.Response:
        if request.query.get("format") != "json":
            return web.Response(status=403, text="Forbidden")  # as SearXNG answers a format it has not enabled
        results = [{"url": r.url, "title": r.title, "content": r.snippet, "publishedDate": r.date, "engine": "fake",
                    "score": 1.0, "category": "general"} for r in self.results]  # fmt: skip
        body = {"query": request.query.get("q"), "number_of_results": len(results), "results": results,
                "answers": [], "corrections": [], "infoboxes": [], "suggestions": [], "unresponsive_engines": []}  # fmt: skip
        return await self._answer(request, dict(request.query), body)

    async def _brave(self, request: web.Request) -> web.Response:
        results = [{"type": "search_result", "url": r.url, "title": r.title, "description": r.snippet,
                    "age": r.date, "page_age": r.date} for r in self.results]  # fmt: skip
        body = {
            "type": "search",
            "query": {"original": request.query.get("q")},
            "web": {"type": "search", "results": results},
        }
        return await self._answer(request, dict(request.query), body)

    async def _tavily(self, request: web.Request) -> web.Response:
        params = await request.json()
        results = [{"url": r.url, "title": r.title, "content": r.snippet, "score": 0.9, "published_date": r.date}
                   for r in self.results]  # fmt: skip
        body = {"query": params.get("query"), "answer": None, "images": [], "results": results, "response_time": 0.1}
        return await self._answer(request, params, body)


PAGE = """<!doctype html><html><head><title>Dragoman handbook</title><style>body{color:red}</style>
<script>var secret = "not page text";</script></head><body><h1>Dragoman</h1>
<p>Dragoman runs web search &amp; web fetch for open models.</p><p>It is configured in TOML.</p></body></html>"""


class FakePages:
    """Web pages on a loopback socket for the web fetch tool: `/page.html` (HTML with a title,
    a script and a style), `/notes.txt`, `/image.png` (not text); `requests` counts the fetches."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        app = web.Application()
        app.router.add_get("/{name}", self._page)
        self._site = ThreadedSite(app)
        self.port = 0

    def url(self, name: str = "page.html") -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def start(self) -> FakePages:
        self.port = self._site.start()
        return self

    def stop(self) -> None:
        self._site.stop()

    async def _page(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.requests.append(name)
        if name == "page.html":
            return web.Response(text=PAGE, content_type="text/html")
        if name == "notes.txt":
            return web.Response(text="plain notes " * 50, content_type="text/plain")
        if name == "image.png":
            return web.Response(body=b"\x89PNG\r\n\x1a\n" + b"\0" * 64, content_type="image/png")
        return web.Response(status=404, text="no such page")

"""The `web_fetch_*` tool: a page the conversation already named, fetched through the
gateway's URL fetcher (`backends.fetch`: public addresses only unless fetch_allow_private,
server.fetch_max_bytes and fetch_timeout), as Anthropic's `web_fetch_tool_result`."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import Any

import msgspec

from dragoman.core import ids
from dragoman.core.errors import InvalidRequest, Overloaded
from dragoman.files.charsets import decode_text
from dragoman.files.sniff import is_text, usable_type
from dragoman.protocol import anthropic as a
from dragoman.servertools.runners import Result, Tally
from dragoman.servertools.search import matches
from dragoman.servertools.websearch import check_domains
from dragoman.translate.pdf import pdf_text

MAX_URL = 250  # characters; longer is `url_too_long`
CHARS_PER_TOKEN = 4  # max_content_tokens is approximate, as on Anthropic
SCHEMA = msgspec.Raw(
    b'{"type":"object","properties":{"url":{"type":"string","description":"The URL to fetch"}},"required":["url"]}'
)
DESCRIPTION = (
    "Fetch the text of a web page or PDF. Only URLs that already appear in the conversation "
    "(given by the user, or found by a search) can be fetched."
)
# Fetches a page under the gateway's rules (backends.fetch.page_fetcher): its body, content
# type and charset, or an InvalidRequest saying why not.
Fetch = Callable[[str], Awaitable[tuple[bytes, str, "str | None"]]]
_URL = re.compile(r"https?://[^\s<>\"'\\)\]}]+")


def urls_in(text: str) -> set[str]:
    return {url.rstrip(".,;:!?") for url in _URL.findall(text)}


def context_urls(messages: list[a.MessageParam]) -> set[str]:
    """The URLs the conversation holds (its text, documents, tool results, search results)."""
    return urls_in(msgspec.json.encode(messages).decode())


HIDDEN = ("script", "style", "noscript", "template")  # elements whose text is not the page's


class _Text(HTMLParser):
    """A page's visible text and title (scripts, styles and markup dropped)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in HIDDEN:
            self._skip += 1
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        if tag in HIDDEN and self._skip > 0:
            self._skip -= 1
        self._in_title = False
        if tag in ("p", "div", "br", "li", "h1", "h2", "h3", "h4", "tr", "section", "article"):
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data.strip()
        elif not self._skip:
            self.parts.append(data)


def page_text(html: str) -> tuple[str, str]:
    parser = _Text()
    parser.feed(html)
    text = re.sub(r"[ \t]+", " ", "".join(parser.parts))
    return parser.title, re.sub(r"\n\s*\n+", "\n\n", text).strip()


class WebFetch:
    """One request's web fetch tool: the URLs it may fetch, and the uses it has left."""

    def __init__(self, tool: a.Tool, where: str, fetch: Fetch, max_tokens: int, seen: set[str], tally: Tally) -> None:
        check_domains(tool, where)
        self._tool, self._fetch, self._seen, self._tally = tool, fetch, seen, tally
        self._max_chars = min(tool.max_content_tokens or max_tokens, max_tokens) * CHARS_PER_TOKEN
        self._used = 0
        self.function = a.Tool(name=tool.name, description=DESCRIPTION, input_schema=SCHEMA)

    def new_id(self) -> str:
        return ids.new_id("srvtoolu_01")

    def use_block(self, call_id: str, arguments: Any) -> a.ContentBlock:
        return a.OutServerToolUseBlock(id=call_id, name="web_fetch", input=arguments)

    def _refusal(self, url: Any) -> str | None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return "invalid_tool_input"
        if len(url) > MAX_URL:
            return "url_too_long"
        if url not in self._seen and url.rstrip("/") not in {u.rstrip("/") for u in self._seen}:
            return "url_not_in_prior_context"
        domains = tuple(d.partition("/")[0] for d in self._tool.allowed_domains or ())
        if (domains and not matches(url, domains)) or matches(url, tuple(self._tool.blocked_domains or ())):
            return "url_not_allowed"
        if self._tool.max_uses is not None and self._used >= self._tool.max_uses:
            return "max_uses_exceeded"
        return None

    async def run(self, call_id: str, arguments: Any) -> Result:
        url = arguments.get("url") if isinstance(arguments, dict) else None
        refusal = self._refusal(url)
        if refusal is not None:
            return self._error(call_id, refusal)
        assert isinstance(url, str)
        self._used += 1  # failed fetches count against max_uses, as on Anthropic
        try:
            data, declared, charset = await self._fetch(url)
        except Overloaded:  # the process holds all the fetched bytes it may: a later try may pass
            return self._error(call_id, "too_many_requests")
        except InvalidRequest as refused:
            return self._error(call_id, "url_not_allowed" if "private" in refused.message else "url_not_accessible")
        kind = usable_type(declared, data).partition(";")[0]
        try:
            source, title, text = self._document(url, kind, data, charset)
        except InvalidRequest:
            return self._error(call_id, "unsupported_content_type")
        self._tally.web_fetch_requests += 1
        self._tally.runs.append(("web_fetch", "gateway", "ok"))
        self._seen.update(urls_in(text))
        document = {"type": "document", "source": source, "title": title}
        content = {"type": "web_fetch_result", "url": url, "content": document,
                   "retrieved_at": datetime.now(UTC).isoformat()}  # fmt: skip
        model_text = f"Fetched {url}" + (f"\nTitle: {title}" if title else "") + f"\n\n{text}"
        return Result(a.OutWebFetchToolResultBlock(tool_use_id=call_id, content=content), model_text)

    def _document(
        self, url: str, kind: str, data: bytes, charset: str | None
    ) -> tuple[dict[str, Any], str | None, str]:
        if kind == "application/pdf":
            text = pdf_text(data, "web_fetch", time.monotonic)[: self._max_chars]
            return (
                {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(data).decode()},
                None,
                text,
            )
        if not is_text(kind):
            raise InvalidRequest(f"{kind} is not text")
        text, title = decode_text(data, charset), None
        if kind in ("text/html", "application/xhtml+xml"):
            title, text = page_text(text)
        text = text[: self._max_chars]
        return {"type": "text", "media_type": "text/plain", "data": text}, title or None, text

    def _error(self, call_id: str, code: str) -> Result:
        self._tally.runs.append(("web_fetch", "gateway", code))
        block = a.OutWebFetchToolResultBlock(tool_use_id=call_id, content=a.WebFetchToolResultError(error_code=code))
        return Result(block, f"Error: {code}. The page was not fetched.", is_error=True)


def replayed_text(block: a.WebFetchToolResultBlock) -> str:
    """A replayed fetch result as the model reads it."""
    content: dict[str, Any] = block.content if isinstance(block.content, dict) else {}
    if "error_code" in content:
        return f"Error: {content['error_code']}. The page was not fetched."
    document: dict[str, Any] = content["content"] if isinstance(content.get("content"), dict) else {}
    source: dict[str, Any] = document["source"] if isinstance(document.get("source"), dict) else {}
    body = source.get("data", "") if source.get("type") == "text" else "(a PDF document)"
    title = document.get("title")
    return f"Fetched {content.get('url', '')}" + (f"\nTitle: {title}" if title else "") + f"\n\n{body}"

"""Fetching `document` blocks given by URL, when the operator allows it.

Off by default: a gateway that fetches what clients name can be turned against
the network it sits in. When on, only public addresses are fetched (every
redirect hop is checked again), within a size and a time limit; PDFs and text
become the sources the translator reads.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import aiohttp.abc
from aiohttp.abc import ResolveResult
from yarl import URL

from dragoman.core.config import ServerConfig
from dragoman.core.errors import InvalidRequest
from dragoman.files.charsets import decode_text
from dragoman.files.sniff import is_text, usable_type
from dragoman.protocol import anthropic as a

MAX_REDIRECTS = 3
MAX_DOCUMENTS = 100  # URL documents fetched for one request
PARALLEL_FETCHES = 4  # of one request's fetches, running at once


# Not globally reachable, though `is_global` says so: what Python before 3.11.10 misses
# (CVE-2024-4032: 192.0.0.0/24 holds a cloud metadata address), and IPv6 forms that carry an
# IPv4 address to a translator (6to4) or are deprecated (IPv4-compatible, site-local).
_NOT_GLOBAL = tuple(
    ipaddress.ip_network(n) for n in ("192.0.0.0/24", "::/96", "64:ff9b:1::/48", "2002::/16", "fec0::/10")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the last 32 bits are the IPv4 address reached


def _public(address: str) -> bool:
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):  # an IPv4 address inside is what is reached
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip in _NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.is_global and not ip.is_multicast and not any(ip in network for network in _NOT_GLOBAL)


def _checked(url: str | URL, allow_private: bool, kind: str = "document") -> URL:
    """The URL as aiohttp reads it (yarl, not urllib: it turns a host written in full-width
    digits into 127.0.0.1, an address aiohttp then connects to without resolving it), with a
    literal address checked here, as the resolver below never sees it."""
    try:
        parsed = url if isinstance(url, URL) else URL(url)
        host = parsed.raw_host
    except (ValueError, UnicodeError):
        raise InvalidRequest(f"{kind} URL {str(url)!r}: not a valid URL") from None
    if parsed.scheme not in ("http", "https") or not host:
        raise InvalidRequest(f"{kind} URL {str(url)!r}: only http and https URLs are fetched")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return parsed
    if not allow_private and not _public(str(literal)):
        raise InvalidRequest(f"{kind} URL {str(url)!r}: refusing to fetch from a private, loopback or reserved address")
    return parsed


class _PublicOnlyResolver(aiohttp.abc.AbstractResolver):
    """Resolves names and refuses private answers at connect time, so the address
    checked is the address connected to (no second lookup to rebind)."""

    def __init__(self, kind: str) -> None:
        self._resolver = aiohttp.ThreadedResolver()
        self._kind = kind

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            answers = await self._resolver.resolve(host, port, family)
        except OSError as error:
            raise InvalidRequest(
                f"{self._kind} URL host {host!r} cannot be resolved: {error.strerror or error}"
            ) from None
        if not answers or not all(_public(answer["host"]) for answer in answers):
            raise InvalidRequest(
                f"{self._kind} URL host {host!r}: refusing to fetch from a private, loopback or reserved address"
            )
        return answers

    async def close(self) -> None:
        await self._resolver.close()


class Budget:
    """What the fetches of one request may still take, together: a small request naming
    many URLs must neither hold gigabytes of documents nor send thousands of requests out."""

    def __init__(self, total_bytes: int) -> None:
        self.documents = MAX_DOCUMENTS
        self.total_bytes = total_bytes  # server.max_request_bytes: what the request could have held itself
        self.bytes = total_bytes
        self.slots = asyncio.Semaphore(PARALLEL_FETCHES)

    def count(self, where: str, kind: str = "document") -> None:
        """One more document (or image) to fetch, at `where` in the request."""
        self.documents -= 1
        if self.documents < 0:
            raise InvalidRequest(f"{where}.source: at most {MAX_DOCUMENTS} {kind}s are fetched by URL for one request")

    def take(self, size: int, url: str, kind: str = "document") -> None:
        self.bytes -= size
        if self.bytes < 0:
            raise InvalidRequest(f"{kind} URL {url!r}: the {kind}s fetched for this request together pass "
                                 f"server.max_request_bytes ({self.total_bytes} bytes)")  # fmt: skip


async def fetch_document(
    url: str, *, max_bytes: int, timeout: float, allow_private: bool, budget: Budget
) -> a.DocumentSource:
    async with budget.slots:  # the timeout starts once a slot is had
        data, kind, charset = await fetch(url, max_bytes=max_bytes, timeout=timeout, allow_private=allow_private,
                                          budget=budget)  # fmt: skip
    kind = usable_type(kind, data).partition(";")[0]  # what its bytes show, if its type says otherwise or nothing
    if kind == "application/pdf":
        return a.Base64Source(media_type="application/pdf", data=base64.b64encode(data).decode())
    if is_text(kind):
        return a.TextSource(data=decode_text(data, charset))
    raise InvalidRequest(f"document URL {url!r}: content type {kind!r} is not a PDF or text")


async def fetch(url: str, *, max_bytes: int, timeout: float, allow_private: bool, budget: Budget,
                kind: str = "document") -> tuple[bytes, str, str | None]:  # fmt: skip
    """The body at `url`, its content type and charset, fetched under the rules above; a 400
    naming the URL (`kind` says what it is for) when they refuse it or it cannot be had."""
    try:
        # No proxy: the address check must see what is connected to.
        connector = aiohttp.TCPConnector(resolver=None if allow_private else _PublicOnlyResolver(kind))
        async with asyncio.timeout(timeout), aiohttp.ClientSession(connector=connector, trust_env=False) as session:
            target = _checked(url, allow_private, kind)
            for _ in range(MAX_REDIRECTS + 1):
                async with session.get(target, allow_redirects=False) as response:
                    if response.status in (301, 302, 303, 307, 308) and "location" in response.headers:
                        try:
                            location = target.join(URL(response.headers["location"]))
                        except (ValueError, UnicodeError):
                            raise InvalidRequest(f"{kind} URL {url!r}: redirected to an invalid URL") from None
                        url = str(location)
                        target = _checked(location, allow_private, kind)
                        continue
                    if response.status != 200:
                        raise InvalidRequest(f"{kind} URL {url!r}: the server answered {response.status}")
                    data = await _read(response, url, max_bytes, budget, kind)
                    return data, response.content_type, response.charset
            raise InvalidRequest(f"{kind} URL {url!r}: too many redirects")
    except TimeoutError:
        raise InvalidRequest(f"{kind} URL {url!r}: not fetched within {timeout:g} seconds") from None
    except aiohttp.ClientConnectorError as error:
        if isinstance(error.os_error, InvalidRequest):
            raise error.os_error from None
        raise InvalidRequest(f"{kind} URL {url!r}: could not be fetched: {error}") from None
    except aiohttp.ClientError as error:
        raise InvalidRequest(f"{kind} URL {url!r}: could not be fetched: {error}") from None


def page_fetcher(server: ServerConfig) -> Callable[[str], Awaitable[tuple[bytes, str, str | None]]]:
    """Fetches one page under the server's rules (its own budget each): for the web fetch
    tool (dragoman.servertools), which lies below this layer."""

    async def fetch_page(url: str) -> tuple[bytes, str, str | None]:
        return await fetch(url, max_bytes=server.fetch_max_bytes, timeout=server.fetch_timeout,
                           allow_private=server.fetch_allow_private, budget=Budget(server.max_request_bytes),
                           kind="web_fetch")  # fmt: skip

    return fetch_page


def address_check(allow_private: bool) -> Callable[[str, str], Awaitable[None]]:
    """Refuses (400) a URL on a private, loopback or reserved address unless `allow_private`:
    for connections other clients make (the MCP connector, dragoman.servertools). The name is
    resolved here; the client connecting later resolves it again."""

    async def check(url: str, kind: str) -> None:
        parsed = _checked(url, allow_private, kind)
        if allow_private or parsed.raw_host is None:
            return
        try:
            ipaddress.ip_address(parsed.raw_host)
        except ValueError:
            resolver = _PublicOnlyResolver(kind)
            try:
                await resolver.resolve(parsed.raw_host, parsed.port or 0)
            finally:
                await resolver.close()

    return check


async def _read(response: aiohttp.ClientResponse, url: str, max_bytes: int, budget: Budget, kind: str) -> bytes:
    """The whole body, refused once past `max_bytes`. (`content.read(n)` returns what has
    arrived so far, at most n bytes: a document that came in pieces was cut to its first.)"""
    if response.content_length is not None and response.content_length > max_bytes:
        raise InvalidRequest(f"{kind} URL {url!r}: larger than the {max_bytes}-byte limit")
    chunks, size = [], 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > max_bytes:
            raise InvalidRequest(f"{kind} URL {url!r}: larger than the {max_bytes}-byte limit")
        budget.take(len(chunk), url, kind)
        chunks.append(chunk)
    return b"".join(chunks)


async def resolve_url_documents(request: a.MessagesRequest, *, max_bytes: int, timeout: float, allow_private: bool,
                                total_bytes: int) -> None:  # fmt: skip
    """Replace URL sources of document blocks with what they point to (in place), within
    one `Budget` of `total_bytes`. The first failure cancels the other fetches."""
    budget = Budget(total_bytes)
    pending: list[tuple[a.DocumentBlock, str]] = []
    for m, message in enumerate(request.messages):
        if isinstance(message.content, str):
            continue
        for b, block in enumerate(message.content):
            blocks: list[tuple[str, Any]] = [(f"messages.{m}.content.{b}", block)]
            if isinstance(block, a.ToolResultBlock) and isinstance(block.content, list):
                blocks = [(f"messages.{m}.content.{b}.content.{i}", inner) for i, inner in enumerate(block.content)]
            for where, inner in blocks:
                if isinstance(inner, a.DocumentBlock) and isinstance(inner.source, a.URLSource):
                    budget.count(where)
                    pending.append((inner, inner.source.url))
    if not pending:
        return
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(fetch_document(url, max_bytes=max_bytes, timeout=timeout, allow_private=allow_private,
                                                      budget=budget)) for _, url in pending]  # fmt: skip
    except BaseExceptionGroup as failed:  # the first failure is the client's answer
        raise failed.exceptions[0] from None
    for (block, _), task in zip(pending, tasks, strict=True):
        block.source = task.result()


def has_url_documents(body: bytes) -> bool:
    """A cheap pre-check, so most requests without URL documents pay nothing. A body with any
    `\\u` escape is looked through too: `"\\u0075rl"` decodes to `"url"`."""
    return (b'"url"' in body and b'"document"' in body) or b"\\u" in body

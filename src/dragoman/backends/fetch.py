"""Fetching `document` blocks given by URL, when the operator allows it.

Off by default: a gateway that fetches what clients name can be turned against
the network it sits in. When on, only public addresses are fetched (every
redirect hop is checked again), within a size and a time limit, and within what all
of the request's fetches may take together (`backends.fetch_budget`); PDFs and text
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

from dragoman.backends.fetch_budget import Budget, Held
from dragoman.core.config import ServerConfig
from dragoman.core.errors import InvalidRequest
from dragoman.files.charsets import decode_text
from dragoman.files.sniff import is_text, usable_type
from dragoman.protocol import anthropic as a

MAX_REDIRECTS = 3


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
    literal address checked here, as the resolver below never sees it. A numeric host in any
    other form is refused, whatever the installed aiohttp would do with it."""
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
        if ":" in host or _inet_aton(host):  # an address `ipaddress` does not read, which the socket layer would
            raise InvalidRequest(f"{kind} URL {str(url)!r}: refusing a numeric host not written as four decimal "
                                 f"numbers or an IPv6 address ({host!r})") from None  # fmt: skip
        return parsed
    if not allow_private and not _public(str(literal)):
        raise InvalidRequest(f"{kind} URL {str(url)!r}: refusing to fetch from a private, loopback or reserved address")
    return parsed


def _inet_aton(host: str) -> bool:
    """Whether the socket layer reads `host` as an IPv4 address, in forms `ipaddress` does not:
    `2130706433`, `127.1`, `0177.0.0.1` and `0` aiohttp before 3.14.1 connected to without asking
    the resolver below (aio-libs/aiohttp#12827); `0x7f.1` and the like reach it (glibc reads them)."""
    try:
        socket.inet_aton(host)
    except (OSError, ValueError):
        return False
    return True


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


async def fetch_document(url: str, server: ServerConfig, budget: Budget) -> a.DocumentSource:
    """The document at `url`, as the source a translator reads: a PDF as base64, text as text."""
    async with budget.turn(url):
        data, kind, charset = await fetch(url, server, budget)
    kind = usable_type(kind, data).partition(";")[0]  # what its bytes show, if its type says otherwise or nothing
    if kind == "application/pdf":
        return a.Base64Source(media_type="application/pdf", data=base64.b64encode(data).decode())
    if is_text(kind):
        return a.TextSource(data=decode_text(data, charset))
    raise InvalidRequest(f"document URL {url!r}: content type {kind!r} is not a PDF or text")


async def fetch(
    url: str, server: ServerConfig, budget: Budget, kind: str = "document"
) -> tuple[bytes, str, str | None]:
    """The body at `url`, its content type and charset, fetched under the rules above; a 400
    naming the URL (`kind` says what it is for) when they refuse it or it cannot be had."""
    timeout, allow_private = server.fetch_timeout, server.fetch_allow_private
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
                    data = await _read(response, url, server.fetch_max_bytes, budget, kind)
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


def page_fetcher(server: ServerConfig, held: Held) -> Callable[[str], Awaitable[tuple[bytes, str, str | None]]]:
    """Fetches one page under the server's rules, with a budget of its own held only while it is
    read: for the web fetch tool (dragoman.servertools), which lies below this layer."""

    async def fetch_page(url: str) -> tuple[bytes, str, str | None]:
        with Budget(server, held) as budget:
            async with budget.turn(url, "web_fetch"):
                return await fetch(url, server, budget, kind="web_fetch")

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
    body = bytearray()
    async for chunk in response.content.iter_any():
        if len(body) + len(chunk) > max_bytes:
            raise InvalidRequest(f"{kind} URL {url!r}: larger than the {max_bytes}-byte limit")
        budget.take(len(chunk), url, kind)
        body += chunk
    return bytes(body)


async def resolve_url_documents(request: a.MessagesRequest, server: ServerConfig, budget: Budget) -> None:
    """Replace URL sources of document blocks with what they point to (in place), each
    distinct URL fetched once. The first failure cancels the other fetches."""
    pending: dict[str, list[a.DocumentBlock]] = {}
    for m, message in enumerate(request.messages):
        if isinstance(message.content, str):
            continue
        for b, block in enumerate(message.content):
            blocks: list[tuple[str, Any]] = [(f"messages.{m}.content.{b}", block)]
            if isinstance(block, a.ToolResultBlock) and isinstance(block.content, list):
                blocks = [(f"messages.{m}.content.{b}.content.{i}", inner) for i, inner in enumerate(block.content)]
            for where, inner in blocks:
                if isinstance(inner, a.DocumentBlock) and isinstance(inner.source, a.URLSource):
                    budget.count(where, inner.source.url)
                    pending.setdefault(inner.source.url, []).append(inner)
    if not pending:
        return
    try:
        async with asyncio.TaskGroup() as group:
            tasks = {url: group.create_task(fetch_document(url, server, budget)) for url in pending}
    except BaseExceptionGroup as failed:  # the first failure is the client's answer
        raise failed.exceptions[0] from None
    for url, documents in pending.items():
        for document in documents:
            document.source = tasks[url].result()


def has_url_documents(body: bytes) -> bool:
    """A cheap pre-check, so most requests without URL documents pay nothing. A body with any
    `\\u` escape is looked through too: `"\\u0075rl"` decodes to `"url"`."""
    return (b'"url"' in body and b'"document"' in body) or b"\\u" in body

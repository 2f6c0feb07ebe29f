"""Image blocks given by URL: fetched by the gateway and sent on inline, on both paths.

vLLM, SGLang and llama.cpp fetch an image URL themselves, from inside the network they run
in, so a client could make them request `http://169.254.169.254/` or a local Redis. The
gateway fetches each one instead, under the rules URL documents have (`backends.fetch`:
public addresses only unless `fetch_allow_private`, checked at connect time and on every
redirect; `fetch_max_bytes`, `fetch_timeout`; and, with the request's URL documents,
`backends.fetch_budget`: each distinct URL once, at most 100 images a request, 4 fetches at a
time, within `max_request_bytes` together and `fetch_total_timeout`), and sends its bytes as
a base64 source: no model server is given a URL to fetch. The bytes must show a JPEG, PNG,
GIF or WebP image.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator
from typing import Any

from dragoman.backends.fetch import fetch
from dragoman.backends.fetch_budget import Budget
from dragoman.core.config import ServerConfig
from dragoman.core.errors import InvalidRequest
from dragoman.files.sniff import image_type
from dragoman.protocol import anthropic as a
from dragoman.protocol import blocks

# Where an image URL was found, the URL, and how to put the fetched image in its place.
_Found = tuple[str, str, Callable[[str, str], None]]


def may_have_url_images(body: bytes, envelope: a.Envelope | None = None) -> bool:
    """Whether the body gives an image by URL, decoded (so an escaped `"\\u0075rl"` is seen as
    `"url"`) into only the fields that say so (`protocol.blocks`): about 23 µs for an 80 KB
    Claude Code body, where scanning its bytes for every spelling cost over 100; less from its
    `messages`, when the core read them already (`Envelope`), nothing when a route read them.
    A body that does not decode so is looked through whole by `inline_url_images`."""
    return (blocks.read_body(body) if envelope is None else blocks.read(envelope)).url_images


async def inline_url_images(messages: list[Any], server: ServerConfig, budget: Budget) -> bool:
    """Replace, in place, the URL source of every image in `messages` (decoded structs or
    plain JSON) with the image it points to, as base64, each distinct URL fetched once.
    Whether there was any."""
    found = [item for m, message in enumerate(messages) for item in _in_message(message, f"messages.{m}.content")]
    if not found:
        return False
    for where, url, _ in found:
        budget.count(where, url, "image")
    try:
        async with asyncio.TaskGroup() as group:
            tasks = {
                url: group.create_task(_fetch_image(url, server, budget))
                for url in dict.fromkeys(u for _, u, _ in found)
            }
    except BaseExceptionGroup as failed:  # the first failure is the client's answer
        raise failed.exceptions[0] from None
    for _, url, put in found:
        put(*tasks[url].result())
    return True


async def _fetch_image(url: str, server: ServerConfig, budget: Budget) -> tuple[str, str]:
    """(media type, base64 data) of the image at `url`."""
    async with budget.turn(url, "image"):
        data, _, _ = await fetch(url, server, budget, "image")
    media_type = image_type(data[:16])
    if media_type is None:
        raise InvalidRequest(f"image URL {url!r}: not a JPEG, PNG, GIF or WebP image")
    return media_type, base64.b64encode(data).decode()


def _in_message(message: Any, where: str) -> Iterator[_Found]:
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    if isinstance(content, list):
        for index, block in enumerate(content):
            yield from _in_block(block, f"{where}.{index}")


def _in_block(block: Any, where: str) -> Iterator[_Found]:
    """URL images in a block: an image itself, or those a tool result or a `content` document holds."""
    if isinstance(block, a.ImageBlock) and isinstance(block.source, a.URLSource):
        yield where, block.source.url, _struct_setter(block)
    elif isinstance(block, a.ToolResultBlock) and isinstance(block.content, list):
        for index, inner in enumerate(block.content):
            yield from _in_block(inner, f"{where}.content.{index}")
    elif isinstance(block, a.DocumentBlock) and isinstance(block.source, a.ContentSource):
        if isinstance(block.source.content, list):
            for index, item in enumerate(block.source.content):
                yield from _in_block(item, f"{where}.source.content.{index}")
    elif isinstance(block, dict):
        kind, source = block.get("type"), block.get("source")
        if kind == "image" and isinstance(source, dict) and source.get("type") == "url":
            if isinstance(source.get("url"), str):
                yield where, source["url"], _dict_setter(block)
        elif kind == "tool_result" and isinstance(block.get("content"), list):
            for index, inner in enumerate(block["content"]):
                yield from _in_block(inner, f"{where}.content.{index}")
        elif kind == "document" and isinstance(source, dict) and isinstance(source.get("content"), list):
            for index, item in enumerate(source["content"]):
                yield from _in_block(item, f"{where}.source.content.{index}")


def _struct_setter(block: a.ImageBlock) -> Callable[[str, str], None]:
    def put(media_type: str, data: str) -> None:
        block.source = a.Base64Source(media_type=media_type, data=data)

    return put


def _dict_setter(block: dict[str, Any]) -> Callable[[str, str], None]:
    def put(media_type: str, data: str) -> None:
        block["source"] = {"type": "base64", "media_type": media_type, "data": data}

    return put

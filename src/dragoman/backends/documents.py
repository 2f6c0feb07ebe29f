"""Document blocks as text blocks, for passthrough servers that ignore documents.

llama-server's own `/v1/messages` drops `document` blocks without a word (the prompt is
the same size with or without one), so the model answers as if it had never seen the
document. With `documents = "as_text"` on a passthrough upstream, each document block of
a user turn, or of a tool result, is replaced by a text block holding the document as the
translating path gives it to a model (`translate.content.document_text`: title, context,
text; a PDF's extracted text; a URL document fetched only with `server.fetch_documents`),
and the images of a `content` document by themselves, between text blocks.
Everything else in the request stays as the client sent it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dragoman.backends.fetch import fetch_document
from dragoman.backends.fetch_budget import Budget
from dragoman.backends.shared import Shared
from dragoman.core.config import ServerConfig
from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic
from dragoman.translate.content import content_with_images, document_head, document_text


async def documents_as_text(data: dict[str, Any], server: ServerConfig, budget: Budget, shared: Shared) -> None:
    """Replace, in place, every document block of the request `data` with a text block; its
    URL documents are fetched within the request's `budget`, each distinct URL once."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        return
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            await _blocks(content, f"messages.{index}.content", server, budget, shared)


async def _blocks(blocks: list[Any], where: str, server: ServerConfig, budget: Budget, shared: Shared) -> None:
    replaced: list[Any] = []
    for index, block in enumerate(blocks):
        here = f"{where}.{index}"
        if isinstance(block, dict) and block.get("type") == "document":
            replaced.extend(await _as_text(block, here, server, budget, shared))
            continue
        if isinstance(block, dict) and block.get("type") == "tool_result" and isinstance(block.get("content"), list):
            await _blocks(block["content"], f"{here}.content", server, budget, shared)
        replaced.append(block)
    blocks[:] = replaced


async def _as_text(
    block: dict[str, Any], where: str, server: ServerConfig, budget: Budget, shared: Shared
) -> list[dict[str, Any]]:
    """The document as a text block; a `content` document holding images as text blocks
    with its images, as the client sent them, in their places."""
    try:
        document = msgspec.convert(block, anthropic.DocumentBlock)
    except msgspec.ValidationError as error:
        raise InvalidRequest(f"{where}: {error}") from None
    if isinstance(document.source, anthropic.URLSource) and server.fetch_documents:
        url = document.source.url
        budget.count(where, url)
        if url in budget.fetched:  # named before in the request: its bytes count again, it is not fetched again
            source, size = budget.fetched[url]
            budget.take(size, url, places=1)
        else:
            source = await fetch_document(url, server, budget)
            budget.fetched[url] = source, budget.size(url)
        document = msgspec.structs.replace(document, source=source)
    items = content_with_images(document)
    if items is not None:
        parts = [
            {"type": "text", "text": document_head(document)},
            *(item for _, item in items),
            {"type": "text", "text": "</document>"},
        ]
    elif isinstance(document.source, anthropic.Base64Source):  # a PDF: its text is extracted off the loop
        parts = [{"type": "text", "text": await shared.offload(document_text, document, where, shared.clock)}]
    else:
        parts = [{"type": "text", "text": document_text(document, where, shared.clock)}]
    if "cache_control" in block:  # a breakpoint on the document stays a breakpoint, on its last block
        parts[-1] = {**parts[-1], "cache_control": block["cache_control"]}
    return parts

"""User-side content blocks (text, images, documents, search results) as Chat parts.

Chat Completions knows only text and images, so documents and search results
become text the model reads, with their title and context kept (and the images of a
`content` document in their places).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from dragoman.core.errors import InvalidRequest, NotFound
from dragoman.files.sniff import IMAGE_TYPES, image_type
from dragoman.protocol import anthropic, openai
from dragoman.translate.pdf import pdf_text

_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_BASE64_SLICE = 1 << 16  # a slice stays in the CPU cache: twice as fast as the whole string at once
INVALID_BASE64 = "invalid base64 data"  # Anthropic's words


def is_base64(data: str) -> bool:
    """Whether `data` is padded standard base64 throughout (RFC 4648), without decoding it.

    Deleting the alphabet (`bytes.translate`) a slice at a time and seeing nothing left
    costs about 0.4 ms per MB here; a strict decode (`binascii.a2b_base64`) costs 2 ms per
    MB and a regex 1.4 ms. Claude Code resends every screenshot of a conversation with
    each turn, so this runs often.
    """
    if len(data) % 4 or not data.isascii():
        return False
    end = len(data) - 2  # padding, if any, is in the last two characters
    for start in range(0, end, _BASE64_SLICE):
        if data[start : min(start + _BASE64_SLICE, end)].encode("ascii").translate(None, _BASE64_ALPHABET):
            return False
    tail = data[-2:]
    left = tail.encode("ascii").translate(None, _BASE64_ALPHABET)
    return left in (b"", b"=", b"==") and tail.endswith(left.decode())


def sniffed_image_type(data: str, where: str) -> str:
    """The media type an image's first bytes show; a 400 naming `source.data` if the data
    is not base64 throughout (as Anthropic checks it) or its first bytes show none."""
    if data.startswith("data:"):
        raise InvalidRequest(f"{where}.source.data: give the base64 data alone, without a 'data:' URL prefix")
    if not is_base64(data):
        raise InvalidRequest(f"{where}.source.data: {INVALID_BASE64}")
    media_type = image_type(
        binascii.a2b_base64(data[:16])
    )  # valid: a prefix of valid data, padded only if it is all of it
    if media_type is not None:
        return media_type
    raise InvalidRequest(f"{where}.source.data: not a JPEG, PNG, GIF or WebP image")


def image_part(block: anthropic.ImageBlock, where: str) -> openai.ImagePart:
    source = block.source
    if isinstance(source, anthropic.Base64Source):
        if source.media_type not in IMAGE_TYPES:
            allowed = ", ".join(IMAGE_TYPES)
            raise InvalidRequest(
                f"{where}.source.media_type: {source.media_type!r} is not supported; use one of {allowed}"
            )
        # A mislabelled image (a JPEG sent as image/png) is sent with the type its bytes
        # show: Anthropic refuses it, which leaves Claude Code sessions stuck on every
        # later turn, while the model needs only the bytes.
        media_type = sniffed_image_type(source.data, where)
        return openai.ImagePart(image_url=openai.ImageURL(url=f"data:{media_type};base64,{source.data}"))
    if isinstance(source, anthropic.URLSource):
        return openai.ImagePart(image_url=openai.ImageURL(url=source.url))
    raise _no_file(source, where)


def _pdf_text(data: str, where: str, clock: Callable[[], float]) -> str:
    try:
        raw = binascii.a2b_base64(data, strict_mode=True)  # decoded anyway: checked as is_base64 would
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where}.source.data: {INVALID_BASE64}") from None
    return pdf_text(raw, where, clock)


def document_text(block: anthropic.DocumentBlock, where: str, clock: Callable[[], float]) -> str:
    """The document as text for a model (a PDF's read within a time budget, on `clock`)."""
    source = block.source
    if isinstance(source, anthropic.TextSource):
        body = source.data
    elif isinstance(source, anthropic.ContentSource):
        if isinstance(source.content, str):
            body = source.content
        else:
            texts = [item.get("text", "") for item in source.content if _is_item(item, "text")]
            body = "\n".join(texts)
    elif isinstance(source, anthropic.Base64Source):
        if source.media_type != "application/pdf":
            raise InvalidRequest(
                f"{where}.source.media_type: {source.media_type!r} is not supported for base64 documents; use application/pdf"
            )
        body = _pdf_text(source.data, where, clock)
    elif isinstance(source, anthropic.URLSource):
        raise InvalidRequest(
            f"{where}.source: URL documents are not fetched by this gateway (server.fetch_documents is off); "
            "send the document's content instead"
        )
    else:
        raise _no_file(source, where)
    return f"{document_head(block)}\n{body}\n</document>"


def document_head(block: anthropic.DocumentBlock) -> str:
    """The text that opens a document for the model: its title and context."""
    header = "<document"
    if block.title:
        header += f' title="{block.title}"'
    header += ">"
    return header + (f"\n<context>{block.context}</context>" if block.context else "")


def _is_item(item: Any, kind: str) -> bool:
    return isinstance(item, dict) and item.get("type") == kind


def content_with_images(block: anthropic.DocumentBlock) -> list[tuple[int, dict[str, Any]]] | None:
    """The text and image items of a `content` document that holds images, with their
    places; None for any other document, which goes to a model as text alone."""
    source = block.source
    if not (isinstance(source, anthropic.ContentSource) and isinstance(source.content, list)
            and any(_is_item(item, "image") for item in source.content)):  # fmt: skip
        return None
    return [
        (index, item) for index, item in enumerate(source.content) if _is_item(item, "image") or _is_item(item, "text")
    ]


def document_parts(
    block: anthropic.DocumentBlock, where: str, *, vision: bool | None, clock: Callable[[], float]
) -> list[openai.Part]:
    """A document as parts: its text, and the images a `content` source holds in their
    places, as image blocks would go (the text alone would drop them unsaid)."""
    items = content_with_images(block)
    if items is None:
        return [openai.TextPart(text=document_text(block, where, clock))]
    if vision is False:
        raise InvalidRequest(f"{where}.source.content: this model does not accept images (it has no vision capability)")
    parts: list[openai.Part] = [openai.TextPart(text=document_head(block))]
    for index, item in items:
        here = f"{where}.source.content.{index}"
        if item["type"] == "image":
            try:
                image = msgspec.convert(item, anthropic.ImageBlock)
            except msgspec.ValidationError as error:
                raise InvalidRequest(f"{here}: {error}") from None
            parts.append(image_part(image, here))
        else:
            parts.append(openai.TextPart(text=item.get("text", "")))
    parts.append(openai.TextPart(text="</document>"))
    return parts


# Base64 image data checked on the event loop up to this much per request (about 2 ms, see
# is_base64); past it, the request is translated in a thread, as one with a PDF is.
INLINE_IMAGE_CHARS = 4 * 1024 * 1024


def slow_to_translate(messages: list[anthropic.MessageParam]) -> bool:
    """Whether the request's translation is slow enough for a thread: a base64 PDF (text
    extraction: about a second per MB with pypdf) or more than INLINE_IMAGE_CHARS of base64
    images. A walk of the decoded blocks, cheaper than searching a large body's bytes."""
    image_chars = 0
    for block in _blocks_and_tool_result_items(messages):
        if isinstance(block, anthropic.DocumentBlock) and isinstance(block.source, anthropic.Base64Source):
            return True
        if isinstance(block, anthropic.ImageBlock) and isinstance(block.source, anthropic.Base64Source):
            image_chars += len(block.source.data)
    return image_chars > INLINE_IMAGE_CHARS


def _blocks_and_tool_result_items(messages: list[anthropic.MessageParam]) -> Iterator[object]:
    for message in messages:
        if isinstance(message.content, str):
            continue
        for block in message.content:
            if isinstance(block, anthropic.ToolResultBlock) and isinstance(block.content, list):
                yield from block.content
            else:
                yield block


def search_result_text(block: anthropic.SearchResultBlock) -> str:
    body = "\n".join(item.text for item in block.content)
    return f'<search_result source="{block.source}" title="{block.title}">\n{body}\n</search_result>'


def user_parts(
    blocks: list[anthropic.ContentBlockParam],
    where: str,
    *,
    vision: bool | None,
    clock: Callable[[], float],
    first_index: int = 0,
) -> list[openai.Part]:
    """Parts for the text, image, document and search-result blocks of a user turn
    (`first_index`: where `blocks` begin in the list `where` names, for error messages)."""
    parts: list[openai.Part] = []
    for index, block in enumerate(blocks, first_index):
        here = f"{where}.{index}"
        if isinstance(block, anthropic.TextBlock):
            parts.append(openai.TextPart(text=block.text))
        elif isinstance(block, anthropic.ImageBlock):
            if vision is False:
                raise InvalidRequest(f"{here}: this model does not accept images (it has no vision capability)")
            parts.append(image_part(block, here))
        elif isinstance(block, anthropic.DocumentBlock):
            parts.extend(document_parts(block, here, vision=vision, clock=clock))
        elif isinstance(block, anthropic.SearchResultBlock):
            parts.append(openai.TextPart(text=search_result_text(block)))
    return parts


def collapse(parts: list[openai.Part]) -> str | list[openai.Part]:
    """A plain string when every part is text: the form every chat template accepts."""
    if all(isinstance(part, openai.TextPart) for part in parts):
        return "\n\n".join(part.text for part in parts)  # type: ignore[union-attr]
    return parts


def _no_file(source: object, where: str) -> NotFound:
    """A file source still here: the gateway fills in every file it has before translating
    (dragoman.files.store), so this one names no file it has."""
    file_id = getattr(source, "file_id", "")
    return NotFound(f"{where}.source.file_id: no file {file_id!r}")

"""`slow_to_translate`: which requests are translated in a thread: those with a PDF (its
text extraction) or with more base64 image data than is checked on the event loop."""

from __future__ import annotations

import msgspec
import pytest

from dragoman.protocol import anthropic
from dragoman.translate.content import INLINE_IMAGE_CHARS, slow_to_translate

PDF = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="}}
TEXT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "application/pdf"}}
HALF = INLINE_IMAGE_CHARS // 2


def image(chars: int) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * chars}}


def in_tool_result(*blocks: dict) -> dict:
    return {"type": "tool_result", "tool_use_id": "t", "content": list(blocks)}


URL_IMAGE = {"type": "image", "source": {"type": "url", "url": "https://example.com/" + "a" * INLINE_IMAGE_CHARS}}


@pytest.mark.parametrize(
    "content, expected",
    [
        ("a PDF is application/pdf", False),  # the words are not a document
        ([{"type": "text", "text": "hi"}], False),
        ([TEXT], False),
        ([PDF], True),
        ([in_tool_result(TEXT)], False),
        ([in_tool_result(PDF)], True),
        ([{"type": "tool_result", "tool_use_id": "t", "content": "application/pdf"}], False),
        ([image(INLINE_IMAGE_CHARS)], False),
        ([image(INLINE_IMAGE_CHARS + 4)], True),
        ([image(HALF), in_tool_result(image(HALF))], False),
        ([image(HALF), in_tool_result(image(HALF + 4))], True),  # images of tool results count too
        ([URL_IMAGE], False),  # nothing to check
    ],
    ids=["words", "text", "text-document", "pdf", "text-in-tool-result", "pdf-in-tool-result", "tool-result-string",
         "images-at-the-bound", "images-past-it", "split-at-the-bound", "split-past-it", "url-image"],
)  # fmt: skip
def test_slow_to_translate(content: object, expected: bool) -> None:
    messages = msgspec.convert([{"role": "user", "content": content}], list[anthropic.MessageParam])
    assert slow_to_translate(messages) is expected


def test_images_are_counted_across_messages() -> None:
    turns = [
        {"role": "user", "content": [image(HALF + 4)]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [image(HALF)]},
    ]
    assert slow_to_translate(msgspec.convert(turns, list[anthropic.MessageParam]))

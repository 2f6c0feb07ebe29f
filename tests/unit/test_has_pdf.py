"""`has_pdf`: which requests have a PDF whose text extraction goes to a thread."""

from __future__ import annotations

import msgspec
import pytest

from dragoman.protocol import anthropic
from dragoman.translate.content import has_pdf

PDF = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="}}
TEXT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "application/pdf"}}


@pytest.mark.parametrize(
    "content, expected",
    [
        ("a PDF is application/pdf", False),  # the words are not a document
        ([{"type": "text", "text": "hi"}], False),
        ([TEXT], False),
        ([PDF], True),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [TEXT]}], False),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [PDF]}], True),
        ([{"type": "tool_result", "tool_use_id": "t", "content": "application/pdf"}], False),
    ],
)
def test_has_pdf(content: object, expected: bool) -> None:
    messages = msgspec.convert([{"role": "user", "content": content}], list[anthropic.MessageParam])
    assert has_pdf(messages) is expected

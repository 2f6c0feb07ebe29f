"""A PDF's text within fixed limits: pages, content to parse, time and text, each a 400
naming the field. A small file must not cost minutes (300 pages sharing one content
stream once took 49 s to read)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

from dragoman.core.errors import InvalidRequest
from dragoman.translate import pdf
from tests.support.samples import pdf_bytes, shared_stream_pdf

WHERE = "messages.0.content.0"


def _refused(raw: bytes, clock: Callable[[], float] = time.monotonic, max_text: int = pdf.MAX_TEXT) -> str:
    with pytest.raises(InvalidRequest) as caught:
        pdf.pdf_text(raw, WHERE, clock, max_text=max_text)
    assert caught.value.message.startswith(f"{WHERE}.source.data: ")
    return caught.value.message


def test_a_pdf_within_the_limits_is_read_page_by_page() -> None:
    assert pdf.pdf_text(pdf_bytes("one", "two"), WHERE, time.monotonic) == "[page 1]\none\n\n[page 2]\ntwo"


def test_more_pages_than_anthropic_accepts_are_refused_before_reading() -> None:
    assert "has 101 pages; at most 100" in _refused(pdf_bytes(*["x"] * 101))


def test_pages_that_share_a_large_content_stream_are_refused_before_parsing() -> None:
    raw = shared_stream_pdf(100, 2500)  # 100 pages of one 42 KB stream: 4.2 MB to parse, from 16 KB
    assert len(raw) < 20_000
    assert "draw more than 4 MiB of content" in _refused(raw)


def test_reading_stops_at_the_time_budget() -> None:
    ticks = itertools.count(0.0, pdf.TIME_BUDGET)  # each reading of the clock a budget later: no clock to race
    assert "took longer than 10 s" in _refused(shared_stream_pdf(2, 100), lambda: next(ticks))


def test_reading_stops_at_the_text_limit() -> None:
    assert "text is longer than 150" in _refused(shared_stream_pdf(2, 100), max_text=150)  # 200 x's, and more
    assert pdf.pdf_text(shared_stream_pdf(2, 100), WHERE, time.monotonic, max_text=100_000).count("x") == 200


def test_a_damaged_pdf_is_a_400() -> None:
    assert "could not read the PDF" in _refused(b"%PDF-1.4\nnot really")

"""A PDF's text, for models that read text only, within fixed limits.

pypdf parses a page's content stream whole, once per page that draws it, so a small
file can cost minutes: 300 pages sharing one stream of 2,000 operations took 49 s. What
is read is bounded before and while reading, and a PDF past a bound is a 400 naming it.
The caller runs this off the event loop (`core.offload`), and hands it the clock the time
budget is read on: translate/ reads no clock of its own."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from dragoman.core.errors import InvalidRequest

MAX_PAGES = 100  # as Anthropic's API
MAX_CONTENT = 4 * 1024 * 1024  # bytes of page content streams (each page's counted): pypdf parses about 1 MB/s
MAX_TEXT = 2 * 1024 * 1024  # characters of text extracted
TIME_BUDGET = 10.0  # seconds of reading; checked between drawing operations


class _OverBudget(Exception):
    """Raised from pypdf's visitors to stop a page's extraction part-way."""


def pdf_text(raw: bytes, where: str, clock: Callable[[], float], *, max_text: int = MAX_TEXT) -> str:
    """The text of the PDF `raw`, page by page; a 400 naming `where` when it cannot be
    read or is past a limit (`clock`, in seconds: how long reading took)."""
    try:
        from pypdf import PdfReader
    except ImportError:  # pragma: no cover - pypdf is a dependency
        raise InvalidRequest(f"{where}: PDF documents need the pypdf package") from None
    try:
        with _limits():
            reader = PdfReader(io.BytesIO(raw))
            pages = reader.pages
            _check_size(pages, where)
            texts = _texts(pages, where, clock, max_text)
    except InvalidRequest:
        raise
    except Exception as error:  # pypdf raises many types on a damaged file (PdfReadError, LimitReachedError, ...)
        raise InvalidRequest(f"{where}.source.data: could not read the PDF: {error}") from None
    return "\n\n".join(f"[page {n}]\n{text.strip()}" for n, text in enumerate(texts, 1))


def _check_size(pages: Any, where: str) -> None:
    """Pages and content past the limits, refused before any is parsed (decompressing is
    cheap; parsing is what costs)."""
    if len(pages) > MAX_PAGES:
        raise InvalidRequest(f"{where}.source.data: the PDF has {len(pages)} pages; at most {MAX_PAGES} are accepted")
    content = 0
    for page in pages:
        stream = page.get_contents()
        content += len(stream.get_data()) if stream is not None else 0
        if content > MAX_CONTENT:
            raise InvalidRequest(
                f"{where}.source.data: the PDF's pages draw more than {MAX_CONTENT // (1024 * 1024)} MiB of content; "
                "send fewer pages, or the text itself"
            )


def _texts(pages: Any, where: str, clock: Callable[[], float], max_text: int) -> list[str]:
    deadline = clock() + TIME_BUDGET
    size = 0

    def on_operation(*_: object) -> None:
        if clock() >= deadline:
            raise _OverBudget(f"reading the PDF's text took longer than {TIME_BUDGET:g} s")

    def on_text(text: str, *_: object) -> None:
        nonlocal size
        size += len(text)
        if size > max_text:
            raise _OverBudget(f"the PDF's text is longer than {max_text:,} characters")

    texts = []
    try:
        for page in pages:
            on_operation()
            texts.append(page.extract_text(visitor_operand_before=on_operation, visitor_text=on_text) or "")
    except _OverBudget as error:
        raise InvalidRequest(f"{where}.source.data: {error}; send fewer pages, or the text itself") from None
    return texts


def _limits() -> Any:
    """pypdf's own decompression limits lowered to MAX_CONTENT where it has them (7.0 on),
    for streams the size check does not see (forms a page draws)."""
    import contextlib

    import pypdf

    apply = getattr(pypdf, "apply_configuration", None)
    if apply is None:
        return contextlib.nullcontext()
    return apply(zlib_maximum_output_length=MAX_CONTENT + 1, lzw_maximum_output_length=MAX_CONTENT + 1,
                 run_length_maximum_output_length=MAX_CONTENT + 1)  # fmt: skip

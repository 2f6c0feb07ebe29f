"""What a file's first bytes show it to be, among the kinds a message can carry: a PDF, a
JPEG, PNG, GIF or WebP image (the image types Anthropic accepts), or text.

An upload's declared type is often no help: raw bytes sent without a name or a type (the
SDKs and curl make such uploads easily) are `application/octet-stream`, and a name whose
extension Python's `mimetypes` does not know (`.jsonl`) or maps wrongly (`.ts` as a video)
gets that type or a wrong one. A base64 image may also be labelled with another image type.

A table of magic bytes, not a library: five signatures are needed (the check of base64
images in `translate.content` uses them too). `filetype` (last released in 2022) knows no
text, the case that matters most here; `puremagic` brings a database of hundreds of
signatures for those five. Text is judged as `file(1)` does, roughly: it decodes, and holds
no control characters that text does not.

Sniffed where a file is used, not at upload: the metadata keeps the type the client gave (as
Anthropic's does), files stored before this are read the same, and the look is at HEAD bytes
of a file that is being read whole anyway.
"""

from __future__ import annotations

import codecs
import re

from dragoman.files.charsets import bom_encoding

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
PDF = "application/pdf"
TEXT = "text/plain"
TEXT_TYPES = (
    "text/plain",
    "text/markdown",
    "text/csv",
    "text/html",
    "application/json",
    "application/xml",
)  # besides text/*, read as text
HEAD = 4096  # the bytes looked at: a file is judged by its start, never read through

_SIGNATURES = ((b"%PDF-", PDF), (b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"),
               (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))  # fmt: skip
# Control characters text does not hold: all but whitespace, BEL, BS and ESC (terminal logs have those).
_NOT_TEXT = re.compile("[\x00-\x06\x0e-\x1a\x1c-\x1f]")


def image_type(head: bytes) -> str | None:
    """The image type (one of IMAGE_TYPES) that `head`, a file's first 12 bytes or more, shows."""
    kind = _signed(head)
    return kind if kind in IMAGE_TYPES else None


def sniffed_type(data: bytes) -> str | None:
    """PDF, an image type or `text/plain`, as the first HEAD bytes of `data` show; None for
    anything else. Text is UTF-8 (or UTF-16 with a byte order mark) holding no control
    characters but whitespace, BEL, BS and ESC: a NUL marks binary data."""
    return _signed(data) or (TEXT if _looks_like_text(data[:HEAD], complete=len(data) <= HEAD) else None)


def usable_type(declared: str, data: bytes) -> str:
    """The type a file is used as, in a message: the declared one when it is a type a
    message can carry and its bytes agree (or show nothing), else the type its bytes show
    (an `application/octet-stream` upload that is a PDF, a PNG labelled `image/jpeg`), else
    the declared one, which is then refused as it was. The declared type keeps its
    parameters (a text file's `charset`)."""
    detected = sniffed_type(data)
    if detected is None:
        return declared
    base = declared.partition(";")[0].strip().lower()
    agrees = base == detected if base in IMAGE_TYPES or base == PDF else detected == TEXT and is_text(base)
    return declared if agrees else detected


def is_text(media_type: str) -> bool:
    """Whether a (bare, lower-case) media type is read as text."""
    return media_type.startswith("text/") or media_type in TEXT_TYPES


def _signed(head: bytes) -> str | None:
    for signature, media_type in _SIGNATURES:
        if head.startswith(signature):
            return media_type
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _looks_like_text(head: bytes, *, complete: bool) -> bool:
    """Whether `head` decodes as UTF-8 (or, after its BOM, UTF-16) into text. `complete`: it is
    the whole file, else a character cut at its end is no fault."""
    try:
        text = codecs.getincrementaldecoder(bom_encoding(head) or "utf-8")().decode(head, final=complete)
    except UnicodeDecodeError:
        return False
    return _NOT_TEXT.search(text) is None

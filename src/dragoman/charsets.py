"""Text in the charset its sender declared: an upload's content type, a fetched document's."""

from __future__ import annotations


def decode_text(data: bytes, charset: str | None) -> str:
    """`data` read in `charset`, else as UTF-8, bad bytes replaced. A charset that is unknown,
    names no text encoding (`base64`, `zlib`, `rot13` are codecs too) or cannot replace bad
    bytes (`idna`) is read as UTF-8: the sender chose it, and it must never fail a request."""
    if charset:
        try:
            return data.decode(charset.strip().strip('"'), "replace")
        except (LookupError, UnicodeError, ValueError):
            pass
    return data.decode("utf-8", "replace")

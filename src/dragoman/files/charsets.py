"""Text in the charset its sender declared: an upload's content type, a fetched document's."""

from __future__ import annotations

import codecs

# A byte order mark names the encoding when the sender named none (UTF-16 text is unreadable
# as UTF-8); the codecs named here drop the mark.
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def decode_text(data: bytes, charset: str | None) -> str:
    """`data` read in `charset`, else in the encoding its byte order mark names, else as
    UTF-8, bad bytes replaced. A charset that is unknown, names no text encoding (`base64`,
    `zlib`, `rot13` are codecs too) or cannot replace bad bytes (`idna`) is as none: the
    sender chose it, and it must never fail a request."""
    if charset:
        try:
            return data.decode(charset.strip().strip('"'), "replace")
        except (LookupError, UnicodeError, ValueError):
            pass
    return data.decode(bom_encoding(data) or "utf-8", "replace")


def bom_encoding(data: bytes) -> str | None:
    """The encoding a byte order mark at the start of `data` names (UTF-8 or UTF-16), if any."""
    return next((name for bom, name in _BOMS if data.startswith(bom)), None)

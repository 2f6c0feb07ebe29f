"""charsets.decode_text: a sender's charset honoured, and never an error."""

from __future__ import annotations

import pytest

from dragoman.files.charsets import decode_text


@pytest.mark.parametrize(
    ("data", "charset", "expected"),
    [
        ("Café".encode("iso-8859-1"), "iso-8859-1", "Café"),
        ("Café".encode("utf-16"), '"utf-16"', "Café"),
        ("Café".encode(), None, "Café"),
        ("Café".encode(), "", "Café"),
        ("Café".encode(), "no-such-charset", "Café"),
        ("Café".encode(), "base64", "Café"),  # a codec, but no text encoding
        ("Café".encode(), "zlib", "Café"),
        ("Café".encode(), "idna", "Café"),  # refuses to replace bad bytes
        (b"bad \xff byte", "utf-8", "bad \ufffd byte"),
    ],
)
def test_text_is_read_in_the_declared_charset_else_utf8(data: bytes, charset: str | None, expected: str) -> None:
    assert decode_text(data, charset) == expected

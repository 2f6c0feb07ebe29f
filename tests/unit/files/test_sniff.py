"""sniff: what a file's first bytes show it to be, and the type a stored file is used as in a
message (its declared type where that fits its bytes, else the type its bytes show)."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest

from dragoman.core.config import FilesConfig
from dragoman.core.errors import InvalidRequest
from dragoman.files.charsets import decode_text
from dragoman.files.sniff import HEAD, image_type, sniffed_type, usable_type
from dragoman.files.store import FileStore
from tests.support.samples import pdf_bytes

PNG = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + b"\0" * 16
JPEG = b"\xff\xd8\xff\xe0\0\x10JFIF\0" + b"\0" * 16
GIF = b"GIF89a\x01\0\x01\0\x80\0\0" + b"\0" * 16
GIF87 = b"GIF87a\x01\0\x01\0\x80\0\0"
WEBP = b"RIFF\x24\0\0\0WEBPVP8 " + b"\0" * 16
PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n"
UTF8 = "Café notes: naïve, 日本語, emoji 🙂\n".encode()
JSONL = b'{"a": 1}\n{"b": 2}\n'
UTF16 = "Café notes\r\n".encode("utf-16")  # with its byte order mark (little-endian here)
UTF16_BE = b"\xfe\xff" + "Café notes".encode("utf-16-be")
UTF8_BOM = b"\xef\xbb\xbf" + "Café".encode()
ANSI_LOG = b"\x1b[31mred\x1b[0m\tdone\x07\x08\r\n\x0c"  # ESC, BEL, BS, FF: terminal output is still text
ZIP = b"PK\x03\x04\x14\0\0\0\x08\0"
NUL_TEXT = b"looks like text\0but has a NUL"
CONTROL = b"text with a \x01 in it"
LATIN1 = "Café".encode("latin-1")  # not UTF-8: judged no text (its declared charset still reads it)
UTF16_NO_BOM = "Café".encode("utf-16-le")  # NULs between ASCII letters
CUT = b"a" + ("é" * HEAD).encode()  # valid UTF-8 whose look ends within a character: no fault
BINARY_LATER = b"a" * HEAD + b"\0\x01\x02"  # binary past the bytes looked at: judged by its start


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (PDF, "application/pdf"), (PNG, "image/png"), (JPEG, "image/jpeg"), (GIF, "image/gif"), (GIF87, "image/gif"),
        (WEBP, "image/webp"), (UTF8, "text/plain"), (JSONL, "text/plain"), (UTF16, "text/plain"), (UTF16_BE, "text/plain"),
        (UTF8_BOM, "text/plain"), (ANSI_LOG, "text/plain"), (b"x", "text/plain"), (CUT, "text/plain"),
        (BINARY_LATER, "text/plain"),
        (ZIP, None), (NUL_TEXT, None), (CONTROL, None), (LATIN1, None), (UTF16_NO_BOM, None), (b"\x00\x01", None),
        (b"RIFF\x24\0\0\0WAVEfmt ", None), (UTF8[:-3], None),  # a cut character at the very end of a file is a fault
    ],
)  # fmt: skip
def test_the_first_bytes_show_the_type(data: bytes, expected: str | None) -> None:
    assert sniffed_type(data) == expected


@pytest.mark.parametrize(
    ("head", "expected"), [(PNG[:12], "image/png"), (WEBP[:12], "image/webp"), (PDF, None), (UTF8, None)]
)
def test_image_type_names_images_only(head: bytes, expected: str | None) -> None:
    assert image_type(head) == expected


@pytest.mark.parametrize(
    ("data", "declared", "used_as"),
    [
        # nothing declared, or nothing usable: the bytes decide
        (PDF, "application/octet-stream", "application/pdf"),
        (PNG, "application/octet-stream", "image/png"),
        (JPEG, "application/octet-stream", "image/jpeg"),
        (GIF, "application/octet-stream", "image/gif"),
        (WEBP, "application/octet-stream", "image/webp"),
        (UTF8, "application/octet-stream", "text/plain"),
        (UTF16, "application/octet-stream", "text/plain"),
        (JSONL, "application/octet-stream", "text/plain"),  # .jsonl: unknown to mimetypes
        (b"const a: number = 1;\n", "video/mp2t", "text/plain"),  # .ts: a video to mimetypes
        (PDF, "binary/octet-stream", "application/pdf"),
        # a specific type the bytes agree with is kept, with its parameters
        (PDF, "application/pdf", "application/pdf"),
        (PNG, "image/png", "image/png"),
        (UTF8, "text/markdown; charset=utf-8", "text/markdown; charset=utf-8"),
        (JSONL, "application/json", "application/json"),
        (UTF16, "text/plain; charset=utf-16", "text/plain; charset=utf-16"),
        # ... and one they contradict is not
        (PNG, "image/jpeg", "image/png"),
        (PDF, "text/plain", "application/pdf"),
        (UTF8, "application/pdf", "text/plain"),
        # bytes that show nothing leave the declared type, to be used or refused as it is
        (LATIN1, "text/plain; charset=iso-8859-1", "text/plain; charset=iso-8859-1"),
        (UTF16_NO_BOM, "text/plain; charset=utf-16-le", "text/plain; charset=utf-16-le"),
        (ZIP, "application/octet-stream", "application/octet-stream"),
        (ZIP, "application/zip", "application/zip"),
        (b"\xff\xd8garbage", "image/jpeg", "image/jpeg"),
    ],
)  # fmt: skip
def test_the_type_a_file_is_used_as(data: bytes, declared: str, used_as: str) -> None:
    assert usable_type(declared, data) == used_as


@pytest.mark.parametrize(
    ("data", "charset", "expected"),
    [
        (UTF16, None, "Café notes\r\n"),
        (UTF16_BE, None, "Café notes"),
        (UTF8_BOM, None, "Café"),
        (UTF8_BOM, "no-such", "Café"),
    ],
)
def test_a_byte_order_mark_names_the_encoding_when_none_is_declared(
    data: bytes, charset: str | None, expected: str
) -> None:
    assert decode_text(data, charset) == expected


def source_of(files: FileStore, block_type: str, data: bytes, declared: str) -> dict:
    """The source a block of `block_type` naming an upload of `data` declared as `declared` gets."""

    async def main() -> dict:
        meta = await files.save("", declared, data, owner="")
        raw = json.dumps(
            {
                "messages": [
                    {"role": "user", "content": [{"type": block_type, "source": {"type": "file", "file_id": meta.id}}]}
                ]
            }
        )
        resolved = json.loads(await files.resolve(raw.encode(), 10**9, owner=""))
        assert files.metadata(meta.id, owner="").mime_type == declared  # reported as uploaded, as Anthropic does
        return resolved["messages"][0]["content"][0]["source"]

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("block_type", "data", "declared", "expected"),
    [
        ("document", PDF, "application/octet-stream", {"type": "base64", "media_type": "application/pdf"}),
        ("image", PNG, "application/octet-stream", {"type": "base64", "media_type": "image/png"}),
        ("image", JPEG, "application/octet-stream", {"type": "base64", "media_type": "image/jpeg"}),
        ("image", PNG, "image/jpeg", {"type": "base64", "media_type": "image/png"}),  # as an upstream would not refuse it
        ("document", UTF8, "application/octet-stream", {"type": "text", "media_type": "text/plain", "data": UTF8.decode()}),
        ("document", UTF16, "application/octet-stream", {"type": "text", "media_type": "text/plain", "data": "Café notes\r\n"}),
        ("document", JSONL, "video/mp2t", {"type": "text", "media_type": "text/plain", "data": JSONL.decode()}),
    ],
)  # fmt: skip
def test_a_stored_file_is_filled_in_by_what_its_bytes_show(tmp_path: Path, block_type: str, data: bytes, declared: str,
                                                          expected: dict) -> None:  # fmt: skip
    source = source_of(FileStore(FilesConfig(dir=str(tmp_path / "files"))), block_type, data, declared)
    assert {name: source[name] for name in expected} == expected
    if source["type"] == "base64":
        assert base64.b64decode(source["data"]) == data


@pytest.mark.parametrize(
    ("block_type", "data"), [("document", ZIP), ("document", NUL_TEXT), ("image", UTF8), ("image", PDF)]
)
def test_bytes_that_show_nothing_usable_are_still_refused(tmp_path: Path, block_type: str, data: bytes) -> None:
    with pytest.raises(InvalidRequest, match=r"messages\.0\.content\.0\.source\.file_id"):
        source_of(FileStore(FilesConfig(dir=str(tmp_path / "files"))), block_type, data, "application/octet-stream")


def test_a_real_pdf_uploaded_as_octet_stream_is_a_pdf(tmp_path: Path) -> None:
    pdf = pdf_bytes("sniffed")
    source = source_of(FileStore(FilesConfig(dir=str(tmp_path / "files"))), "document", pdf, "application/octet-stream")
    assert source["media_type"] == "application/pdf"

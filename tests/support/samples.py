"""Sample inputs several test modules need: a PDF with text, a PDF slow to read, a tiny
PNG, a self-signed certificate, a gzip bomb."""

from __future__ import annotations

import subprocess
import zlib
from pathlib import Path

MiB = 1024 * 1024
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)  # a 1x1 PNG


def gzip_bomb(mib: int, fill: bytes = b"\0", *, prefix: bytes = b"") -> bytes:
    """A gzip stream of `prefix` then `mib` MiB of `fill`, without its end (readers fail
    long before it would matter), built in milliseconds: after a full flush each MiB
    compresses to the same bytes, which are repeated. 1024 MiB is about 1 MB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = fill * (MiB // len(fill))
    first = packer.compress(prefix) + packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    assert packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH) == again
    return first + again * (mib - 1)


def pdf_bytes(*pages: str) -> bytes:
    """A minimal PDF with one line of Helvetica text per page, built by hand (pypdf's
    PdfWriter has no public API to draw text)."""
    count = len(pages)
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(count))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, line in enumerate(pages):
        content = f"BT /F1 12 Tf 20 100 Td ({line}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    return _pdf(objects)


def shared_stream_pdf(pages: int, operations: int) -> bytes:
    """A small PDF that is slow to read: `pages` pages that all draw one compressed content
    stream of `operations` text operations, so a reader parses it once per page."""
    content = zlib.compress(b"BT /F1 12 Tf " + b"20 100 Td (x) Tj " * operations + b"ET", 9)
    kids = " ".join(f"{5 + i} 0 R" for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream",
    ]
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>"
    return _pdf(objects + [page] * pages)


def _pdf(objects: list[bytes]) -> bytes:
    """A PDF file of `objects` (numbered from 1; the first is the catalog) and their cross-reference table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, obj in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) for CN=`name`, valid for IP 127.0.0.1, made with openssl."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key

"""`is_base64`: image data checked throughout without decoding it, as a strict decode would
judge it (and stricter where that decode lets superfluous padding by)."""

from __future__ import annotations

import base64
import binascii

import pytest

from dragoman.translate.content import is_base64

LONG = base64.b64encode(bytes(range(256)) * 1000).decode()  # 341,336 characters: several slices


@pytest.mark.parametrize(
    "data",
    ["", "QQ==", "QUI=", "QUJD", "+/+/", LONG, base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()],
)
def test_valid(data: str) -> None:
    assert is_base64(data)
    binascii.a2b_base64(data, strict_mode=True)  # the reference agrees


@pytest.mark.parametrize(
    "data",
    [
        "QQ", "QQ=", "QUJDR", "Q===", "====", "QQ==QQ==", "Q=Q=", "=QQQ", "QUJD====",
        "QU J", "QU\nJ", "QUJ-", "QUJ_", "QUJé", "QUJ\x00",
        LONG[:65536] + "%" + LONG[65537:],  # on a slice boundary
        LONG[:65535] + "%" + LONG[65536:],
        LONG[:-3] + "=" + LONG[-2:],  # padding before the end
        LONG[:100_000] + "\n" + LONG[100_001:],
        LONG + "\n",
    ],
)  # fmt: skip
def test_invalid(data: str) -> None:
    assert not is_base64(data)

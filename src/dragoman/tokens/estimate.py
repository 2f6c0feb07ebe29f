"""Token counts when nothing better can answer: about four characters a token over
everything the translated request sends (system prompt, texts, documents as text,
tool calls and results, tool schemas), and images by Anthropic's size formula."""

from __future__ import annotations

import base64
import binascii
import math
import struct

import msgspec

from dragoman.protocol import openai

IMAGE_TOKENS_MAX = 1600  # what Anthropic charges at most for one image
LONG_EDGE = 1568  # larger images are scaled down to this first


def image_tokens(width: int, height: int) -> int:
    """Anthropic's estimate: (width x height) / 750, after scaling the long edge to 1568."""
    scale = min(1.0, LONG_EDGE / max(width, height, 1))
    return min(IMAGE_TOKENS_MAX, max(1, math.ceil(width * scale * height * scale / 750)))


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) read from a PNG, GIF, WebP or JPEG header, without decoding it."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8X":
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if chunk == b"VP8L":
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        if chunk == b"VP8 ":
            return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
    if data[:2] == b"\xff\xd8":
        at = 2
        while at + 9 < len(data):
            if data[at] != 0xFF:
                return None
            marker, length = data[at + 1], int.from_bytes(data[at + 2 : at + 4], "big")
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                height, width = struct.unpack(">HH", data[at + 5 : at + 9])
                return width, height
            at += 2 + length
    return None


IMAGE_HEAD_CHARS = 128 * 1024  # base64 of the first 96 KiB: past any EXIF block a JPEG's size follows


def _image_part_tokens(url: str) -> int:
    if url.startswith("data:") and "," in url:
        data = url[url.index(",") + 1 : url.index(",") + 1 + IMAGE_HEAD_CHARS]  # not the whole image: 4 ms a MB
        try:
            size = image_size(base64.b64decode(data[: len(data) - len(data) % 4], validate=False))
        except (binascii.Error, ValueError):
            size = None
        if size:
            return image_tokens(*size)
    return IMAGE_TOKENS_MAX  # a URL, or a format we cannot read: the most it can cost


def count_estimate(chat: openai.ChatRequest) -> int:
    chars, images = 0, 0
    for message in chat.messages:
        content = getattr(message, "content", None)
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, openai.TextPart):
                    chars += len(part.text)
                else:
                    images += _image_part_tokens(part.image_url.url)
        for call in getattr(message, "tool_calls", None) or ():
            chars += len(call.function.name) + len(call.function.arguments)
    if chat.tools:
        chars += len(msgspec.json.encode(chat.tools))
    return max(1, (chars + 3) // 4 + images)


def completion_estimate(message: openai.ResponseMessage) -> int:
    """Output tokens of a reply whose server reported no usage, by the same measure."""
    chars = sum(
        len(text) for text in (message.content, message.reasoning or message.reasoning_content, message.refusal) if text
    )
    for call in message.tool_calls or ():
        if call.function is not None:
            arguments = call.function.arguments
            chars += len(call.function.name or "") + len(
                arguments if isinstance(arguments, str) else msgspec.json.encode(arguments)
            )
    return max(1, (chars + 3) // 4)

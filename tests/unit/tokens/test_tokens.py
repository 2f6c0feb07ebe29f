"""The estimate used when neither the upstream nor a tokenizer can count."""

import base64
import struct

import pytest

from dragoman.protocol import openai
from dragoman.tokens.estimate import (
    IMAGE_TOKENS_MAX,
    count_estimate,
    image_size,
    image_tokens,
)


def _png(width: int, height: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR" + struct.pack(">II", width, height) + b"\x08\x06\x00\x00\x00"


def _jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + (16).to_bytes(2, "big") + b"JFIF\x00" + b"\x00" * 9
    sof = b"\xff\xc0" + (17).to_bytes(2, "big") + b"\x08" + struct.pack(">HH", height, width) + b"\x03" + b"\x00" * 9
    return b"\xff\xd8" + app0 + sof


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (_png(640, 480), (640, 480)),
        (b"GIF89a" + struct.pack("<HH", 32, 16), (32, 16)),
        (_jpeg(1024, 768), (1024, 768)),
        (
            b"RIFF\x00\x00\x00\x00WEBPVP8X" + b"\x00" * 8 + (99).to_bytes(3, "little") + (49).to_bytes(3, "little"),
            (100, 50),
        ),
        (b"not an image", None),
    ],
)
def test_image_sizes_from_headers(data, size):
    assert image_size(data) == size


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [(200, 200, 54), (1000, 1000, 1334), (1092, 1092, 1590), (4000, 3000, IMAGE_TOKENS_MAX)],
)
def test_anthropic_image_formula(width, height, tokens):
    assert image_tokens(width, height) == tokens


def test_estimate_counts_every_part_of_the_translated_request():
    png = base64.b64encode(_png(200, 200)).decode()
    chat = openai.ChatRequest(
        model="m",
        messages=[
            openai.SystemMessage(content="x" * 40),
            openai.UserMessage(
                content=[
                    openai.TextPart(text="y" * 40),
                    openai.ImagePart(image_url=openai.ImageURL(url=f"data:image/png;base64,{png}")),
                ]
            ),
            openai.AssistantMessage(
                tool_calls=[openai.ToolCall(id="t", function=openai.FunctionCall(name="abcd", arguments="e" * 36))]
            ),
            openai.ToolMessage(tool_call_id="t", content="z" * 40),
            openai.UserMessage(content=[openai.ImagePart(image_url=openai.ImageURL(url="https://example.com/a.png"))]),
        ],
    )
    assert count_estimate(chat) == 160 // 4 + 54 + IMAGE_TOKENS_MAX

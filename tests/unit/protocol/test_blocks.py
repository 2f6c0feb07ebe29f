"""protocol.blocks: what a prompt's messages hold, read with every block's `content` left
undecoded until the scan needs its blocks, and as strict as a read of everything at once."""

from __future__ import annotations

import json

import pytest

from dragoman.protocol import anthropic, blocks

URL = {"type": "url", "url": "http://169.254.169.254/x.png"}
PNG = {"type": "base64", "media_type": "image/png", "data": "AAAA"}


def seen(*content: object) -> tuple[bool, bool]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": list(content)}]}).encode()
    whole, read = blocks.read_body(body), blocks.read(anthropic.ENVELOPE.decode(body))
    assert whole == read  # from the body, or from the envelope's messages
    return whole.images, whole.url_images


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ([{"type": "tool_result", "tool_use_id": "t", "content": "an image: " * 1000}], (False, False)),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": PNG}]}], (True, False)),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": URL}]}], (True, True)),
        (
            [{"type": "document", "source": {"type": "content", "content": [{"type": "image", "source": URL}]}}],
            (False, True),
        ),  # fmt: skip
        ([{"type": "image", "source": PNG}, {"type": "text", "text": "t"}], (True, False)),
        ([{"type": "tool_result", "tool_use_id": "t", "content": None}], (False, False)),
    ],
)
def test_what_the_blocks_hold(content: list[object], expected: tuple[bool, bool]) -> None:
    assert seen(*content) == expected


@pytest.mark.parametrize("bad", [5, {"type": "text"}, [5], [{"type": "text", "content": 5}]])
def test_a_part_that_is_not_blocks_fails_the_read_wherever_it_is(bad: object) -> None:
    image = {"type": "image", "source": PNG}
    assert seen(image, {"type": "tool_result", "tool_use_id": "t", "content": bad}) == (False, True)
    assert seen(image, {"type": "text", "text": "t", "content": bad}) == (False, True)  # checked, though not used

"""backends.images.may_have_url_images: the check every request pays, exact on what a
model server would read (escapes decoded), nested images included; from the body, or from
the messages the core read already (`Envelope`)."""

from __future__ import annotations

import json

import msgspec
import pytest

from dragoman.backends.images import may_have_url_images
from dragoman.protocol import anthropic, blocks
from dragoman.routes.shape import Shape, routed_envelope

URL = {"type": "url", "url": "http://169.254.169.254/x.png"}


def check(raw: bytes, read: bool) -> bool:
    return may_have_url_images(raw, anthropic.ENVELOPE.decode(raw) if read else None)


def body(*blocks: object) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": list(blocks)}]}).encode()


@pytest.mark.parametrize(
    "raw",
    [
        body({"type": "image", "source": URL}),
        body({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": URL}]}),
        body({"type": "document", "source": {"type": "content", "content": [{"type": "image", "source": URL}]}}),
        body({"type": "image", "source": URL}).replace(b'"url"', b'"\\u0075rl"', 1),  # escaped: still "url"
        body({"type": "image", "source": URL}).replace(b'"image"', b'"\\u0069mage"', 1),
    ],
)
@pytest.mark.parametrize("read", [False, True])
def test_an_image_given_by_url_is_found_however_it_is_spelled_or_nested(raw: bytes, read: bool) -> None:
    assert check(raw, read)


@pytest.mark.parametrize(
    "raw",
    [
        body({"type": "text", "text": 'an "image" with a "url" and \\u escapes'}),
        body({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}),
        body({"type": "document", "source": URL}),  # a URL document: fetch_documents' business
        json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "Hello"}],
                "tools": [{"name": "fetch", "input_schema": {"properties": {"url": {"type": "string"}}}}],
            }
        ).encode(),  # fmt: skip
    ],
)
@pytest.mark.parametrize("read", [False, True])
def test_no_image_url_means_no_fetch(raw: bytes, read: bool) -> None:
    assert not check(raw, read)


def test_a_body_of_another_shape_is_looked_through_whole() -> None:
    assert may_have_url_images(b'{"messages": [{"content": [42]}]}')
    assert check(b'{"model": "m", "messages": [{"content": [42]}]}', read=True)


def test_the_messages_a_route_read_are_not_read_again():
    raw = json.dumps(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": URL}]}]}
    ).encode()
    envelope = msgspec.json.decode(raw, type=routed_envelope(()))
    assert Shape("m", {}, raw, read=envelope).images  # the route's read, kept on the envelope
    kept = vars(envelope)["blocks"]
    assert blocks.read(envelope) is kept and may_have_url_images(raw, envelope)

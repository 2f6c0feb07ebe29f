"""Fuzz-style: hostile upstream replies, as raw bytes, each answered with Anthropic's
envelope in bounded memory and time (never a 500, a traceback or a hang), the gateway
serving on after each. The cases: a head that never ends (its value, or its count of
headers), a folded reply that never ends (its text, or a tool call's arguments), a
reply's head or body replaced by seeded random bytes."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator

import httpx
import pytest

from dragoman.backends.shared import Shared
from tests.support.fakes import chunk
from tests.support.hostile import HostileUpstream
from tests.support.samples import MiB

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"  # a stream ended by the close
ASK = {"model": "test-model", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}],
       "stop_sequences": ["###"]}  # fmt: skip  # stop sequences: the stream is folded for a non-streaming reply


def _event(delta: dict) -> bytes:
    return b"data: " + json.dumps(chunk(delta)).encode() + b"\n\n"


def endless_header_value() -> Iterator[bytes]:
    yield b"HTTP/1.1 200 OK\r\nx-endless: "
    yield from (b"v" * 65536 for _ in range(1024))  # 64 MiB, were it all read


def endless_headers() -> Iterator[bytes]:
    yield b"HTTP/1.1 200 OK\r\n"
    yield from (b"x-h%d: v\r\n" % n for n in range(1_000_000))


def endless_text() -> Iterator[bytes]:
    yield HEAD + _event({"role": "assistant", "content": ""})
    piece = _event({"content": "x" * 4096})
    yield from (piece * 16 for _ in range(1024))  # 64 MiB of text, were it all read


def endless_arguments() -> Iterator[bytes]:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": "'}}
    yield HEAD + _event({"role": "assistant", "content": None, "tool_calls": [call]})
    piece = _event({"tool_calls": [{"index": 0, "function": {"arguments": "x" * 4096}}]})
    yield from (piece * 16 for _ in range(1024))


def random_head() -> Iterator[bytes]:
    yield random.Random(1).randbytes(8192)


def random_body() -> Iterator[bytes]:
    noise = random.Random(2)
    yield HEAD
    yield from (noise.randbytes(65536) for _ in range(64))


CASES: list[tuple[Callable[[], Iterator[bytes]], int, str]] = [
    (endless_header_value, 502, "head exceeds 64 KB"),
    (endless_headers, 502, "head exceeds 64 KB"),
    (endless_text, 502, "longer than 1 MiB"),
    (endless_arguments, 502, "longer than 1 MiB"),
    (random_head, 502, "unreadable HTTP"),
    (random_body, 502, "upstream default"),
]


@pytest.mark.parametrize(("answer", "status", "words"), CASES, ids=[case[0].__name__ for case in CASES])
def test_a_hostile_reply_is_an_envelope_and_the_gateway_serves_on(make_gateway, answer, status, words):
    hostile = HostileUpstream(answer).start()
    try:
        gateway = make_gateway(url=hostile.url, models=[{"name": "test-model", "upstream": "default"}],
                               shared=Shared(max_folded=MiB))  # 64 MiB in earnest: the same path, a shorter run  # fmt: skip
        response = httpx.post(f"{gateway.url}/v1/messages", json=ASK, headers={"x-api-key": "k"}, timeout=30)
        assert response.status_code == status, response.text
        body = response.json()
        assert body["type"] == "error" and body["error"]["type"] == "api_error"
        assert words in body["error"]["message"]
        assert hostile.sent < 16 * MiB  # the gateway stopped reading long before the end
        assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200
    finally:
        hostile.stop()

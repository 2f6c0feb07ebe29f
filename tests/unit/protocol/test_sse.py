"""SSE: decoding upstream `data:` frames across arbitrary byte splits; encoding
Anthropic events with the `event:` line the SDKs dispatch on."""

from __future__ import annotations

import json

import pytest

from dragoman.protocol import anthropic as a
from dragoman.protocol import sse
from dragoman.protocol.sse import DataDecoder

CHUNK_1 = {"id": "c1", "choices": [{"index": 0, "delta": {"content": "héllo 世界 🙂"}, "finish_reason": None}]}
CHUNK_2 = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def frames(line_end: bytes) -> bytes:
    parts = [
        b": keep-alive",
        b"",
        b"data: " + json.dumps(CHUNK_1, ensure_ascii=False).encode(),
        b"",
        b"event: ignored",
        b"id: 7",
        b"data:" + json.dumps(CHUNK_2).encode(),  # no space after the colon
        b"",
        b": another comment",
        b"data: [DONE]",
        b"",
        b"",
    ]
    return line_end.join(parts)


EXPECTED = [json.dumps(CHUNK_1, ensure_ascii=False).encode(), json.dumps(CHUNK_2).encode(), b"[DONE]"]


def decode(pieces: list[bytes]) -> list[bytes]:
    decoder = DataDecoder()
    out: list[bytes] = []
    for piece in pieces:
        out += decoder.feed(piece)
    return out + decoder.flush()


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_whole_stream(line_end: bytes) -> None:
    assert decode([frames(line_end)]) == EXPECTED


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_every_split_point(line_end: bytes) -> None:
    """Network reads cut anywhere: inside `data:`, inside a CRLF, inside a UTF-8 character."""
    sample = frames(line_end)
    for i in range(len(sample) + 1):
        assert decode([sample[:i], sample[i:]]) == EXPECTED, i


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_one_byte_at_a_time(line_end: bytes) -> None:
    sample = frames(line_end)
    assert decode([sample[i : i + 1] for i in range(len(sample))]) == EXPECTED


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_one_event_per_read(line_end: bytes) -> None:
    """How tokens arrive from a real model: each read one whole event (a fast path)."""
    events = [event + line_end + line_end for event in frames(line_end).split(line_end + line_end) if event]
    assert len(events) == 4
    assert decode(events) == EXPECTED
    assert decode([b"data:   \n\n", b"data: x\n\n"]) == [b"x"]  # an empty payload is skipped either way
    assert decode([b"data: a", b"\n\n"]) == [b"a"]  # the fast path never skips what a previous read left


def test_payloads_are_valid_utf8_json() -> None:
    sample = frames(b"\n")
    payloads = decode([sample[i : i + 3] for i in range(0, len(sample), 3)])
    assert json.loads(payloads[0])["choices"][0]["delta"]["content"] == "héllo 世界 🙂"


def test_last_line_without_newline_is_delivered_by_flush() -> None:
    decoder = DataDecoder()
    assert decoder.feed(b'data: {"a":1}\n\ndata: {"b":2}') == [b'{"a":1}']
    assert decoder.flush() == [b'{"b":2}']
    assert decoder.flush() == []


@pytest.mark.parametrize(
    "noise", [b": ping\n\n", b"data:\n\n", b"data:   \n\n", b"event: message\n\n", b"retry: 3000\n\n", b"\n\n\n"]
)
def test_lines_without_a_payload_are_skipped(noise: bytes) -> None:
    assert decode([noise + b'data: {"x":1}\n\n']) == [b'{"x":1}']


EVENTS: list[a.StreamEvent] = [
    a.MessageStart(
        message=a.Message(
            id="msg_1",
            model="m",
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=a.Usage(input_tokens=3, output_tokens=0),
        )
    ),  # fmt: skip
    a.ContentBlockStart(index=0, content_block=a.OutTextBlock(text="")),
    a.ContentBlockDelta(index=0, delta=a.TextDelta(text='line\nbreak "quoted" é')),
    a.ContentBlockStop(index=0),
    a.ContentBlockStart(index=1, content_block=a.OutToolUseBlock(id="toolu_1", name="f", input={})),
    a.ContentBlockDelta(index=1, delta=a.InputJSONDelta(partial_json='{"a": ')),
    a.ContentBlockStop(index=1),
    a.Ping(),
    a.MessageDelta(
        delta=a.MessageDeltaBody(stop_reason="tool_use", stop_sequence=None),
        usage=a.MessageDeltaUsage(input_tokens=3, output_tokens=5),
    ),  # fmt: skip
    a.MessageStop(),
]


@pytest.mark.parametrize("event", EVENTS, ids=[type(e).__name__ for e in EVENTS])
def test_every_event_is_one_named_frame(event: a.StreamEvent) -> None:
    frame = sse.encode(event)
    assert frame.endswith(b"\n\n") and frame.count(b"\n\n") == 1
    name_line, data_line = frame[:-2].split(b"\n")
    data = json.loads(data_line.removeprefix(b"data: "))
    assert name_line == b"event: " + data["type"].encode()


def test_encode_all_is_the_frames_in_order() -> None:
    assert sse.encode_all(EVENTS) == b"".join(sse.encode(e) for e in EVENTS)
    assert sse.encode_all([]) == b""


def test_ping_constant_is_a_valid_ping_frame() -> None:
    assert sse.PING == sse.encode(a.Ping())


def test_a_line_arriving_in_many_pieces_is_whole_and_each_piece_is_kept_not_recopied() -> None:
    decoder = DataDecoder()
    payload = b'{"choices": [{"delta": {"content": "' + b"x" * 10_000 + b'"}}]}'
    line = b"data: " + payload + b"\n\n"
    out: list[bytes] = []
    for start in range(0, len(line), 7):
        out += decoder.feed(line[start : start + 7])
    assert out == [payload]


def test_a_line_longer_than_the_limit_is_the_upstreams_failure() -> None:
    from dragoman.core.errors import UpstreamError

    decoder = DataDecoder(max_line=1000)
    decoder.feed(b"data: " + b"y" * 600)
    with pytest.raises(UpstreamError, match="longer than"):
        decoder.feed(b"y" * 600)

"""The gateway's note on a reply whose tools the model never saw: added once, as a block of its
own after the model's, and taken out again when a client sends it back (notices/tools_dropped)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import msgspec
import pytest

from dragoman.calls.types import Call, Completed, Outcome, Streaming
from dragoman.notices.tools_dropped import MARK, NOTE, note_events, noted, wants_note, without_notes
from tests.support.servers import sse_frames

CLAUDE_CODE = {"user-agent": "claude-cli/2.1.332 (external, cli)"}
FIRST = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "read a.txt"}]}
STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    b'"content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":0}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":1}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
    b'"usage":{"output_tokens":1}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def call(body: dict | bytes, headers: dict[str, str] = CLAUDE_CODE, dropped: bool = True) -> Call:
    outcome = Outcome(request_id="req_1", endpoint="messages")
    outcome.tools_dropped = dropped
    raw = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    return Call(body=raw, model="m", upstream_model="m", headers=headers, request_id="req_1", stream=False,
                outcome=outcome)  # fmt: skip


def test_the_note_is_marked_as_the_gateways() -> None:
    assert NOTE.startswith(MARK) and "gateway" in MARK and "tools" in NOTE


def test_only_a_first_turn_whose_tools_were_dropped_gets_it_for_the_clients_asked_for() -> None:
    assert wants_note(call(FIRST), "claude-code")
    assert not wants_note(call(FIRST, dropped=False), "claude-code")
    assert not wants_note(call(FIRST), "off")
    assert not wants_note(call(FIRST, headers={"user-agent": "Anthropic/Python 0.75.0"}), "claude-code")
    assert wants_note(call(FIRST, headers={"user-agent": "Anthropic/Python 0.75.0"}), "all")
    later = {
        **FIRST,
        "messages": [*FIRST["messages"], {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}],
    }
    assert not wants_note(call(later), "all")
    assert not wants_note(call(json.dumps(later, indent=2).encode()), "all")  # "role": "assistant", spaced
    quoted = {**FIRST, "messages": [{"role": "user", "content": 'say "role":"assistant"'}]}  # inside a string
    assert wants_note(call(quoted), "all")


def test_a_whole_message_gets_it_as_its_last_block() -> None:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "Hi"}],
               "usage": {"input_tokens": 3, "output_tokens": 1}}  # fmt: skip
    reply = noted(Completed(json.dumps(message).encode()), call(FIRST), "claude-code")
    assert isinstance(reply, Completed)
    content = json.loads(reply.body)["content"]
    assert content == [{"type": "text", "text": "Hi"}, {"type": "text", "text": NOTE}]
    assert json.loads(reply.body)["usage"] == message["usage"]  # the model's count, untouched
    error = Completed(b'{"type":"error"}', status=400)
    assert noted(error, call(FIRST), "claude-code").body == b'{"type":"error"}'


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def _read(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
def test_a_stream_gets_it_as_a_block_before_message_delta_however_it_is_cut(size: int) -> None:
    reply = noted(Streaming(_chunks(STREAM, size)), call(FIRST), "claude-code")
    assert isinstance(reply, Streaming) and reply.direct is None
    frames = sse_frames(asyncio.run(_read(reply.chunks)).decode())
    names = [name for name, _ in frames]
    assert names[-5:] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    added = [data for _, data in frames[-5:-2]]
    assert {d["index"] for d in added} == {2}  # after the model's blocks 0 and 1
    assert added[1]["delta"] == {"type": "text_delta", "text": NOTE}
    assert asyncio.run(_read(noted(Streaming(_chunks(STREAM, size)), call(FIRST), "off").chunks)) == STREAM


def test_the_events_are_a_text_block() -> None:
    frames = sse_frames(note_events(0).decode())
    assert frames[0] == ("content_block_start", {"type": "content_block_start", "index": 0,
                                                 "content_block": {"type": "text", "text": ""}})  # fmt: skip


def test_a_note_sent_back_is_taken_out_wherever_it_is() -> None:
    request = {
        "model": "m", "max_tokens": 5, "system": "keep",
        "messages": [
            {"role": "user", "content": "read a.txt"},
            {"role": "assistant", "content": [{"type": "text", "text": "It says hi."}, {"type": "text", "text": NOTE}]},
            {"role": "user", "content": "and b.txt?"},
            {"role": "assistant", "content": [{"type": "text", "text": NOTE}]},  # the model said nothing else
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": f"done\n\n{NOTE}"}]},
            {"role": "assistant", "content": f"ok {NOTE}"},
        ],
    }  # fmt: skip
    cleaned = msgspec.json.decode(without_notes(json.dumps(request).encode()))
    assert MARK not in json.dumps(cleaned)
    assert cleaned["system"] == "keep" and cleaned["model"] == "m"
    assert cleaned["messages"] == [
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "content": [{"type": "text", "text": "It says hi."}]},
        {"role": "user", "content": "and b.txt?"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "done"}]},
        {"role": "assistant", "content": "ok"},
    ]


def test_a_body_without_a_note_is_passed_on_as_it_is() -> None:
    body = json.dumps(FIRST).encode()
    assert without_notes(body) is body
    assert without_notes(b'{"messages": [' + MARK.encode()) == b'{"messages": [' + MARK.encode()  # refused later

"""The stream hold (a stream transform): events pass as they come, the final message_delta
waits for the verdicts. Run here around a stream's chunks, as for a stream no pump reads; the
pump's own keep-alives meanwhile are tested through the gateway (tests/integration/test_safeguards.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from dragoman.calls.types import Streaming
from dragoman.safeguards.stream import hold
from tests.support.fake_anthropic import event

START = {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": []}}
EVENTS = [
    event("message_start", START),
    event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    event("content_block_stop", {"type": "content_block_stop", "index": 0}),
    event("content_block_start", {"type": "content_block_start", "index": 1,
                                  "content_block": {"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": {}}}),
    event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                  "delta": {"type": "input_json_delta", "partial_json": '{"command": '}}),
    event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                  "delta": {"type": "input_json_delta", "partial_json": '"ls"}'}}),
    event("content_block_stop", {"type": "content_block_stop", "index": 1}),
    event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 4}}),
    event("message_stop", {"type": "message_stop"}),
]  # fmt: skip


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _run(data: bytes, size: int) -> tuple[bytes, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    async def decide(message: dict[str, Any]) -> list[dict[str, Any]]:
        seen.append(message)
        return [{"type": "dangerous_tool_use", "status": {"type": "available", "tool_uses": {"toolu_x": {}}}}]

    async def main() -> bytes:
        reply = hold(Streaming(_chunks(data, size)), decide)
        return b"".join([chunk async for chunk in reply.chunks])

    return asyncio.run(main()), seen


def test_any_chunking_gives_the_same_events_with_the_results_in_the_last_delta() -> None:
    whole = b"".join(EVENTS)
    for size in (1, 7, 64, len(whole)):
        out, seen = _run(whole, size)
        frames = out.split(b"\n\n")[:-1]
        assert [f + b"\n\n" for f in frames[:7]] == EVENTS[:7] and frames[8] + b"\n\n" == EVENTS[8]
        delta = json.loads(frames[7].split(b"data: ", 1)[1])
        assert delta["delta"] == {"stop_reason": "tool_use", "safeguard_results": [
            {"type": "dangerous_tool_use", "status": {"type": "available", "tool_uses": {"toolu_x": {}}}}]}  # fmt: skip
        assert seen[-1]["content"][1] == {
            "type": "tool_use",
            "id": "toolu_x",
            "name": "Bash",
            "input": {"command": "ls"},
        }


def test_crlf_events_are_read_too() -> None:
    out, seen = _run(b"".join(EVENTS).replace(b"\n", b"\r\n"), 5)
    assert b"safeguard_results" in out and seen[-1]["stop_reason"] == "tool_use"


def test_a_stream_without_message_delta_is_passed_as_it_came() -> None:
    out, seen = _run(b"".join(EVENTS[:3]) + b"event: error\ndata: {", 4)
    assert out == b"".join(EVENTS[:3]) + b"event: error\ndata: {" and seen == []

"""The stream hold: a reply's events pass through as they come, but its final
`message_delta` waits until the verdicts are in, and then carries them as
`delta.safeguard_results` (as Anthropic's API sends them); pings keep the client's
connection alive meanwhile.

The one place a stream is held for safeguards: `hold` wraps the reply's chunks and turns
off direct writes (it must see every event). When the pump offers observer/transformer
hooks, this becomes one: it reads tool_use blocks as they go by, and transforms one event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from dragoman.calls.types import Streaming
from dragoman.protocol.sse import KEEPALIVE_COMMENT, PING

Decide = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]  # the message so far -> safeguard_results


def hold(reply: Streaming, decide: Decide, interval: float) -> Streaming:
    """`reply`, its final message_delta held for `decide`'s results (pings every `interval` s)."""
    reply.chunks = _held(reply.chunks, decide, interval)
    reply.direct = None  # every event goes through `_held`
    return reply


class _Watch:
    """The tool_use blocks of a stream, from its events (their input joined at the end)."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.pieces: dict[int, list[str]] = {}

    def see(self, event: bytes) -> None:
        if event.startswith(b"event: content_block_start"):
            data = _data(event)
            block = data.get("content_block") or {}
            self.blocks[int(data.get("index", 0))] = (
                dict(block) if block.get("type") == "tool_use" else {"type": "other"}
            )
        elif event.startswith(b"event: content_block_delta") and b"input_json_delta" in event:
            data = _data(event)
            self.pieces.setdefault(int(data.get("index", 0)), []).append(data["delta"].get("partial_json", ""))

    def message(self, stop_reason: str | None) -> dict[str, Any]:
        content = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.get("type") == "tool_use" and index in self.pieces:
                joined = "".join(self.pieces[index])
                try:
                    block["input"] = msgspec.json.decode(joined) if joined.strip() else {}
                except msgspec.DecodeError:  # cut short: not judged
                    block["input"], stop_reason = None, "max_tokens" if index == max(self.blocks) else stop_reason
            content.append(block)
        return {"content": content, "stop_reason": stop_reason}


def _data(event: bytes) -> dict[str, Any]:
    line = next((line for line in event.split(b"\n") if line.startswith(b"data:")), b"data: {}")
    decoded = msgspec.json.decode(line[5:])
    return decoded if isinstance(decoded, dict) else {}


async def _held(chunks: AsyncIterator[bytes], decide: Decide, interval: float) -> AsyncIterator[bytes]:
    watch, buffer = _Watch(), b""
    async for chunk in chunks:
        if chunk is PING or chunk is KEEPALIVE_COMMENT:  # passed as they are: the endpoint counts them
            yield chunk
            continue
        buffer += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
        events, _, buffer = buffer.rpartition(b"\n\n")
        if not events:
            continue
        before: list[bytes] = []
        for event in (events + b"\n\n").split(b"\n\n")[:-1]:
            if event.startswith(b"event: message_delta"):
                if before:
                    yield b"".join(before)
                async for out in _verdicts(event, watch, decide, interval):
                    yield out
                before = []
                continue
            watch.see(event)
            before.append(event + b"\n\n")
        if before:
            yield b"".join(before)
    if buffer:
        yield buffer


async def _verdicts(event: bytes, watch: _Watch, decide: Decide, interval: float) -> AsyncIterator[bytes]:
    """The held message_delta, with the results once `decide` gives them; pings until then."""
    delta = _data(event)
    task = asyncio.ensure_future(decide(watch.message((delta.get("delta") or {}).get("stop_reason"))))
    try:
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=interval)
            if not done:
                yield PING  # the shared constant: the endpoint counts it as a keep-alive
    finally:
        if not task.done():  # the client left
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    delta.setdefault("delta", {})["safeguard_results"] = task.result()
    yield b"event: message_delta\ndata: " + msgspec.json.encode(delta) + b"\n\n"

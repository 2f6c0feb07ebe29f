"""The stream hold: a reply's events pass through as they come, but its final
`message_delta` waits until the verdicts are in, and then carries them as
`delta.safeguard_results` (as Anthropic's API sends them). A stream transform
(`calls.streams`): `feed` reads the tool_use blocks going by and holds the delta; `finish`
asks for the verdicts while the pump keeps the client's connection alive with pings.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import msgspec

from dragoman.calls.types import Streaming

Decide = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]  # the message so far -> safeguard_results
_EVENT_END = re.compile(rb"\r?\n\r?\n")


def hold(reply: Streaming, decide: Decide) -> Streaming:
    """`reply`, its final message_delta held for `decide`'s results."""
    reply.transform(HeldDelta(decide))
    return reply


class HeldDelta:
    """Passes whole events on, reading tool_use blocks; holds `message_delta` and what
    follows until `finish`, which adds the results to it. A partial event (a stream no pump
    cuts into events) waits for its end."""

    __slots__ = ("_decide", "_blocks", "_pieces", "_pending", "_held")

    def __init__(self, decide: Decide) -> None:
        self._decide = decide
        self._blocks: dict[int, dict[str, Any]] = {}
        self._pieces: dict[int, list[str]] = {}
        self._pending = b""
        self._held: list[bytes] | None = None  # from message_delta on, once it came

    def feed(self, chunk: bytes) -> Iterable[bytes]:
        if self._held is not None:
            self._held.append(chunk)
            return ()
        data, out, start = self._pending + chunk, bytearray(), 0
        for end in _EVENT_END.finditer(data):
            event, start = data[start : end.end()], end.end()
            if event.lstrip().startswith(b"event: message_delta"):
                self._held = [event, data[end.end() :]]
                self._pending = b""
                return (bytes(out),) if out else ()
            self._see(event)
            out += event
        self._pending = data[start:]
        return (bytes(out),) if out else ()

    async def finish(self) -> AsyncIterator[bytes]:
        if self._held is None:  # a stream that ended without message_delta: what it sent, as it sent it
            if self._pending:
                yield self._pending
            return
        delta = _data(self._held[0])
        results = await self._decide(self._message((delta.get("delta") or {}).get("stop_reason")))
        delta.setdefault("delta", {})["safeguard_results"] = results
        yield b"event: message_delta\ndata: " + msgspec.json.encode(delta) + b"\n\n" + b"".join(self._held[1:])

    def _see(self, event: bytes) -> None:
        head = event.lstrip()
        if head.startswith(b"event: content_block_start"):
            data = _data(event)
            block = data.get("content_block") or {}
            self._blocks[int(data.get("index", 0))] = (
                dict(block) if block.get("type") == "tool_use" else {"type": "other"}
            )
        elif head.startswith(b"event: content_block_delta") and b"input_json_delta" in event:
            data = _data(event)
            self._pieces.setdefault(int(data.get("index", 0)), []).append(data["delta"].get("partial_json", ""))

    def _message(self, stop_reason: str | None) -> dict[str, Any]:
        """The reply as far as judging goes: its blocks (tool_use ones whole) and stop reason."""
        content = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.get("type") == "tool_use" and index in self._pieces:
                joined = "".join(self._pieces[index])
                try:
                    block["input"] = msgspec.json.decode(joined) if joined.strip() else {}
                except msgspec.DecodeError:  # cut short: not judged
                    block["input"], stop_reason = None, "max_tokens" if index == max(self._blocks) else stop_reason
            content.append(block)
        return {"content": content, "stop_reason": stop_reason}


def _data(event: bytes) -> dict[str, Any]:
    line = next((line for line in event.replace(b"\r\n", b"\n").split(b"\n") if line.startswith(b"data:")), b"data: {}")
    try:
        decoded = msgspec.json.decode(line[5:])
    except msgspec.DecodeError:
        return {}
    return decoded if isinstance(decoded, dict) else {}

"""What a client receives from a translated stream, fed upstream reads as the pump does:
through `feed`, or (once the stream started, with `direct`) straight through `feed_to`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from dragoman.backends.openai.backend import _sse
from dragoman.backends.openai.stream import Translation
from dragoman.core.errors import GatewayError
from tests.support.stream_cases import translator


def client_bytes(reads: list[bytes], options: dict[str, Any], direct: bool) -> bytes:
    """The client's bytes for `reads`; an error the translation raises ends them, named."""
    out: list[bytes] = []

    class Writer:
        def write(self, data: bytes) -> None:
            out.append(data)

    t = Translation("up", translator(**options), None, _sse, None, sse=True)
    try:
        for read in reads:
            if t.ended:
                break
            if direct and t.started:
                t.feed_to(read, Writer())  # type: ignore[arg-type]
            else:
                out.extend(t.feed(read))

        async def finish() -> None:
            out.extend([piece async for piece in t.finish()])

        asyncio.run(finish())
    except GatewayError as error:
        out.append(f"{type(error).__name__}: {error}".encode())
    return b"".join(out)


def client_events(data: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """`client_bytes` as the events a client decodes, each frame checked (`event:` line, then
    its `data:` line naming the same type), and what follows the last event (an error, named)."""
    cut = data.rfind(b"\n\n") + 2
    events = []
    for frame in data[:cut].split(b"\n\n")[:-1]:
        name, line = frame.split(b"\n")
        assert name.startswith(b"event: ") and line.startswith(b"data: "), frame
        event = json.loads(line[6:])
        assert event["type"] == name[7:].decode(), frame
        events.append(event)
    return events, data[cut:]


def text_joined(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events` with the text deltas of a block that come in a row joined into one: the stream
    as a client reads it, whatever the split of its text (any split is a valid stream)."""
    out: list[dict[str, Any]] = []
    for event in events:
        last = out[-1] if out else None
        if (
            last is not None
            and event["type"] == last["type"] == "content_block_delta"
            and event["delta"]["type"] == last["delta"]["type"] == "text_delta"
            and event["index"] == last["index"]
        ):
            last["delta"] = {"type": "text_delta", "text": last["delta"]["text"] + event["delta"]["text"]}
        else:
            out.append(event)
    return out


def sdk_message(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The message the official Python SDK folds from `events` (its `accumulate_event`)."""
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)  # type: ignore[arg-type]
    return None if snapshot is None else snapshot.to_dict()

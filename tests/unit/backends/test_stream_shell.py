"""The translating backend's stream loop over upstream reads: what leaves per read.

A real model sends a token per read; a fast upstream or a congested link can
deliver a whole burst in one read. The first token of a burst goes out on its own,
before the rest is translated, so time to first token does not grow with it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from dragoman.backends.openai.backend import OpenAIBackend, _as_events, _sse
from dragoman.backends.openai.stream import FIRST_PIECE
from dragoman.backends.shared import Shared
from dragoman.core import ids
from dragoman.core.config_load import from_dict
from dragoman.core.errors import GatewayError, UpstreamError
from dragoman.protocol.sse import DataDecoder
from dragoman.translate.stream import StreamTranslator
from dragoman.upstream.keepalive import BodyEnds
from tests.support.responses import ScriptedResponse as Response
from tests.support.waiting import eventually_async


def chunk(**delta: Any) -> bytes:
    payload = {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


FINISH = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n'
DONE = b"data: [DONE]\n\n"


def backend(shared: Shared | None = None) -> OpenAIBackend:
    config = from_dict({"upstreams": {"up": {"url": "http://127.0.0.1:9/v1"}}})
    return OpenAIBackend("up", config.upstreams["up"], config, shared or Shared())  # type: ignore[arg-type]


def translator() -> StreamTranslator:
    return StreamTranslator(model="m", message_id="msg_1", new_tool_id=ids.tool_use_id)


async def collect(reads: list[bytes], encode: Any) -> tuple[list[Any], Response]:
    response = Response(reads)
    out = [batch async for batch in backend()._streams.translated(response, translator(), None, encode)]  # type: ignore[arg-type]
    return out, response


def kinds(batch: list[Any]) -> list[str]:
    return [type(event).__name__ for event in batch]


def test_a_burst_in_one_read_sends_its_first_token_alone_then_the_rest() -> None:
    burst = (
        chunk(role="assistant", content="")
        + chunk(content="a")
        + chunk(content="b")
        + chunk(content="c")
        + FINISH
        + USAGE
        + DONE
    )
    batches, response = asyncio.run(collect([burst], _as_events))
    assert [kinds(b) for b in batches] == [
        ["MessageStart", "ContentBlockStart", "ContentBlockDelta"],  # the first token, before b and c are decoded
        ["ContentBlockDelta", "ContentBlockDelta"],
        ["ContentBlockStop", "MessageDelta", "MessageStop"],
    ]
    assert response.released and not response.closed  # read to the end: the connection is reused


def test_a_large_burst_is_split_into_events_only_in_part_before_its_first_token(monkeypatch: Any) -> None:
    fed: list[int] = []

    class CountingDecoder(DataDecoder):
        def feed(self, chunk: bytes) -> list[bytes]:
            fed.append(len(chunk))
            return super().feed(chunk)

    monkeypatch.setattr("dragoman.backends.openai.stream.DataDecoder", CountingDecoder)
    tokens = [f"token {i} " for i in range(80)]
    burst = chunk(role="assistant", content="") + b"".join(chunk(content=t) for t in tokens) + FINISH + USAGE + DONE
    assert len(burst) > 4 * FIRST_PIECE

    async def run() -> tuple[list[Any], int]:
        batches, fed_at_first = [], 0
        async for batch in backend()._streams.translated(Response([burst]), translator(), None, _as_events):  # type: ignore[arg-type]
            if not batches:
                fed_at_first = sum(fed)
            batches.append(batch)
        return batches, fed_at_first

    batches, fed_at_first = asyncio.run(run())
    assert kinds(batches[0]) == ["MessageStart", "ContentBlockStart", "ContentBlockDelta"]
    assert fed_at_first <= FIRST_PIECE  # the rest of the read was split after the first token went out
    assert sum(fed) == len(burst)
    texts = [e.delta.text for batch in batches for e in batch if getattr(getattr(e, "delta", None), "text", None)]
    assert texts == tokens  # an event cut where the read is split is whole all the same


def test_one_token_per_read_is_one_batch_per_read() -> None:
    reads = [chunk(content="a"), chunk(content="b"), FINISH, USAGE, DONE]
    batches, _ = asyncio.run(collect(reads, _as_events))
    assert [kinds(b) for b in batches] == [
        ["MessageStart", "ContentBlockStart", "ContentBlockDelta"],  # one write before the first token, not two
        ["ContentBlockDelta"],
        ["ContentBlockStop", "MessageDelta", "MessageStop"],
    ]


class SlowStart(Response):
    """A server that takes a while before its first token (a long prompt)."""

    waited = False

    async def readany(self) -> bytes:
        if not self.waited:
            self.waited = True
            await asyncio.sleep(0.3)  # pacing: several keep-alive intervals pass
        return await super().readany()


def test_a_ping_before_the_first_token_follows_message_start() -> None:
    config = from_dict({"server": {"keepalive_interval": 0.05}, "upstreams": {"up": {"url": "http://127.0.0.1:9/v1"}}})
    slow = OpenAIBackend("up", config.upstreams["up"], config, Shared())  # type: ignore[arg-type]
    response = SlowStart([chunk(content="a"), FINISH + USAGE + DONE])

    async def run() -> list[Any]:
        return [batch async for batch in slow._streams.translated(response, translator(), None, _as_events)]  # type: ignore[arg-type]

    batches = [kinds(b) for b in asyncio.run(run())]
    assert batches[0] == ["MessageStart", "Ping"]  # message_start first, as Anthropic orders them
    assert all(b == ["Ping"] for b in batches[1:-2])
    assert batches[-2:] == [
        ["ContentBlockStart", "ContentBlockDelta"],
        ["ContentBlockStop", "MessageDelta", "MessageStop"],
    ]


def test_a_stream_cut_before_its_first_token_raises_before_anything_is_yielded() -> None:
    """Nothing has gone out, not even `message_start`: the client gets the failure as an HTTP
    status (see EventStreamResponse), which the SDKs retry."""

    async def run() -> tuple[list[Any], BaseException | None]:
        batches: list[Any] = []
        try:
            async for batch in backend()._streams.translated(
                Response([chunk(role="assistant", content="")]), translator(), None, _as_events
            ):  # type: ignore[arg-type]
                batches.append(batch)
        except GatewayError as error:
            return batches, error
        return batches, None

    batches, error = asyncio.run(run())
    assert batches == []
    assert isinstance(error, UpstreamError) and "closed the stream before the reply was complete" in error.message


def test_sse_encoding_of_the_batches_is_the_client_stream() -> None:
    burst = chunk(content="a") + chunk(content="b") + FINISH + USAGE + DONE
    frames, _ = asyncio.run(collect([burst], _sse))
    stream = b"".join(frames).decode()
    names = [line.removeprefix("event: ") for line in stream.splitlines() if line.startswith("event: ")]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    assert '"output_tokens":4' in stream


def test_a_chunk_with_invalid_utf8_is_read_with_a_replacement_character() -> None:
    """A server that streams bytes may cut a character between two chunks: the reply goes on."""
    broken = b'data: {"choices":[{"index":0,"delta":{"content":"caf\xc3"}}]}\n\n'
    rest = b'data: {"choices":[{"index":0,"delta":{"content":" ok"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    events, _ = asyncio.run(collect([broken, rest], lambda batch: batch))
    texts = [e.delta.text for batch in events for e in batch if getattr(getattr(e, "delta", None), "text", None)]
    assert "".join(texts) == "caf\ufffd ok"


class OpenBody(Response):
    """A server that keeps its body open after `[DONE]`: the reads after it never come."""

    @property
    def ended(self) -> bool:
        return False

    async def readany(self) -> bytes:
        if self._reads:
            return await super().readany()
        await asyncio.Event().wait()  # forever
        return b""


def test_a_body_kept_open_after_done_ends_the_reply_at_once_and_its_connection_is_closed_later() -> None:
    shared = Shared(ends=BodyEnds(grace=0.01))

    async def run() -> tuple[list[Any], OpenBody, tuple[bool, bool]]:
        response = OpenBody([chunk(content="a") + FINISH + USAGE + DONE])
        batches = [
            batch async for batch in backend(shared)._streams.translated(response, translator(), None, _as_events)
        ]  # type: ignore[arg-type]
        at_the_end = (response.released, response.closed)  # the reply is whole; the body is still being read
        await eventually_async(lambda: response.closed, "the body closed", timeout=2)
        return batches, response, at_the_end

    batches, response, at_the_end = asyncio.run(run())
    assert kinds(batches[-1]) == ["ContentBlockStop", "MessageDelta", "MessageStop"]
    assert at_the_end == (False, False)
    assert response.closed and not response.released  # not reused: what it would send next belongs to no reply

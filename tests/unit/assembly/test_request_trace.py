"""RequestTrace.watch reads a stream's message_start and message_delta however the
stream's bytes are cut into chunks, and passes every byte on unchanged."""

from __future__ import annotations

import asyncio
import json

import pytest

from dragoman.assembly.request_trace import RequestTrace
from dragoman.calls.types import Streaming


def event(name: str, data: dict, newline: str = "\n") -> bytes:
    return f"event: {name}{newline}data: {json.dumps(data)}{newline}{newline}".encode()


def stream(newline: str = "\n") -> bytes:
    return b"".join([
        event("message_start", {"type": "message_start", "message": {"id": "msg_1", "model": "served",
              "usage": {"input_tokens": 7, "cache_read_input_tokens": 2}}}, newline),  # fmt: skip
        event("content_block_delta", {"type": "content_block_delta", "index": 0,
              "delta": {"type": "text_delta", "text": "event: message_start is text"}}, newline),  # fmt: skip
        event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
              "usage": {"output_tokens": 5}}, newline),  # fmt: skip
        event("message_stop", {"type": "message_stop"}, newline),
    ])  # fmt: skip


def watched(chunks: list[bytes]) -> tuple[RequestTrace, bytes]:
    trace = RequestTrace(None, None, operation="chat", capture_content=False, instruments=None)

    async def source():
        for piece in chunks:
            yield piece

    reply = Streaming(source())
    reply.observe(trace.seen)

    async def drain() -> bytes:
        return b"".join([piece async for piece in reply.chunks])

    return trace, asyncio.run(drain())


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_every_cut_of_the_stream_gives_the_same_reading(newline: str) -> None:
    whole = stream(newline)
    for cut in range(1, len(whole)):
        trace, passed = watched([whole[:cut], whole[cut:]])
        assert passed == whole
        reply = trace._reply
        assert (reply.id, reply.model, reply.stop_reason) == ("msg_1", "served", "max_tokens"), cut
        assert reply.usage is not None
        assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cache_read_input_tokens) == (7, 5, 2)


def test_byte_by_byte() -> None:
    whole = stream()
    trace, passed = watched([whole[i : i + 1] for i in range(len(whole))])
    assert passed == whole and trace._reply.stop_reason == "max_tokens"


def test_a_clients_unlisted_model_name_is_cut_short_and_no_metric_label() -> None:
    from types import SimpleNamespace

    from dragoman.calls.types import Call, Route
    from dragoman.core.capabilities import ModelCaps

    spans: list = []
    span = SimpleNamespace(set_attribute=lambda *args: spans.append(args))
    trace = RequestTrace(None, span, operation="chat", capture_content=False, instruments=None)
    name = "m" * 100_000
    route = Route(
        backend=SimpleNamespace(path="translate"), upstream="u", upstream_model=name, caps=ModelCaps(), listed=False
    )
    trace.prepared(Call(body=b"{}", model=name, upstream_model=name, headers={}, request_id="r"), route, "openai")
    assert trace._metric_model == "unlisted"
    assert len(trace._request_attributes["gen_ai.request.model"]) < 300
    assert all(len(str(value)) < 300 for _, value in spans)

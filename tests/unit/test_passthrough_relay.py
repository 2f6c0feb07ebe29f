"""The passthrough relay: bytes forwarded as they arrive, the model name put back in
the head, and token counts read for the metrics without decoding the stream."""

from __future__ import annotations

import asyncio

from dragoman.backends.anthropic import AnthropicBackend
from dragoman.backends.base import Call
from dragoman.config import from_dict
from dragoman.observe import Outcome
from tests.unit.test_stream_shell import Response

START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    b'"model":"served","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":31,"output_tokens":1,'
    b'"cache_read_input_tokens":7}}}\n\n'
)
BLOCK = b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}\n\n'
STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
END = (
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
    b'"usage":{"output_tokens":12}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def relay(reads: list[bytes]) -> tuple[bytes, Outcome, Response]:
    config = from_dict({"upstreams": {"native": {"url": "http://127.0.0.1:9", "protocol": "anthropic"}}})
    backend = AnthropicBackend("native", config.upstreams["native"], config)  # type: ignore[arg-type]
    outcome = Outcome(request_id="req_1", endpoint="messages")
    call = Call(b"{}", "client-name", "served", {}, "req_1", True, outcome)
    response = Response(reads)

    async def run() -> bytes:
        return b"".join([chunk async for chunk in backend._relay(response, call)])  # type: ignore[arg-type]

    return asyncio.run(run()), outcome, response


def test_tokens_arriving_one_by_one_are_counted_from_message_start_and_message_delta() -> None:
    body, outcome, response = relay([START, BLOCK, DELTA, DELTA, STOP, END])
    assert (outcome.input_tokens, outcome.output_tokens, outcome.cache_read_tokens) == (31, 12, 7)
    assert body.count(b'"model":"client-name"') == 1 and b"served" not in body
    assert response.released


def test_a_whole_stream_in_one_read_is_counted_the_same() -> None:
    body, outcome, _ = relay([START + BLOCK + DELTA * 50 + STOP + END])
    assert (outcome.input_tokens, outcome.output_tokens, outcome.cache_read_tokens) == (31, 12, 7)
    assert body.startswith(START.replace(b'"served"', b'"client-name"'))

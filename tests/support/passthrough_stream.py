"""A passthrough stream driven without sockets: Anthropic events as a server sends them,
relayed by `AnthropicBackend._relay` over a scripted upstream response."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from dragoman.backends.anthropic.backend import AnthropicBackend
from dragoman.backends.shared import Shared
from dragoman.calls.types import Call, Outcome
from dragoman.core.config_load import from_dict
from dragoman.core.errors import GatewayError
from tests.support.responses import ScriptedResponse as Response

# A server that sends every field the SDKs type: its events go through unchanged.
START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    b'"model":"served","content":[],"stop_reason":null,"stop_sequence":null,"stop_details":null,"container":null,'
    b'"diagnostics":null,"usage":{"input_tokens":31,"output_tokens":1,"cache_read_input_tokens":7}}}\n\n'
)
BLOCK = b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}\n\n'
STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
END = (
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null,'
    b'"stop_details":null,"container":null},"usage":{"output_tokens":12}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def delta(value: str, kind: str = "text") -> bytes:
    """A `content_block_delta` of generated text: `kind` text, thinking or partial_json."""
    types = {"text": "text_delta", "thinking": "thinking_delta", "partial_json": "input_json_delta"}
    data = {"type": "content_block_delta", "index": 0, "delta": {"type": types[kind], kind: value}}
    return b"event: content_block_delta\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _backend(shared: Shared | None = None) -> AnthropicBackend:
    config = from_dict({"upstreams": {"native": {"url": "http://127.0.0.1:9", "protocol": "anthropic"}}})
    return AnthropicBackend("native", config.upstreams["native"], config, shared or Shared())  # type: ignore[arg-type]


def relay(reads: list[bytes], shared: Shared | None = None) -> tuple[bytes, Outcome, Response]:
    """The stream relayed whole by a backend sharing `shared` (its keys to redact, say)."""
    backend = _backend(shared)
    outcome = Outcome(request_id="req_1", endpoint="messages")
    call = Call(b"{}", "client-name", "served", {}, "req_1", True, outcome)
    response = Response(reads)

    async def run() -> bytes:
        return await client_stream(backend._relay(response, call))  # type: ignore[arg-type]

    return asyncio.run(run()), outcome, response


def relay_cut(reads: list[bytes], chunks: int, body: bytes = b"{}") -> tuple[bytes, Outcome]:
    """The stream relayed until the client has had `chunks` chunks and leaves: what it got,
    and the request's outcome once the stream is closed."""
    backend = _backend()
    outcome = Outcome(request_id="req_1", endpoint="messages")
    call = Call(body, "client-name", "served", {}, "req_1", True, outcome)

    async def run() -> bytes:
        stream = backend._relay(Response(reads), call)
        got = []
        async for chunk in stream:
            got.append(chunk)
            if len(got) == chunks:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return b"".join(got)

    return asyncio.run(run()), outcome


async def client_stream(chunks: Any) -> bytes:
    """The stream as the client gets it: a GatewayError the relay raises becomes the
    `error` event the endpoint sends (endpoints.EventStreamResponse._relay)."""
    out = []
    try:
        async for chunk in chunks:
            out.append(chunk)
    except GatewayError as error:
        out.append(error.event())
    return b"".join(out)


def events_of(body: bytes) -> list[tuple[str, dict]]:
    """The stream as the SDK's decoder reads it: every event must be whole JSON."""
    found = []
    for frame in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not frame:
            continue
        fields = dict(line.split(b": ", 1) for line in frame.split(b"\n"))
        found.append((fields[b"event"].decode(), json.loads(fields[b"data"])))
    return found

"""Server-sent events: encoding Anthropic events, decoding upstream `data:` lines.

Anthropic clients dispatch on the `event:` line, so every event carries one; the
OpenAI side sends data-only frames, which `DataDecoder` extracts across arbitrary
chunk boundaries (CRLF or LF line ends, comments ignored).
"""

from __future__ import annotations

import msgspec

from dragoman.core.errors import UpstreamError
from dragoman.protocol import anthropic as a

_encoder = msgspec.json.Encoder()

_NAMES: dict[type, bytes] = {
    cls: f"event: {cls.__struct_config__.tag}\ndata: ".encode()
    for cls in (
        a.MessageStart,
        a.ContentBlockStart,
        a.ContentBlockDelta,
        a.ContentBlockStop,
        a.MessageDelta,
        a.MessageStop,
        a.Ping,
    )
}

PING = b'event: ping\ndata: {"type":"ping"}\n\n'
KEEPALIVE_COMMENT = b": keep-alive\n\n"


def encode(event: a.StreamEvent) -> bytes:
    return _NAMES[type(event)] + _encoder.encode(event) + b"\n\n"


def encode_all(events: list[a.StreamEvent]) -> bytes:
    if len(events) == 1:  # a token as it arrives: the common case
        event = events[0]
        return _NAMES[type(event)] + _encoder.encode(event) + b"\n\n"
    return b"".join([_NAMES[type(e)] + _encoder.encode(e) + b"\n\n" for e in events])


MAX_LINE = 16 * 1024 * 1024  # bytes of one stream line; a server sending more without a newline has failed


class DataDecoder:
    """Yields the payload of each `data:` line of an SSE byte stream."""

    __slots__ = ("_buffer", "_pieces", "_held")

    def __init__(self) -> None:
        self._buffer = b""
        self._pieces: list[bytes] = []  # reads of a line still without its newline (joined once it comes)
        self._held = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        if (
            not self._buffer
            and not self._pieces
            and chunk.startswith(b"data:")
            and chunk.endswith(b"\n\n")
            and chunk.count(b"\n") == 2
        ):
            payload = chunk[5:].strip()  # one whole event in one read: how tokens arrive one by one
            return [payload] if payload else []
        if b"\n" not in chunk:  # a long line arriving in pieces: kept, not copied again per read
            self._pieces.append(chunk)
            self._held += len(chunk)
            if self._held + len(self._buffer) > MAX_LINE:
                raise UpstreamError(f"the upstream sent a stream line longer than {MAX_LINE // (1024 * 1024)} MiB")
            return []
        if self._pieces:
            chunk = b"".join(self._pieces) + chunk
            self._pieces, self._held = [], 0
        buffer = self._buffer + chunk if self._buffer else chunk
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        payloads = []
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload:
                    payloads.append(payload)
        return payloads

    def flush(self) -> list[bytes]:
        rest = self._buffer + b"".join(self._pieces)
        self._buffer, self._pieces, self._held = b"", [], 0
        return self.feed(rest + b"\n") if rest else []

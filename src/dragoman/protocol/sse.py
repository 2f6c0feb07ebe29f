"""Server-sent events: encoding Anthropic events, decoding upstream `data:` lines.

Anthropic clients dispatch on the `event:` line, so every event carries one; the
OpenAI side sends data-only frames, which `DataDecoder` extracts across arbitrary
chunk boundaries (CRLF or LF line ends, comments ignored).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def encode_all(events: Sequence[a.StreamEvent | bytes]) -> bytes:
    """The events' frames in order; an item that is bytes is a frame encoded already (`text_delta`)."""
    if len(events) == 1:  # a token as it arrives: the common case
        event = events[0]
        if isinstance(event, bytes):
            return event
        return _NAMES[type(event)] + _encoder.encode(event) + b"\n\n"
    return b"".join([e if isinstance(e, bytes) else _NAMES[type(e)] + _encoder.encode(e) + b"\n\n" for e in events])


_DELTA_HEADS: dict[int, bytes] = {}  # a text delta's bytes before its text, by block index
_DELTA_TAIL = b"}}\n\n"


def _delta_head(index: int) -> bytes:
    head = _DELTA_HEADS.get(index)
    if head is None:
        whole = encode(a.ContentBlockDelta(index=index, delta=a.TextDelta(text="")))
        head = whole[: -len(b'""' + _DELTA_TAIL)]
        if len(_DELTA_HEADS) < 256:
            _DELTA_HEADS[index] = head
    return head


def text_delta(index: int, text: str) -> bytes:
    """`encode(ContentBlockDelta(index=index, delta=TextDelta(text=text)))`, the common event,
    without making it: its bytes around the text are made once per index."""
    return (_DELTA_HEADS.get(index) or _delta_head(index)) + _encoder.encode(text) + _DELTA_TAIL


def text_delta_written(index: int, string: bytes) -> bytes:
    """`text_delta` of the text of `string`, a JSON string as the encoder writes it, copied
    into the frame as it is."""
    return (_DELTA_HEADS.get(index) or _delta_head(index)) + string + _DELTA_TAIL


MAX_LINE = 16 * 1024 * 1024  # bytes of one stream line; a server sending more without a newline has failed


class DataDecoder:
    """Yields the payload of each `data:` line of an SSE byte stream."""

    __slots__ = ("_buffer", "_pieces", "_held", "_max_line")

    @property
    def idle(self) -> bool:
        """Nothing held back: the next read begins a line."""
        return not self._buffer and not self._pieces

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buffer = b""
        self._pieces: list[bytes] = []  # reads of a line still without its newline (joined once it comes)
        self._held = 0
        self._max_line = max_line  # bytes of one line at most

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
            if self._held + len(self._buffer) > self._max_line:
                raise UpstreamError(
                    f"the upstream sent a stream line longer than {self._max_line / (1024 * 1024):g} MiB"
                )
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

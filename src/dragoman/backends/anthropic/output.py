"""The output tokens of a passthrough stream cut before `message_delta` told them: estimated
from the events relayed to the client, without decoding them.

About four bytes of generated text a token (as the limits estimate input from a body), at
least one a `content_block_delta` (a delta holds whole tokens). Measuring a read costs a search
and a regular expression, about twice what `events.Events.take` costs otherwise, so a stream's
reads are measured while it is shorter than MEASURED_BYTES (message_start and the first deltas:
a short stream is counted whole), then only the read that crosses each SAMPLE_STRIDE bytes; the
bytes not measured are counted at the rate of those that were. Every read costs an addition and
a comparison (`Events.take`).
"""

from __future__ import annotations

import re

_DELTA = b'"content_block_delta"'  # the event's type in its JSON (its `event:` line is unquoted)
# The generated text of a delta, a text, a thinking or a tool's partial input (a JSON string,
# escapes and all), after the delta's type as Anthropic and llama-server order them. A server
# that orders them otherwise is counted a token a delta.
_GENERATED = re.compile(rb'_delta", ?"(?:text|thinking|partial_json)": ?"([^"\\]*(?:\\.[^"\\]*)*)"')
BYTES_PER_TOKEN = 4
MEASURED_BYTES = 1024
HEAD_BYTES = 2048  # of a read measured there (a burst holding the stream's start)
SAMPLE_STRIDE = 2048  # a power of two
SAMPLE_BYTES = 512  # of a read measured past MEASURED_BYTES: a burst's first events


def relayed_tokens(events: bytes) -> int:
    """The output tokens in whole events, estimated."""
    deltas = events.count(_DELTA)
    if not deltas:
        return 0
    return max(deltas, sum([-(-len(text) // BYTES_PER_TOKEN) for text in _GENERATED.findall(events)]))


class RelayedOutput:
    """The tokens of the reads measured, and the rate at which the others are counted."""

    __slots__ = ("_measured", "_tokens", "_rate_tokens", "_rate_bytes")

    def __init__(self) -> None:
        self._measured = self._tokens = 0  # bytes measured, the tokens in them
        # The same without what comes before the first delta (message_start, no text).
        self._rate_tokens = self._rate_bytes = 0

    def measure(self, events: bytes, relayed: int) -> int:
        """Note a read's tokens, the stream's first `relayed` bytes ending with it; how many
        bytes the stream has relayed when the next read is measured (past them)."""
        sample = events[: HEAD_BYTES if relayed - len(events) < MEASURED_BYTES else SAMPLE_BYTES]
        tokens = relayed_tokens(sample)  # (a delta cut at the sample's end counts one)
        skip = 0
        if not self._measured:
            skip = sample.find(_DELTA)
            skip = len(sample) if skip < 0 else skip
        self._rate_tokens += tokens
        self._rate_bytes += len(sample) - skip
        self._measured += len(sample)
        self._tokens += tokens
        return -1 if relayed < MEASURED_BYTES else relayed | (SAMPLE_STRIDE - 1)

    def tokens(self, relayed: int) -> int:
        """The output tokens in the stream's `relayed` bytes."""
        unmeasured = relayed - self._measured
        if not unmeasured or not self._rate_bytes:
            return self._tokens
        return self._tokens - (-unmeasured * self._rate_tokens // self._rate_bytes)

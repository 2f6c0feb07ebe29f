"""An upstream's gzip or deflate body, inflated within bounds.

A compressed body costs the upstream up to 1/1000 of what it costs the gateway (deflate
inflates up to 1032 to 1), so it is inflated in pieces of INFLATE_PIECE bytes, at most a
budget (the response's HIGH_WATER) per call and never once its reader has that much
waiting: the rest of the input waits, reading paused, until the reader catches up. That bounds a
bomb's memory and its time in one callback; MAX_INFLATED bounds its CPU in all. It holds
for streams too, where it is eight times the longest reply a model writes (128k tokens at
about 250 bytes of SSE each: 32 MB). There is no bound on the ratio itself: degenerate yet
legitimate output (one token over and over) compresses hundreds to one.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from dragoman.upstream.transport.failures import BadResponse

INFLATE_PIECE = 64 * 1024
MAX_INFLATED = 256 * 1024 * 1024
CODINGS = ("gzip", "x-gzip", "deflate")  # the content-encodings an `Inflater` reads


class Inflater:
    """One body's decoder, fed its compressed bytes as they arrive, and how much it
    inflated so far (what the bounds are measured by)."""

    __slots__ = ("_decoder", "_deflate", "_started", "inflated")

    def __init__(self, coding: str) -> None:
        self._decoder = zlib.decompressobj(47)  # 32 + 15: gzip or zlib, told apart by the header
        self._deflate = coding == "deflate"
        self._started = False  # a compressed byte arrived (an empty body has no compressed stream to end)
        self.inflated = 0

    def inflate(self, data: bytes, deliver: Callable[[bytes], bool], budget: int) -> bytes | None:
        """Inflate `data` in pieces handed to `deliver`, which answers whether the reader
        has room for more, until the input is used up, `budget` bytes went out, or the
        reader has no room: what is left of the input is returned then, to inflate once
        the reader caught up (None: nothing is left). Raises BadResponse for a corrupt
        body, and past MAX_INFLATED bytes."""
        if not self._started:
            self._started = True
            if self._deflate and _raw_deflate(data):
                self._decoder = zlib.decompressobj(-15)  # some servers send "deflate" without the zlib wrapper
        decoder = self._decoder
        room = True
        while True:
            try:
                piece = decoder.decompress(data, INFLATE_PIECE)
            except zlib.error as error:
                raise BadResponse(f"the upstream's compressed body is corrupt: {error}") from None
            data = decoder.unconsumed_tail
            if piece:
                self.inflated += len(piece)
                if self.inflated > MAX_INFLATED:
                    raise BadResponse(
                        f"the upstream's compressed body inflates past {MAX_INFLATED // (1024 * 1024)} MiB"
                    )
                room = deliver(piece)
                budget -= len(piece)
            if not data and len(piece) < INFLATE_PIECE:  # (a full piece: zlib may hold more output)
                return None
            if budget <= 0 or not room:
                return data

    def flush(self) -> bytes:
        """What the decoder still holds once the body has ended."""
        return self._decoder.flush()

    @property
    def truncated(self) -> bool:
        """The body ended before its compressed stream did (an empty body has none to end)."""
        return self._started and not self._decoder.eof


def _raw_deflate(first: bytes) -> bool:
    """Whether a `deflate` body's first bytes lack the zlib header (RFC 1950: CM 8, a
    multiple of 31)."""
    if len(first) < 2:
        return False
    return not (first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0)

"""The bytes of a translated stream's end, from templates made once per block index and
stop reason: at the end of most replies (a text block open, nothing held back) only the
usage's three counts are written (the events' structs made and encoded cost several times
more, once per stream)."""

from __future__ import annotations

from dragoman.protocol import anthropic as a
from dragoman.protocol.sse import encode_all
from dragoman.translate.stream import message_delta

_MARKS = (1_000_000_001, 1_000_000_002, 1_000_000_003)  # counts no template holds elsewhere
_ENDS: dict[tuple[int, str], tuple[bytes, bytes, bytes, bytes]] = {}


def text_end(index: int, reason: a.StopReason, usage: a.Usage) -> bytes:
    """`encode_all` of `StreamTranslator.finish`'s events for a text block at `index`:
    `content_block_stop`, `message_delta` (no stop sequence) and `message_stop`."""
    if usage.output_tokens_details is not None:  # reasoning counted: the delta carries them
        return _whole(index, reason, usage)
    parts = _ENDS.get((index, reason))
    if parts is None:
        marked = _whole(index, reason, a.Usage(input_tokens=_MARKS[0], output_tokens=_MARKS[1],
                                                cache_read_input_tokens=_MARKS[2]))  # fmt: skip
        pieces = [marked]
        for mark in _MARKS:
            before, found, after = pieces.pop().partition(b"%d" % mark)
            if not found:  # (counts written in another order)
                return _whole(index, reason, usage)
            pieces += (before, after)
        parts = (pieces[0], pieces[1], pieces[2], pieces[3])
        if len(_ENDS) < 256:
            _ENDS[index, reason] = parts
    return b"%b%d%b%d%b%d%b" % (
        parts[0],
        usage.input_tokens,
        parts[1],
        usage.output_tokens,
        parts[2],
        usage.cache_read_input_tokens,
        parts[3],
    )


def _whole(index: int, reason: a.StopReason, usage: a.Usage) -> bytes:
    return encode_all([a.ContentBlockStop(index=index), message_delta(reason, None, usage), a.MessageStop()])

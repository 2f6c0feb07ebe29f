"""A passthrough stream's events: relayed whole, the stream's end found by the event's own
type, token counts noted for the metrics, a missing `message_start` supplied, and the
null fields a server left out of `message_start` and `message_delta` put in."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import msgspec

from dragoman.backends.anthropic.output import RelayedOutput
from dragoman.backends.anthropic.tool_tags import TOOL_USE, tagged_events
from dragoman.calls.types import Call, max_tokens
from dragoman.core.error_mapping import anthropic_envelope, from_error_event
from dragoman.core.ids import message_id
from dragoman.core.redaction import Redactor
from dragoman.protocol import anthropic
from dragoman.protocol.sse import encode

_TOKENS = re.compile(
    rb'"(input_tokens|output_tokens|cache_read_input_tokens|cache_creation_input_tokens|ephemeral_1h_input_tokens)"'
    rb"\s*:\s*(\d+)"
)


def note_usage(call: Call, data: bytes) -> bool:
    """Token counts for the metrics, read from the reply without decoding it; whether they
    held an output count."""
    outcome = call.outcome
    if outcome is None:
        return False
    counted = False
    for name, value in _TOKENS.findall(data):
        if name == b"input_tokens":
            outcome.input_tokens = int(value)
        elif name == b"output_tokens":
            outcome.output_tokens = int(value)
            counted = True
        elif name == b"cache_read_input_tokens":
            outcome.cache_read_tokens = int(value)
        elif name == b"cache_creation_input_tokens":
            outcome.cache_creation_tokens = int(value)
        else:  # usage.cache_creation's; its 5-minute part is the rest of cache_creation_input_tokens
            outcome.cache_creation_1h_tokens = int(value)
    return counted


def leading_comments(head: bytes) -> int:
    """How many bytes at the start of a stream's head are comment and blank lines only:
    llama-server sends `:` lines of its own while it reads a long prompt, before
    `message_start`. They are not the head (the event that names the model), and go on as
    comments. An unfinished line is left for the next read."""
    at = 0
    while True:
        end = head.find(b"\n", at)
        if end < 0 or (end > at and head[at] != 58 and head[at:end] != b"\r"):  # 58: ':'
            return at
        at = end + 1


_FIRST_EVENT = re.compile(rb"^event: ?([a-z_]+)", re.MULTILINE)
# Events that come only after `message_start`: a stream that begins with one of them lacks it.
_AFTER_START = frozenset(
    {b"content_block_start", b"content_block_delta", b"content_block_stop", b"message_delta", b"message_stop"}
)


def with_start(head: bytes, call: Call) -> bytes:
    """The stream's head, with a `message_start` put before it when the server sent none.

    llama-server leaves it out when the reply's first token is part of a character (an emoji,
    most CJK text), and the SDKs refuse a stream that does not begin with it. The server's
    prompt count went with it: the stand-in says 0 input tokens."""
    first = _FIRST_EVENT.search(head)
    if first is None or first.group(1) not in _AFTER_START:
        return head
    usage = anthropic.Usage(input_tokens=0, output_tokens=0)
    message = anthropic.Message(
        id=message_id(), model=call.model, content=[], stop_reason=None, stop_sequence=None, usage=usage
    )
    return encode(anthropic.MessageStart(message=message)) + head


def error_event_data(events: bytes) -> bytes | None:
    """The data of the first event in `events` if that event is an error: `event: error`, or an
    unnamed event whose data is one (`{"type": "error", ...}`, OpenAI's `{"error": ...}`). Read
    for a stream's head, and for the event that ends a stream (Events), only if the bytes say
    "error"."""
    if b"error" not in events:
        return None
    end = events.find(b"\n\n")
    crlf_end = events.find(b"\n\r\n")
    if end < 0 or 0 <= crlf_end < end:
        end = crlf_end
    name = None
    data = []
    for line in (events if end < 0 else events[:end]).splitlines():
        if line.startswith(b"event:"):
            name = line[6:].strip()
        elif line.startswith(b"data:"):
            data.append(line[5:].strip())
    payload = b"\n".join(data)
    if name == b"error":
        return payload
    if name is not None or not payload.startswith(b"{"):
        return None
    try:
        value = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return None
    return payload if isinstance(value, dict) and (value.get("type") == "error" or value.get("error")) else None


# Fields the official SDKs type as nullable, and the TypeScript SDK as always there
# (`Message`'s; the `delta` of `message_delta`), which servers other than Anthropic's, such
# as llama-server, leave out: the TypeScript SDK's MessageStream then gives
# finalMessage().stop_details undefined where its types say null (it copies delta.stop_details,
# or keeps message_start's). The translating path sends them all, null (protocol.anthropic_replies).
MESSAGE_NULLS = ("stop_details", "container", "diagnostics")
DELTA_NULLS = ("stop_details", "container")


_QUOTED = {name: f'"{name}"'.encode() for name in MESSAGE_NULLS + DELTA_NULLS}


def _lacks(data: bytes, names: Iterable[str]) -> bool:
    """Whether a name is not even in the bytes: only then is the JSON decoded."""
    return any(_QUOTED[name] not in data for name in names)


def _put_nulls(target: object, names: Iterable[str]) -> bool:
    """`names` missing from `target` set to null; whether any was."""
    if not isinstance(target, dict):
        return False
    missing = [name for name in names if name not in target]
    for name in missing:
        target[name] = None
    return bool(missing)


def completed_message(body: bytes) -> bytes:
    """A non-streamed reply with MESSAGE_NULLS, decoded and encoded again only when one
    is missing."""
    if not _lacks(body, MESSAGE_NULLS):
        return body
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body
    if not isinstance(data, dict) or data.get("type") != "message" or not _put_nulls(data, MESSAGE_NULLS):
        return body
    return msgspec.json.encode(data)


def _completed_event(chunk: bytes, at: int, kind: str, field: str, names: tuple[str, ...]) -> bytes:
    """`chunk` with the `data:` line holding byte `at` rewritten if it is a `kind` event
    whose `field` object lacks some of `names`; else `chunk` as it is (a text that only
    names the event, a server that sends them all)."""
    start = chunk.rfind(b"\n", 0, at) + 1
    end = chunk.find(b"\n", at)
    end = len(chunk) if end < 0 else end
    line = chunk[start:end]
    if not line.startswith(b"data:") or not _lacks(line, names):
        return chunk
    try:
        data = msgspec.json.decode(line[5:])  # JSON allows the space and \r around it
    except msgspec.DecodeError:
        return chunk
    if not isinstance(data, dict) or data.get("type") != kind or not _put_nulls(data.get(field), names):
        return chunk
    cr = b"\r" if line.endswith(b"\r") else b""
    return chunk[:start] + b"data: " + msgspec.json.encode(data) + cr + chunk[end:]


def completed_start(head: bytes) -> bytes:
    """The stream's head with MESSAGE_NULLS in `message_start`'s message (once per stream)."""
    at = head.find(b'"message_start"')  # the event's JSON, not its `event:` line
    return head if at < 0 else _completed_event(head, at, "message_start", "message", MESSAGE_NULLS)


MAX_HELD_EVENT = 1024 * 1024  # an event larger than this goes out in pieces rather than wait whole


# The event that ends a stream, by its own type at the start of a line: a text can be
# "message_stop" or "error" too, but JSON strings cannot hold a raw newline. An unnamed event
# says it in its data: `{"type": "error", ...}`, or OpenAI's `{"error": {...}}`. The group
# that matched (the match's last) names the end.
_END_LINE = re.compile(rb'event: ?(message_stop|error)\r?\n|data: ?\{"(?:type": ?"(message_stop|error)"|(error)": ?\{)')


def _end_event(chunk: bytes) -> re.Match[bytes] | None:
    """The event ending the stream in `chunk`, found from the end (where it is) and checked
    at its line's start: a regular expression over a whole burst costs a millisecond."""
    found: re.Match[bytes] | None = None
    for name in (b"message_stop", b"error"):
        stop = len(chunk)
        while (at := chunk.rfind(name, 0, stop)) >= 0:
            line = _END_LINE.match(chunk, chunk.rfind(b"\n", 0, at) + 1)
            if line is not None and line.end() > at:  # the name is the event's own type
                if found is None or line.start() < found.start():
                    found = line
                break
            stop = at
    return found


def _whole_error(held: bytes) -> bool:
    """Whether an event cut off by the stream's end is an `error` event whole but for its
    blank line: it has data, and its data is whole JSON or its last line was ended (a text)."""
    data = error_event_data(held)  # the one event held: no blank line in it
    if not data:
        return False
    if held.endswith((b"\n", b"\r")):
        return True
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False  # cut in its data: what came is not the server's whole error
    return True


_ERROR_TYPE = re.compile(rb'"error": ?\{[^{}]*?"type": ?"([a-z_]+)"')


class Events:
    """A passthrough stream cut at event boundaries: `take` gives the whole events so
    far and holds a cut one back. Also notes the token counts of `message_delta` for
    the metrics (without one, `count_output` estimates them from what was relayed), puts
    DELTA_NULLS in its delta, and whether the stream ended as Anthropic ends one (`message_stop` or
    an `error` event, named or unnamed); nothing after that end is relayed. An `error` event not
    in Anthropic's envelope (llama-server's bare `{"code", "message", "type"}`, OpenAI's
    `{"error": {...}}`) is put in it. `finish`, at the stream's end, takes an error event the
    server closed on without its blank line. With `tag` (the tag of the replica answering, asked
    once a read says `"tool_use"`), a `tool_use` block's id is tagged (tool_tags.py)."""

    __slots__ = ("_call", "_upstream", "redactor", "_held", "ended", "_cut_sent", "_counted", "_relayed", "_measure_past",
                 "_output", "_tag")  # fmt: skip

    def __init__(self, call: Call, upstream: str, redactor: Redactor, tag: Callable[[], str] | None = None) -> None:
        self._call = call
        self._upstream = upstream  # the server's name, for the messages of the errors it sends
        self.redactor = redactor  # the gateway's keys, kept out of the error events relayed
        self._tag = tag
        self._held = b""
        # `message_stop` or an `error` event went past: nothing after it is relayed. An
        # attribute, not a property: read once per read.
        self.ended = False
        self._cut_sent = False  # part of an oversized event went out
        # For `count_output`, where no `message_delta` tells the output tokens: the bytes
        # relayed, and the read measured next (`output`) once they are past `_measure_past`.
        self._counted = False
        self._relayed = 0
        self._measure_past = -1
        self._output = RelayedOutput()
        if call.outcome is not None:  # the estimate `count_output` would give now (usage's journal)
            call.outcome.progress = lambda: self._output.tokens(self._relayed)

    @property
    def at_boundary(self) -> bool:
        return not self._held and not self._cut_sent

    def take(self, chunk: bytes) -> bytes:
        if self._held:
            chunk = self._held + chunk
            self._held = b""
        if not chunk.endswith(b"\n\n"):
            end = chunk.rfind(b"\n\n")
            cut = end + 2 if end >= 0 else 0
            end = chunk.rfind(b"\n\r\n")  # CRLF line ends
            if end >= 0 and end + 3 > cut:
                cut = end + 3
            if cut < len(chunk):
                if len(chunk) - cut > MAX_HELD_EVENT:
                    self._cut_sent = True
                    return chunk
                chunk, self._held = chunk[:cut], chunk[cut:]
        self._cut_sent = False
        if chunk and not chunk.isascii():
            try:
                chunk.decode()
            except UnicodeDecodeError:  # bytes that are no UTF-8 would fail the SDKs' decoding of the whole stream
                chunk = chunk.decode("utf-8", "replace").encode()
        if chunk:
            if self._tag is not None and TOOL_USE in chunk:
                chunk = tagged_events(chunk, self._tag())
            at = chunk.rfind(b"message_delta")
            if at >= 0:  # the counts follow the event's name; not the whole burst is searched
                if note_usage(self._call, chunk[at:]):
                    self._counted = True
                    self._measure_past = 1 << 62  # nothing more to estimate
                chunk = _completed_event(chunk, at, "message_delta", "delta", DELTA_NULLS)
            # Only then the closer look. "error", not '"error"': llama-server's bare error object
            # says it only in its `event: error` line. Still these two searches per read, the
            # second's word only shorter; a text that says "error" pays for the look (_end_event),
            # which finds no end there.
            if b'"message_stop"' in chunk or b"error" in chunk:
                chunk = self._end(chunk)
            self._relayed += len(chunk)
            if self._relayed > self._measure_past:
                self._measure_past = self._output.measure(chunk, self._relayed)
        return chunk

    def count_output(self) -> None:
        """At the stream's end, however it ended: where no `message_delta` told the output
        tokens (the client left, the upstream failed or ended with an `error` event), the
        estimate of what was relayed, which only `message_start`'s count may exceed. An
        estimate is at most `max_tokens`: the upstream generates no more."""
        outcome = self._call.outcome
        if outcome is None or self._counted:
            return
        relayed = self._output.tokens(self._relayed)
        if relayed:
            most = max_tokens(self._call)
            relayed = min(relayed, most) if most else relayed
        outcome.output_tokens = max(outcome.output_tokens or 0, relayed)

    def _end(self, chunk: bytes) -> bytes:
        found = _end_event(chunk)
        if found is None:
            return chunk  # a text, a stop sequence or a tool named so
        self.ended = True
        self._held = b""  # what follows the end (a proxy's `data: [DONE]`) is no part of the reply
        end = chunk.find(b"\n\n", found.end())
        crlf_end = chunk.find(b"\n\r\n", found.end())  # the end of that event: whole events only came here
        if end < 0 or 0 <= crlf_end < end:
            end, width = crlf_end, 3
        else:
            width = 2
        if end >= 0:
            chunk = chunk[: end + width]
        if found[found.lastindex or 0] == b"error":
            chunk, kind = self._in_envelope(chunk, found.start())
            chunk = self.redactor.redact_bytes(chunk)  # a server may quote the gateway's key back
            outcome = self._call.outcome
            if outcome is not None:  # counted as the upstream's error, as on the translating path
                if kind is None:
                    named = _ERROR_TYPE.search(chunk)
                    kind = named.group(1).decode() if named else "api_error"
                outcome.error_type = kind
                outcome.upstream_failed = True
        return chunk

    def _in_envelope(self, chunk: bytes, at: int) -> tuple[bytes, str | None]:
        """`chunk`, ending with the `error` event whose line begins at `at`, with that event in
        Anthropic's envelope, and the error's type if it was put there. Anthropic's envelope
        goes as it came; another shape (llama-server's `{"code": 500, "message", "type"}`,
        OpenAI's `{"error": {...}}`) is mapped as the same error opening the stream is
        (error_mapping.from_error_event), so the SDKs' exception has Anthropic's `.body`."""
        lf, crlf = chunk.rfind(b"\n\n", 0, at), chunk.rfind(b"\n\r\n", 0, at)
        start = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)  # the event's first line
        data = error_event_data(chunk[start:])
        if data is None or anthropic_envelope(data) is not None:
            return chunk, None
        error = from_error_event(data, upstream=self._upstream, redactor=self.redactor)
        event = error.event()
        if chunk.endswith(b"\r\n"):  # the server's line ends, as the rest of its stream has them
            event = event.replace(b"\n", b"\r\n")
        return chunk[:start] + event, error.type

    def finish(self) -> bytes:
        """At the stream's end, once: the held event if it is a whole `error` event but for its
        blank line (a server that wrote it and closed), completed and taken as any error event
        is (the stream's end, in Anthropic's envelope); else nothing, and the stream is
        incomplete as it was. Nothing of this is done per read."""
        held = self._held
        if self.ended or not _whole_error(held):
            return b""
        self._held = b""
        line_end = b"\r\n" if b"\r" in held else b"\n"  # the server's (an event cut in its first line: \n)
        if held.endswith(b"\r"):
            held += b"\n"
        elif not held.endswith(b"\n"):
            held += line_end
        return self.take(held + line_end)

    def complete(self) -> bool:
        return self.ended and not self._cut_sent

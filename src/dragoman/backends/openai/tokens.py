"""A stream's text tokens read without decoding their whole chunk.

A server streams most of a reply as chunks that differ only in their text: the same id,
model, creation time and empty fields around `"delta":{"content":"…"}`. Once one such
chunk has been decoded whole, its bytes before and after the text are a template: a
later payload that starts and ends with them, with one JSON string between, is that
chunk with another text, and only the string is decoded (most of the CPU of a translated
token was the chunk's decoding). The template is learnt only if a probe proves it: the
chunk with another string in that place decodes to the same chunk with that text. A
payload that does not fit is decoded whole, as before.

A read that holds many such events (a burst, or a client slower than the model) is read as
one run (`TokenTemplate.run`): its lines are split, the template's bytes and the strings'
quotes cut from each, and the run is proved by writing it back from the texts left. Their texts go to the client
joined, in one text delta: they arrived together, so nothing waits for it, and any split of
a block's text into deltas is a valid stream (the SDKs join them). Strings the encoder would
write the same (`_plain`, `_copyable`: raw UTF-8, only its own escapes) are joined as they
are; others are decoded and encoded again. Nothing else of the run is decoded.
"""

from __future__ import annotations

import operator
import re

import msgspec

from dragoman.protocol import openai

LEARN_TRIES = 16  # templates a stream may learn in a row that serve no token: a server whose chunks all differ
# stops paying for it; one whose chunks change now and then (a `created` of each second) learns again
_PROBE = "\x00probe"
_PROBE_JSON = msgspec.json.encode(_PROBE)
_TEXT = msgspec.json.Decoder(str)
_ENCODE = msgspec.json.Encoder().encode
# A non-empty JSON string as msgspec writes it: no control character raw, and only the escapes
# it writes (`\u` escapes are left out: it writes few, and other writers many it does not).
_STRING = rb'"(?:[^"\\\x00-\x1f]++|\\["\\btnfr])++"'
_STRINGS = re.compile(rb"%s(?:\x00%s)*+" % (_STRING, _STRING))  # a run's strings, joined by NULs
_SPLIT_WHOLE = 4096  # bytes around a run split with it rather than the run copied out (a burst's head and end)
_PLAIN = bytes(b for b in range(256) if b >= 0x20 and b not in b'"\\')  # what a string holds as it is


class TokenTemplate:
    """The bytes around a stream's text tokens, once learnt: in a `data:` payload, and in a
    whole read that is one `data: …` event (how tokens arrive one by one)."""

    __slots__ = (
        "_head",
        "_tail",
        "_read_head",
        "_read_tail",
        "_least",
        "_tries",
        "_served",
        "_text",
        "_seam",
        "learnt",
    )

    def __init__(self) -> None:
        self._head = self._tail = self._read_head = self._read_tail = b""
        self._least = 0  # shorter payloads cannot fit (head, a string of one character at least, tail)
        self._tries = LEARN_TRIES
        self._served = False  # the template has read a token since it was learnt
        self._text = operator.itemgetter(slice(0))  # an event's line to its string's text (no quotes), once learnt
        self._seam = b""  # the bytes between two events' strings' texts (their quotes among them)
        self.learnt = False  # (a plain attribute: read once per read)

    def begins(self, data: bytes, at: int = 0) -> bool:
        """Whether `data` from `at` begins as a token's event does."""
        return data.startswith(self._read_head, at)

    def text(self, payload: bytes) -> str | None:
        """The payload's text, if it is the template's chunk with another (non-empty) text; else None."""
        if not self._least or len(payload) < self._least:
            return None
        text = _between(payload, self._head, self._tail)
        if text is not None:
            self._served = True
        return text

    def read(self, data: bytes) -> str | None:
        """`text` of a read that is one whole `data: <payload>\n\n` event, the decoder holding nothing."""
        if not self._least or len(data) < self._least + 8 or data.find(b"\n") != len(data) - 2:
            return None  # (several events: `run` reads them)
        text = _between(data, self._read_head, self._read_tail)
        if text is not None:
            self._served = True
        return text

    def run(self, data: bytes, at: int = 0) -> tuple[bytes, int, int] | None:
        """A read that begins (from `at`) with whole events of the template's chunk (the decoder
        holding nothing), up to the last of them in it: their texts joined, as one JSON string
        as the encoder writes it; how many tokens (non-empty texts) they are; and where they
        end. None when the read does not begin so, something else comes between them, or a
        string is no JSON string."""
        head, tail = self._read_head, self._read_tail
        if not self._least or not data.startswith(head, at):
            return None
        end = data.rfind(tail) + len(tail)
        if end < at + self._least + 8:
            return None
        # Each event's line, less the template's bytes around its string: what the events are
        # if writing them back from those strings gives the same bytes. (Splitting at each
        # newline is the cheapest cut: a search for a longer separator costs more than it saves.)
        if at == 0 and end == len(data):  # a read of tokens alone (written straight to the client)
            lines = data.split(b"\n")[0:-1:2]
        elif at + len(data) - end <= _SPLIT_WHOLE:  # the few lines around the run split too, not copied
            lines = data.split(b"\n")
            lines = lines[data.count(b"\n", 0, at) : len(lines) - 1 - data.count(b"\n", end) : 2]
        else:
            lines = data[at:end].split(b"\n")[0:-1:2]
        # The strings' texts, less their quotes: written back between the quotes and the seam.
        texts = list(map(self._text, lines))
        written = self._seam.join(texts)
        start, stop = at + len(head), end - len(tail) - 1  # the first string's quote, the last's
        if (
            len(written) != stop - start - 1
            or data[start] != 34  # '"'
            or data[stop] != 34
            or not data.startswith(written, start + 1)
        ):
            return None
        joined = b"\x00".join(texts)
        if all(texts) and _plain(joined, len(texts)):  # (most runs: non-empty texts that need nothing)
            self._served = True
            return b'"' + joined.translate(None, b"\x00") + b'"', len(texts), end
        strings = [b'"%b"' % text for text in texts]
        joined = b"\x00".join(strings)  # (no JSON string holds a NUL raw)
        if not _copyable(joined, len(strings)):
            rewritten = _rewritten(strings)
            if rewritten is None:
                return None
            joined = b"\x00".join(rewritten)
            strings = rewritten
        self._served = True
        return joined.replace(b'"\x00"', b""), len(strings), end

    def learn(self, payload: bytes, chunk: openai.ChatChunk) -> None:
        """Take `chunk` (decoded from `payload`) as the template if it is a plain text token."""
        if self._served:
            self._tries, self._served = LEARN_TRIES, False
        if self._tries <= 0 or not plain_text(chunk):
            return
        self._tries -= 1
        choice = chunk.choices[0]
        text = msgspec.json.encode(choice.delta.content)
        at = payload.find(text)
        if at < 0 or payload.find(text, at + 1) >= 0:
            return  # written otherwise (escaped differently), or not in one place only
        head, tail = payload[:at], payload[at + len(text) :]
        try:
            probe = openai.CHAT_CHUNK.decode(head + _PROBE_JSON + tail)
        except msgspec.DecodeError:
            return
        delta = msgspec.structs.replace(choice.delta, content=_PROBE)
        if probe != msgspec.structs.replace(chunk, choices=[msgspec.structs.replace(choice, delta=delta)]):
            return
        self._head, self._tail = head, tail
        self._read_head, self._read_tail = b"data: " + head, tail + b"\n\n"  # the payload, stripped, has no newline
        self._least = len(head) + len(tail) + 3
        self._text = operator.itemgetter(slice(len(self._read_head) + 1, -len(tail) - 1))
        self._seam = b'"' + self._read_tail + self._read_head + b'"'
        self.learnt = True


def _copyable(joined: bytes, count: int) -> bool:
    """Whether `count` JSON strings joined by NULs are each a text, written as the encoder
    writes it (raw UTF-8, only its own escapes)."""
    if b"\\" in joined:
        if _STRINGS.fullmatch(joined) is None or joined.count(b"\x00") != count - 1:
            return False
    elif b'""' in joined or joined.translate(None, _PLAIN) != (_QUOTES[count] if count < 64 else _quotes(count)):
        return False  # an empty string, or not strings alone (a quote or a control character raw)
    return _utf8(joined)


def _plain(joined: bytes, count: int) -> bool:
    """Whether `count` texts joined by NULs are each raw text that JSON strings hold as it
    is (no quote, backslash or control character) in UTF-8."""
    if joined.translate(None, _PLAIN) != (_NULS[count - 1] if count <= len(_NULS) else b"\x00" * (count - 1)):
        return False
    return _utf8(joined)


def _utf8(joined: bytes) -> bool:
    """Whether the bytes are UTF-8 (ASCII, the common case, answered without decoding)."""
    if joined.isascii():
        return True
    try:
        joined.decode()
    except UnicodeDecodeError:
        return False
    return True


_NULS = [b"\x00" * count for count in range(64)]


def _quotes(count: int) -> bytes:
    """What `count` strings joined by NULs hold but their text: their quotes, and the NULs."""
    return b'"' + b'"\x00"' * (count - 1) + b'"'


_QUOTES = [b""] + [_quotes(count) for count in range(1, 64)]


def _rewritten(strings: list[bytes]) -> list[bytes] | None:
    """The strings as the encoder writes them, each decoded and encoded again where it is
    written otherwise (`\\u` escapes), empty texts left out (no token: no delta, no count);
    None if one is no JSON string."""
    out = []
    for string in strings:
        if _copyable(string, 1):
            out.append(string)
            continue
        try:
            text = _TEXT.decode(string)
        except msgspec.DecodeError:
            return None
        if text:
            out.append(_ENCODE(text))
    return out


def _between(data: bytes, head: bytes, tail: bytes) -> str | None:
    """The non-empty JSON string between `head` and `tail` that make up `data`, else None."""
    if not (data.startswith(head) and data.endswith(tail)):
        return None
    try:
        text = _TEXT.decode(data[len(head) : len(data) - len(tail)])
    except msgspec.DecodeError:
        return None
    return text or None


def plain_text(chunk: openai.ChatChunk) -> bool:
    """One choice, with text and nothing else: what `StreamTranslator.feed_text` stands for."""
    if chunk.error is not None or chunk.usage is not None or len(chunk.choices) != 1:
        return False
    choice = chunk.choices[0]
    delta = choice.delta
    return bool(
        delta.content
        and not (delta.reasoning or delta.reasoning_content or delta.tool_calls or delta.refusal)
        and not choice.finish_reason
    )

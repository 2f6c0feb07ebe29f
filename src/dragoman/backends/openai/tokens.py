"""A stream's text tokens read without decoding their whole chunk.

A server streams most of a reply as chunks that differ only in their text: the same id,
model, creation time and empty fields around `"delta":{"content":"…"}`. Once one such
chunk has been decoded whole, its bytes before and after the text are a template: a
later payload that starts and ends with them, with one JSON string between, is that
chunk with another text, and only the string is decoded (most of the CPU of a translated
token was the chunk's decoding). The template is learnt only if a probe proves it: the
chunk with another string in that place decodes to the same chunk with that text. A
payload that does not fit is decoded whole, as before.
"""

from __future__ import annotations

import msgspec

from dragoman.protocol import openai

LEARN_TRIES = 16  # templates a stream may learn in a row that serve no token: a server whose chunks all differ
# stops paying for it; one whose chunks change now and then (a `created` of each second) learns again
_PROBE = "\x00probe"
_PROBE_JSON = msgspec.json.encode(_PROBE)
_TEXT = msgspec.json.Decoder(str)


class TokenTemplate:
    """The bytes around a stream's text tokens, once learnt: in a `data:` payload, and in a
    whole read that is one `data: …` event (how tokens arrive one by one)."""

    __slots__ = ("_head", "_tail", "_read_head", "_read_tail", "_least", "_tries", "_served")

    def __init__(self) -> None:
        self._head = self._tail = self._read_head = self._read_tail = b""
        self._least = 0  # shorter payloads cannot fit (head, a string of one character at least, tail)
        self._tries = LEARN_TRIES
        self._served = False  # the template has read a token since it was learnt

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
        if not self._least or len(data) < self._least + 8:
            return None
        text = _between(data, self._read_head, self._read_tail)
        if text is not None:
            self._served = True
        return text

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

"""The first-content gate of a streamed reply: until its first content event, a failure (a
raised error, or an `error` event in a 200 stream: Anthropic's, or vLLM's and SGLang's
`data: {"error": ...}`) may still move the request to another model; after it, never: the
stream ends with an `error` event, as any failure mid-stream does.

Keep-alives pass while the gate waits. A `message_start` the client already has (the
translating path sends one with its first keep-alive) is not sent twice: the next model's is
left out. Until content comes, nothing is written straight to the client, so every chunk
passes here; from then on the stream's own direct writes resume. What was registered on the
reply (`Streaming.observe`, `transform`) is handed to each model's stream in turn.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable
from typing import Protocol

from dragoman.calls.types import Call, DirectWrites, Reply, Route, Streaming
from dragoman.core.error_mapping import from_error_event, from_upstream
from dragoman.core.errors import GatewayError
from dragoman.core.redaction import NO_KEYS

_CONTENT = (b"content_block_start", b"message_delta", b"message_stop")
_START = re.compile(rb"event: ?message_start\r?\ndata: ?[^\n]*\r?\n\r?\n")
_ERROR = re.compile(rb'(?:^|\n)(?:event: ?error\r?\ndata: ?([^\n]*)|data: ?(\{"(?:type": ?"error"|error": ?\{)[^\n]*))')


class Chooser(Protocol):
    """What the gate asks of `fallbacks.Attempts`."""

    async def after(self, error: GatewayError) -> tuple[str, Route] | None: ...

    def attempt(self, call: Call, name: str, target: Route) -> Awaitable[Reply]: ...

    def let_go(self) -> None: ...


def in_band_error(chunk: bytes, upstream: str) -> GatewayError | None:
    """The error an `error` event in `chunk` carries, as the status it would have had."""
    if b"error" not in chunk:
        return None
    found = _ERROR.search(chunk)
    if found is None:
        return None
    data = found.group(1) or found.group(2)
    error = from_error_event(data.strip(), upstream=upstream, redactor=NO_KEYS)  # relayed: redacted by its backend
    error.upstream = upstream
    return error


class Gate:
    """One streamed reply, the models it may still move to, and where its stream stands."""

    def __init__(self, chooser: Chooser, call: Call, first: Streaming) -> None:
        self._chooser = chooser
        self._call = call
        self._current = first
        self._headers = first.headers  # the reply's: the endpoint reads them when its head goes out
        self._inner = first.direct  # held back (no writer) until content has gone out
        self._outer = DirectWrites() if first.direct is not None else None
        self._content = False
        self._started = False  # a message_start has gone to the client

    def reply(self) -> Streaming:
        first = self._current
        return Streaming(self._chunks(), headers=first.headers, status=first.status, on_close=self._close,
                         direct=self._outer)  # fmt: skip

    def _close(self) -> None:
        if self._current.on_close is not None:
            self._current.on_close()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            try:
                async for chunk in self._gated(self._current):
                    yield chunk
                return
            except GatewayError as error:
                if self._content:
                    raise
                following = await self._chooser.after(error)
                if following is None:
                    raise
                await self._switch(*following)

    async def _gated(self, reply: Streaming) -> AsyncIterator[bytes]:
        chunks = reply.chunks
        stages = self._outer.stages if self._outer is not None else None  # what was registered on the reply
        if stages is not None:
            if reply.direct is not None:
                reply.direct.stages = stages  # its pump runs them, before its first output
            else:
                chunks = stages.around(chunks)  # no pump behind this one: run around its chunks
        try:
            async for chunk in chunks:
                if not self._content:
                    chunk = self._before_content(chunk)
                    if not chunk:
                        continue
                yield chunk
        finally:
            for stream in {id(chunks): chunks, id(reply.chunks): reply.chunks}.values():
                closing = getattr(stream, "aclose", None)
                if closing is not None:
                    await closing()

    def _before_content(self, chunk: bytes) -> bytes:
        if self._started and b"message_start" in chunk:
            chunk = _START.sub(b"", chunk, count=1)  # the client has one already
        error = in_band_error(chunk, self._current_upstream())
        if error is not None:
            raise error
        if b"message_start" in chunk:
            self._started = True
        if any(marker in chunk for marker in _CONTENT):
            self._content = True
            if self._inner is not None and self._outer is not None:
                self._inner.writer = self._outer.writer  # the stream may write straight to the client now
        return chunk

    def _current_upstream(self) -> str:
        outcome = self._call.outcome
        return outcome.upstream if outcome is not None and outcome.upstream else "upstream"

    async def _switch(self, name: str, target: Route) -> None:
        """The stream of the next model (it may itself fall through to the ones after it)."""
        self._close()
        self._chooser.let_go()  # the failed one's slot, if it took one
        reply = await self._chooser.attempt(self._call, name, target)
        if not isinstance(reply, Streaming):  # an error answer passed through, whole
            raise from_upstream(reply.status, reply.body, upstream=target.upstream, redactor=NO_KEYS)  # as relayed
        self._headers.update(reply.headers)
        self._current, self._inner = reply, reply.direct

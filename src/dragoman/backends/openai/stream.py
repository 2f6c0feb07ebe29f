"""The translating backend's streams: an OpenAI-compatible server's Chat Completions
stream read (by the one pump, `upstream.pump`) as batches of Anthropic events, for the
client (SSE) or to fold into one message (`backends.openai`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Generic, TypeVar

import msgspec

from dragoman.backends.openai.tokens import TokenTemplate
from dragoman.calls.types import ClientWriter, DirectWrites, Outcome
from dragoman.core.config import OpenAIUpstream
from dragoman.core.error_mapping import from_stream_error, upstream_message
from dragoman.core.errors import GatewayError, UpstreamError
from dragoman.core.redaction import Redactor
from dragoman.protocol import anthropic, openai
from dragoman.protocol.sse import DataDecoder, encode_all, text_delta, text_delta_written
from dragoman.tokens.estimate import completion_estimate
from dragoman.translate.stream import StreamTranslator
from dragoman.upstream.errors import upstream_errors
from dragoman.upstream.keepalive import BodyEnds
from dragoman.upstream.pump import Pump
from dragoman.upstream.transport.response import Response

T = TypeVar("T")
Batch = list[anthropic.StreamEvent]
PINGS: Batch = [anthropic.Ping()]
FIRST_PIECE = 512  # bytes of a stream's first read split into events at a time until its first token is out


class ChatStreams:
    """How one upstream's streams are read (`upstream.pump.Pump`: its name, timeouts and
    keep-alive interval), each through a `Translation`."""

    __slots__ = ("_pump", "name")

    def __init__(self, name: str, upstream: OpenAIUpstream, keepalive: float, ends: BodyEnds) -> None:
        self.name = name
        self._pump = Pump(name, upstream, keepalive, ends)

    def translated(
        self,
        response: Response,
        translator: StreamTranslator,
        outcome: Outcome | None,
        encode: Callable[[Batch], T],
        prompt_tokens: Callable[[], Awaitable[int]] | None = None,
        direct: DirectWrites | None = None,
        estimate: Callable[[], int] | None = None,
        sse: bool = False,
    ) -> AsyncGenerator[T, None]:
        """An upstream stream as batches of Anthropic events (one per network read, the
        first token alone), each passed through `encode`: SSE bytes for the client, or
        the events themselves to fold. After the first token, reads go straight to
        `direct`'s writer when there is one (SSE only), from the connection's callback.
        Raises GatewayError after yielding what came before the failure; always closes
        or releases the upstream response. `estimate` gives the prompt's tokens, cheaply,
        for the record a crash mid-stream leaves (usage's journal). `sse`: `encode` is
        `encode_all` (the client's stream), so a batch may carry frames encoded already."""
        translation = Translation(self.name, translator, outcome, encode, prompt_tokens, estimate, sse)
        if response.content_type == "application/json":  # the upstream ignored `stream: true`
            return translation.whole(response)
        return self._pump.run(response, translation, direct)


class Translation(Generic[T]):
    """The translating path's `upstream.pump.Transformer`: Chat Completions chunks in,
    batches of Anthropic events out (`encode`d)."""

    __slots__ = ("_decoder", "_encode", "_opening", "_outcome", "_prompt_tokens", "_sse", "_tokens", "cut", "ended", "name",
                 "started", "translator")  # fmt: skip

    def __init__(self, name: str, translator: StreamTranslator, outcome: Outcome | None, encode: Callable[[Batch], T],
                 prompt_tokens: Callable[[], Awaitable[int]] | None,
                 estimate: Callable[[], int] | None = None, sse: bool = False) -> None:  # fmt: skip
        self.name = name
        self.translator = translator
        self._outcome = outcome
        self._encode = encode
        self._prompt_tokens = prompt_tokens
        self._decoder = DataDecoder()
        self._tokens = TokenTemplate()  # text tokens read without decoding their whole chunk
        self._sse = sse  # `encode` makes SSE (`encode_all`): a batch may hold frames encoded already
        # Plain attributes, not properties: the pump reads them once per read.
        self.started = False  # the first token has gone out
        self.ended = False  # `[DONE]` came, or a stop sequence matched
        self.cut = False  # a stop sequence matched: the upstream is closed at once
        # `message_start` goes out with what comes first (the first token, a ping, the end):
        # one write fewer before the first token, whose time clients see.
        self._opening: Batch = translator.start()
        if outcome is not None:  # one output token per chunk until the upstream tells its usage
            outcome.progress = lambda: (translator.usage_so_far() or translator.usage).output_tokens
            outcome.input_so_far = lambda: input_so_far(translator, estimate)

    def silence(self) -> T:
        return self._with_start(PINGS)

    def resent(self, response: Response) -> None:
        pass  # the reply's headers were the gateway's own, sent already

    def abandoned(self) -> None:
        outcome = self._outcome
        if outcome is not None and outcome.output_tokens is None:
            # Cut short: what the upstream reported so far, else one output token per chunk
            # received (its input then unknown: the limits estimate it; usage records 0).
            translator = self.translator
            cut = translator.usage_so_far()
            note_usage(outcome, cut if cut is not None else translator.usage)
            if translator.needs_usage:
                outcome.input_tokens = None

    def _with_start(self, batch: Batch) -> T:
        if self._opening:
            batch, self._opening = self._opening + batch, []
        return self._encode(batch)

    def feed(self, data: bytes) -> Iterable[T]:
        if not self.started:
            return self._first(data)
        out: Batch = []
        try:
            self._translate(data, out)
        except GatewayError as error:
            if not out:
                raise
            return _then_raise(self._encode(out), error)  # what came before the failure still reaches the client
        return (self._encode(out),) if out else ()

    def _first(self, data: bytes) -> Iterator[T]:
        """A read before the first token: it can hold a whole burst. The first token goes
        out before the rest is translated: the read is split into events a piece at a time
        (`_piece_end`) until it has, the rest at once (`_translate`: a run of text tokens
        made straight from their bytes)."""
        out: Batch = []
        at = 0
        try:
            while at < len(data) and not self.ended:
                if self.started:
                    self._translate(data[at:] if at else data, out)
                    break
                end = _piece_end(data, at)
                payloads = self._decoder.feed(data[at:end] if at or end < len(data) else data)
                at = end
                used = self._feed(payloads, out, first_alone=True)
                if out:
                    self.started = True
                    yield self._with_start(out)
                    out = []
                self._feed(payloads[used:], out)
        except GatewayError:
            if out:
                yield self._with_start(out)  # what came before the failure still reaches the client
            raise
        if out:
            yield self._encode(out)

    def feed_to(self, data: bytes, writer: ClientWriter) -> None:
        if self._decoder.idle:  # a read of one text token, as most are: no chunk, no events made
            text = self._tokens.read(data)
            if text is not None:
                index = self.translator.streaming_text(text)
                if index >= 0:
                    writer.write(text_delta(index, text))
                    return
        out: Batch = []
        try:
            self._translate(data, out)
        finally:
            if out:
                writer.write(encode_all(out))  # what came before a failure still reaches the client

    def _translate(self, data: bytes, out: Batch) -> None:
        """A read's events into `out`. Text tokens, while the client's text block is open, go
        as one text delta made from their bytes (`TokenTemplate.run`), from its first whole event."""
        if self._sse and self._tokens.learnt and self.translator.open_text() >= 0:
            if not (self._decoder.idle and self._tokens.begins(data)):
                cut = data.find(b"\n\n") + 2  # the end of the event the read begins with (or inside)
                if not 1 < cut < len(data):
                    self._feed(self._decoder.feed(data), out)
                    return
                self._feed(self._decoder.feed(data[:cut]), out)
                data = data[cut:]
                if self.ended:
                    return
            index = self.translator.open_text()
            run = self._tokens.run(data) if index >= 0 and self._decoder.idle else None
            if run is not None:
                string, count, end = run
                if count:  # (empty texts are no tokens)
                    self.translator.streamed(count)
                    out.append(text_delta_written(index, string))  # type: ignore[arg-type]  # an SSE batch takes frames made already
                if end == len(data):
                    return
                data = data[end:]
        self._feed(self._decoder.feed(data), out)

    async def finish(self) -> AsyncIterator[T]:
        translator = self.translator
        if not translator.done and not translator.finished_upstream:
            raise UpstreamError(f"upstream {self.name} closed the stream before the reply was complete")
        if translator.needs_usage and self._prompt_tokens is not None:
            translator.assume_usage(await self._prompt_tokens())
        final = translator.finish()
        note_usage(self._outcome, translator.usage)
        yield self._with_start(final)

    async def whole(self, response: Response) -> AsyncGenerator[T, None]:
        """The reply of an upstream that answered a stream request with one completion."""
        opening = response.opening
        try:
            with upstream_errors(self.name):
                body = await response.read()
            completion = completion_of(body, self.name, self.translator.redactor)
        except BaseException:
            response.close()
            self.abandoned()
            raise
        finally:
            if opening is not None:
                opening.close()
        response.release()  # read to the end: the connection can be reused
        choice = completion.choices[0]
        whole = openai.ChatChunk(
            choices=[openai.ChunkChoice(delta=choice.message, finish_reason=choice.finish_reason)],
            usage=completion.usage,
        )
        translator = self.translator
        events = self._opening + translator.feed(whole)
        self._opening = []
        if translator.needs_usage and self._prompt_tokens is not None:  # a server that reports none
            translator.assume_usage(await self._prompt_tokens(), completion_estimate(choice.message))
        events += translator.finish()
        note_usage(self._outcome, translator.usage)
        yield self._encode(events)

    def _feed(self, payloads: list[bytes], out: Batch, *, first_alone: bool = False) -> int:
        """Translate a read's `data:` payloads into `out`, up to `[DONE]` or the reply's end;
        with `first_alone`, stop once `out` holds something. How many payloads were used
        (all of them at `[DONE]` or the end)."""
        translator, tokens, sse = self.translator, self._tokens, self._sse
        for used, payload in enumerate(payloads, 1):
            text = tokens.text(payload)
            if text is not None:
                index = translator.streaming_text(text) if sse else -1
                if index >= 0:
                    out.append(text_delta(index, text))  # type: ignore[arg-type]  # an SSE batch takes frames made already
                else:
                    translator.feed_text(text, out)
            elif payload == b"[DONE]":
                translator.upstream_ended = self.ended = True
                break
            else:
                chunk = self._chunk(payload)
                out.extend(translator.feed(chunk))
                tokens.learn(payload, chunk)
            if translator.done:
                self.ended = self.cut = True
                break
            if first_alone and out:
                return used
        return len(payloads)

    def _chunk(self, payload: bytes) -> openai.ChatChunk:
        try:
            return openai.CHAT_CHUNK.decode(payload)
        except msgspec.DecodeError as error:
            try:  # a token cut inside a UTF-8 sequence (some servers stream bytes, not characters)
                repaired = payload.decode("utf-8", "replace").encode()
                if repaired != payload:
                    return openai.CHAT_CHUNK.decode(repaired)
            except msgspec.DecodeError:
                pass
            raise UpstreamError(f"upstream {self.name} sent an unreadable stream chunk: {error}") from None


def _piece_end(data: bytes, at: int) -> int:
    """Where the piece of `data` from `at` split into events before the first token ends:
    FIRST_PIECE bytes at most, up to the last event that ends in them if one does."""
    if len(data) - at <= FIRST_PIECE:
        return len(data)
    end = data.rfind(b"\n\n", at, at + FIRST_PIECE)
    return end + 2 if end >= 0 else at + FIRST_PIECE


def input_so_far(translator: StreamTranslator, estimate: Callable[[], int] | None) -> int:
    """A stream's input tokens before it ended: the upstream's, if it told them (some servers
    report usage in every chunk), else the estimate, else 0."""
    if not translator.needs_usage:
        return translator.usage.input_tokens
    return estimate() if estimate is not None else 0


def _then_raise(out: T, error: BaseException) -> Iterator[T]:
    yield out
    raise error


def completion_of(body: bytes, upstream: str, redactor: Redactor) -> openai.ChatCompletion:
    """A completion body decoded, or the upstream's failure in it raised."""
    try:
        completion = openai.CHAT_COMPLETION.decode(body)
    except msgspec.DecodeError as error:
        raise UpstreamError(f"upstream {upstream} sent an unreadable completion: {error}") from None
    if not completion.choices:  # some servers answer a failure with 200 and an error body
        if b'"error"' in body:
            raise from_stream_error(upstream_message(body)[0], upstream=upstream, redactor=redactor)
        raise UpstreamError(f"upstream {upstream} returned a completion without choices")
    return completion


def note_usage(outcome: Outcome | None, usage: anthropic.Usage) -> None:
    """The reply's token counts, noted in the request's outcome."""
    if outcome is not None:
        outcome.input_tokens, outcome.output_tokens = usage.input_tokens, usage.output_tokens
        outcome.cache_read_tokens = usage.cache_read_input_tokens

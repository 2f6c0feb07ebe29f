"""The translating backend's stream loop: an OpenAI-compatible server's Chat Completions
stream read as batches of Anthropic events, for the client (SSE) or to fold into one
message (`backends.openai`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import msgspec

from dragoman.core.config import OpenAIUpstream
from dragoman.core.errors import (
    GatewayError,
    UpstreamError,
    from_stream_error,
    upstream_message,
)
from dragoman.core.types import DirectWrites
from dragoman.protocol import anthropic, openai
from dragoman.protocol.sse import DataDecoder, encode_all
from dragoman.tokens.estimate import completion_estimate
from dragoman.translate.stream import StreamTranslator
from dragoman.upstream.errors import upstream_errors
from dragoman.upstream.keepalive import ReadWatch, Silence, end_body
from dragoman.upstream.transport.response import Response

if TYPE_CHECKING:  # observe imports the backends
    from dragoman.core.types import Outcome

T = TypeVar("T")
Batch = list[anthropic.StreamEvent]
PINGS: Batch = [anthropic.Ping()]
FIRST_PIECE = 2048  # bytes of a stream's first read split into events before its first token goes out


class ChatStreams:
    """How one upstream's streams are read: its name (in errors), its read timeouts, and
    the keep-alive interval (a ping batch after that long without a read)."""

    __slots__ = ("_keepalive", "_upstream", "name")

    def __init__(self, name: str, upstream: OpenAIUpstream, keepalive: float) -> None:
        self.name = name
        self._upstream = upstream
        self._keepalive = keepalive

    async def translated(
        self,
        response: Response,
        translator: StreamTranslator,
        outcome: Outcome | None,
        encode: Callable[[Batch], T],
        prompt_tokens: Callable[[], Awaitable[int]] | None = None,
        direct: DirectWrites | None = None,
    ) -> AsyncGenerator[T, None]:
        """An upstream stream as batches of Anthropic events (one per network read, the
        first token alone), each passed through `encode`: SSE bytes for the client, or
        the events themselves to fold. After the first token, reads go straight to
        `direct`'s writer when there is one (SSE only), from the connection's callback.
        Raises GatewayError after yielding what came before the failure; always closes
        or releases the upstream response."""
        finished = handed_over = False
        watch: ReadWatch | None = None
        opening = response.opening  # a stream's head alone is no answer: until its body begins
        try:
            if response.content_type == "application/json":  # the upstream ignored `stream: true`
                with upstream_errors(self.name):
                    body = await response.read()
                completion = completion_of(body, self.name)
                choice = completion.choices[0]
                whole = openai.ChatChunk(
                    choices=[openai.ChunkChoice(delta=choice.message, finish_reason=choice.finish_reason)],
                    usage=completion.usage,
                )
                events = translator.start() + translator.feed(whole)
                if translator.needs_usage and prompt_tokens is not None:  # a server that reports none
                    translator.assume_usage(await prompt_tokens(), completion_estimate(choice.message))
                events += translator.finish()
                note_usage(outcome, translator.usage)
                finished = True
                yield encode(events)
                return
            # `message_start` goes out with what comes first (the first token, a ping, the end):
            # one write fewer before the first token, whose time clients see.
            opening_events = translator.start()

            def with_start(batch: Batch) -> T:
                nonlocal opening_events
                if opening_events:
                    batch, opening_events = opening_events + batch, []
                return encode(batch)

            decoder = DataDecoder()
            watch = reads = ReadWatch.for_upstream(self._upstream, interval=self._keepalive, name=self.name)
            while (
                opening is not None
            ):  # until the body begins: it may come from another instance (no content block has gone out)
                try:
                    with upstream_errors(self.name):
                        response = await opening.begun(response, reads)
                    break
                except Silence:
                    yield with_start(PINGS)
            started = False
            writes = direct if direct is not None else DirectWrites()
            failed: list[BaseException] = []  # what a direct read raised, re-raised here

            def translate_to_client(raw: bytes) -> bool:  # Response.drain_to's sink: must not raise
                writer = writes.writer
                if writer is None or failed or not writer.ready():
                    return False  # e.g. the client is slow: this read goes through `readany`, and `send` waits
                reads.touch()
                out: list[anthropic.StreamEvent] = []
                try:
                    try:
                        self._feed(translator, decoder.feed(raw), out)
                    finally:
                        if out:
                            writer.write(encode_all(out))  # what came before a failure still reaches the client
                except BaseException as error:  # noqa: BLE001 - handed to the generator, which raises it
                    failed.append(error)
                if failed or translator.done or translator.upstream_ended:
                    response.stop_sink()
                return True

            while not translator.done and not translator.upstream_ended:
                if started and writes.writer is not None:
                    try:
                        await reads.read(response.drain_to(translate_to_client))
                    except Silence:
                        if not failed:  # (a failure in the same loop turn as the ping's timer: no ping)
                            yield encode(PINGS)
                            continue
                    if failed:
                        raise failed[0]
                    if translator.done or translator.upstream_ended:
                        break
                try:
                    with upstream_errors(self.name):
                        raw = await reads.read(response.readany())
                except Silence:
                    yield with_start(PINGS)
                    continue
                if not raw:
                    break
                out: list[anthropic.StreamEvent] = []
                try:
                    if started:
                        self._feed(translator, decoder.feed(raw), out)
                    else:
                        # A read can hold a whole burst: the first token goes out before the rest is
                        # translated, and before most of the read is even split into events.
                        for piece in (raw,) if len(raw) <= FIRST_PIECE else (raw[:FIRST_PIECE], raw[FIRST_PIECE:]):
                            if translator.done or translator.upstream_ended:
                                break
                            payloads = decoder.feed(piece)
                            used = self._feed(translator, payloads, out, first_alone=not started)
                            if out and not started:
                                started = True
                                yield with_start(out)
                                out = []
                            self._feed(translator, payloads[used:], out)
                except GatewayError:
                    if out:
                        yield with_start(out)  # what came before the failure still reaches the client
                    raise
                if out:
                    yield encode(out)
            if not translator.done and not translator.finished_upstream:
                raise UpstreamError(f"upstream {self.name} closed the stream before the reply was complete")
            if translator.needs_usage and prompt_tokens is not None:
                if translator.done:
                    response.close()  # a stop sequence matched: the generation stops now, not after the count below
                translator.assume_usage(await prompt_tokens())
            final = translator.finish()
            note_usage(outcome, translator.usage)
            yield with_start(final)
            finished = not translator.done
            if finished and translator.upstream_ended:
                handed_over = True
                end_body(response)  # the client's reply ends now, not when the server ends its body
        finally:
            if not finished and outcome is not None and outcome.output_tokens is None:
                # Cut short: what the upstream reported so far, else one output token per chunk
                # received (its input then unknown: the limits estimate it; usage records 0).
                cut = translator.usage_so_far()
                note_usage(outcome, cut if cut is not None else translator.usage)
                if translator.needs_usage:
                    outcome.input_tokens = None
            if watch is not None:
                watch.close()
            if opening is not None:
                opening.close()
            if finished and not handed_over:
                response.release()  # read to the end: the connection can be reused
            elif not finished:
                response.close()  # stops the backend's generation

    def _feed(self, translator: StreamTranslator, payloads: list[bytes], out: list[anthropic.StreamEvent], *,
              first_alone: bool = False) -> int:  # fmt: skip
        """Translate a read's `data:` payloads into `out`, up to `[DONE]` or the reply's end;
        with `first_alone`, stop once `out` holds something. How many payloads were used
        (all of them at `[DONE]` or the end)."""
        for used, payload in enumerate(payloads, 1):
            if payload == b"[DONE]":
                translator.upstream_ended = True
                break
            out.extend(translator.feed(self._chunk(payload)))
            if translator.done:
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


def completion_of(body: bytes, upstream: str) -> openai.ChatCompletion:
    """A completion body decoded, or the upstream's failure in it raised."""
    try:
        completion = openai.CHAT_COMPLETION.decode(body)
    except msgspec.DecodeError as error:
        raise UpstreamError(f"upstream {upstream} sent an unreadable completion: {error}") from None
    if not completion.choices:  # some servers answer a failure with 200 and an error body
        if b'"error"' in body:
            raise from_stream_error(upstream_message(body)[0], upstream=upstream)
        raise UpstreamError(f"upstream {upstream} returned a completion without choices")
    return completion


def note_usage(outcome: Outcome | None, usage: anthropic.Usage) -> None:
    """The reply's token counts, noted in the request's outcome."""
    if outcome is not None:
        outcome.input_tokens, outcome.output_tokens = usage.input_tokens, usage.output_tokens
        outcome.cache_read_tokens = usage.cache_read_input_tokens

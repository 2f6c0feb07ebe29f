"""The passthrough backend: upstreams that speak /v1/messages themselves.

The body goes upstream unchanged but for the model name; the reply comes back as
the upstream sent it (status, error body, `anthropic-*` and rate-limit headers),
stream bytes forwarded as they arrive. Only the model name in the reply is put
back to the client's, within a bounded look-ahead at the start of the stream, and
a stream that starts without `message_start` gets one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

import msgspec

from dragoman.backends.base import (
    Call,
    Completed,
    DirectWrites,
    Reply,
    Streaming,
    UpstreamModel,
    upstream_errors,
)
from dragoman.backends.http import MAX_ERROR_BODY, HttpClient
from dragoman.backends.keepalive import ReadWatch, Silence, head_or_task, late_start, read_past_end
from dragoman.backends.documents import documents_as_text
from dragoman.backends.response import Response
from dragoman.config import AnthropicUpstream, Config
from dragoman.errors import GatewayError, InvalidRequest, UpstreamError, from_upstream, redact_bytes
from dragoman.ids import message_id
from dragoman.protocol import anthropic
from dragoman.sse import PING, encode

if TYPE_CHECKING:  # routing imports the backends
    from dragoman.routing import Route

FORWARDED_REQUEST_HEADERS = ("anthropic-version", "anthropic-beta")
HEAD_LIMIT = 64 * 1024  # how far into a stream the model name is looked for


_TOKENS = re.compile(rb'"(input_tokens|output_tokens|cache_read_input_tokens)"\s*:\s*(\d+)')


def _note_usage(call: Call, data: bytes) -> None:
    """Token counts for the metrics, read from the reply without decoding it."""
    outcome = call.outcome
    if outcome is None:
        return
    for name, value in _TOKENS.findall(data):
        if name == b"input_tokens":
            outcome.input_tokens = int(value)
        elif name == b"output_tokens":
            outcome.output_tokens = int(value)
        else:
            outcome.cache_read_tokens = int(value)


def _reply_headers(headers: Mapping[str, str]) -> dict[str, str]:
    keep = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith("anthropic-") or lower in ("retry-after", "x-should-retry"):
            keep[lower] = value
        elif lower in ("request-id", "x-request-id"):  # the gateway sends its own request-id
            keep["upstream-request-id"] = value
    return keep


_ERROR_ENVELOPE = msgspec.json.Decoder(anthropic.ErrorResponse)


def _is_error_envelope(body: bytes) -> bool:
    """Whether an error body is Anthropic's envelope, which the client gets as the server sent it."""
    try:
        _ERROR_ENVELOPE.decode(body)
    except msgspec.DecodeError:  # ValidationError included
        return False
    return True


def _not_a_stream(upstream: str, content_type: str) -> UpstreamError:
    return UpstreamError(f"upstream {upstream} answered a stream request without a stream ({content_type or 'no content type'})")


LIST_TIMEOUT = 5.0  # seconds to ask a passthrough server its model list before a request with documents
LIST_EVERY = 60.0  # seconds between such look-ups while the list cannot be read


class AnthropicBackend:
    path = "passthrough"

    def __init__(self, name: str, upstream: AnthropicUpstream, config: Config) -> None:
        self.name = name
        self._upstream = upstream
        # The url is the SDK's base URL, without /v1; a trailing /v1 is tolerated.
        self._http = HttpClient(name, upstream, config.upstream_key(upstream), auth_header="x-api-key", prefix="/v1",
                                defaults={"anthropic-version": "2023-06-01"})  # fmt: skip
        self._keepalive = config.server.keepalive_interval
        self._server = config.server
        self._documents = upstream.documents
        self._documents_as_text = upstream.documents == "as_text"  # "auto": decided by the model list
        self._listed = False
        self._list_asked = -LIST_EVERY

    async def close(self) -> None:
        await self._http.close()

    async def list_models(self) -> list[UpstreamModel]:
        status, body = await self._http.get("/models")
        if status != 200:
            raise UpstreamError(f"upstream {self.name} answered {status} to GET /v1/models")
        try:
            data = msgspec.json.decode(body).get("data", [])
        except (msgspec.DecodeError, AttributeError):
            raise UpstreamError(f"upstream {self.name} sent an unreadable model list") from None
        models = [UpstreamModel(str(m["id"]), m.get("owned_by")) for m in data if isinstance(m, dict) and "id" in m]
        if self._documents == "auto":  # llama-server's own /v1/messages ignores document blocks
            self._documents_as_text = any(m.owned_by == "llamacpp" for m in models)
        self._listed = True
        return models

    async def _body(self, call: Call) -> bytes:
        """The body as the client sent it, unless the model is renamed or documents go as text."""
        if self._documents == "auto" and not self._listed and self._may_ask_list() and b'"document"' in call.body:
            with contextlib.suppress(GatewayError, TimeoutError):  # what server is it? (not known yet: it was down at start)
                async with asyncio.timeout(LIST_TIMEOUT):
                    await self.list_models()
        as_text = self._documents_as_text and b'"document"' in call.body
        if call.upstream_model == call.model and not as_text:
            return call.body
        try:
            data = msgspec.json.decode(call.body)
        except msgspec.DecodeError as error:
            raise InvalidRequest(f"the request body is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise InvalidRequest("the request body must be a JSON object")
        data["model"] = call.upstream_model
        if as_text:
            await documents_as_text(data, self._server)
        return msgspec.json.encode(data)

    def _may_ask_list(self) -> bool:
        """At most one look-up of the model list per LIST_EVERY seconds from requests: a server
        without one costs no time, nor a search of every body, after the first."""
        now = time.monotonic()
        if now - self._list_asked < LIST_EVERY:
            return False
        self._list_asked = now
        return True

    async def _send(self, call: Call, path: str, body: bytes) -> Response:
        headers = {k: call.headers[k] for k in FORWARDED_REQUEST_HEADERS if k in call.headers}
        getlist = getattr(call.headers, "getlist", None)
        if getlist is not None and "anthropic-beta" in headers:  # sent as several headers: all of them, as one
            headers["anthropic-beta"] = ",".join(getlist("anthropic-beta"))
        return await self._http.post(path, body, headers=headers, raw=True, outcome=call.outcome)

    async def messages(self, call: Call, route: Route) -> Reply:
        # The body first: a document that cannot become text is a 400, before a stream is committed.
        send = self._send(call, "/messages", await self._body(call))
        if not call.stream:
            response = await send
            return await self._complete(response, call, _reply_headers(response.headers))
        head = await head_or_task(send, self._keepalive)
        direct = DirectWrites()
        if isinstance(head, asyncio.Task):
            # Committed to 200 before the upstream answered: its refusal becomes an error event.
            return Streaming(late_start(head, self._keepalive, lambda r: self._late_relay(r, call, direct)), direct=direct)
        headers = _reply_headers(head.headers)
        if head.content_type == "text/event-stream" and head.status == 200:
            return Streaming(self._relay(head, call, direct), headers=headers, on_close=head.close, direct=direct)
        return await self._complete(head, call, headers)

    async def _late_relay(self, response: Response, call: Call, direct: DirectWrites) -> AsyncIterator[bytes]:
        if response.status == 200 and response.content_type == "text/event-stream":
            async for chunk in self._relay(response, call, direct):
                yield chunk
            return
        with upstream_errors(self.name):
            try:
                raw = await response.read(MAX_ERROR_BODY)
            finally:
                response.release()
        if response.status == 200:  # a non-streaming answer to a streaming request
            raise _not_a_stream(self.name, response.content_type)
        raise from_upstream(response.status, raw, upstream=self.name)

    async def count_tokens(self, call: Call, route: Route) -> Reply:
        response = await self._send(call, "/messages/count_tokens", await self._body(call))
        headers = _reply_headers(response.headers)
        headers["x-token-count-method"] = "upstream"
        return await self._complete(response, call, headers)

    async def _complete(self, response: Response, call: Call, headers: dict[str, str]) -> Completed:
        with upstream_errors(self.name):
            try:
                body = await response.read()
            finally:
                response.release()
        if response.status == 200:
            if call.stream:
                raise _not_a_stream(self.name, response.content_type)
            if "json" not in response.content_type:  # an HTML page from a proxy, or a stream
                raise UpstreamError(f"upstream {self.name} answered 200 with {response.content_type or 'no content type'}, not a message")
            body = self._rename(body, call)
            _note_usage(call, body)
            return Completed(body, status=200, headers=headers)
        if response.status in (401, 403) or not _is_error_envelope(body):
            # Not Anthropic's envelope (a proxy's page, another server's shape), or the server
            # refusing the gateway's own key, which the client cannot fix: dragoman's error.
            raise from_upstream(response.status, body, upstream=self.name, retry_after=headers.get("retry-after"))
        return Completed(redact_bytes(body), status=response.status, headers=headers)

    def _rename(self, data: bytes, call: Call) -> bytes:
        if call.upstream_model == call.model:
            return data
        old = msgspec.json.encode(call.upstream_model)
        new = msgspec.json.encode(call.model)
        return data.replace(b'"model":' + old, b'"model":' + new, 1).replace(b'"model": ' + old, b'"model": ' + new, 1)

    async def _relay(self, response: Response, call: Call, direct: DirectWrites | None = None) -> AsyncIterator[bytes]:
        """Forward stream events as they arrive, whole: an event cut by a read waits for
        its end, so that an upstream failing mid-event ends the client's stream with a
        clean `error` event. Pings fill silences, never past the upstream's idle timeout.
        Once `message_start` has gone out, reads go straight to `direct`'s writer when
        there is one, from the connection's callback."""
        head: bytes | None = b""
        finished = False
        events = _Events(call)
        watch = ReadWatch.for_upstream(self._upstream, interval=self._keepalive, name=self.name)
        writes = direct if direct is not None else DirectWrites()

        def relay_to_client(chunk: bytes) -> bool:  # Response.drain_to's sink
            writer = writes.writer
            if writer is None or not writer.ready():
                return False  # the client is slow: this read goes through `readany`, and `send` waits
            watch.touch()
            whole = events.take(chunk)
            if whole:
                writer.write(whole)
            if events.ended:
                response.stop_sink()
            return True

        try:
            while not events.ended:
                if head is None and writes.writer is not None:
                    try:
                        await watch.read(response.drain_to(relay_to_client))
                    except Silence:
                        if events.at_boundary:
                            yield PING
                        continue
                    if events.ended:
                        break
                try:
                    with upstream_errors(self.name):
                        chunk = await watch.read(response.readany())
                except Silence:
                    if events.at_boundary and head is None:
                        yield PING
                    continue
                if not chunk:
                    break
                if head is not None:
                    head += chunk
                    if b"\n\n" not in head and b"\n\r\n" not in head and len(head) < HEAD_LIMIT:
                        continue
                    chunk, head = _with_start(self._rename(head, call), call), None
                    _note_usage(call, chunk[: chunk.find(b"\n\n")])  # message_start: the input tokens
                whole = events.take(chunk)
                if whole:
                    yield whole
            if head:
                whole = events.take(_with_start(self._rename(head, call), call))
                if whole:
                    yield whole
            if not events.complete():
                raise UpstreamError(f"upstream {self.name} closed the stream before the reply was complete")
            await read_past_end(response)  # what follows the stream's end is only the body's
            finished = True
        finally:
            watch.close()
            if finished:
                response.release()
            else:
                response.close()


_FIRST_EVENT = re.compile(rb"^event: ?([a-z_]+)", re.MULTILINE)
# Events that come only after `message_start`: a stream that begins with one of them lacks it.
_AFTER_START = frozenset({b"content_block_start", b"content_block_delta", b"content_block_stop", b"message_delta", b"message_stop"})


def _with_start(head: bytes, call: Call) -> bytes:
    """The stream's head, with a `message_start` put before it when the server sent none.

    llama-server leaves it out when the reply's first token is part of a character (an emoji,
    most CJK text), and the SDKs refuse a stream that does not begin with it. The server's
    prompt count went with it: the stand-in says 0 input tokens."""
    first = _FIRST_EVENT.search(head)
    if first is None or first.group(1) not in _AFTER_START:
        return head
    usage = anthropic.Usage(input_tokens=0, output_tokens=0)
    message = anthropic.Message(id=message_id(), model=call.model, content=[], stop_reason=None, stop_sequence=None, usage=usage)
    return encode(anthropic.MessageStart(message=message)) + head


MAX_HELD_EVENT = 1024 * 1024  # an event larger than this goes out in pieces rather than wait whole


# The event that ends a stream, by its own type at the start of a line: a text can be
# "message_stop" or "error" too, but JSON strings cannot hold a raw newline.
_END_LINE = re.compile(rb'event: ?(message_stop|error)\r?\n|data: ?\{"type": ?"(message_stop|error)"')


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


_ERROR_TYPE = re.compile(rb'"error": ?\{[^{}]*?"type": ?"([a-z_]+)"')


class _Events:
    """A passthrough stream cut at event boundaries: `take` gives the whole events so
    far and holds a cut one back. Also notes the token counts of `message_delta` for
    the metrics, and whether the stream ended as Anthropic ends one (`message_stop` or
    an `error` event); nothing after that end is relayed."""

    __slots__ = ("_call", "_held", "_ended", "_cut_sent")

    def __init__(self, call: Call) -> None:
        self._call = call
        self._held = b""
        self._ended = False
        self._cut_sent = False  # part of an oversized event went out

    @property
    def ended(self) -> bool:
        """`message_stop` or an `error` event went past: nothing after it is relayed."""
        return self._ended

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
            at = chunk.rfind(b"message_delta")
            if at >= 0:  # the counts follow the event's name; not the whole burst is searched
                _note_usage(self._call, chunk[at:])
            if b'"message_stop"' in chunk or b'"error"' in chunk:  # only then the closer look
                chunk = self._end(chunk)
        return chunk

    def _end(self, chunk: bytes) -> bytes:
        found = _end_event(chunk)
        if found is None:
            return chunk  # a text, a stop sequence or a tool named so
        self._ended = True
        self._held = b""  # what follows the end (a proxy's `data: [DONE]`) is no part of the reply
        end = chunk.find(b"\n\n", found.end())
        crlf_end = chunk.find(b"\n\r\n", found.end())  # the end of that event: whole events only came here
        if end < 0 or 0 <= crlf_end < end:
            end, width = crlf_end, 3
        else:
            width = 2
        if end >= 0:
            chunk = chunk[: end + width]
        if (found.group(1) or found.group(2)) == b"error":
            chunk = redact_bytes(chunk)  # a server may quote the gateway's key back
            outcome = self._call.outcome
            if outcome is not None:  # counted as the upstream's error, as on the translating path
                kind = _ERROR_TYPE.search(chunk)
                outcome.error_type = kind.group(1).decode() if kind else "api_error"
                outcome.upstream_failed = True
        return chunk

    def complete(self) -> bool:
        return self._ended and not self._cut_sent

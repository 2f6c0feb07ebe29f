"""Thin HTTP handlers: read, authenticate, route, hand to the backend, render."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import cast

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from dragoman.assembly.gateway import Gateway
from dragoman.assembly.observe import Metrics, capped, observe
from dragoman.assembly.pipeline import Endpoint, Prepared
from dragoman.assembly.threads import Turn
from dragoman.calls.types import Caller, Completed, DirectWrites, Outcome, Reply, Streaming
from dragoman.core.errors import (
    GatewayError,
    InvalidRequest,
    Overloaded,
    RequestTooLarge,
    UpstreamError,
)
from dragoman.protocol.sse import KEEPALIVE_COMMENT, PING
from dragoman.server import auth
from dragoman.server.disconnect import ClientLeft, DisconnectWatch
from dragoman.server.serving import DIRECT_BODY, DirectBody

log = logging.getLogger("dragoman.upstream")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _gateway(request: Request) -> Gateway:
    """The gateway the request began on (`app.App`: a reload does not change it mid-request)."""
    return request.scope["state"].get("gateway") or request.app.state.gateway


def authorized(request: Request) -> Gateway:
    """The gateway, once the request's key is checked (every route but the open ones)."""
    gateway = _gateway(request)
    request.scope.setdefault("state", {})["grant"] = auth.check(request, gateway.keyring)
    return gateway


def owner(request: Request, gateway: Gateway) -> str:
    """Whose files and batches this (authorized) request sees: see `auth.owner`."""
    return auth.owner(request, request.scope["state"].get("grant"), shared=gateway.config.server.share_between_keys,
                      owners=gateway.owners)  # fmt: skip


def caller(request: Request, gateway: Gateway) -> Caller:
    """Who sent this (authorized) request: its owner, key id and tenant (see `auth.caller`)."""
    return auth.caller(request, request.scope["state"].get("grant"), shared=gateway.config.server.share_between_keys,
                       owners=gateway.owners)  # fmt: skip


def struct_response(value: object) -> Response:
    """A msgspec struct (or plain data) as a JSON response."""
    return Response(msgspec.json.encode(value), media_type="application/json")


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused past `limit` without reading it whole."""
    coding = request.headers.get("content-encoding")
    if coding and coding.strip().lower() != "identity":
        raise InvalidRequest(
            f"content-encoding: {coding!r} request bodies are not accepted; send the body uncompressed"
        )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body is {declared} bytes; the limit is {limit} bytes")
    chunks, size = [], 0
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientLeft
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if not body:
        raise InvalidRequest("the request body is empty; send a JSON object")
    return body


class EventStreamResponse(StreamingResponse):
    """An SSE reply: sent chunk by chunk, observed, and ended well whatever happens.

    - The head goes out with the stream's first chunk (its first event, or a keep-alive
      after `keepalive_interval`), in the same turn of the loop: a failure before it is
      an HTTP error in Anthropic's envelope, with its status (which the SDKs retry, and
      an `error` event is not), and the headers are the reply's as they are then (a
      passthrough stream sent to another instance carries that instance's).
    - A client leaving is noticed at once, not at the next write: during a long
      prefill nothing is written for a while, and the backend would keep generating
      for nobody. Cancelling the stream closes the upstream request.
    - A GatewayError raised mid-stream becomes an `error` event, as Anthropic sends
      them once a 200 is committed; a bug still ends the stream well-formed.
    - The first token's time, keep-alives and the outcome are recorded here, in the
      one loop every chunk passes through (no wrapper generators per chunk).
    """

    def __init__(self, chunks: AsyncIterator[bytes], *, headers: Mapping[str, str], status_code: int,
                 outcome: Outcome, metrics: Metrics, on_close: Callable[[], None] | None = None,
                 direct: DirectWrites | None = None, request_id: str | None = None) -> None:  # fmt: skip
        super().__init__(chunks, status_code=status_code, media_type="text/event-stream")
        self.headers_of_reply = headers  # read when the head goes out: the stream may change them until then
        self.request_id = request_id
        self.head_sent = False
        self.outcome = outcome
        self.metrics = metrics
        self.on_close = on_close
        self.direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome, metrics = self.outcome, self.metrics
        metrics.streams.inc()
        watch = DisconnectWatch(receive)
        finished = False
        body = scope.get("extensions", {}).get(DIRECT_BODY) if self.direct is not None else None
        writer = None
        if body is not None:
            self.direct.writer = writer = _NotingWriter(body, outcome)  # type: ignore[union-attr]
        try:
            try:
                await self._relay(send, outcome)
                finished = True
            except asyncio.CancelledError:
                watch.absorb()  # ClientLeft when the watch cancelled us: the client is gone
                # Not the client: the server is stopping and this stream outlived the grace
                # period. The client gets a well-formed end it can retry, not a cut body.
                if self.direct is not None:
                    self.direct.writer = None
                stopping = Overloaded("the server is shutting down; send the request again")
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    async with asyncio.timeout(1):
                        if not self.head_sent:
                            await self._refuse(send, outcome, stopping)
                        else:
                            outcome.failed(stopping, committed=True)
                            await send({"type": "http.response.body", "body": stopping.event(), "more_body": True})
                            await send({"type": "http.response.body", "body": b"", "more_body": False})
                        finished = True
        except (ClientLeft, OSError):
            pass
        finally:
            watch.stop()
            metrics.streams.dec()
            if writer is not None:
                writer.done()
            outcome.disconnected = not finished
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()  # runs the stream's own clean-up now (closing the upstream), not at garbage collection
            if self.on_close is not None:
                self.on_close()
            outcome.finish.end()  # the stream's end is the request's

    async def _relay(self, send: Send, outcome: Outcome) -> None:
        """The head with the first chunk, the chunks that are not written directly, the end."""
        chunks = self.body_iterator.__aiter__()
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = b""
        except GatewayError as error:
            log.warning("stream from %s failed before it began: %s", outcome.upstream, capped(error.message))
            await self._refuse(send, outcome, error)
            return
        except Exception:  # a bug
            log.exception("stream from %s failed before it began", outcome.upstream)
            await self._refuse(send, outcome, GatewayError("internal error in the gateway"))  # as any request's bug
            return
        headers = {**SSE_HEADERS, **self.headers_of_reply}
        if self.request_id:
            headers["request-id"] = self.request_id
        self.init_headers(headers)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self.head_sent = True
        if first:
            if first is PING or first is KEEPALIVE_COMMENT:
                outcome.keepalives += 1
            else:
                _note_first_token(outcome, cast(bytes, first))  # the backends' streams are bytes
            await send({"type": "http.response.body", "body": first, "more_body": True})
        failed = False
        while not failed:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except GatewayError as error:
                log.warning("stream from %s failed: %s", outcome.upstream, capped(error.message))
                outcome.failed(error, committed=True)
                chunk, failed = error.event(), True
            except Exception:  # a bug: the client still gets a well-formed end
                log.exception("stream from %s failed", outcome.upstream)
                bug = UpstreamError("internal error while relaying the upstream stream")
                outcome.error_type, outcome.error_message = "api_error", bug.message
                chunk, failed = bug.event(), True
            else:
                if chunk is PING or chunk is KEEPALIVE_COMMENT:
                    outcome.keepalives += 1
                elif outcome.first_byte is None:
                    _note_first_token(outcome, cast(bytes, chunk))  # the backends' streams are bytes
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _refuse(self, send: Send, outcome: Outcome, error: GatewayError) -> None:
        """The whole answer to a stream that failed before its head went out: the error's
        status and envelope, as a request that fails before its stream would get."""
        outcome.failed(error)
        headers = error.headers()
        if self.request_id:
            headers["request-id"] = self.request_id
        self.head_sent = True
        answer = Response(
            error.body(self.request_id), status_code=error.status, headers=headers, media_type="application/json"
        )
        await send({"type": "http.response.start", "status": answer.status_code, "headers": answer.raw_headers})
        await send({"type": "http.response.body", "body": answer.body, "more_body": False})


def _note_first_token(outcome: Outcome, chunk: bytes) -> None:
    if b"content_block_delta" in chunk:
        outcome.first_byte = time.perf_counter()


class _NotingWriter:
    """The client's direct writer, noting the first token as `_relay` does for the
    chunks that pass through it; once noted, `write` is the body's own (one call less
    per token)."""

    __slots__ = ("_body", "_outcome", "ready", "write")

    def __init__(self, body: DirectBody, outcome: Outcome) -> None:
        self._body = body
        self._outcome = outcome
        self.ready = body.ready
        self.write = body.write if outcome.first_byte is not None else self._noting

    def done(self) -> None:
        """The stream has ended: `write` no longer holds this writer's own method (a cycle
        that would wait for a garbage collection, with the request's outcome)."""
        self.write = self._body.write

    def _noting(self, chunk: bytes) -> None:
        if self._outcome.first_byte is None:  # else noted by `_relay` meanwhile
            _note_first_token(self._outcome, chunk)
        if self._outcome.first_byte is not None:
            self.write = self._body.write
        self._body.write(chunk)


class WholeResponse(Response):
    """A whole reply, its head made here: the headers Starlette's `Response` would send (the
    reply's, `request-id`, then content-length and content-type unless the reply has them),
    without its rendering and header passes (the hot path's every JSON answer)."""

    media_type = "application/json"

    def __init__(self, reply: Completed, request_id: str) -> None:
        self.status_code, self.body, self.background = reply.status, reply.body, None
        headers = {**reply.headers, "request-id": request_id} if reply.headers else {"request-id": request_id}
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        if len(raw) > 1:
            names = [name for name, _ in raw]
            length, kind = b"content-length" not in names, b"content-type" not in names
        else:
            length = kind = True
        if length and not (self.status_code < 200 or self.status_code in (204, 304)):
            raw.append((b"content-length", b"%d" % len(self.body)))
        if kind:
            raw.append((b"content-type", b"application/json"))
        self.raw_headers = raw


def render(reply: Reply, request_id: str, outcome: Outcome, metrics: Metrics) -> Response:
    if isinstance(reply, Completed):
        return WholeResponse(reply, request_id)
    return EventStreamResponse(reply.chunks, status_code=reply.status, headers=reply.headers, outcome=outcome, metrics=metrics,
                               on_close=reply.on_close, direct=reply.direct, request_id=request_id)  # fmt: skip


# Responses `render` makes, which carry their `request-id` already.
HOT_RESPONSES = (WholeResponse, EventStreamResponse)


async def serve(gateway: Gateway, request: Request, endpoint: Endpoint, outcome: Outcome | None = None) -> Response:
    """POST /v1/messages and /v1/messages/count_tokens, through the gateway's pipeline. The
    caller wraps it, and the sending of its response, in `with outcome.finish:`."""
    state = request.scope["state"]
    if outcome is None:
        outcome = gateway.metrics.outcome(state["request_id"], endpoint)
    state["outcome"] = outcome
    tracing = gateway.pipeline.tracing
    if tracing is not None:
        outcome.trace = tracing.request(request.headers, endpoint, request.scope["path"])
    state["grant"] = auth.check(request, gateway.keyring)
    who = caller(request, gateway)
    outcome.key_id, outcome.tenant = who.key_id, who.tenant  # a body that fails to arrive is accounted too
    body = await _read_body(request, gateway.config.server.max_request_bytes)
    prepared = await gateway.pipeline.prepare(
        body, endpoint=endpoint, headers=request.headers, caller=who, outcome=outcome
    )
    reply: Reply | Response | None = None
    try:
        reply = await _send(gateway, request, prepared, endpoint)
    except GatewayError as error:
        if prepared.admission is not None:  # failed after the limits admitted it: their headers all the same
            error.extra_headers.update(prepared.admission.headers())
        raise
    finally:
        if prepared.turn is not None:
            _follow(prepared.turn, reply, outcome)
    if isinstance(reply, Response):  # the client left
        return reply
    if prepared.admission is not None:  # JSON or a stream's head: Anthropic's anthropic-ratelimit-* headers
        reply.headers.update(prepared.admission.headers())
    if isinstance(observe(reply, outcome), Completed):
        outcome.finish.end()  # the body is whole: settled before it goes out
    return render(reply, outcome.request_id, outcome, gateway.metrics)


def _follow(turn: Turn, reply: Reply | Response | None, outcome: Outcome) -> None:
    """Hold a threaded reply once it is whole: now, or as its stream goes by. None (a
    failure) or a client that left ends the turn with nothing held."""
    if isinstance(reply, Completed):
        turn.answered_json(reply.status, reply.body)
    elif isinstance(reply, Streaming):
        turn.follow(reply, outcome.finish)
    else:
        turn.answered(None)


async def _send(gateway: Gateway, request: Request, prepared: Prepared, endpoint: Endpoint) -> Reply | Response:
    """The backend's reply, or the (unsent) answer to a client that left meanwhile."""
    # A client that hangs up cancels the backend call, and with it the upstream request;
    # one that hangs up while queued for a slot leaves the queue, never sent upstream.
    watch = DisconnectWatch(request.receive)
    try:
        return await gateway.pipeline.send(prepared, endpoint=endpoint)
    except asyncio.CancelledError:
        try:
            watch.absorb()
        except ClientLeft:
            outcome = prepared.call.outcome
            assert outcome is not None
            outcome.left()  # nobody to answer; the log and metrics still say so
            return Response(status_code=499)
        raise
    finally:
        watch.stop()


async def messages(request: Request) -> Response:
    return await serve(_gateway(request), request, "messages")


async def count_tokens(request: Request) -> Response:
    return await serve(_gateway(request), request, "count_tokens")


async def metrics(request: Request) -> Response:
    return Response(generate_latest(_gateway(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def list_models(request: Request) -> Response:
    gateway = authorized(request)
    await gateway.discover_if_stale()
    return JSONResponse(gateway.models_page(request.query_params))


async def get_model(request: Request) -> Response:
    gateway = authorized(request)
    await gateway.discover_if_stale()
    return JSONResponse(gateway.model_info(request.path_params["model_id"]))


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    gateway = _gateway(request)
    reachable = await gateway.reachable_upstreams()
    status = 200 if reachable else 503
    return JSONResponse(
        {"status": "ready" if reachable else "no upstream reachable", "upstreams": reachable}, status_code=status
    )


async def root(request: Request) -> Response:
    # Claude Code pre-warms its connection with HEAD on the base URL (newer versions: /api/hello).
    return JSONResponse({"name": "dragoman", "endpoints": ["/v1/messages", "/v1/messages/count_tokens", "/v1/models"]})

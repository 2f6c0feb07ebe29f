"""Thin HTTP handlers: read, authenticate, route, hand to the backend, render."""

from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from dragoman import auth
from dragoman.backends.base import Call, Completed, Reply
from dragoman.disconnect import ClientLeft, DisconnectWatch
from dragoman.errors import InvalidRequest, RequestTooLarge
from dragoman.gateway import Gateway
from dragoman.observe import Outcome, observe
from dragoman.protocol import anthropic
from dragoman.routing import Route
from dragoman.validation import decode_request

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused past `limit` without reading it whole."""
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
    """A stream that notices a client leaving at once, not at its next write.

    Starlette only watches for `http.disconnect` on older ASGI servers; during a
    long prefill nothing is written for a while, and the backend would keep
    generating for nobody. Cancelling the stream closes the upstream request.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = DisconnectWatch(receive)
        try:
            try:
                await self.stream_response(send)
            except asyncio.CancelledError:
                watch.absorb()  # ClientLeft when the watch cancelled us: the client is gone
                raise
        except (ClientLeft, OSError):
            pass
        finally:
            watch.stop()
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()  # runs the stream's own clean-up now, not at garbage collection


def render(reply: Reply, request_id: str) -> Response:
    if isinstance(reply, Completed):
        headers = {**reply.headers, "request-id": request_id}
        return Response(reply.body, status_code=reply.status, headers=headers, media_type="application/json")
    headers = {**SSE_HEADERS, **reply.headers, "request-id": request_id}
    return EventStreamResponse(reply.chunks, status_code=reply.status, headers=headers, media_type="text/event-stream")


async def _call(gateway: Gateway, request: Request, endpoint: str) -> tuple[Call, Route, Outcome]:
    state = request.scope["state"]
    outcome = state["outcome"] = Outcome(request_id=state["request_id"], endpoint=endpoint)
    auth.check(request, gateway.api_keys)
    body = await _read_body(request, gateway.config.server.max_request_bytes)
    whole: anthropic.MessagesRequest | None = None
    envelope: anthropic.MessagesRequest | anthropic.Envelope
    if endpoint == "messages" and gateway.translates_only:
        envelope = whole = decode_request(body, anthropic.MESSAGES_REQUEST)  # decoded once (a large body costs)
    else:
        envelope = decode_request(body, anthropic.ENVELOPE)
    outcome.model = envelope.model
    route = await gateway.route(envelope.model)
    outcome.upstream, outcome.served_model, outcome.path = route.upstream, route.upstream_model, route.path
    call = Call(body, envelope.model, route.upstream_model, request.headers, outcome.request_id, envelope.stream, outcome, whole)
    return call, route, outcome


async def serve(gateway: Gateway, request: Request, endpoint: str) -> Response:
    """POST /v1/messages and /v1/messages/count_tokens."""
    call, route, outcome = await _call(gateway, request, endpoint)
    limiter = gateway.limiters.get(route.upstream)
    if limiter is not None:
        await limiter.acquire()
        outcome.release = limiter.release  # at the reply's last byte, see observe()
    handler = route.backend.messages if endpoint == "messages" else route.backend.count_tokens
    # A client that hangs up cancels the backend call, and with it the upstream request.
    watch = DisconnectWatch(request.receive)
    try:
        reply = await handler(call, route)
    except asyncio.CancelledError:
        outcome.finish()
        try:
            watch.absorb()
        except ClientLeft:
            outcome.disconnected = True
            outcome.status = 499  # nobody to answer; the log and metrics still say so
            gateway.metrics.record(outcome)
            return Response(status_code=499)
        raise
    except BaseException:
        outcome.finish()
        raise
    finally:
        watch.stop()
    outcome.path = route.path  # an `auto` upstream knows its path only after its probe
    return render(observe(reply, outcome, gateway.metrics), call.request_id)


async def messages(request: Request) -> Response:
    return await serve(_gateway(request), request, "messages")


async def count_tokens(request: Request) -> Response:
    return await serve(_gateway(request), request, "count_tokens")


async def metrics(request: Request) -> Response:
    return Response(generate_latest(_gateway(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def list_models(request: Request) -> Response:
    gateway = _gateway(request)
    auth.check(request, gateway.api_keys)
    await gateway.discover_if_stale()
    return JSONResponse(gateway.models_page(request.query_params))


async def get_model(request: Request) -> Response:
    gateway = _gateway(request)
    auth.check(request, gateway.api_keys)
    await gateway.discover_if_stale()
    return JSONResponse(gateway.model_info(request.path_params["model_id"]))


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    gateway = _gateway(request)
    reachable = await gateway.reachable_upstreams()
    status = 200 if reachable else 503
    return JSONResponse({"status": "ready" if reachable else "no upstream reachable", "upstreams": reachable}, status_code=status)


async def root(request: Request) -> Response:
    # Claude Code pre-warms its connection with HEAD on the base URL (newer versions: /api/hello).
    return JSONResponse({"name": "dragoman", "endpoints": ["/v1/messages", "/v1/messages/count_tokens", "/v1/models"]})

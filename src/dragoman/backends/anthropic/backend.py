"""The passthrough backend: upstreams that speak /v1/messages themselves.

The body goes upstream unchanged but for the model name (and tagged tool ids, below);
the reply comes back as the upstream sent it (status, error body, `anthropic-*` and
rate-limit headers), stream bytes forwarded as they arrive. Only the model name in the
reply is put back to the client's, within a bounded look-ahead at the start of the
stream, a stream that starts without `message_start` gets one, and the reply's null
fields a server left out (`stop_details`...: anthropic_events.MESSAGE_NULLS) are put in.
Behind replicas under cache_aware, tool ids say which replica made them (`tool_tags`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping

import msgspec

from dragoman.backends.anthropic.events import completed_message, note_usage
from dragoman.backends.anthropic.relay import Relay, renamed
from dragoman.backends.anthropic.tool_tags import latest_tag, tagged_message, untagged
from dragoman.backends.documents import documents_as_text
from dragoman.backends.fetch_budget import Budget
from dragoman.backends.images import inline_url_images, may_have_url_images
from dragoman.backends.openai.tool_support import llamacpp_renders_tools, sends_tools
from dragoman.backends.shared import Shared
from dragoman.calls.types import (
    NO_MODEL_LIST_STATUSES,
    Call,
    Completed,
    DirectWrites,
    NoModelList,
    Reply,
    Route,
    Streaming,
    UpstreamModel,
)
from dragoman.core.config import AnthropicUpstream, Config
from dragoman.core.error_mapping import anthropic_envelope, from_upstream
from dragoman.core.errors import GatewayError, InvalidRequest, UpstreamError
from dragoman.protocol import anthropic
from dragoman.upstream.client import MAX_ERROR_BODY, HttpClient
from dragoman.upstream.errors import upstream_errors
from dragoman.upstream.keepalive import head_or_task, late_start
from dragoman.upstream.placement import MessagesParts, PromptKind
from dragoman.upstream.pump import Pump
from dragoman.upstream.transport.response import Response


def _tools_dropped(call: Call, route: Route) -> dict[str, str]:
    """The header for a request whose tools the server's chat template drops (and the log field)."""
    if route.renders_tools is not False or not sends_tools(call.body):
        return {}
    if call.outcome is not None:
        call.outcome.tools_dropped = True
    return {"x-tools-dropped": "chat-template"}


def _reply_headers(headers: Mapping[str, str]) -> dict[str, str]:
    keep = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith("anthropic-") or lower in ("retry-after", "x-should-retry"):
            keep[lower] = value
        elif lower in ("request-id", "x-request-id"):  # the gateway sends its own request-id
            keep["upstream-request-id"] = value
    return keep


def _not_a_stream(upstream: str, content_type: str) -> UpstreamError:
    return UpstreamError(
        f"upstream {upstream} answered a stream request without a stream ({content_type or 'no content type'})"
    )


LIST_EVERY = 60.0  # seconds between such look-ups while the list cannot be read


class AnthropicBackend:
    path = "passthrough"

    def __init__(self, name: str, upstream: AnthropicUpstream, config: Config, shared: Shared) -> None:
        self.name = name
        self._upstream = upstream
        # The url is the SDK's base URL, without /v1; a trailing /v1 is tolerated.
        self._http = HttpClient(name, upstream, config.upstream_key(upstream), redactor=shared.redactor, cool_downs=shared.cool_downs, waits=shared.waits, shown_by=shared.gauges,
                                auth_header="x-api-key",
                                prefix="/v1",
                                defaults={"anthropic-version": "2023-06-01"})  # fmt: skip
        self._keepalive = config.server.keepalive_interval
        self._pump = Pump(name, upstream, self._keepalive, shared.ends)
        self._server = config.server
        self._shared = shared
        self._fetched = shared.fetched
        self._documents = upstream.documents
        self._documents_as_text = upstream.documents == "as_text"  # "auto": decided by the model list
        self._listed = False
        self._list_asked = -LIST_EVERY
        self._renders_tools: bool | None = None  # llama-server's template, once it said

    @property
    def http(self) -> HttpClient:
        """The upstream's client: its replicas and their load, for the console."""
        return self._http

    async def close(self) -> None:
        await self._http.close()

    async def list_models(self) -> list[UpstreamModel]:
        status, body = await self._http.get("/models")
        if status in NO_MODEL_LIST_STATUSES:
            raise NoModelList(self.name, status, self._http.url("/models"))
        if status != 200:
            raise UpstreamError(f"upstream {self.name} answered {status} to GET /v1/models")
        try:
            data = msgspec.json.decode(body).get("data", [])
        except (msgspec.DecodeError, AttributeError):
            raise UpstreamError(f"upstream {self.name} sent an unreadable model list") from None
        models = [UpstreamModel(str(m["id"]), m.get("owned_by"), renders_tools=self._renders_tools)
                  for m in data if isinstance(m, dict) and "id" in m]  # fmt: skip
        if self._documents == "auto":  # llama-server's own /v1/messages ignores document blocks
            self._documents_as_text = any(m.owned_by == "llamacpp" for m in models)
        self._listed = True
        return models

    async def tool_support(self, models: list[UpstreamModel]) -> list[UpstreamModel]:
        """`models` with whether the chat template shows them tools: llama-server says so, and its
        own /v1/messages renders the prompt with the same template (tool_support.py)."""
        if self._renders_tools is None and any(m.owned_by == "llamacpp" for m in models):
            self._renders_tools = await llamacpp_renders_tools(self._http)
        return [dataclasses.replace(m, renders_tools=self._renders_tools) for m in models]

    async def _body(self, call: Call, budget: Budget) -> bytes:
        """The body as the client sent it, unless the model is renamed, documents go as text or
        images are given by URL (fetched here and sent inline)."""
        if self._documents == "auto" and not self._listed and self._may_ask_list() and b'"document"' in call.body:
            with contextlib.suppress(GatewayError):  # what server is it? (not known yet: it was down at start)
                await self.list_models()  # within the model list's own time (`Waits.model_list`)
        as_text = self._documents_as_text and b'"document"' in call.body
        parts = call.envelope
        images = may_have_url_images(
            call.body, parts
        )  # fetched here: the server would fetch them from inside the network
        if call.upstream_model == call.model and not as_text and not images:
            return call.body
        try:
            data = msgspec.json.decode(call.body)
        except msgspec.DecodeError as error:
            raise InvalidRequest(f"the request body is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise InvalidRequest("the request body must be a JSON object")
        if images and isinstance(data.get("messages"), list):
            images = await inline_url_images(data["messages"], self._server, budget)
        if call.upstream_model == call.model and not as_text and not images:
            return call.body  # looked through for URL images, and none found: sent as it came
        data["model"] = call.upstream_model
        if as_text:
            await documents_as_text(data, self._server, budget, self._shared)
        return msgspec.json.encode(data)

    def _may_ask_list(self) -> bool:
        """At most one look-up of the model list per LIST_EVERY seconds from requests: a server
        without one costs no time, nor a search of every body, after the first."""
        now = time.monotonic()
        if now - self._list_asked < LIST_EVERY:
            return False
        self._list_asked = now
        return True

    async def _send(self, call: Call, path: str, body: bytes, *, stream: bool = False) -> Response:
        headers = anthropic.forwarded_headers(call.headers)
        # A count runs no prompt: nothing cached. Routing reads the parts the core read already,
        # the client's (a renamed model or inlined images change no conversation's blocks).
        prompt: PromptKind | MessagesParts | None = None
        previous = None
        if path == "/messages":
            prompt = call.envelope or "messages"
        if self._http.tags:  # tool ids name their replica (tool_tags.py)
            sent = untagged(body)  # the server gets its own ids back
            if sent is not body and path == "/messages":  # the latest says where the turn before went
                previous = latest_tag(call.body, call.envelope.messages if call.envelope is not None else None)
            body = sent
        return await self._http.post(path, body, headers=headers, raw=True, outcome=call.outcome, stream=stream,
                                     prompt=prompt, conversation=call.conversation, previous=previous,
                                     deadline=call.retry_deadline)  # fmt: skip

    async def messages(self, call: Call, route: Route) -> Reply:
        # Its URL images and documents, held until the answer (a stream's head).
        with Budget(self._server, self._fetched) as budget:
            return await self._messages(call, route, budget)

    async def _messages(self, call: Call, route: Route, budget: Budget) -> Reply:
        # The body first: a document that cannot become text is a 400, before a stream is committed.
        send = self._send(call, "/messages", await self._body(call, budget), stream=call.stream)
        said = _tools_dropped(call, route)
        if not call.stream:
            response = await send
            return await self._complete(response, call, _reply_headers(response.headers) | said)
        head = await head_or_task(send, self._keepalive)
        direct = DirectWrites()
        if isinstance(head, asyncio.Task):
            # Committed to 200 before the upstream answered: its refusal becomes an error event.
            return Streaming(
                late_start(head, self._keepalive, lambda r: self._late_relay(r, call, direct)),
                headers=said,
                direct=direct,
            )
        headers = _reply_headers(head.headers) | said
        if head.content_type == "text/event-stream" and head.status == 200:
            return Streaming(
                self._relay(head, call, direct, headers), headers=headers, on_close=head.close, direct=direct
            )
        return await self._complete(head, call, headers)

    async def _late_relay(self, response: Response, call: Call, direct: DirectWrites) -> AsyncIterator[bytes]:
        if response.status == 200 and response.content_type == "text/event-stream":
            # late_start has sent comment lines: the client's 200 is out (unless the answer came
            # as the wait ended, before the first: then an error event, rather than the HTTP error)
            async for chunk in self._relay(response, call, direct, committed=True):
                yield chunk
            return
        with upstream_errors(self.name):
            try:
                raw = await response.read(MAX_ERROR_BODY)
            finally:
                response.release()
        if response.status == 200:  # a non-streaming answer to a streaming request
            raise _not_a_stream(self.name, response.content_type)
        raise from_upstream(response.status, raw, upstream=self.name, redactor=self._http.redactor)

    async def count_tokens(self, call: Call, route: Route) -> Reply:
        with Budget(self._server, self._fetched) as budget:
            response = await self._send(call, "/messages/count_tokens", await self._body(call, budget))
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
                raise UpstreamError(
                    f"upstream {self.name} answered 200 with {response.content_type or 'no content type'}, not a message"
                )
            body = completed_message(renamed(body, call))
            if self._http.tags:
                body = tagged_message(body, self._replica_tag(call))
            note_usage(call, body)
            return Completed(body, status=200, headers=headers)
        if response.status in (401, 403) or anthropic_envelope(body) is None:
            # Not Anthropic's envelope (a proxy's page, another server's shape), or the server
            # refusing the gateway's own key, which the client cannot fix: dragoman's error.
            raise from_upstream(response.status, body, upstream=self.name, redactor=self._http.redactor,
                                retry_after=headers.get("retry-after"))  # fmt: skip
        return Completed(self._http.redactor.redact_bytes(body), status=response.status, headers=headers)

    def _relay(
        self, response: Response, call: Call, direct: DirectWrites | None = None, headers: dict[str, str] | None = None,
        *, committed: bool = False,
    ) -> AsyncIterator[bytes]:  # fmt: skip
        """Forward stream events as they arrive, whole (`relay.Relay`, read by the one pump).
        Once `message_start` has gone out, reads go straight to `direct`'s writer when there
        is one, from the connection's callback."""
        tag = (lambda: self._replica_tag(call)) if self._http.tags else None  # asked at the first tool call
        relay = Relay(self.name, call, headers, _reply_headers, committed=committed, redactor=self._http.redactor,
                      tag=tag)  # fmt: skip
        return self._pump.run(response, relay, direct)

    def _replica_tag(self, call: Call) -> str:
        """The tag for the tool ids of the replica that answered `call` (the last attempt's)."""
        return self._http.replica_tag(getattr(call.outcome, "replica", None))

"""The translating backend: Anthropic in, Chat Completions to an OpenAI-compatible
server, Anthropic back out. The async shell around the pure translators."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

import msgspec

from dragoman.backends.fetch import address_check, has_url_documents, page_fetcher, resolve_url_documents
from dragoman.backends.fetch_budget import Budget
from dragoman.backends.images import inline_url_images, may_have_url_images
from dragoman.backends.openai.counting import CountCache, count_prompt, ollama_context
from dragoman.backends.openai.fitting import fitted_body
from dragoman.backends.openai.stream import (
    PINGS,
    Batch,
    ChatStreams,
    completion_of,
    note_usage,
)
from dragoman.backends.openai.tool_support import renders_tools
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
from dragoman.core import ids
from dragoman.core.config import Config, OpenAIUpstream
from dragoman.core.error_mapping import from_upstream
from dragoman.core.errors import GatewayError, UpstreamError
from dragoman.core.profiles import PROFILES, Profile, profile_for
from dragoman.core.validation import decode_request
from dragoman.protocol import anthropic, openai, sse
from dragoman.protocol.sse import encode_all
from dragoman.servertools.loop import Plan, ServerTools
from dragoman.tokens.estimate import completion_estimate, count_estimate
from dragoman.tokens.tokenizer import TokenizerError
from dragoman.translate.compaction import summarizing, summary_of
from dragoman.translate.content import slow_to_translate
from dragoman.translate.fold import Folder, events_of
from dragoman.translate.reply import ReplySettings
from dragoman.translate.request import Options, Translated, to_chat_request
from dragoman.translate.response import to_message
from dragoman.translate.stream import StreamTranslator
from dragoman.upstream.client import HttpClient
from dragoman.upstream.errors import upstream_errors
from dragoman.upstream.keepalive import head_or_task, late_start
from dragoman.upstream.transport.response import Response

log = logging.getLogger("dragoman.upstream")
MAX_TOOL_PROBES = 16  # models per list whose chat template is checked for tools (a hosted list may have hundreds)

T = TypeVar("T")


def _sse(batch: Batch) -> bytes:
    return sse.PING if batch is PINGS else encode_all(batch)  # the shared constant: counted as a keep-alive


def _as_events(batch: Batch) -> Batch:
    return batch


class OpenAIBackend:
    path = "translate"

    def __init__(self, name: str, upstream: OpenAIUpstream, config: Config, shared: Shared) -> None:
        self.name = name
        self._upstream = upstream
        self._http = HttpClient(name, upstream, config.upstream_key(upstream), redactor=shared.redactor,
                                cool_downs=shared.cool_downs, waits=shared.waits, shown_by=shared.gauges,
                                prefix="/v1" if upstream.url.rstrip("/").endswith("/v1") else "")  # fmt: skip
        self._options = Options(
            clock=shared.clock,
            keep_billing_header=config.server.keep_billing_header,
            drop_server_tools=config.server.server_tools == "drop",
        )
        self.profile: Profile = profile_for(upstream) if upstream.flavor != "auto" else PROFILES["generic"]
        self._counts = CountCache()
        self._tool_support: dict[str, bool] = {}
        self._keepalive = config.server.keepalive_interval
        self._streams = ChatStreams(name, upstream, self._keepalive, shared.ends)
        self._server = config.server
        self._offload = shared.offload
        self._max_folded = shared.max_folded
        self._fetched = shared.fetched
        fetch_page, check = (
            page_fetcher(config.server, shared.fetched),
            address_check(config.server.fetch_allow_private),
        )
        self._server_tools = ServerTools(config, fetch_page, check) if ServerTools.configured(config) else None

    @property
    def http(self) -> HttpClient:
        """The upstream's client: its replicas and their load, for the console."""
        return self._http

    async def close(self) -> None:
        await self._http.close()

    # -- discovery ---------------------------------------------------------------

    async def list_models(self) -> list[UpstreamModel]:
        status, body = await self._http.get("/models")
        if status in NO_MODEL_LIST_STATUSES:
            raise NoModelList(self.name, status, self._http.url("/models"))
        if status != 200:
            raise from_upstream(status, body, upstream=self.name, redactor=self._http.redactor)
        try:
            models = openai.MODEL_LIST.decode(body).data
        except msgspec.DecodeError as error:
            raise UpstreamError(f"upstream {self.name} sent an unreadable model list: {error}") from None
        if models and self._upstream.flavor == "auto":
            self.profile = profile_for(self._upstream, models[0].owned_by)
        windows = [m.context_window for m in models]
        if self.profile.context_probe == "ollama_show":
            windows = await asyncio.gather(*(ollama_context(self._http, m.id) for m in models))
        return [
            UpstreamModel(m.id, m.owned_by, window, self._tool_support.get(m.id))
            for m, window in zip(models, windows, strict=True)
        ]

    async def tool_support(self, models: list[UpstreamModel]) -> list[UpstreamModel]:
        """`models` with whether each one's chat template shows it tools (tool_support.py), asked
        once per model, after the list is in use: no request waits for it."""
        unknown = [m.id for m in models if m.id not in self._tool_support][:MAX_TOOL_PROBES]
        found = await asyncio.gather(*(renders_tools(self._http, self.profile, model) for model in unknown))
        # None (the server could not say: it may be starting) is asked again at the next discovery.
        self._tool_support.update((model, said) for model, said in zip(unknown, found, strict=True) if said is not None)
        return [dataclasses.replace(m, renders_tools=self._tool_support.get(m.id)) for m in models]

    # -- messages ------------------------------------------------------------------

    def _translate(
        self, request: anthropic.MessagesRequest, route: Route, stream: bool, betas: frozenset[str]
    ) -> Translated:
        return to_chat_request(
            request, upstream_model=route.upstream_model, profile=self.profile, caps=route.caps, options=self._options, stream=stream,
            betas=betas,
        )  # fmt: skip

    async def _translate_call(
        self, request: anthropic.MessagesRequest, route: Route, stream: bool, betas: frozenset[str] = frozenset()
    ) -> Translated:
        """Translated on the slow-work threads when that is slow (a PDF's text to extract, many MB
        of images to check: `slow_to_translate`), so that the event loop keeps serving meanwhile,
        else here."""
        if slow_to_translate(request.messages):  # fetched URL documents included: they are base64 by now
            return await self._offload(self._translate, request, route, stream, betas)
        return self._translate(request, route, stream, betas)

    async def messages(self, call: Call, route: Route) -> Reply:
        request = call.request or decode_request(call.body, anthropic.MESSAGES_REQUEST)
        if not self._fetches(call):  # the common request: no budget to hold, one coroutine less
            return await self._answer(call, route, request)
        # Its URL images and documents, held until the answer (a stream's head).
        with Budget(self._server, self._fetched) as budget:
            await self._fetch_documents(call, request, budget)
            return await self._answer(call, route, request)

    def _answer(self, call: Call, route: Route, request: anthropic.MessagesRequest) -> Awaitable[Reply]:
        if request.max_tokens == 0:
            return self._warm_cache(call, route, request)
        if request.compaction is not None:
            return self._compact(call, route, request)
        return self._respond(call, route, request)

    async def _compact(self, call: Call, route: Route, request: anthropic.MessagesRequest) -> Reply:
        """The conversation summarized, as a `compaction` block (see translate.compaction).
        The request as sent is translated first, and the result dropped: it gets every check
        an ordinary request gets (a `tool_choice` naming no tool, an effort the model lacks),
        which the summary's own request, without its tools and thinking, would skip."""
        betas = anthropic.betas(call.headers)
        await self._translate_call(request, route, stream=False, betas=betas)
        reply = await self._respond(call, route, summarizing(request, betas))
        assert isinstance(reply, Completed)
        message = summary_of(msgspec.json.decode(reply.body, type=anthropic.Message))
        if request.stream:
            return Streaming(_once(encode_all(events_of(message))), headers=reply.headers)
        return Completed(msgspec.json.encode(message), headers=reply.headers)

    def _fetches(self, call: Call) -> bool:
        """Whether `_fetch_documents` may fetch anything for `call` (byte searches of its body)."""
        return may_have_url_images(call.body) or (self._server.fetch_documents and has_url_documents(call.body))

    async def _fetch_documents(self, call: Call, request: anthropic.MessagesRequest, budget: Budget) -> None:
        """URL documents fetched when the operator allows it; URL images always (backends.images)."""
        server = self._server
        if may_have_url_images(call.body):
            await inline_url_images(request.messages, server, budget)
        if server.fetch_documents and has_url_documents(call.body):
            await resolve_url_documents(request, server, budget)

    async def _respond(self, call: Call, route: Route, request: anthropic.MessagesRequest) -> Reply:
        if self._server_tools is not None and (plan := await self._server_tools.plan(request)) is not None:
            if plan.runners:
                return await self._looped(call, route, plan)
            request = plan.request  # server-tool blocks sent back, shown to the model as what they were
        # Stop sequences are matched here over the streamed text, so a request that has
        # them reads the upstream as a stream even when the client did not ask for one.
        upstream_stream = request.stream or bool(request.stop_sequences) or self.profile.stream_upstream
        translated = await self._translate_call(request, route, upstream_stream, anthropic.betas(call.headers))
        dropped = bool(translated.chat.tools) and route.renders_tools is False
        if dropped and call.outcome is not None:
            call.outcome.tools_dropped = True
        fitted = await fitted_body(
            translated.chat, route, request.max_tokens, lambda chat: self._count(chat, route, estimate=0)
        )
        post = self._http.post("/chat/completions", fitted.body, outcome=call.outcome, stream=upstream_stream,
                               prompt="chat", conversation=call.conversation,
                               previous=translated.previous_replica, deadline=call.retry_deadline)  # fmt: skip
        reply = self._reply_settings(call, translated, fitted.window_bound)

        async def prompt_tokens() -> int:  # for a reply without the upstream's usage
            return (await self._count(translated.chat, route, estimate=count_estimate(translated.chat)))[0]

        headers = _headers(translated, dropped)
        if request.stream:
            return await self._streamed(post, StreamTranslator(**reply, redactor=self._http.redactor), call,
                                        prompt_tokens, headers, _estimate(call, translated.chat))  # fmt: skip
        response = await post
        if upstream_stream:  # read as a stream, folded into one message
            folder = Folder(upstream=self.name, limit=self._max_folded)  # the events folded as they come: none is kept
            translator = StreamTranslator(**reply, redactor=self._http.redactor)
            batches = self._streams.translated(response, translator, call.outcome, _as_events, prompt_tokens)
            async with contextlib.aclosing(batches):  # a reply refused part-way closes its upstream request now
                async for batch in batches:
                    folder.feed(batch)
            return Completed(msgspec.json.encode(folder.message()), headers=headers)
        with upstream_errors(self.name):
            try:
                body = await response.read()
            finally:
                response.release()
        completion = completion_of(body, self.name, self._http.redactor)
        message = to_message(completion, **reply)
        if completion.usage is None and completion.choices:  # a server that reports none: counted here
            message.usage.input_tokens = await prompt_tokens()
            message.usage.output_tokens = completion_estimate(completion.choices[0].message)
        note_usage(call.outcome, message.usage)
        return Completed(msgspec.json.encode(message), headers=headers)

    async def _looped(self, call: Call, route: Route, plan: Plan) -> Reply:
        """A request with server tools the gateway runs (dragoman.servertools): one model call per
        step of the loop, each read as a stream of events, joined into one message."""
        assert self._server_tools is not None
        batches = self._server_tools.run(plan, lambda request: self._events(call, route, request), call.outcome)
        if plan.request.stream:
            return Streaming(_encoded(batches))
        folder = Folder(upstream=self.name, limit=self._max_folded)
        async with contextlib.aclosing(batches):
            async for batch in batches:
                folder.feed(batch)
        return Completed(msgspec.json.encode(folder.message()))

    async def _events(self, call: Call, route: Route, request: anthropic.MessagesRequest) -> AsyncIterator[Batch]:
        """One model call of a server-tool loop, streamed from the upstream, as batches of events."""
        translated = await self._translate_call(request, route, True, anthropic.betas(call.headers))
        fitted = await fitted_body(
            translated.chat, route, request.max_tokens, lambda chat: self._count(chat, route, estimate=0)
        )
        response = await self._http.post("/chat/completions", fitted.body, outcome=call.outcome, stream=True,
                                          prompt="chat", conversation=call.conversation,
                                          previous=translated.previous_replica, deadline=call.retry_deadline)  # fmt: skip

        async def prompt_tokens() -> int:
            return (await self._count(translated.chat, route, estimate=count_estimate(translated.chat)))[0]

        translator = StreamTranslator(**self._reply_settings(call, translated, fitted.window_bound),
                                      redactor=self._http.redactor)  # fmt: skip
        return self._streams.translated(response, translator, call.outcome, _as_events, prompt_tokens,
                                        estimate=_estimate(call, translated.chat))  # fmt: skip

    def _reply_settings(self, call: Call, translated: Translated, window_bound: bool) -> ReplySettings:
        """What translating the reply back needs to know of the request."""
        return {
            "model": call.model,
            "message_id": ids.message_id(),
            "new_tool_id": ids.tool_use_id,
            "tool_names": translated.tool_names,
            "taken_tool_ids": translated.tool_ids,
            "stop_sequences": translated.stop_sequences,
            "surface_thinking": translated.surface_thinking,
            "omit_thinking_text": translated.omit_thinking_text,
            "single_tool_call": translated.single_tool_call,
            # A cut at a limit the window set is `model_context_window_exceeded` (stop_reason_of).
            # Every reply is built here, batches' included; compaction's summary says
            # `compaction` and max_tokens 0's warm-up `max_tokens` whatever the cut.
            "window_bound": window_bound,
            # Servers asked to continue explicitly never repeat the prefill; native ones may.
            "prefill": translated.prefill if self.profile.prefill == "native" else "",
            "upstream": self.name,
            # Tool ids say which replica made them, for routing to read back (docs/routing.md).
            "replica_tag": lambda: self._http.replica_tag(getattr(call.outcome, "replica", None)),
        }

    async def _streamed(self, post: Awaitable[Response], translator: StreamTranslator, call: Call,
                        prompt_tokens: Callable[[], Awaitable[int]], headers: dict[str, str],
                        estimate: Callable[[], int]) -> Streaming:  # fmt: skip
        """The client's stream: its head may wait for the upstream's (keep-alives meanwhile)."""
        direct = DirectWrites()
        head = await head_or_task(post, self._keepalive)
        if isinstance(head, asyncio.Task):
            chunks = late_start(head, self._keepalive, lambda response: self._streams.translated(
                response, translator, call.outcome, _sse, prompt_tokens, direct, estimate, sse=True))  # fmt: skip
            return Streaming(chunks, headers=headers, direct=direct)
        chunks = self._streams.translated(
            head, translator, call.outcome, _sse, prompt_tokens, direct, estimate, sse=True
        )
        return Streaming(chunks, headers=headers, on_close=head.close, direct=direct)

    async def _warm_cache(self, call: Call, route: Route, request: anthropic.MessagesRequest) -> Reply:
        """max_tokens 0: run the prompt (so the backend caches it), return nothing generated."""
        warm = msgspec.structs.replace(request, stream=False, stop_sequences=None)  # sent with max_tokens 1
        reply = await self._respond(call, route, warm)
        assert isinstance(reply, Completed)
        message = msgspec.json.decode(reply.body, type=anthropic.Message)
        message.content = [anthropic.OutTextBlock(text="")]
        message.stop_reason, message.stop_sequence = "max_tokens", None
        message.usage.output_tokens = 0
        if call.outcome is not None:
            call.outcome.output_tokens = 0
        if request.stream:
            return Streaming(_once(encode_all(events_of(message))), headers=reply.headers)
        return Completed(msgspec.json.encode(message), headers=reply.headers)

    # -- token counting and limits -------------------------------------------------

    async def _count(self, chat: openai.ChatRequest, route: Route, estimate: int) -> tuple[int, str]:
        """(prompt tokens, method), best first: the upstream's own count, the model's
        tokenizer configured here, else the estimate."""
        key = CountCache.key(chat.model, openai.ENCODER.encode(chat.messages), openai.ENCODER.encode(chat.tools))
        cached = self._counts.get(key)
        if cached is not None:
            return cached
        result: tuple[int, str] | None = None
        if self.profile.token_counter is not None:
            try:
                result = (await count_prompt(self._http, self.profile.token_counter, chat), "upstream")
            except GatewayError as error:
                log.info("upstream %s could not count tokens (%s)", self.name, error.message)
        if result is None and route.counter is not None:
            try:
                result = (route.counter.count(chat), "tokenizer")
            except TokenizerError as error:
                log.info("the tokenizer of %s could not count (%s)", route.upstream_model, error)
        if result is None:
            return estimate, "estimate"
        self._counts.put(key, result)
        return result

    async def count_tokens(self, call: Call, route: Route) -> Reply:
        with Budget(self._server, self._fetched) as budget:
            return await self._count_tokens(call, route, budget)

    async def _count_tokens(self, call: Call, route: Route, budget: Budget) -> Reply:
        counted = decode_request(call.body, anthropic.COUNT_TOKENS_REQUEST)
        request = anthropic.MessagesRequest(
            model=counted.model, messages=counted.messages, max_tokens=1, system=counted.system,
            tools=counted.tools, tool_choice=counted.tool_choice,
        )  # fmt: skip
        await self._fetch_documents(call, request, budget)
        if self._server_tools is not None and (plan := await self._server_tools.plan(request, connect=False)):
            request = plan.request  # counted as the model is shown it: server tools as functions
        translated = await self._translate_call(request, route, stream=False)
        tokens, method = await self._count(translated.chat, route, estimate=count_estimate(translated.chat))
        body = msgspec.json.encode(anthropic.CountTokensResponse(input_tokens=tokens))
        return Completed(body, headers={"x-token-count-method": method})


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _encoded(batches: AsyncGenerator[Batch, None]) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(batches):
        async for batch in batches:
            yield encode_all(batch)


def _headers(translated: Translated, tools_dropped: bool = False) -> dict[str, str]:
    """Response headers that say what the gateway applied, and what the backend drops."""
    headers = {"x-tools-dropped": "chat-template"} if tools_dropped else {}
    if translated.effort:
        headers["x-reasoning-effort"] = translated.effort
    applied = translated.chat.max_completion_tokens or translated.chat.max_tokens
    if applied is not None:
        headers["x-max-tokens-applied"] = str(applied)
    return headers


def _estimate(call: Call, chat: openai.ChatRequest) -> Callable[[], int]:
    """The prompt's tokens for the record a crash mid-stream leaves: routing's count if it
    made one, else the local estimate; worked out once, and only if a stream is journaled
    (a closure, not `functools.cache`: that costs microseconds per request to make)."""
    known: list[int] = []

    def estimate() -> int:
        if not known:
            known.append((call.outcome and call.outcome.routed_tokens) or count_estimate(chat))
        return known[0]

    return estimate

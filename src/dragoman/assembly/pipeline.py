"""The one request pipeline: every Messages request, whoever sent it (an HTTP client,
`count_tokens`, the batch runner), goes through `Pipeline.prepare` and `Pipeline.send`.

    body ──prepare──▶ files resolved ▶ decoded ▶ routed ▶ thread opened ▶ Call
    Call ──send─────▶ upstream slot (back-pressure) ▶ backend.messages / count_tokens ▶ Reply

A per-request rule (limits, accounting, routing) belongs in one of these two steps, and
then holds for every entry point. Authentication, reading the body and rendering the
reply stay with the entry point (`server.endpoints`, `batches.runs`), which alone knows
its transport. Compaction and the turns of a message thread are parts of a request
body, resolved here (threads) or by the backend that serves it (compaction).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from dragoman.assembly.backpressure import Limiter
from dragoman.assembly.request_trace import RequestTrace
from dragoman.assembly.threads import ThreadStore, Turn
from dragoman.assembly.tracing import Tracing
from dragoman.calls.types import Call, Caller, Completed, Outcome, Reply, Route
from dragoman.core.errors import InvalidRequest, RequestTooLarge, unsent
from dragoman.core.validation import decode_request
from dragoman.files.store import FileStore
from dragoman.limits.gate import Admission, Limits
from dragoman.notices.tools_dropped import NoticeMode, noted, without_notes
from dragoman.protocol import anthropic
from dragoman.routes.table import Routes
from dragoman.safeguards.service import Safeguards

Endpoint = Literal["messages", "count_tokens", "batch"]
# Claude Code's session (the session_id of its metadata.user_id): one conversation and its
# sub-agents, which cache-aware routing keeps on one replica (docs/routing.md).
SESSION_HEADER = "x-claude-code-session-id"


@dataclass(slots=True)
class Prepared:
    """A request ready to send: what goes to the backend, where, and its thread's turn."""

    call: Call
    route: Route
    turn: Turn | None = None
    caller: Caller | None = None
    admission: Admission | None = None  # what [limits] let it take: its reply's rate-limit headers


class Pipeline:
    """The steps every request takes between its entry point and its backend."""

    def __init__(
        self,
        *,
        route: Callable[[str], Awaitable[Route]],
        files: FileStore,
        threads: ThreadStore,
        limiters: Mapping[str, Limiter],
        max_request_bytes: int,
        decode_whole: Callable[[], bool],
        tracing: Tracing | None = None,
        limits: Limits | None = None,
        notice: NoticeMode = "off",
        safeguards: Safeguards | None = None,
        routes: Routes | None = None,
    ) -> None:
        self._route = route
        self._files = files
        self._threads = threads
        self._limiters = limiters
        self._max_bytes = max_request_bytes
        self._decode_whole = decode_whole  # every upstream translates: decode the body once, here
        self.tracing = tracing  # None: tracing is off, and no request does any tracing work
        self._limits = limits
        self._notice = notice  # the gateway's note on a reply whose tools were dropped (notices/)
        self._safeguards = safeguards  # Claude Code's auto mode (dragoman.safeguards)
        self._routes = routes  # [[routes]] and fallbacks (dragoman.routes); None: names alone decide

    async def prepare(self, body: bytes, *, endpoint: Endpoint, headers: Mapping[str, str], caller: Caller,
                      outcome: Outcome) -> Prepared:  # fmt: skip
        """Resolve, decode and route one request body. A batch's request must be whole
        (no stream, no thread); the others may hold a thread, opened here."""
        outcome.key_id, outcome.tenant = caller.key_id, caller.tenant  # for usage accounting
        body = without_notes(body)  # the gateway's own notes, sent back, never reach a model
        if self._files.named_in(body):
            body = await self._files.resolve(body, self._max_bytes, owner=caller.owner)
        whole: anthropic.MessagesRequest | None = None
        envelope: anthropic.MessagesRequest | anthropic.Envelope
        if endpoint == "batch" or (endpoint == "messages" and self._decode_whole()):
            envelope = whole = decode_request(body, anthropic.MESSAGES_REQUEST)  # decoded once (a large body costs)
        else:
            envelope = decode_request(body, anthropic.ENVELOPE if self._routes is None else self._routes.envelope)
        outcome.model = envelope.model
        if endpoint == "batch":
            _check_batchable(envelope)
        route = await (self._route(envelope.model) if self._routes is None else
                       self._routes.route(body, headers, envelope, endpoint, outcome))  # fmt: skip
        outcome.routed(route)
        turn = None
        if endpoint == "messages" and envelope.thread is not None:  # the held conversation first, no `thread` upstream
            turn = self._threads.open(body, caller.owner)
            body = turn.body
            try:
                if len(body) > self._max_bytes:  # the held turns count: a thread is no way around the limit
                    raise RequestTooLarge(
                        f"thread: the held conversation and this turn come to {len(body)} bytes, more than the "
                        f"gateway accepts ({self._max_bytes}, server.max_request_bytes); send the conversation "
                        'shortened, with thread: {"type": "create"}'
                    )
                if whole is not None:
                    envelope = whole = decode_request(body, anthropic.MESSAGES_REQUEST)
            except BaseException:
                turn.answered(None)
                raise
        parts = envelope if turn is None and isinstance(envelope, anthropic.Envelope) else None  # read from `body`
        call = Call(body=body, model=envelope.model, upstream_model=route.upstream_model, headers=headers,
                    request_id=outcome.request_id, stream=envelope.stream, outcome=outcome, request=whole,
                    conversation=headers.get(SESSION_HEADER) or None, envelope=parts)  # fmt: skip
        if outcome.trace is not None:
            outcome.trace.prepared(call, route, "anthropic" if route.path == "passthrough" else "openai")
        return Prepared(call, route, turn, caller)

    async def send(self, prepared: Prepared, *, endpoint: Endpoint) -> Reply:
        """The backend's reply, once the caller's limits admit it (else a 429) and the upstream
        has a slot for it. An interactive request finds a full queue a 529 at once; a batch's
        waits its turn (it has a day)."""
        call, route = prepared.call, prepared.route
        outcome = call.outcome
        assert outcome is not None
        limiter = self._limiters.get(route.upstream)
        try:
            if self._limits is not None:
                caller = prepared.caller or Caller(owner="")
                admission = await self._limits.admit(caller.key_id, caller.tenant, call, endpoint)
                prepared.admission = admission
                outcome.finish.hold(functools.partial(admission.settle, outcome))  # at the request's end
            if limiter is not None:
                await limiter.acquire(queue=endpoint != "batch")
                outcome.finish.hold(limiter.release)  # at the reply's last byte, or its failure
            handler = route.backend.count_tokens if endpoint == "count_tokens" else route.backend.messages
            if self._safeguards is not None and endpoint != "count_tokens" and self._safeguards.concerns(call):
                reply = await self._safeguards.send(call, route, handler)
            else:
                reply = await handler(call, route)
        except BaseException as error:
            outcome.unsent = unsent(error)  # before its settlement: [limits] give the request back
            raise
        outcome.path = route.path  # an `auto` upstream knows its path only after its probe
        if outcome.trace is not None:
            _traced(reply, outcome.trace)
        return noted(reply, call, self._notice) if endpoint == "messages" and prepared.turn is None else reply


def _traced(reply: Reply, trace: RequestTrace) -> None:
    """Let the trace read the reply: a whole message now, a stream as it goes by."""
    if isinstance(reply, Completed):
        trace.completed(reply.body)
    else:
        reply.observe(trace.seen)


def _check_batchable(request: anthropic.MessagesRequest | anthropic.Envelope) -> None:
    if request.stream:
        raise InvalidRequest("stream: streaming is not available in a batch")
    if request.thread is not None:
        raise InvalidRequest("thread: message threads are not available in a batch; send the whole conversation")

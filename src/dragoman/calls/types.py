"""The types every layer shares: what a request is (`Call`), what the core learned
while serving it (`Outcome`), where it goes (`Route`), what comes back (`Reply`), and
the `Backend` interface, and who sent it (`Caller`). It imports nothing of dragoman's but
`core/`, wire types and the tokenizers, so that the backends and every layer above may import it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from dragoman.calls.streams import Observer, Stages, StreamTransform
from dragoman.core.capabilities import ModelCaps
from dragoman.core.errors import GatewayError, UpstreamError
from dragoman.protocol.anthropic import Envelope, MessagesRequest
from dragoman.tokens.tokenizer import LocalCounter, TiktokenCounter

log = logging.getLogger("dragoman")


@dataclass(frozen=True, slots=True)
class Call:
    """One client request, as the gateway core saw it."""

    body: bytes  # the client's JSON body, untouched
    model: str  # the name the client asked for
    upstream_model: str
    headers: Mapping[str, str]  # the client's request headers
    request_id: str
    stream: bool = False
    outcome: Outcome | None = None  # what the backend saw: tokens, keep-alives, retries
    request: MessagesRequest | None = None  # the body decoded whole, when the core already did
    conversation: str | None = None  # the client's session (Claude Code's), for routing to its replica
    envelope: Envelope | None = None  # else its top fields and prompt parts, when `body` is what was read
    retry_deadline: float | None = None  # a fallback's: no retry waits past it (the request's one budget)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request, as its entry point authenticated it."""

    owner: str  # whose files, batches and threads it may name (see `server.auth.owner`)
    key_id: str | None = None  # a digest naming the key it presented (never the key), None without keys
    tenant: str | None = None  # the key's tenant (`server.tenants`), if it belongs to one


class _MaxTokens(msgspec.Struct):
    max_tokens: int = 0


_MAX_TOKENS = msgspec.json.Decoder(_MaxTokens)


def max_tokens(call: Call) -> int:
    """The request's `max_tokens` (0 without one: a `count_tokens` body), from what the core
    read of the body (whole, or its envelope), else read alone from the body (which was
    decoded before: it is JSON)."""
    read = call.request or call.envelope
    if read is not None:
        return max(0, read.max_tokens)
    try:
        return max(0, _MAX_TOKENS.decode(call.body).max_tokens)
    except msgspec.DecodeError:
        return 0


@dataclass(slots=True)
class Completed:
    body: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


class ClientWriter(Protocol):
    """Writes a stream's bytes to the client synchronously, from the upstream
    connection's callback (see `dragoman.server.serving.DirectBody`)."""

    def ready(self) -> bool:
        """Whether `write` may be called now (else: yield the bytes to the endpoint)."""
        ...

    def write(self, chunk: bytes) -> None: ...


@dataclass(slots=True)
class DirectWrites:
    """Where a stream finds the client's writer: set by the endpoint before the stream's
    first chunk is asked for, if the server offers one; else the stream yields every chunk."""

    writer: ClientWriter | None = None
    stages: Stages | None = None  # what `Streaming.observe` and `transform` registered: the pump runs them


@dataclass(slots=True)
class Streaming:
    chunks: AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    # Called once the stream is over, however it ended: closes the upstream response even
    # if `chunks` never started (a generator's own clean-up runs only once it has).
    on_close: Callable[[], None] | None = None
    # Chunks may bypass `chunks` (written straight to the client) once this has a writer:
    # never wrap `chunks` to see or change them; `observe` or `transform` the stream.
    direct: DirectWrites | None = None
    stages: Stages | None = None  # with no pump behind `chunks` (no `direct`): run around them

    def observe(self, observer: Observer) -> None:
        """`observer` sees every piece the client gets, on either path (`calls.streams`)."""
        self._stages().observers.append(observer)

    def transform(self, transform: StreamTransform) -> None:
        """`transform` may hold, rewrite or add to the stream's events (`calls.streams`),
        after the transforms registered before it."""
        self._stages().transforms.append(transform)

    def _stages(self) -> Stages:
        direct = self.direct
        if direct is not None:  # the pump runs them, on both of its paths
            if direct.stages is None:
                direct.stages = Stages()
            return direct.stages
        if self.stages is None:
            self.stages = Stages()
            self.chunks = self.stages.around(self.chunks)
        return self.stages


Reply = Completed | Streaming


class Slots(Protocol):
    """An upstream's request slots, its `max_concurrent` and queue (`assembly.backpressure.Limiter`):
    what a call made on a request's behalf to another upstream takes (a fallback, a classifier)."""

    async def acquire(self, *, queue: bool = True) -> None: ...

    def release(self) -> None: ...


@dataclass(frozen=True, slots=True)
class UpstreamModel:
    id: str
    owned_by: str | None = None
    context_window: int | None = None
    renders_tools: bool | None = None  # False: its chat template drops a request's tools (None: unknown)


# What `GET /models` answers on a server that has no model list at all, as opposed to one
# that is down or refuses the key (asking again later would find the same).
NO_MODEL_LIST_STATUSES = frozenset({404, 405, 501})


class NoModelList(UpstreamError):
    """The upstream answered, but has no model list: its models are named only by
    configuration, or reached by names that nothing else serves (see `routing`)."""

    def __init__(self, upstream: str, status: int, url: str) -> None:
        super().__init__(f"upstream {upstream} has no model list (GET {url} answered {status}){v1_hint(url, status)}")


def v1_hint(url: str, status: int) -> str:
    """A 404 for a model list often means the upstream URL lacks its `/v1`, or has it twice:
    the words that say which (empty when the URL shows neither)."""
    if status != 404:
        return ""
    path = url.split("://", 1)[-1].partition("/")[2]
    if "v1/v1/" in path:
        return ": the URL has /v1 twice; drop one from the upstream's URL"
    if not path.startswith("v1/") and "/v1/" not in path:
        return ": OpenAI-compatible servers list their models at /v1/models; does the upstream's URL lack /v1?"
    return ""


class Backend(Protocol):
    name: str

    @property
    def path(self) -> str:
        """ "translate" or "passthrough" (for metrics and the log)."""
        ...

    async def messages(self, call: Call, route: Route) -> Reply: ...

    async def count_tokens(self, call: Call, route: Route) -> Reply: ...

    async def list_models(self) -> list[UpstreamModel]: ...

    async def tool_support(self, models: list[UpstreamModel]) -> list[UpstreamModel]:
        """`models` with `renders_tools` filled in where the server can tell (after discovery:
        asking may take a few requests, which the list's users should not wait for)."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class Outcome:
    """Filled in by the endpoint and the backend while a request is served."""

    request_id: str
    endpoint: str
    model: str = ""
    served_model: str = ""
    served_model_listed: bool = True  # False: served_model is a client's name the upstream has not listed
    upstream: str = ""
    replica: str = ""  # the instance (URL) of the upstream that answered last
    key_id: str | None = None  # who sent it (`Caller.key_id`, a digest), for usage accounting
    tenant: str | None = None
    path: str = ""  # "translate" or "passthrough"
    status: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None  # written to the prompt cache (passthrough usage); counts as input
    cache_creation_1h_tokens: int | None = None  # of those, written for an hour (usage.cache_creation's breakdown)
    keepalives: int = 0
    retries: int = 0
    error_type: str | None = None
    error_message: str | None = None  # its message, for the access line (redacted and capped there)
    upstream_failed: bool = False  # the error came from the upstream, not the client or gateway
    unsent: bool = False  # it failed before reaching an upstream, or by the gateway's fault (`core.errors.unsent`)
    disconnected: bool = False
    tools_dropped: bool = False  # the request's tools reached a model whose chat template drops them
    web_search_requests: int = 0  # searches the gateway ran for it (dragoman.servertools)
    web_fetch_requests: int = 0
    server_tool_runs: list[tuple[str, str, str]] = field(default_factory=list)  # (tool, provider, outcome) each
    started: float = field(default_factory=time.perf_counter)
    first_byte: float | None = None
    trace: Any = None  # its RequestTrace (assembly.request_trace) when tracing is on; ended once it is recorded
    routing: str = ""  # why `replica` served it (dragoman.upstream.placement), under a routing policy
    prefix_tokens: int | None = None  # prompt tokens routing expected that replica to hold cached
    routed_tokens: int | None = None  # prompt tokens, as routing estimated them
    replica_load: float | None = None  # requests on `replica` as routing counted them (its own figures, if read)
    safeguards: list[str] | None = None  # auto-mode verdicts given (dragoman.safeguards): "tool=outcome", no input
    route: str = ""  # the [[routes]] entry it took (dragoman.routes), if any
    progress: Callable[[], int] | None = None  # a stream's output tokens relayed so far (usage's journal)
    input_so_far: Callable[[], int] | None = None  # a translated stream's input so far: the upstream's, or estimated
    finish: Finish = field(init=False, repr=False, compare=False)  # the request's one end

    def __post_init__(self) -> None:
        self.finish = Finish(self)

    def routed(self, route: Route) -> None:
        self.upstream, self.served_model, self.path = route.upstream, route.upstream_model, route.path
        self.served_model_listed = route.listed

    def failed(self, error: GatewayError, *, committed: bool = False) -> None:
        """The request failed with `error` (the one copy of an error into the outcome); once
        a stream's 200 is `committed`, its status stays."""
        if not committed:
            self.status = error.status
        self.error_type, self.upstream_failed = error.type, error.is_upstream
        self.error_message = error.message

    def left(self) -> None:
        """The client left before the end: 499 when nothing was answered (nobody to answer)."""
        self.disconnected = True
        if not self.status:
            self.status = 499


class Finish:
    """The one end of a request's life. What the request holds (an upstream slot, its key's
    limits and budget, a replica's count) is released by the callables given to `hold`, and
    then the outcome is recorded (`record`: metrics, the access log, usage, the trace), once,
    however the request ended: an answer, an error, a stream cut or finished, a client that
    left, an exception. `end` may be called any number of times; an entry point wraps its
    work in `with outcome.finish:` so that it is called at least once (docs/architecture.md)."""

    __slots__ = ("_outcome", "_holds", "record", "ended")

    def __init__(self, outcome: Outcome) -> None:
        self._outcome: Outcome | None = outcome  # None once ended: no cycle left for the collector to find
        self._holds: list[Callable[[], None]] = []
        self.record: Callable[[Outcome], None] | None = None  # set by whoever made the outcome
        self.ended = False

    def hold(self, release: Callable[[], None]) -> None:
        """Call `release` when the request ends (at once if it has): each is called once, in
        the order given, whatever the others raise."""
        if self.ended:
            _run(release, "releasing what a request held")
        else:
            self._holds.append(release)

    def end(self) -> None:
        """Release what the request holds, then record its outcome; only the first call does."""
        if self.ended:
            return
        self.ended = True
        holds = self._holds
        if holds:  # (once ended, `hold` runs a release at once: the list is not read again)
            self._holds = []
            for release in holds:
                _run(release, "releasing what a request held")
        # The outcome and its finish refer to each other: a cycle that only a garbage collection
        # would free, with all the request's objects it holds, about 1,400 requests at a time
        # (a collection of 2 ms). Let go of it here and the request is freed as it ends.
        outcome, self._outcome = self._outcome, None
        if outcome is None:
            return
        if self.record is not None:
            _run(self.record, "recording a request", outcome)
        outcome.progress = outcome.input_so_far = None  # recorded: closures that may hold the outcome go too

    def __enter__(self) -> Outcome:
        if self._outcome is None:
            raise RuntimeError("this request has ended")
        return self._outcome

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        """The work's end, even by an exception (which goes on): one not yet on the outcome
        is copied there first."""
        outcome = self._outcome
        if outcome is not None and outcome.error_type is None and not self.ended:
            if isinstance(error, GatewayError):
                outcome.failed(error)
            elif isinstance(error, Exception):
                outcome.failed(GatewayError("internal error in the gateway"))
        self.end()


def _run(step: Callable[..., None], what: str, *args: Any) -> None:
    """`step(*args)`, logged rather than raised: the other steps of a request's end still run."""
    try:
        step(*args)
    except Exception:
        log.exception("failed %s", what)


@dataclass(frozen=True, slots=True)
class Route:
    backend: Backend
    upstream: str
    upstream_model: str
    caps: ModelCaps
    context_window: int | None = None
    counter: LocalCounter | TiktokenCounter | None = None  # the model's own tokenizer, when configured
    # False: `upstream_model` is the client's name, passed on unchecked while the upstream's
    # model list is unknown (so it is no metrics label: clients choose it).
    listed: bool = True
    renders_tools: bool | None = None  # as the upstream's model list found it (UpstreamModel)

    @property
    def path(self) -> str:
        return self.backend.path

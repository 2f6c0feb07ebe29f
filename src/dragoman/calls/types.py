"""The types every layer shares: what a request is (`Call`), what the core learned
while serving it (`Outcome`), where it goes (`Route`), what comes back (`Reply`), and
the `Backend` interface, and who sent it (`Caller`). It imports nothing of dragoman's but
`core/`, wire types and the tokenizers, so that the backends and every layer above may import it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from dragoman.core.capabilities import ModelCaps
from dragoman.core.errors import UpstreamError
from dragoman.protocol.anthropic import Envelope, MessagesRequest
from dragoman.tokens.tokenizer import LocalCounter, TiktokenCounter


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


@dataclass(slots=True)
class Streaming:
    chunks: AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    # Called once the stream is over, however it ended: closes the upstream response even
    # if `chunks` never started (a generator's own clean-up runs only once it has).
    on_close: Callable[[], None] | None = None
    # Chunks may bypass `chunks` (written straight to the client) once this has a writer.
    direct: DirectWrites | None = None


Reply = Completed | Streaming


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
    upstream_failed: bool = False  # the error came from the upstream, not the client or gateway
    disconnected: bool = False
    tools_dropped: bool = False  # the request's tools reached a model whose chat template drops them
    started: float = field(default_factory=time.perf_counter)
    first_byte: float | None = None
    release: Callable[[], None] | None = None  # frees the request's concurrency slot
    trace: Any = None  # its RequestTrace (assembly.request_trace) when tracing is on; ended once it is recorded
    routing: str = ""  # why `replica` served it (dragoman.upstream.placement), under a routing policy
    prefix_tokens: int | None = None  # prompt tokens routing expected that replica to hold cached
    routed_tokens: int | None = None  # prompt tokens, as routing estimated them
    replica_load: float | None = None  # requests on `replica` as routing counted them (its own figures, if read)
    progress: Callable[[], int] | None = None  # a stream's output tokens relayed so far (usage's journal)

    def routed(self, route: Route) -> None:
        self.upstream, self.served_model, self.path = route.upstream, route.upstream_model, route.path
        self.served_model_listed = route.listed

    def on_finish(self, release: Callable[[], None]) -> None:
        """Also call `release` when the request ends (after what is there already)."""
        before = self.release
        if before is None:
            self.release = release
        else:

            def both() -> None:
                try:
                    before()
                finally:
                    release()

            self.release = both

    def finish(self) -> None:
        """Frees what the request held; safe to call more than once."""
        if self.release is not None:
            release, self.release = self.release, None
            release()


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

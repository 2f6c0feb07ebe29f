"""The Backend interface, the reply types the endpoints render, and the one place
where the HTTP client's exceptions become GatewayErrors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dragoman.backends.failures import ConnectFailed
from dragoman.errors import GatewayError, UpstreamError, UpstreamTimeout
from dragoman.protocol.anthropic import MessagesRequest

if TYPE_CHECKING:  # routing and observe import the backends
    from dragoman.observe import Outcome
    from dragoman.routing import Route


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


@dataclass(slots=True)
class Completed:
    body: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


class ClientWriter(Protocol):
    """Writes a stream's bytes to the client synchronously, from the upstream
    connection's callback (see `dragoman.serving.DirectBody`)."""

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


# What `GET /models` answers on a server that has no model list at all, as opposed to one
# that is down or refuses the key (asking again later would find the same).
NO_MODEL_LIST_STATUSES = frozenset({404, 405, 501})


class NoModelList(UpstreamError):
    """The upstream answered, but has no model list: its models are named only by
    configuration, or reached by names that nothing else serves (see `routing`)."""

    def __init__(self, upstream: str, status: int) -> None:
        super().__init__(f"upstream {upstream} has no model list (GET /v1/models answered {status})")


class Backend(Protocol):
    name: str

    @property
    def path(self) -> str:
        """ "translate" or "passthrough" (for metrics and the log)."""
        ...

    async def messages(self, call: Call, route: Route) -> Reply: ...

    async def count_tokens(self, call: Call, route: Route) -> Reply: ...

    async def list_models(self) -> list[UpstreamModel]: ...

    async def close(self) -> None: ...


class upstream_errors:
    """Map the HTTP client's failures to GatewayErrors, once, at the boundary.

    A class rather than a generator-based context manager: it wraps every read of
    every stream, so entering and leaving it must cost next to nothing."""

    __slots__ = ("upstream",)

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        if error is None or isinstance(error, GatewayError) or not isinstance(error, Exception):
            return
        mapped = _mapped(error, self.upstream)
        if mapped is not None:
            raise mapped from None


def _mapped(error: Exception, upstream: str) -> GatewayError | None:
    if isinstance(error, ConnectFailed):  # never connected: another replica may answer
        return UpstreamError(f"upstream {upstream} is unreachable: {error}")
    if isinstance(error, TimeoutError):
        return UpstreamTimeout(f"upstream {upstream} timed out ({str(error) or 'no response in time'})")
    if isinstance(error, ConnectionError):
        return UpstreamError(f"upstream {upstream} failed: {str(error) or type(error).__name__}")
    return None

"""The Backend interface, the reply types the endpoints render, and the one place
where the HTTP client's exceptions become GatewayErrors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import aiohttp

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


@dataclass(slots=True)
class Streaming:
    chunks: AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200


Reply = Completed | Streaming


@dataclass(frozen=True, slots=True)
class UpstreamModel:
    id: str
    owned_by: str | None = None
    context_window: int | None = None


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


@contextmanager
def upstream_errors(upstream: str) -> Iterator[None]:
    """Map the HTTP client's failures to GatewayErrors, once, at the boundary."""
    try:
        yield
    except GatewayError:
        raise
    except aiohttp.ConnectionTimeoutError as error:  # never connected: another replica may answer
        raise UpstreamError(f"upstream {upstream} is unreachable: connection timed out ({str(error) or 'no answer'})") from None
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as error:
        raise UpstreamTimeout(f"upstream {upstream} timed out ({str(error) or 'no response in time'})") from None
    except aiohttp.ClientConnectorError as error:
        raise UpstreamError(f"upstream {upstream} is unreachable: {error.os_error or error}") from None
    except (aiohttp.ClientError, ConnectionError) as error:
        raise UpstreamError(f"upstream {upstream} failed: {str(error) or type(error).__name__}") from None

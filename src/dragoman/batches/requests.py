"""What the batch runner needs of the layer above it, as protocols: the request path (the
assembly's `Pipeline`) and the recorder (its `Metrics`). The gateway hands both in, so
`batches/` imports nothing of the assembly that builds it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from dragoman.calls.types import Caller, Outcome, Reply


class BatchTracing(Protocol):
    def batch_request(self, batch_id: str, custom_id: str, created_by: str | None) -> Any:
        """A trace of its own for one request of a batch (`Outcome.trace`)."""
        ...


class RequestPath(Protocol):
    """The one request path (`dragoman.assembly.pipeline.Pipeline`), as a batch's requests take it."""

    @property
    def tracing(self) -> BatchTracing | None: ...

    async def prepare(self, body: bytes, *, endpoint: Literal["batch"], headers: Mapping[str, str], caller: Caller,
                      outcome: Outcome) -> Any: ...  # fmt: skip

    async def send(self, prepared: Any, *, endpoint: Literal["batch"]) -> Reply: ...


class Recorder(Protocol):
    """Records finished requests (`dragoman.assembly.observe.Metrics`)."""

    def outcome(self, request_id: str, endpoint: str) -> Outcome:
        """A new request's outcome, recorded when it ends (`Outcome.finish`)."""
        ...

"""The HTTP server protocol: uvicorn's httptools protocol, plus a direct body writer.

A streamed token costs an event-loop wake-up of the request's task and an ASGI `send`
when it goes through the ASGI interface: about 3 µs of the 20 a translated token costs
on the benchmark machine (docs/performance.md). With the writer this module puts in
each request's scope, a stream's tokens are written to the client from the upstream
connection's own callback instead (see `backends.connection.Response.drain_to`).

The writer reads four attributes of uvicorn's request cycle. `http_protocol()` checks
them once; if uvicorn changed them, or httptools is missing, the server is uvicorn's
own and streams take the ASGI path, which works the same, a little slower.
"""

from __future__ import annotations

import importlib.util
from typing import Any

if importlib.util.find_spec("httptools") is None:  # uvicorn[standard] brings it where wheels exist
    HTTPTOOLS = False
    _Base: Any = object
else:
    HTTPTOOLS = True
    from uvicorn.protocols.http import httptools_impl

    _Base = httptools_impl.HttpToolsProtocol

DIRECT_BODY = "dragoman.direct_body"  # the scope extension's name
_CYCLE_ATTRIBUTES = ("transport", "flow", "disconnected", "response_complete", "chunked_encoding")


class DirectBody:
    """Writes chunks of a response body that uvicorn has started, bypassing `send`.

    Only for a chunked body whose head has gone out: `ready()` is false otherwise, and
    while the client's socket is full (flow control) or gone, so that the caller goes
    back to `send`, which waits for the client as usual."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle

    def ready(self) -> bool:
        cycle = self._cycle
        return (cycle.chunked_encoding is True and not cycle.flow.write_paused
                and not cycle.disconnected and not cycle.response_complete)  # fmt: skip

    def write(self, chunk: bytes) -> None:
        """One chunk of the body (not empty); call `ready()` first."""
        self._cycle.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))


class DirectBodyProtocol(_Base):
    """uvicorn's httptools protocol; each request's scope carries a `DirectBody`."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not an upgrade
            self.scope["extensions"] = {**self.scope.get("extensions", {}), DIRECT_BODY: DirectBody(cycle)}


def http_protocol() -> Any:
    """What to pass to uvicorn as `http`: the protocol with the direct writer, or
    uvicorn's own choice when that cannot work here."""
    if not HTTPTOOLS:
        return "h11"
    init = getattr(httptools_impl.RequestResponseCycle.__init__, "__code__", None)
    assigned = set(init.co_names) if init is not None else set()
    if not all(name in assigned for name in _CYCLE_ATTRIBUTES):  # uvicorn changed its cycle
        return "httptools"
    return DirectBodyProtocol

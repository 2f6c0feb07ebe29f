"""How a call over dragoman's own upstream HTTP/1.1 client fails: ConnectionErrors and
TimeoutErrors, mapped to GatewayErrors once, in `dragoman.upstream.errors`."""

from __future__ import annotations


class ConnectFailed(ConnectionError):
    """No connection: refused, unresolvable, timed out, TLS or proxy refusal. Nothing was sent."""


class ConnectTimeout(ConnectFailed):
    """No connection within connect_timeout: the instance (or an address) drops connections."""


class Disconnected(ConnectionError):
    """The upstream closed the connection before its reply was complete."""


class StaleConnection(Disconnected):
    """A pooled connection was closed by the upstream as the request went out: safe to send again."""


class HeadTimeout(TimeoutError):
    """The upstream did not start its answer in time (first_byte_timeout)."""


class BodyTimeout(TimeoutError):
    """A body read whole stalled for longer than the response's `idle_timeout`."""


class BadResponse(ConnectionError):
    """The upstream's bytes are not HTTP/1.1 the gateway can read."""

"""The one place where the HTTP client's exceptions become GatewayErrors."""

from __future__ import annotations

from dragoman.core.errors import GatewayError, UpstreamError, UpstreamTimeout
from dragoman.upstream.transport.failures import ConnectFailed


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
        unreachable = UpstreamError(f"upstream {upstream} is unreachable: {error}")
        unreachable.unsent = True
        return unreachable
    if isinstance(error, TimeoutError):
        return UpstreamTimeout(f"upstream {upstream} timed out ({str(error) or 'no response in time'})")
    if isinstance(error, ConnectionError):
        return UpstreamError(f"upstream {upstream} failed: {str(error) or type(error).__name__}")
    return None

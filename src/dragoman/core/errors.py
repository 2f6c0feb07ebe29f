"""One error tree for the whole gateway, rendered in Anthropic's envelope.

    GatewayError            500 api_error
    ├── InvalidRequest      400 invalid_request_error
    ├── Unauthorized        401 authentication_error
    ├── PermissionDenied    403 permission_error
    ├── NotFound            404 not_found_error
    ├── MethodNotAllowed    405 invalid_request_error
    ├── RequestTimeout      408 timeout_error    (the client stopped sending its request)
    ├── RequestTooLarge     413 request_too_large
    ├── RateLimited         429 rate_limit_error
    ├── UpstreamError       502 api_error        (connection failures, upstream 5xx)
    ├── UpstreamTimeout     504 timeout_error
    └── Overloaded          529 overloaded_error (upstream 503/529)
        └── StoreUnavailable 503 overloaded_error (a database the gateway keeps is down or locked)

Statuses are chosen for the SDKs' retry logic: they retry 408, 409, 429 and >= 500,
so a deterministic failure must never be a 5xx. A backend's error answers are mapped onto
the tree in `core.error_mapping`; `core.redaction` keeps the gateway's keys out of them.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec


class ErrorDetail(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    """The `error` of Anthropic's envelope (`protocol.anthropic` re-exports it with the wire types)."""

    type: str
    message: str
    details: dict[str, str] | None = None  # `error_code` for the errors the SDKs act on (threads)


class ErrorResponse(msgspec.Struct, kw_only=True, gc=False, tag="error", tag_field="type", omit_defaults=True):
    error: ErrorDetail
    request_id: str | None = None  # omitted in stream error events, which carry none


class GatewayError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "api_error"

    def __init__(self, message: str, *, retry_after: str | None = None, should_retry: bool | None = None,
                 error_code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.should_retry = should_retry
        self.upstream: str | None = None  # set when an upstream's answer caused it
        self.unsent = False  # the request never reached an upstream (connecting failed): see `unsent()`
        # `error.details`: `error_code` picks the SDKs' exception class (e.g. FileNotDownloadableError)
        self.details: dict[str, str] | None = {"error_code": error_code} if error_code else None
        self.extra_headers: dict[str, str] = {}  # more for its answer: the caller's anthropic-ratelimit-*

    @property
    def is_upstream(self) -> bool:
        """Whether the upstream failed (for its error metric), not the client or the gateway."""
        return self.upstream is not None or isinstance(self, (UpstreamError, UpstreamTimeout))

    def body(self, request_id: str | None) -> bytes:
        detail = ErrorDetail(type=self.type, message=self.message, details=self.details)
        return msgspec.json.encode(ErrorResponse(error=detail, request_id=request_id))

    def event(self) -> bytes:
        """The SSE `error` event that ends a stream which has already started."""
        detail = ErrorDetail(type=self.type, message=self.message, details=self.details)
        data = msgspec.json.encode(ErrorResponse(error=detail))
        return b"event: error\ndata: " + data + b"\n\n"

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.retry_after is not None:
            headers["retry-after"] = self.retry_after
        if self.should_retry is False or (
            self.should_retry is None and self.status < 500 and self.status not in (408, 409, 429)
        ):
            headers["x-should-retry"] = "false"
        if self.extra_headers:
            headers.update(self.extra_headers)
        return headers


def unsent(error: BaseException) -> bool:
    """Whether a request that failed so was the gateway's to fail: it never reached an upstream,
    or the gateway itself failed it (a 5xx of its own). [limits] then give its request back."""
    return isinstance(error, GatewayError) and (error.unsent or (error.status >= 500 and not error.is_upstream))


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"


class RequestTooLarge(GatewayError):
    status = 413
    type = "request_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"


class UpstreamError(GatewayError):
    status = 502
    type = "api_error"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "timeout_error"


class RequestTimeout(GatewayError):
    """The client stopped sending its request (serving.DirectBodyProtocol)."""

    status = 408
    type = "timeout_error"


class RequestHeadersTooLarge(GatewayError):
    """The client's request line and headers passed serving.MAX_HEAD_BYTES."""

    status = 431
    type = "invalid_request_error"


class Overloaded(GatewayError):
    status = 529
    type = "overloaded_error"


class StoreUnavailable(Overloaded):
    """A store of the gateway's own (the usage database) is down or locked: try again shortly."""

    status = 503


def context_overflow(prompt: int | None, limit: int | None, completion: int | None = None) -> InvalidRequest:
    """Anthropic's wording for a request that does not fit the context window: the
    prompt alone is too long, or (when the prompt fits) prompt plus max_tokens is."""
    if prompt is not None and limit is not None and completion is not None and prompt < limit:
        return context_limit(prompt, completion, limit)
    if prompt is not None and limit is not None:
        text = f"prompt is too long: {prompt} tokens > {limit} maximum"
    else:
        text = "prompt is too long: the prompt exceeds the model's context window"
    return InvalidRequest(text + " (capability_rejected: prompt_too_long)")


def context_limit(prompt: int, max_tokens: int, window: int) -> InvalidRequest:
    """The prompt leaves no room for even a minimal reply (checked before calling the model)."""
    return InvalidRequest(
        f"input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > {window}, "
        "decrease input length or `max_tokens` and try again"
    )

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

Statuses are chosen for the SDKs' retry logic: they retry 408, 409, 429 and >= 500,
so a deterministic failure must never be a 5xx. `from_upstream` is the one place
that maps a backend's error response, and `from_error_event` the `error` event a passthrough
stream begins with (by its type, or through `from_upstream`).
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

import msgspec

from dragoman.protocol import anthropic


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
        # `error.details`: `error_code` picks the SDKs' exception class (e.g. FileNotDownloadableError)
        self.details: dict[str, str] | None = {"error_code": error_code} if error_code else None
        self.extra_headers: dict[str, str] = {}  # more for its answer: the caller's anthropic-ratelimit-*

    @property
    def is_upstream(self) -> bool:
        """Whether the upstream failed (for its error metric), not the client or the gateway."""
        return self.upstream is not None or isinstance(self, (UpstreamError, UpstreamTimeout))

    def body(self, request_id: str | None) -> bytes:
        detail = anthropic.ErrorDetail(type=self.type, message=self.message, details=self.details)
        return msgspec.json.encode(anthropic.ErrorResponse(error=detail, request_id=request_id))

    def event(self) -> bytes:
        """The SSE `error` event that ends a stream which has already started."""
        detail = anthropic.ErrorDetail(type=self.type, message=self.message, details=self.details)
        data = msgspec.json.encode(anthropic.ErrorResponse(error=detail))
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


class _UpstreamErrorBody(msgspec.Struct):
    message: str | None = None
    type: str | None = None
    code: int | str | None = None
    n_prompt_tokens: int | None = None
    n_ctx: int | None = None


class _UpstreamEnvelope(msgspec.Struct):
    error: _UpstreamErrorBody | str | None = None
    message: str | None = None
    detail: str | None = None


_ENVELOPE = msgspec.json.Decoder(_UpstreamEnvelope)

_BY_STATUS: dict[int, type[GatewayError]] = {
    400: InvalidRequest,
    401: UpstreamError,  # our key for the upstream is wrong: the client cannot fix it
    403: UpstreamError,
    404: NotFound,
    407: UpstreamError,  # the gateway's proxy refused it: not the client's doing
    408: UpstreamTimeout,
    413: RequestTooLarge,
    422: InvalidRequest,
    429: RateLimited,
    503: Overloaded,
    504: UpstreamTimeout,
    529: Overloaded,
}

# Context-overflow messages in each backend's wording; numbers are (prompt, limit) and,
# where the backend says it, the completion tokens asked for (`completion`).
# The named groups are optional: a recogniser without numbers still classifies.
_CONTEXT_OVERFLOW = [
    # OpenAI and older vLLM: "maximum context length is L tokens. However, your messages resulted in P tokens"
    re.compile(
        r"maximum context length is (?P<limit>\d+) tokens\. However, (?:your messages resulted in|your request has) (?P<prompt>\d+)"
    ),
    # OpenAI and older vLLM: "... However, you requested T tokens (P in the messages, C in the completion)"
    re.compile(
        r"maximum context length is (?P<limit>\d+) tokens\. However, you requested \d+ tokens "
        r"\((?P<prompt>\d+) in the messages, (?P<completion>\d+) in the completion\)"
    ),
    # vLLM: "... you requested C output tokens and your prompt contains [at least ]P input tokens"
    re.compile(
        r"maximum context length is (?P<limit>\d+) tokens\..*?(?:you requested (?P<completion>\d+) output tokens and )?"
        r"your prompt contains (?:at least )?(?P<prompt>\d+) input tokens"
    ),
    # vLLM: "'max_tokens' or 'max_completion_tokens' is too large: C. This model's maximum context length is L tokens and ..."
    re.compile(
        r"(?:is too large: (?P<completion>\d+)\. This model's )?"
        r"maximum context length is (?P<limit>\d+) tokens and your request has (?P<prompt>\d+) input tokens"
    ),
    re.compile(
        r"You passed (?P<prompt>\d+) input tokens(?: and requested (?P<completion>\d+) output tokens)?.*?context length is only (?P<limit>\d+) tokens"
    ),
    # llama.cpp
    re.compile(r"request \((?P<prompt>\d+) tokens\) exceeds the available context size \((?P<limit>\d+) tokens\)"),
    # SGLang and Ollama's MLX runner
    re.compile(
        r"input \(?(?P<prompt>\d+) tokens\)? is longer than the model's context length \((?P<limit>\d+) tokens\)"
    ),
    re.compile(
        r"input length \((?P<prompt>\d+) tokens\) exceeds the model's maximum context length \((?P<limit>\d+) tokens\)"
    ),
    re.compile(
        r"context_length_exceeded|exceed_context_size_error|maximum context length|exceeds the context window"
        r"|longer than the maximum model length|input length exceeds the context length|prompt is too long"
        r"|prompt too long|the prompt is longer than the context length",
        re.IGNORECASE,
    ),
]


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


def _recognise_overflow(text: str, body: _UpstreamErrorBody | None) -> InvalidRequest | None:
    if body is not None and body.n_prompt_tokens is not None and body.n_ctx is not None:
        return context_overflow(body.n_prompt_tokens, body.n_ctx)
    for pattern in _CONTEXT_OVERFLOW:
        match = pattern.search(text)
        if match:
            numbers = {k: int(v) if v else None for k, v in match.groupdict().items()}
            return context_overflow(numbers.get("prompt"), numbers.get("limit"), numbers.get("completion"))
    if body is not None and body.code == "context_length_exceeded":
        return context_overflow(None, None)
    return None


# A model asked for input it cannot take answers 500 on some servers (llama.cpp without a
# vision projector): the client's request, not a fault to retry.
_UNSUPPORTED_INPUT = re.compile(r"(?i)image input is not supported|does not support image input")


# What a backend may echo back of a credential: bearer tokens, `sk-...` style keys,
# `api_key=...` parameters. The gateway's own upstream key must never reach a client.
_CREDENTIAL = re.compile(
    r"(?i)(?<=bearer )[^\s\"',;]{6,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_*\-]{6,}"
    r"|(?<=api[_-]key=)[^\s\"',;&]+|(?<=api[_-]key: )[^\s\"',;&]+"
)


_SECRETS: list[str] = []  # the upstream keys configured here, longest first: redacted wherever they appear
MIN_SECRET = 8  # shorter "keys" (test placeholders, "none") would redact ordinary words


def register_secret(secret: str | None) -> None:
    """A key this gateway sends upstream; error texts and passthrough error bodies never carry it.
    A header value's own token counts too (`Basic xyz`: `xyz` alone may be quoted back)."""
    for value in (secret, (secret or "").rpartition(" ")[2]):
        if value and len(value) >= MIN_SECRET and value not in _SECRETS:
            _SECRETS.append(value)
            _SECRETS.sort(key=len, reverse=True)  # a key inside a longer one must not leave the longer one's tail


def redact(text: str) -> str:
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, "[redacted]")
    return _CREDENTIAL.sub("[redacted]", text)


_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')  # a JSON string literal, escapes and all


def redact_bytes(data: bytes) -> bytes:
    """The configured upstream keys taken out of bytes relayed as they came (passthrough errors:
    JSON bodies, SSE events), as written and inside JSON strings however they are escaped
    (`\\u002d` for `-`): a string holding a key, once decoded, is written again redacted."""
    for secret in _SECRETS:
        if secret.encode() in data:
            data = data.replace(secret.encode(), b"[redacted]")
    if _SECRETS and b"\\" in data:
        data = _JSON_STRING.sub(_redact_escaped, data)
    return data


def _redact_escaped(match: re.Match[bytes]) -> bytes:
    literal = match.group()
    if b"\\" not in literal:
        return literal
    try:
        text = msgspec.json.decode(literal, type=str)
    except msgspec.DecodeError:
        return literal
    redacted = text
    for secret in _SECRETS:
        redacted = redacted.replace(secret, "[redacted]")
    return literal if redacted == text else msgspec.json.encode(redacted)


def upstream_message(raw: bytes) -> tuple[str, _UpstreamErrorBody | None]:
    """The human-readable message inside a backend's error body, in any of the shapes
    that OpenAI, vLLM, SGLang, llama.cpp and Ollama use."""
    try:
        envelope = _ENVELOPE.decode(raw)
    except msgspec.DecodeError:
        return raw.decode("utf-8", "replace").strip()[:2000], None
    if isinstance(envelope.error, _UpstreamErrorBody):
        body = envelope.error
        text = body.message or body.type or ""
        if body.type and body.type not in text:
            text = f"{body.type}: {text}" if text else body.type
        return text, body
    text = envelope.error or envelope.message or envelope.detail or raw.decode("utf-8", "replace")
    return text.strip()[:2000], None


def from_upstream(status: int, raw: bytes, *, upstream: str, retry_after: str | None = None) -> GatewayError:
    """Map a backend's non-2xx response to the error the client should see."""
    text, body = upstream_message(redact_bytes(raw))  # before the message is shortened: no key is cut in two
    text = redact(text)
    if status in (400, 413, 422) or (body and body.code == "context_length_exceeded"):
        overflow = _recognise_overflow(text, body)
        if overflow is not None:
            overflow.upstream = upstream
            return overflow
    if _UNSUPPORTED_INPUT.search(text):
        refused = InvalidRequest(f"the model behind upstream {upstream} does not accept images (it answered {status}: {text}); "
                                 "send text, or set vision = false for the model so images are refused here")  # fmt: skip
        refused.upstream = upstream
        return refused
    kind = _BY_STATUS.get(status, UpstreamError if status >= 500 or status < 400 else InvalidRequest)
    # The upstream (or its proxy) refusing our key is a gateway misconfiguration: retrying cannot help.
    should_retry = False if status in (401, 403, 407) else None
    error = kind(f"upstream {upstream} answered {status}: {text}", retry_after=retry_after, should_retry=should_retry)
    error.upstream = upstream
    return error


# Anthropic's status for each error type, by the class that has it (the error types table of
# its API reference): what a server that sends the error in a stream would have answered.
_BY_TYPE: dict[str, type[GatewayError]] = {
    kind.type: kind
    for kind in (
        GatewayError,
        InvalidRequest,
        Unauthorized,
        PermissionDenied,
        NotFound,
        RequestTooLarge,
        RateLimited,
        UpstreamTimeout,
        Overloaded,
    )
}


class _AnthropicEnvelope(msgspec.Struct):
    type: Literal["error"]  # required: OpenAI's `{"error": {"type", "message"}}` is not Anthropic's envelope
    error: anthropic.ErrorDetail


_ANTHROPIC_ENVELOPE = msgspec.json.Decoder(_AnthropicEnvelope)
_BARE_ERROR = msgspec.json.Decoder(_UpstreamErrorBody)


def anthropic_envelope(raw: bytes) -> _AnthropicEnvelope | None:
    """The error in Anthropic's envelope (`{"type": "error", "error": {type, message}}`), or None."""
    try:
        return _ANTHROPIC_ENVELOPE.decode(raw)
    except msgspec.DecodeError:  # ValidationError included
        return None


def from_error_event(data: bytes, *, upstream: str, retry_after: str | None = None) -> GatewayError:
    """The HTTP error for an `error` event a passthrough server sent as its stream's first
    event, before anything reached the client: what the server would have answered.

    Anthropic's envelope keeps its type and message, with Anthropic's status for the type, as
    such an error body is relayed; the server refusing the gateway's key (authentication or
    permission error) and other shapes (llama-server's `{"code": 400, "message", "type"}`, OpenAI's
    `{"error": {...}}`) are mapped as such a body with that status is (`from_upstream`)."""
    envelope = anthropic_envelope(data)
    if envelope is not None:
        kind = _BY_TYPE.get(envelope.error.type)
        message = redact(envelope.error.message)
        if kind in (Unauthorized, PermissionDenied):
            return from_upstream(kind.status, data, upstream=upstream, retry_after=retry_after)
        if kind is None:  # a type with no status here (billing_error, vLLM's BadRequestError): not known to pass
            error: GatewayError = UpstreamError(f"upstream {upstream} sent {envelope.error.type}: {message}",
                                                retry_after=retry_after, should_retry=False)  # fmt: skip
        else:
            error = kind(message, retry_after=retry_after, error_code=(envelope.error.details or {}).get("error_code"))
        error.upstream = upstream
        return error
    body, data = _error_body(data)
    if body is None:  # no error object: a text, or `{"error": "..."}`
        status = 500
    elif isinstance(body.code, int) and 400 <= body.code < 600:
        status = body.code
    else:
        status = _BY_TYPE.get(body.type or "", UpstreamError).status
    return from_upstream(status, data, upstream=upstream, retry_after=retry_after)


def _error_body(data: bytes) -> tuple[_UpstreamErrorBody | None, bytes]:
    """The error object of `{"error": {...}}`, or the object itself (llama-server's stream
    errors), with the data as an error body holding it."""
    try:
        envelope = _ENVELOPE.decode(data)
    except msgspec.DecodeError:
        return None, data
    if isinstance(envelope.error, _UpstreamErrorBody):
        return envelope.error, data
    try:
        body = _BARE_ERROR.decode(data)
    except msgspec.DecodeError:
        return None, data
    return (body, b'{"error":' + data + b"}") if body.message is not None else (None, data)


def from_stream_error(text: str, *, upstream: str) -> GatewayError:
    """Map an error that a backend reported inside a stream after its 200."""
    text = redact(text)
    overflow = _recognise_overflow(text, None)
    if overflow is not None:
        overflow.upstream = upstream
        return overflow
    return UpstreamError(f"upstream {upstream} failed mid-stream: {text}")

"""A backend's error answers mapped onto the error tree (`core.errors`), once.

`from_upstream` maps a backend's non-2xx response, `from_error_event` the `error` event a
passthrough stream begins with (by its type, or through `from_upstream`), `from_stream_error`
an error reported inside a stream after its 200. Context overflows, in each server's wording,
become Anthropic's, which Claude Code acts on; the gateway's keys are redacted first.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from dragoman.core.errors import (
    ErrorDetail,
    GatewayError,
    InvalidRequest,
    NotFound,
    Overloaded,
    PermissionDenied,
    RateLimited,
    RequestTooLarge,
    Unauthorized,
    UpstreamError,
    UpstreamTimeout,
    context_overflow,
)
from dragoman.core.redaction import Redactor


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


def from_upstream(
    status: int, raw: bytes, *, upstream: str, redactor: Redactor, retry_after: str | None = None
) -> GatewayError:
    """Map a backend's non-2xx response to the error the client should see, without the gateway's keys."""
    text, body = upstream_message(redactor.redact_bytes(raw))  # before the message is shortened: no key is cut in two
    text = redactor.redact(text)
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
    error: ErrorDetail


_ANTHROPIC_ENVELOPE = msgspec.json.Decoder(_AnthropicEnvelope)
_BARE_ERROR = msgspec.json.Decoder(_UpstreamErrorBody)


def anthropic_envelope(raw: bytes) -> _AnthropicEnvelope | None:
    """The error in Anthropic's envelope (`{"type": "error", "error": {type, message}}`), or None."""
    try:
        return _ANTHROPIC_ENVELOPE.decode(raw)
    except msgspec.DecodeError:  # ValidationError included
        return None


def from_error_event(data: bytes, *, upstream: str, redactor: Redactor, retry_after: str | None = None) -> GatewayError:
    """The HTTP error for an `error` event a passthrough server sent as its stream's first
    event, before anything reached the client: what the server would have answered.

    Anthropic's envelope keeps its type and message, with Anthropic's status for the type, as
    such an error body is relayed; the server refusing the gateway's key (authentication or
    permission error) and other shapes (llama-server's `{"code": 400, "message", "type"}`, OpenAI's
    `{"error": {...}}`) are mapped as such a body with that status is (`from_upstream`)."""
    envelope = anthropic_envelope(data)
    if envelope is not None:
        kind = _BY_TYPE.get(envelope.error.type)
        message = redactor.redact(envelope.error.message)
        if kind in (Unauthorized, PermissionDenied):
            return from_upstream(kind.status, data, upstream=upstream, redactor=redactor, retry_after=retry_after)
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
    return from_upstream(status, data, upstream=upstream, redactor=redactor, retry_after=retry_after)


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


def from_stream_error(text: str, *, upstream: str, redactor: Redactor, status: int | str | None = None) -> GatewayError:
    """Map an error that a backend reported inside a stream after its 200 (with the status
    it carries, as vLLM's and SGLang's `{"error": {"code": 400}}` do: a 4xx is the request's)."""
    text = redactor.redact(text)
    overflow = _recognise_overflow(text, None)
    if overflow is not None:
        overflow.upstream = upstream
        return overflow
    if isinstance(status, int) and 400 <= status < 500:
        error = _BY_STATUS.get(status, InvalidRequest)(f"upstream {upstream} refused it mid-stream: {text}")
        error.upstream = upstream
        return error
    return UpstreamError(f"upstream {upstream} failed mid-stream: {text}")

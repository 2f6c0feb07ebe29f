"""error_mapping.from_upstream / from_stream_error: backends' real error bodies -> what the
client sees. Statuses matter to the SDKs (they retry 408, 409, 429 and >= 500), and
Claude Code reacts to Anthropic's two context-overflow wordings: `prompt is too
long: P tokens > L maximum` (compact the conversation) and `input length and
`max_tokens` exceed context limit: P + C > L` (retry with a smaller max_tokens)."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest

from dragoman.core.error_mapping import from_stream_error, from_upstream
from dragoman.core.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    Overloaded,
    RateLimited,
    RequestTooLarge,
    UpstreamError,
    UpstreamTimeout,
)
from dragoman.core.redaction import NO_KEYS, Redactor

PROMPT_TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum")
MAX_TOKENS_TOO_LARGE = re.compile(
    r"^input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+), decrease input length or `max_tokens` and try again"
)


def raw(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def openai_error(message: str, type: str = "invalid_request_error", code: Any = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": None, "code": code, **extra}}


# (name, status, body, (prompt, limit)) - the prompt alone exceeds the window
PROMPT_OVERFLOWS = [
    ("openai-messages", 400, openai_error(
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.",
        code="context_length_exceeded"), (9000, 8192)),
    ("openai-requested", 400, openai_error(
        "This model's maximum context length is 8192 tokens. However, you requested 9500 tokens (9000 in the messages, 500 in the completion). "
        "Please reduce the length of the messages or completion.", code="context_length_exceeded"), (9000, 8192)),
    ("vllm-old-input-only", 400, {"object": "error", "type": "BadRequestError", "code": 400, "param": None, "message":
        "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages."},
        (5000, 4096)),
    ("vllm-renderer", 400, openai_error(
        "This model's maximum context length is 4096 tokens. However, you requested 100 output tokens and your prompt contains 5000 input tokens, "
        "for a total of 5100 tokens. Please reduce the length of the input prompt or the number of requested output tokens.",
        type="BadRequestError", code=400, param="input_tokens"), (5000, 4096)),
    ("vllm-renderer-at-least", 400, openai_error(
        "This model's maximum context length is 4096 tokens. However, you requested 100 output tokens and your prompt contains at least 4097 input "
        "tokens, for a total of at least 4197 tokens. Please reduce the length of the input prompt or the number of requested output tokens.",
        type="BadRequestError", code=400), (4097, 4096)),
    ("vllm-you-passed", 400, openai_error(
        "You passed 5000 input tokens and requested 100 output tokens. However, the model's context length is only 4096 tokens, resulting in a "
        "maximum input length of 3996 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=5000)",
        type="BadRequestError", code=400), (5000, 4096)),
    ("llamacpp-fields", 400, openai_error(
        "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",
        type="exceed_context_size_error", code=400, n_prompt_tokens=5000, n_ctx=4096), (5000, 4096)),
    ("llamacpp-fields-only", 400, openai_error(
        "the request exceeds the available context size, try increasing it", type="exceed_context_size_error", code=400,
        n_prompt_tokens=5000, n_ctx=4096), (5000, 4096)),
    ("llamacpp-text-only", 400, openai_error(
        "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it", type="exceed_context_size_error", code=400),
        (5000, 4096)),
    ("sglang", 400, {"object": "error", "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
                     "type": "BadRequestError", "param": None, "code": 400}, (5000, 4096)),
    ("ollama-mlx", 400, openai_error("input length (5000 tokens) exceeds the model's maximum context length (4096 tokens)"), (5000, 4096)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("status", "body", "numbers"), [c[1:] for c in PROMPT_OVERFLOWS], ids=[c[0] for c in PROMPT_OVERFLOWS]
)
def test_context_overflow_becomes_prompt_is_too_long_with_numbers(
    status: int, body: Any, numbers: tuple[int, int]
) -> None:
    error = from_upstream(status, raw(body), upstream="local", redactor=NO_KEYS)
    assert isinstance(error, InvalidRequest) and error.status == 400 and error.type == "invalid_request_error"
    match = PROMPT_TOO_LONG.match(error.message)
    assert match, error.message
    assert (int(match[1]), int(match[2])) == numbers
    assert error.headers().get("x-should-retry") == "false"


# The prompt fits, but prompt + max_tokens does not: the client should lower max_tokens
# rather than compact a conversation that is not too long.
MAX_TOKENS_OVERFLOWS = [
    ("openai-requested", openai_error(
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (3000 in the messages, 2000 in the completion). "
        "Please reduce the length of the messages or completion.", code="context_length_exceeded"), (3000, 2000, 4096)),
    ("vllm-max-tokens-too-large", openai_error(
        "'max_tokens' or 'max_completion_tokens' is too large: 2000. This model's maximum context length is 4096 tokens and your request has "
        "3000 input tokens (2000 > 4096 - 3000). (parameter=max_tokens, value=2000)", type="BadRequestError", code=400), (3000, 2000, 4096)),
    ("vllm-renderer", openai_error(
        "This model's maximum context length is 4096 tokens. However, you requested 2000 output tokens and your prompt contains 3000 input tokens, "
        "for a total of 5000 tokens. Please reduce the length of the input prompt or the number of requested output tokens.",
        type="BadRequestError", code=400), (3000, 2000, 4096)),
    ("vllm-you-passed", openai_error(
        "You passed 3000 input tokens and requested 2000 output tokens. However, the model's context length is only 4096 tokens, resulting in a "
        "maximum input length of 2096 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=3000)",
        type="BadRequestError", code=400), (3000, 2000, 4096)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "numbers"), [c[1:] for c in MAX_TOKENS_OVERFLOWS], ids=[c[0] for c in MAX_TOKENS_OVERFLOWS]
)
def test_prompt_plus_max_tokens_overflow_uses_anthropics_max_tokens_wording(
    body: Any, numbers: tuple[int, int, int]
) -> None:
    error = from_upstream(400, raw(body), upstream="local", redactor=NO_KEYS)
    assert isinstance(error, InvalidRequest)
    match = MAX_TOKENS_TOO_LARGE.match(error.message)
    assert match, error.message
    assert (int(match[1]), int(match[2]), int(match[3])) == numbers


OVERFLOWS_WITHOUT_NUMBERS = [
    ("openai-responses", openai_error("Your input exceeds the context window of this model. Please adjust your input and try again.",
                                      code="context_length_exceeded")),
    ("openai-code-only", openai_error("Request too large for this model.", code="context_length_exceeded")),
    ("ollama", openai_error("the input length exceeds the context length")),
    ("ollama-no-shift", openai_error("the prompt is longer than the context length currently available to the model; shorten the prompt, "
                                     "adjust the context length in settings, or use a model with a longer context length")),
    ("ollama-cloud", {"error": "prompt too long; exceeded max context length by 808 tokens"}),
    ("vllm-engine", openai_error("The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure that `max_model_len` "
                                 "is no smaller than the number of text tokens.", type="BadRequestError", code=400)),
]  # fmt: skip


@pytest.mark.parametrize(
    "body", [c[1] for c in OVERFLOWS_WITHOUT_NUMBERS], ids=[c[0] for c in OVERFLOWS_WITHOUT_NUMBERS]
)
def test_context_overflow_without_numbers_is_still_prompt_is_too_long(body: Any) -> None:
    error = from_upstream(400, raw(body), upstream="local", redactor=NO_KEYS)
    assert isinstance(error, InvalidRequest)
    assert error.message.startswith("prompt is too long")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens.",
            "prompt is too long: 5000 tokens > 4096 maximum",
        ),
        (
            "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
            "prompt is too long: 5000 tokens > 4096 maximum",
        ),
    ],
)
def test_context_overflow_reported_inside_a_stream(text: str, expected: str) -> None:
    error = from_stream_error(text, upstream="local", redactor=NO_KEYS)
    assert isinstance(error, InvalidRequest) and error.message.startswith(expected)


def test_other_stream_errors_are_upstream_errors() -> None:
    error = from_stream_error("CUDA out of memory", upstream="gpu-box", redactor=NO_KEYS)
    assert isinstance(error, UpstreamError) and error.status == 502
    assert "gpu-box" in error.message and "CUDA out of memory" in error.message


@pytest.mark.parametrize(
    ("status", "body", "kind", "client_status", "client_type", "fragment"),
    [
        (
            400,
            openai_error("'temperature' must be <= 2"),
            InvalidRequest,
            400,
            "invalid_request_error",
            "'temperature' must be <= 2",
        ),
        (
            404,
            openai_error("The model `qwen` does not exist.", type="NotFoundError", code=404),
            NotFound,
            404,
            "not_found_error",
            "The model `qwen` does not exist.",
        ),
        (408, b"Request Timeout", UpstreamTimeout, 504, "timeout_error", "Request Timeout"),
        (413, b"Payload Too Large", RequestTooLarge, 413, "request_too_large", "Payload Too Large"),
        (
            422,
            {"detail": [{"loc": ["body", "messages"], "msg": "Field required", "type": "missing"}]},
            InvalidRequest,
            400,
            "invalid_request_error",
            "Field required",
        ),
        (
            429,
            openai_error("Rate limit reached for requests", type="requests", code="rate_limit_exceeded"),
            RateLimited,
            429,
            "rate_limit_error",
            "Rate limit reached",
        ),
        (500, openai_error("boom", type="server_error", code=500), UpstreamError, 502, "api_error", "boom"),
        (500, b"Internal Server Error", UpstreamError, 502, "api_error", "Internal Server Error"),
        (502, b"<html><body>Bad Gateway</body></html>", UpstreamError, 502, "api_error", "Bad Gateway"),
        (
            503,
            openai_error("Loading model", type="unavailable_error", code=503),
            Overloaded,
            529,
            "overloaded_error",
            "Loading model",
        ),
        (529, b"overloaded", Overloaded, 529, "overloaded_error", "overloaded"),
        (504, b"Gateway Timeout", UpstreamTimeout, 504, "timeout_error", "Gateway Timeout"),
        (
            401,
            openai_error("Invalid API key", type="authentication_error", code=401),
            UpstreamError,
            502,
            "api_error",
            "Invalid API key",
        ),
        (407, b"Proxy Authentication Required", UpstreamError, 502, "api_error", "Proxy Authentication Required"),
    ],
    ids=[
        "400",
        "404",
        "408",
        "413",
        "422",
        "429",
        "500-json",
        "500-text",
        "502-html",
        "503",
        "529",
        "504",
        "401",
        "407",
    ],
)
def test_status_mapping(
    status: int, body: Any, kind: type[GatewayError], client_status: int, client_type: str, fragment: str
) -> None:
    error = from_upstream(status, raw(body), upstream="local", redactor=NO_KEYS)
    assert type(error) is kind
    assert (error.status, error.type) == (client_status, client_type)
    assert fragment in error.message and "local" in error.message


def test_deterministic_errors_say_do_not_retry_and_transient_ones_do_not() -> None:
    assert (
        from_upstream(400, raw(openai_error("bad")), upstream="u", redactor=NO_KEYS).headers()["x-should-retry"]
        == "false"
    )
    assert (
        from_upstream(407, b"Proxy Authentication Required", upstream="u", redactor=NO_KEYS).headers()["x-should-retry"]
        == "false"
    )
    assert "x-should-retry" not in from_upstream(429, b"slow down", upstream="u", redactor=NO_KEYS).headers()
    assert "x-should-retry" not in from_upstream(503, b"busy", upstream="u", redactor=NO_KEYS).headers()


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_kept(status: int) -> None:
    error = from_upstream(status, raw(openai_error("slow down")), upstream="u", redactor=NO_KEYS, retry_after="17")
    assert error.headers()["retry-after"] == "17"


@pytest.mark.parametrize(
    "body",
    [
        openai_error("a message", type="BadRequestError", code=400),
        {"object": "error", "message": "a message", "type": "BadRequestError", "param": None, "code": 400},
        {"error": "a message"},
        {"message": "a message"},
        {"detail": "a message"},
        b"a message",
        b"  a message\n",
    ],
    ids=["error-object", "object-error", "error-string", "message", "detail", "plain-text", "plain-text-padded"],
)
def test_body_shapes(body: Any) -> None:
    error = from_upstream(400, raw(body), upstream="local", redactor=NO_KEYS)
    assert isinstance(error, InvalidRequest)
    assert error.message.endswith("a message")


def test_non_utf8_and_huge_bodies_are_handled() -> None:
    assert isinstance(from_upstream(500, b"\xff\xfe broken", upstream="u", redactor=NO_KEYS), UpstreamError)
    error = from_upstream(500, b"x" * 100_000, upstream="u", redactor=NO_KEYS)
    assert len(error.message) < 5_000


SECRET = "sk-proj-Zx81kQ0aLmN3pQr7StUvWxYz12345678"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            401,
            openai_error(
                f"Incorrect API key provided: {SECRET}. You can find your API key at https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            ),
        ),
        (401, {"error": f"invalid header Authorization: Bearer {SECRET}"}),
        (403, f"Forbidden for key {SECRET}".encode()),
        (400, openai_error(f"Invalid request: authorization=Bearer {SECRET}")),
    ],
    ids=["openai-401", "echoed-header", "plain-403", "400"],
)
def test_credentials_are_never_repeated_to_the_client(status: int, body: Any) -> None:
    error = from_upstream(status, raw(body), upstream="local", redactor=NO_KEYS)
    assert SECRET not in error.message
    assert SECRET[8:] not in error.message
    assert SECRET.encode() not in error.body("req_1") and SECRET.encode() not in error.event()


def test_credentials_are_not_repeated_from_a_stream_error() -> None:
    assert (
        SECRET not in from_stream_error(f"auth failed for Bearer {SECRET}", upstream="local", redactor=NO_KEYS).message
    )


def test_error_body_and_event_use_anthropics_envelope() -> None:
    error = from_upstream(503, raw(openai_error("busy")), upstream="local", redactor=NO_KEYS)
    body = msgspec.json.decode(error.body("req_123"))
    assert body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": error.message},
        "request_id": "req_123",
    }
    event = error.event()
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    data = msgspec.json.decode(event.split(b"data: ", 1)[1])
    assert data["type"] == "error" and data["error"] == {"type": "overloaded_error", "message": error.message}


def test_a_registered_key_is_redacted_even_where_the_message_is_shortened() -> None:
    key = "gsk_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123"
    redactor = Redactor(key)
    for body in (
        b"x" * 1980 + b" bad key " + key.encode(),
        b'{"error": "' + b"y" * 1980 + b" bad key " + key.encode() + b'"}',
    ):
        message = from_upstream(401, body, upstream="u", redactor=redactor).message
        assert "gsk_" not in message and "ABCDEFG" not in message


def test_keys_are_redacted_longest_first_and_a_header_schemes_token_alone() -> None:
    redactor = Redactor("shortkey-12345", "shortkey-12345-and-a-longer-tail")
    assert redactor.redact("saw shortkey-12345-and-a-longer-tail") == "saw [redacted]"
    redactor.register("Basic dXNlcjpwYXNzd29yZA==")
    assert redactor.redact("credentials dXNlcjpwYXNzd29yZA== refused") == "credentials [redacted] refused"


def test_one_gateways_keys_are_not_anothers() -> None:
    first, second = Redactor("first-gateway-key"), Redactor()
    assert first.redact("saw first-gateway-key") == "saw [redacted]"
    assert second.redact("saw first-gateway-key") == "saw first-gateway-key"


@pytest.mark.parametrize(
    ("body", "is_anthropic"),
    [
        (b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}', True),
        (b'{"type":"error","error":{"type":"BadRequestError","message":"vLLM says"},"request_id":"req_1"}', True),
        # OpenAI's and llama-server's shape: `error.type` and `error.message`, no `"type": "error"`.
        ((b'{"error":{"code":400,"message":"request (5 tokens) exceeds the available context size (4 tokens)",'
          b'"type":"exceed_context_size_error","n_prompt_tokens":5,"n_ctx":4}}'), False),
        (b'{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}', False),
        (b'{"type":"message","error":{"type":"api_error","message":"x"}}', False),
        (b'{"type":"error","error":{"message":"no type"}}', False),
        (b"<html>502</html>", False),
    ],
    ids=["anthropic", "vllm", "llama", "openai", "not-error-type", "no-error-type", "html"],
)  # fmt: skip
def test_anthropics_envelope_is_told_from_other_servers_shapes(body: bytes, is_anthropic: bool) -> None:
    from dragoman.core.error_mapping import anthropic_envelope

    assert (anthropic_envelope(body) is not None) is is_anthropic

"""A passthrough stream that begins with an `error` event, before anything reached the
client: the HTTP error the server would have answered (which the SDKs retry, and an
error event they do not), not a 200 and the event. Once anything has gone out (a
comment line commits the 200) or after `message_start`, the event is relayed as it came."""

from __future__ import annotations

import asyncio
import json

import pytest

from dragoman.backends.anthropic.backend import AnthropicBackend
from dragoman.backends.anthropic.events import error_event_data
from dragoman.backends.shared import Shared
from dragoman.calls.types import Call, Outcome
from dragoman.core.config_load import from_dict
from dragoman.core.error_mapping import from_error_event
from dragoman.core.errors import GatewayError
from dragoman.core.redaction import NO_KEYS, Redactor
from tests.support.passthrough_stream import BLOCK, DELTA, START
from tests.support.responses import ScriptedResponse as Response


def anthropic_error(kind: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def error_event(data: bytes) -> bytes:
    return b"event: error\ndata: " + data + b"\n\n"


LLAMA_OVERFLOW = (
    b'{"code":400,"message":"request (1031 tokens) exceeds the available context size (512 tokens), try increasing it",'
    b'"type":"exceed_context_size_error","n_prompt_tokens":1031,"n_ctx":512}'
)


RETRIED, NOT_RETRIED = True, False  # by the SDKs (status >= 500 or 429, and no `x-should-retry: false`)


@pytest.mark.parametrize(
    ("data", "status", "kind", "message", "retried"),
    [
        (anthropic_error("invalid_request_error", "prompt is too long: 208656 tokens > 200000 maximum"), 400,
         "invalid_request_error", "prompt is too long: 208656 tokens > 200000 maximum", NOT_RETRIED),
        (anthropic_error("not_found_error", "no such model"), 404, "not_found_error", "no such model", NOT_RETRIED),
        (anthropic_error("request_too_large", "too big"), 413, "request_too_large", "too big", NOT_RETRIED),
        (anthropic_error("rate_limit_error", "slow down"), 429, "rate_limit_error", "slow down", RETRIED),
        (anthropic_error("api_error", "Internal server error"), 500, "api_error", "Internal server error", RETRIED),
        (anthropic_error("timeout_error", "took too long"), 504, "timeout_error", "took too long", RETRIED),
        (anthropic_error("overloaded_error", "Overloaded"), 529, "overloaded_error", "Overloaded", RETRIED),
        # The server refusing the gateway's key: not the client's to fix, as such a body is (from_upstream).
        (anthropic_error("authentication_error", "invalid x-api-key"), 502, "api_error",
         "upstream native answered 401: authentication_error: invalid x-api-key", NOT_RETRIED),
        (anthropic_error("permission_error", "not allowed"), 502, "api_error",
         "upstream native answered 403: permission_error: not allowed", NOT_RETRIED),
        # A type with no status here: a 502 the SDKs are told not to retry (as they would not retry the event).
        (anthropic_error("billing_error", "no credit"), 502, "api_error", "upstream native sent billing_error: no credit", NOT_RETRIED),
        (anthropic_error("BadRequestError", "vLLM's type"), 502, "api_error", "upstream native sent BadRequestError: vLLM's type",
         NOT_RETRIED),
        # llama-server's stream error: the bare object, its `code` the status.
        (LLAMA_OVERFLOW, 400, "invalid_request_error", "prompt is too long: 1031 tokens > 512 maximum (capability_rejected: prompt_too_long)",
         NOT_RETRIED),
        (b'{"code":503,"message":"Loading model","type":"unavailable_error"}', 529, "overloaded_error",
         "upstream native answered 503: unavailable_error: Loading model", RETRIED),
        # OpenAI's shape, its status from the type when there is no code.
        (b'{"error":{"message":"bad field","type":"invalid_request_error","code":null}}', 400, "invalid_request_error",
         "upstream native answered 400: invalid_request_error: bad field", NOT_RETRIED),
        (b'{"error":{"message":"boom","type":"server_error"}}', 502, "api_error", "upstream native answered 502: server_error: boom", RETRIED),
        (b"something broke", 502, "api_error", "upstream native answered 500: something broke", RETRIED),
    ],
    ids=["invalid-request", "not-found", "too-large", "rate-limit", "api-error", "timeout", "overloaded", "authentication",
         "permission", "unknown-type", "vllm-type", "llama-overflow", "llama-unavailable", "openai-invalid", "openai-server", "text"],
)  # fmt: skip
def test_an_opening_error_event_maps_to_the_status_the_server_would_have_answered(
    data, status, kind, message, retried
) -> None:
    error = from_error_event(data, upstream="native", redactor=NO_KEYS, retry_after="7")
    assert (error.status, error.type, error.message) == (status, kind, message)
    assert error.is_upstream  # counted as the upstream's failure
    headers = error.headers()
    assert (headers.get("x-should-retry") != "false" and (status >= 500 or status == 429)) is retried
    if not message.startswith("prompt is too long"):  # which no wait can fix: from_upstream gives it none
        assert headers.get("retry-after") == "7"


def test_an_opening_error_keeps_its_error_code_and_never_the_gateways_key() -> None:
    redactor = Redactor("opening-secret-key")
    data = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "key opening-secret-key",
                                                  "details": {"error_code": "some_code"}}}).encode()  # fmt: skip
    error = from_error_event(data, upstream="native", redactor=redactor)
    assert error.message == "key [redacted]" and error.details == {"error_code": "some_code"}
    llama = from_error_event(
        b'{"code":400,"message":"key opening-secret-key","type":"invalid_request_error"}',
        upstream="native",
        redactor=redactor,
    )
    assert "opening-secret-key" not in llama.message and "[redacted]" in llama.message


@pytest.mark.parametrize(
    ("head", "found"),
    [
        (error_event(anthropic_error("overloaded_error", "Overloaded")), anthropic_error("overloaded_error", "Overloaded")),
        (b"event:error\r\ndata:" + LLAMA_OVERFLOW + b"\r\n\r\n" + START, LLAMA_OVERFLOW),
        (b"data: " + anthropic_error("api_error", "x") + b"\n\n", anthropic_error("api_error", "x")),
        (b'data: {"error":{"message":"boom"}}\n\n', b'{"error":{"message":"boom"}}'),
        (START, None),
        (START + error_event(anthropic_error("api_error", "later")), None),  # only the first event
        (DELTA.replace(b'"hi"', b'"an error"'), None),  # a text that says "error"
        (b'data: {"type":"message_start","text":"error"}\n\n', None),
        (b"data: error\n\n", None),
    ],
    ids=["anthropic", "llama-crlf", "unnamed-anthropic", "unnamed-openai", "message-start", "error-second",
         "text-says-error", "unnamed-not-error", "unnamed-not-json"],
)  # fmt: skip
def test_the_first_event_of_a_head_is_an_error_or_not(head: bytes, found: bytes | None) -> None:
    assert error_event_data(head) == found


def relay(
    reads: list[bytes], headers: dict[str, str] | None = None, committed: bool = False
) -> tuple[bytes, GatewayError | None, Outcome]:
    """What the relay yields before it ends, and the error it raises, if any."""
    config = from_dict({"upstreams": {"native": {"url": "http://127.0.0.1:9", "protocol": "anthropic"}}})
    backend = AnthropicBackend("native", config.upstreams["native"], config, Shared())  # type: ignore[arg-type]
    outcome = Outcome(request_id="req_1", endpoint="messages")
    call = Call(b"{}", "client-name", "served", {}, "req_1", True, outcome)

    async def run() -> tuple[bytes, GatewayError | None]:
        out = []
        try:
            async for chunk in backend._relay(Response(reads), call, None, headers, committed=committed):  # type: ignore[arg-type]
                out.append(chunk)
        except GatewayError as error:
            return b"".join(out), error
        return b"".join(out), None

    sent, error = asyncio.run(run())
    return sent, error, outcome


OVERLOADED = error_event(anthropic_error("overloaded_error", "Overloaded"))


@pytest.mark.parametrize(
    "reads",
    [[OVERLOADED], [OVERLOADED[:20], OVERLOADED[20:]], [OVERLOADED[:-1]], [b"event: error\ndata: " + anthropic_error("overloaded_error", "Overloaded")]],
    ids=["whole", "cut", "no-blank-line", "no-end"],
)  # fmt: skip
def test_a_stream_that_begins_with_an_error_event_raises_it_before_a_byte_goes_out(reads: list[bytes]) -> None:
    sent, error, _ = relay(reads, headers={"retry-after": "3"})
    assert sent == b""
    assert error is not None and (error.status, error.type, error.message) == (529, "overloaded_error", "Overloaded")
    assert error.retry_after == "3"


@pytest.mark.parametrize(
    ("reads", "committed"),
    [([b":\n\n", OVERLOADED], False), ([OVERLOADED], True), ([START, BLOCK, DELTA, OVERLOADED], False)],
    ids=["after-a-servers-comment", "after-our-comments", "mid-stream"],
)
def test_an_error_event_after_anything_went_out_is_relayed_as_it_came(reads: list[bytes], committed: bool) -> None:
    sent, error, outcome = relay(reads, committed=committed)
    assert error is None
    assert sent.endswith(OVERLOADED) and sent.count(b"event: error") == 1
    assert outcome.error_type == "overloaded_error" and outcome.upstream_failed


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
@pytest.mark.parametrize(
    ("reads", "committed"),
    [([b":\n\n", OVERLOADED[:-1]], False), ([OVERLOADED[:-2]], True), ([OVERLOADED[:20], OVERLOADED[20:-1]], True)],
    ids=["after-a-servers-comment", "after-our-comments", "after-our-comments-cut"],
)
def test_an_error_event_closed_on_without_its_blank_line_after_anything_went_out_is_the_streams_end(
    reads, committed, crlf
) -> None:
    # Nothing but comments went out, and the 200 with them: the event, completed, ends the stream (no HTTP error now).
    line_ends = (lambda b: b.replace(b"\n", b"\r\n")) if crlf else (lambda b: b)
    sent, error, outcome = relay([line_ends(read) for read in reads], committed=committed)
    assert error is None  # not dragoman's "closed the stream before the reply was complete"
    assert sent.endswith(line_ends(OVERLOADED)) and sent.count(b"event: error") == 1
    assert outcome.error_type == "overloaded_error" and outcome.upstream_failed

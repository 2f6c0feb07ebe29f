"""Traces in OpenTelemetry's GenAI conventions, read back from a real OTLP/HTTP export
(decoded with opentelemetry-proto): the span tree, names and attributes of a streamed and
a whole reply, a retried one, a failed one, a client that left, and a batch; and that an
incoming `traceparent` is continued and a child's sent upstream."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.assembly.tracing import build_tracing, resolve_tracing, wanted
from dragoman.core.config import TracingConfig
from tests.support.batches import wait_ended
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
from tests.support.otlp import GrpcOtlpReceiver, OtlpReceiver, Span
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually

KEY = "sk-trace-secret"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SERVER, CLIENT, INTERNAL = 2, 3, 1  # OTLP's SpanKind numbers
ASK = {"model": "test-model", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    otlp = OtlpReceiver().start()
    yield otlp
    otlp.stop()


@pytest.fixture
def traced(
    upstream: FakeUpstream, receiver: OtlpReceiver, gateway_from: Callable[[dict], GatewayServer]
) -> Callable[..., GatewayServer]:
    """`traced(**tracing)` starts a gateway exporting to the receiver; `flushed(gateway, ...)` stops it."""

    def start(upstream_keys: dict[str, Any] | None = None, **tracing: Any) -> GatewayServer:
        return gateway_from({
            "server": {"api_keys": [KEY]},
            "upstreams": {"default": {"url": upstream.url, "max_retries": 0, **(upstream_keys or {})}},
            "tracing": {"enabled": True, "endpoint": receiver.url, "metrics_interval": 0.2, **tracing},
        })  # fmt: skip

    return start


def flushed(gateway: GatewayServer, receiver: OtlpReceiver) -> list[Span]:
    """Every span, once the gateway has stopped (its shutdown exports what is left)."""
    gateway.stop()
    return receiver.spans()


def sdk(gateway: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0, timeout=10)


def one(spans: list[Span], kind: int) -> Span:
    found = [span for span in spans if span.kind == kind]
    assert len(found) == 1, [(s.name, s.kind) for s in spans]
    return found[0]


def test_a_whole_reply_continues_the_clients_trace_and_sends_a_child_upstream(traced, upstream, receiver):
    upstream.json_reply(completion("Hello!", prompt=12, completion_tokens=3))
    gateway = traced()
    message = sdk(gateway).messages.create(**ASK, stop_sequences=["END"], extra_headers={"traceparent": TRACEPARENT},
                                           extra_body={"temperature": 0.5})  # fmt: skip
    spans = flushed(gateway, receiver)

    server, client = one(spans, SERVER), one(spans, CLIENT)
    assert server.name == "POST /v1/messages"
    assert (server.trace_id, server.parent_span_id) == (TRACE_ID, PARENT_ID)
    assert server.attributes["http.response.status_code"] == 200
    assert client.name == "chat test-model" and client.trace_id == TRACE_ID and client.parent_span_id == server.span_id
    attributes = client.attributes
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "test-model"
    assert attributes["gen_ai.request.max_tokens"] == 32 and attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.request.stop_sequences"] == ["END"]
    assert attributes["gen_ai.response.id"] == message.id
    assert attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (12, 3)
    assert attributes["server.address"] == "127.0.0.1" and isinstance(attributes["server.port"], int)
    assert "gen_ai.input.messages" not in attributes  # contents only when the operator opts in
    sent = upstream.headers[0]["traceparent"]
    assert sent == f"00-{TRACE_ID}-{client.span_id}-01"
    assert not any(KEY in str(value) for span in spans for value in span.attributes.values())


def test_a_stream_has_first_token_and_end_events(traced, upstream, receiver):
    upstream.stream_reply(text_stream("Hel", "lo", prompt=9))
    gateway = traced()
    with sdk(gateway).messages.stream(**ASK) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    spans = flushed(gateway, receiver)

    assert text == "Hello"
    server, client = one(spans, SERVER), one(spans, CLIENT)
    assert server.parent_span_id == ""  # no traceparent came: a trace of its own
    assert client.attributes["gen_ai.response.id"] == final.id
    assert client.attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert client.attributes["gen_ai.usage.input_tokens"] == 9
    names = [name for name, _ in client.events]
    assert names == ["gen_ai.first_token", "gen_ai.end_of_stream"]
    assert client.events[0][1]["gen_ai.server.time_to_first_token"] > 0


def test_a_retry_is_a_sibling_attempt(traced, upstream, receiver):
    upstream.queue(Reply(status=503, body={"error": {"message": "busy"}}, headers={"retry-after": "0"}))
    upstream.json_reply(completion("ok"))
    gateway = traced(upstream_keys={"max_retries": 1})
    sdk(gateway).messages.create(**ASK)
    spans = flushed(gateway, receiver)

    server = one(spans, SERVER)
    attempts = [span for span in spans if span.kind == CLIENT]
    assert len(attempts) == 2 and all(span.parent_span_id == server.span_id for span in attempts)
    failed = [span for span in attempts if span.attributes.get("error.type") == "503"]
    assert len(failed) == 1 and failed[0].status_code == 2  # STATUS_CODE_ERROR
    assert [span for span in attempts if span is not failed[0]][0].attributes["gen_ai.response.finish_reasons"] == [
        "end_turn"
    ]
    assert [request["model"] for request in upstream.requests] == ["test-model", "test-model"]
    assert upstream.headers[0]["traceparent"] != upstream.headers[1]["traceparent"]  # each attempt its own span


def test_a_failed_request_marks_both_spans(traced, upstream, receiver):
    upstream.json_reply({"error": {"message": "model exploded", "type": "server_error"}}, status=500)
    gateway = traced()
    with pytest.raises(anthropic.InternalServerError):
        sdk(gateway).messages.create(**ASK)
    spans = flushed(gateway, receiver)

    server, client = one(spans, SERVER), one(spans, CLIENT)
    assert server.attributes["http.response.status_code"] == 502 and server.attributes["error.type"] == "api_error"
    assert server.status_code == 2
    assert client.attributes["error.type"] == "500" and client.status_code == 2


def test_a_client_that_leaves_mid_stream_ends_its_trace(traced, upstream, receiver):
    upstream.stream_reply([*text_stream("first")[:2], ("sleep", 1), *text_stream("late")[2:]])
    gateway = traced()
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json={**ASK, "stream": True},
                      headers={"x-api-key": KEY}, timeout=10) as response:  # fmt: skip
        for line in response.iter_lines():
            if "content_block_delta" in line:
                break
    eventually(lambda: upstream.disconnects >= 1, "the upstream saw it")
    spans = flushed(gateway, receiver)

    server = one(spans, SERVER)
    assert server.attributes["http.response.status_code"] == 200  # the head had gone out
    assert server.attributes["error.type"] == "client_disconnected"
    assert one(spans, CLIENT).attributes["error.type"] == "client_disconnected"


def _run_batch(client: anthropic.Anthropic, **extra: Any) -> str:
    params = {"model": "test-model", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    created = client.messages.batches.create(
        requests=[{"custom_id": "a", "params": params}, {"custom_id": "b", "params": params}], **extra
    )
    wait_ended(client, created.id)
    return created.id


@pytest.mark.parametrize("continued", [True, False])
def test_each_batch_request_has_a_trace_linked_to_the_batch(traced, upstream, receiver, continued):
    gateway = traced()
    batch_id = _run_batch(sdk(gateway), **({"extra_headers": {"traceparent": TRACEPARENT}} if continued else {}))
    spans = flushed(gateway, receiver)

    create = one([span for span in spans if span.name == "POST /v1/messages/batches"], SERVER)
    assert create.attributes["dragoman.batch.id"] == batch_id
    assert (create.trace_id, create.parent_span_id) == ((TRACE_ID, PARENT_ID) if continued else (create.trace_id, ""))
    roots = [span for span in spans if span.name == "batch request"]
    assert sorted(span.attributes["dragoman.batch.custom_id"] for span in roots) == ["a", "b"]
    assert len({span.trace_id for span in roots}) == 2 and create.trace_id not in {span.trace_id for span in roots}
    for root in roots:
        assert root.attributes["dragoman.batch.id"] == batch_id
        assert root.links == [(create.trace_id, create.span_id)]
        attempt = [span for span in spans if span.parent_span_id == root.span_id]
        assert len(attempt) == 1 and attempt[0].name == "chat test-model"


def test_contents_are_recorded_only_when_the_operator_opts_in(traced, upstream, receiver):
    upstream.json_reply(completion("Hello there"))
    gateway = traced(capture_content=True)
    sdk(gateway).messages.create(**ASK, system="Be brief.")
    attributes = one(flushed(gateway, receiver), CLIENT).attributes

    assert '"Hi"' in attributes["gen_ai.input.messages"]
    assert attributes["gen_ai.system_instructions"] == '"Be brief."'
    assert "Hello there" in attributes["gen_ai.output.messages"]


def test_the_genai_metrics_are_exported(traced, upstream, receiver):
    upstream.stream_reply(text_stream("Hel", "lo", prompt=9))
    gateway = traced()
    with sdk(gateway).messages.stream(**ASK) as stream:
        stream.until_done()
    flushed(gateway, receiver)

    assert {
        "gen_ai.server.request.duration",
        "gen_ai.server.time_to_first_token",
        "gen_ai.client.token.usage",
    } <= receiver.metric_names()


def test_spans_go_over_grpc_too(upstream, gateway_from):
    grpc_receiver = GrpcOtlpReceiver().start()
    try:
        gateway = gateway_from({
            "upstreams": {"default": {"url": upstream.url, "max_retries": 0}},
            "tracing": {"enabled": True, "endpoint": grpc_receiver.url, "protocol": "grpc", "metrics": False,
                        "service_name": "gateway-7"},
        })  # fmt: skip
        anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0).messages.create(**ASK)
        gateway.stop()
        spans = grpc_receiver.received.spans
    finally:
        grpc_receiver.stop()
    assert sorted(span.name for span in spans) == ["POST /v1/messages", "chat test-model"]
    assert {span.service for span in spans} == {"gateway-7"}


def test_the_replica_and_why_routing_chose_it_are_on_the_attempt(traced, upstream, receiver):
    other = FakeUpstream().start()
    try:
        gateway = traced(upstream_keys={"replicas": [other.url], "routing": "cache_aware"})
        sdk(gateway).messages.create(**ASK)
        attempt = one(flushed(gateway, receiver), CLIENT)
    finally:
        other.stop()
    assert attempt.attributes["dragoman.replica"] in {upstream.url.removesuffix("/v1"), other.url.removesuffix("/v1")}
    assert attempt.attributes["dragoman.route.reason"]
    assert isinstance(attempt.attributes["dragoman.route.prefix_tokens"], int)


def test_tracing_is_off_unless_asked_for():
    off, problems = resolve_tracing(TracingConfig(), {})
    assert build_tracing(off, "0") is None and problems == []  # the request path then does no tracing work
    assert wanted(TracingConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not wanted(TracingConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert not wanted(TracingConfig(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})

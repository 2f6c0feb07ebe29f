"""A replica that sends a stream's response head (200, text/event-stream) and then nothing, as
vLLM does with a hung engine: it has not answered. Its stream is retried once on another
replica while nothing the client could tell apart has gone out (translating: no content
block; passthrough: no `message_start`, only keep-alive comments), and the replica is passed
over like one that sent no head. A stream whose answer had begun is never retried.
Timeouts are small; cool-downs are longer than any test, never waited for."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import anthropic
import pytest

from dragoman.assembly.gateway import Timings
from dragoman.upstream.replicas import CoolDowns
from tests.support.fake_anthropic import FakeAnthropic, NativeReply, text_events
from tests.support.fakes import FakeUpstream, Reply, chunk, text_stream
from tests.support.servers import GatewayServer

FIRST_BYTE_TIMEOUT = 1.0  # small, yet far above what a healthy fake takes to answer on a loaded machine
# Rotation sends each test's requests to the failing replica too (cache-aware routing would keep one
# conversation on one replica: docs/routing.md).
FLEET = {"max_retries": 2, "first_byte_timeout": FIRST_BYTE_TIMEOUT, "routing": "round_robin"}
VALID = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
NATIVE = {"model": "native-model", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
KEEPALIVES = pytest.mark.parametrize("keepalive", [15.0, 0.2], ids=["no-keepalives", "keepalives"])


def _head_then_nothing(body: dict) -> Reply:
    return Reply(chunks=[("sleep", 60.0)], done=False)  # the head goes out at once; the body never starts


def _answers_streams(body: dict) -> Reply | None:
    return Reply(chunks=text_stream("Hi", "!")) if body.get("stream") else None


LONG_COOL_DOWN = Timings(cool_downs=CoolDowns(silent=3600.0))  # a silent instance stays passed over


@pytest.fixture
def make_gateway(make_gateway: Callable[..., GatewayServer]) -> Callable[..., GatewayServer]:
    """The shared fixture's, with every gateway passing a silent instance over for the whole test."""
    return functools.partial(make_gateway, timings=LONG_COOL_DOWN)


@pytest.fixture
def gateway_from(gateway_from: Callable[..., GatewayServer]) -> Callable[..., GatewayServer]:
    return functools.partial(gateway_from, timings=LONG_COOL_DOWN)


@pytest.fixture
def stalled() -> Iterator[FakeUpstream]:
    """A Chat Completions replica whose streams send their head and nothing else."""
    fake = FakeUpstream().start()
    fake.responder = _head_then_nothing
    yield fake
    fake.stop()


@pytest.fixture
def stalled_native() -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic().start()
    fake.replies.extend(NativeReply(events=[("sleep", 60.0)]) for _ in range(4))
    yield fake
    fake.stop()


def _client(gateway) -> anthropic.Anthropic:  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0, timeout=30)


def _timeout_event(client: anthropic.Anthropic, request: dict) -> tuple[list[str], str]:
    """The text a stream delivered before its `error` event, and the event's message (type checked)."""
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with client.messages.stream(**request) as stream:
            seen.extend(stream.text_stream)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "timeout_error", body
    return seen, body["error"]["message"]


# -- the translating path ---------------------------------------------------------------


@KEEPALIVES
def test_a_translated_stream_whose_replica_stalls_after_its_head_is_retried_and_the_replica_passed_over(
    make_gateway, upstream, stalled, keepalive
):
    upstream.responder = _answers_streams
    gateway = make_gateway(url=stalled.url, upstream={"replicas": [upstream.url], **FLEET},
                           server={"default_model": "test-model", "keepalive_interval": keepalive})  # fmt: skip
    client = _client(gateway)
    for _ in range(4):  # round robin would send every other one to the stalled replica
        with client.messages.stream(**VALID) as stream:
            assert stream.get_final_text() == "Hi!"
    assert len(stalled.requests) == 1  # the one that found it stalled (and was retried): then passed over
    assert len(upstream.requests) == 4


def test_a_non_streaming_reply_read_as_a_stream_is_retried_too(make_gateway, upstream, stalled):
    """Stop sequences make the gateway read the upstream as a stream for a plain request: nothing
    has gone to the client while it waits for the body, so it is retried the same way."""
    upstream.responder = _answers_streams
    gateway = make_gateway(
        url=stalled.url, upstream={"replicas": [upstream.url], **FLEET}, server={"default_model": "test-model"}
    )
    client = _client(gateway)
    for _ in range(2):
        message = client.messages.create(**VALID, stop_sequences=["zzz"])
        assert message.content[0].text == "Hi!"
    assert len(stalled.requests) == 1
    assert len(upstream.requests) == 2


def test_with_every_translating_replica_stalled_the_stream_ends_with_a_timeout_error(make_gateway, stalled):
    other = FakeUpstream().start()
    other.responder = _head_then_nothing
    try:
        gateway = make_gateway(url=stalled.url, upstream={"replicas": [other.url], **FLEET},
                               server={"default_model": "test-model", "keepalive_interval": 0.2})  # fmt: skip
        seen, message = _timeout_event(_client(gateway), VALID)
        assert seen == []
        assert f"{FIRST_BYTE_TIMEOUT:g} s" in message
        assert len(stalled.requests) == 1 and len(other.requests) == 1  # retried once, on the other
    finally:
        other.stop()


def test_a_translated_stream_that_had_a_content_block_is_not_retried(make_gateway, upstream):
    def stalls(body: dict) -> Reply:  # the answer starts, then the replica falls silent
        return Reply(
            chunks=[chunk({"role": "assistant", "content": ""}), chunk({"content": "Hi"}), ("sleep", 30.0)], done=False
        )

    other = FakeUpstream().start()
    upstream.responder = other.responder = stalls
    try:
        gateway = make_gateway(
            upstream={"replicas": [other.url], **FLEET, "idle_timeout": 0.5}, server={"default_model": "test-model"}
        )
        seen, _ = _timeout_event(_client(gateway), VALID)
        assert seen == ["Hi"]
        assert len(upstream.requests) + len(other.requests) == 1
    finally:
        other.stop()


# -- the passthrough path -----------------------------------------------------------------


def _native_gateway(gateway_from, first: FakeAnthropic, second: FakeAnthropic, keepalive: float = 15.0, **upstream):  # type: ignore[no-untyped-def]
    return gateway_from({"server": {"default_model": "native-model", "keepalive_interval": keepalive},
                         "upstreams": {"n": {"url": first.url, "replicas": [second.url], "protocol": "anthropic", **FLEET, **upstream}}})  # fmt: skip


@KEEPALIVES
def test_a_passthrough_stream_whose_replica_stalls_after_its_head_is_retried_and_the_replica_passed_over(
    gateway_from, native, stalled_native, keepalive
):
    native.replies.extend(NativeReply(events=text_events("Hi")) for _ in range(4))
    client = _client(_native_gateway(gateway_from, stalled_native, native, keepalive))
    for _ in range(4):
        with client.messages.stream(**NATIVE) as stream:
            assert stream.get_final_text() == "Hi"
    assert len(stalled_native.requests) == 1
    assert len(native.requests) == 4


def test_with_every_passthrough_replica_stalled_the_stream_ends_with_a_timeout_error(gateway_from, stalled_native):
    other = FakeAnthropic().start()
    other.replies.extend(NativeReply(events=[("sleep", 60.0)]) for _ in range(2))
    try:
        seen, message = _timeout_event(_client(_native_gateway(gateway_from, stalled_native, other, 0.2)), NATIVE)
        assert seen == []
        assert f"{FIRST_BYTE_TIMEOUT:g} s" in message
        assert len(stalled_native.requests) == 1 and len(other.requests) == 1
    finally:
        other.stop()


def test_a_passthrough_stream_that_had_a_content_block_is_not_retried(gateway_from, native):
    other = FakeAnthropic().start()
    for fake in (native, other):
        fake.replies.append(NativeReply(events=[*text_events("Hi")[:3], ("sleep", 30.0)]))
    try:
        seen, _ = _timeout_event(_client(_native_gateway(gateway_from, native, other, idle_timeout=0.5)), NATIVE)
        assert seen == ["Hi"]
        assert len(native.requests) + len(other.requests) == 1
    finally:
        other.stop()
